//! Checking that every rank holds the same parameters (the walk and the
//! digests are the shared `replicas`).

use crate::shim;
use burn::module::Module;
use burn::tensor::backend::Backend;
use burn_ddp_comm::{CommError, ProcessGroup, Result};

/// Checks that every rank of `group` holds exactly rank 0's parameters, every
/// parameter tensor of `model` (trained or not) compared by a digest of its
/// shape and bytes. Returns how many tensors were compared; a difference is an
/// error on every rank naming the first parameter that differs (its path in
/// the module) and the ranks it differs on. Collective: every rank calls it at
/// the same point, for example after training.
///
/// Saved records cannot be compared with `cmp`: they embed each process's
/// parameter ids.
pub fn check_replicas<B: Backend, M: Module<B>>(model: &M, group: &ProcessGroup) -> Result<usize> {
    crate::shared::replicas::check(group, shim::walker(model))
}

/// A fingerprint of every parameter tensor of `model` (paths, shapes and
/// bytes; [`burn_ddp_training::replicas::fingerprint`]): print it at the end
/// of two runs to check that they ended with exactly the same parameters (a
/// run restarted from snapshots and an uninterrupted one, say). Local: no
/// collective.
pub fn parameters_fingerprint<B: Backend, M: Module<B>>(model: &M) -> u64 {
    crate::shared::replicas::fingerprint(shim::walker(model))
}

/// Every float parameter of `model`, in declaration order, as f32: to
/// compare two runs to a tolerance where their fingerprints cannot agree
/// (another world size sums in another order). Local: no collective.
pub fn parameter_values<B: Backend, M: Module<B>>(model: &M) -> Vec<f32> {
    crate::shared::replicas::values(shim::walker(model))
}

/// Rank 0's model and optimizer state on every rank of `group` (loaded into
/// `model` and `optimizer` on the others, the parameters' ids with them, so
/// the optimizer's state finds its parameters): what a replacement that
/// joined the running job ([`admit_joiners`](crate::admit_joiners)) needs.
/// Full precision. Wrap the model over `group` afterwards. Collective.
pub fn share_training_state<B, M, O>(
    model: M,
    optimizer: O,
    group: &ProcessGroup,
    device: &B::Device,
) -> Result<(M, O)>
where
    B: burn::tensor::backend::AutodiffBackend,
    M: burn::module::AutodiffModule<B>,
    O: burn::optim::Optimizer<M, B>,
{
    use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let rank = group.rank();
    let unreadable = |what: &str, e: burn::record::RecorderError| CommError::InvalidArgument {
        rank,
        message: format!("the training state cannot be {what}: {e}"),
    };
    let bytes = if rank == 0 {
        let record = (model.clone().into_record(), optimizer.to_record());
        recorder
            .record(record, ())
            .map_err(|e| unreadable("written", e))?
    } else {
        Vec::new()
    };
    let bytes = burn_ddp_training::recovery::broadcast_bytes(group, bytes)?;
    if rank == 0 {
        return Ok((model, optimizer));
    }
    let (model_record, optimizer_record): (M::Record, O::Record) = recorder
        .load(bytes, device)
        .map_err(|e| unreadable("read", e))?;
    Ok((
        model.load_record(model_record),
        optimizer.load_record(optimizer_record),
    ))
}
