//! burn-ddp-22's own scenarios: a layout change of a wrapped model (its
//! gradient sync returns the error), and training until killed (the fault
//! cases).

use crate::shared::contract::DdpModel;
use crate::shared::scenarios::{Task, ToyTask};
use crate::shared::{e, Res};
use crate::shim::{self, ddp};
use burn::optim::SgdConfig;
use burn_ddp_testkit::numbers::shards;

/// Trains the toy model, wrapped, on 2 items of this rank's shard a step
/// with `sync_gradients` and learning rate `lr`, for `steps`; `before(step,
/// rank, model)` runs before each step.
fn train_toy(
    steps: impl Iterator<Item = usize>,
    lr: f64,
    mut before: impl FnMut(usize, usize, &mut shim::Toy),
) -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = shim::device();
    let mut model = ToyTask::build(&device).wrap(&group)?;
    let mut opt = SgdConfig::new().init();
    let shards = shards(world * 8, world);
    for step in steps {
        before(step, rank, &mut model);
        let at = 2 * (step % 4);
        let loss = ToyTask::loss(&model, &shards[rank][at..at + 2], &device);
        let grads = model.synced_grads(loss)?;
        model = opt.step(lr, model, grads);
    }
    Ok(())
}

/// After two steps rank 1 freezes the bias (no longer trainable there): the
/// next sync must fail on every rank, not sum misaligned buckets.
pub fn layout_change() -> Res<()> {
    train_toy(0..3, 0.1, |step, rank, model| {
        if step == 2 && rank == 1 {
            let (id, value, _) = model.linear.bias.take().unwrap().consume();
            model.linear.bias = Some(burn::module::Param::initialized(
                id,
                value.set_require_grad(false),
            ));
        }
    })?;
    Err("a layout change on one rank should have failed the sync".into())
}

/// Trains until killed: prints `ready` after two steps, then keeps going
/// (for the fault cases).
pub fn train_forever() -> Res<()> {
    train_toy(0.., 0.01, |step, _, _| {
        if step == 3 {
            println!("ready");
        }
    })?;
    unreachable!()
}
