//! A sum over the ranks that autodiff goes through: rank r sums
//! `x_r = [r+1, 2(r+1)]` over the ranks and weighs the sum by its own
//! `w_r = [r+1, 1]`; the loss of one process holding every rank's part is
//! `sum_r (sum_q x_q) . w_r`, so each rank's `x` must get `sum_r w_r` as its
//! gradient, not its own `w_r` (what a sum detached from autodiff would give).

use crate::shared::{e, Res};
use burn::backend::{Autodiff, NdArray};
use burn::tensor::Tensor;

type B = Autodiff<NdArray>;

pub fn run() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let r = group.rank() as f32;
    let device = Default::default();
    let x = Tensor::<B, 1>::from_floats([r + 1.0, 2.0 * (r + 1.0)], &device).require_grad();
    let w = Tensor::<B, 1>::from_floats([r + 1.0, 1.0], &device);
    let sum = burn_ddp::all_reduce_sum_tracked(&group, x.clone()).map_err(e)?;
    println!(
        "sum {:?}",
        sum.to_data()
            .to_vec::<f32>()
            .map_err(|e| format!("{e:?}"))?
    );
    let grads = (sum * w).sum().backward();
    let grad = x.grad(&grads).ok_or("x has no gradient")?;
    println!(
        "grad {:?}",
        grad.to_data()
            .to_vec::<f32>()
            .map_err(|e| format!("{e:?}"))?
    );
    // Without gradients, the same sum.
    let plain = Tensor::<B, 1>::from_floats([r + 1.0, 2.0 * (r + 1.0)], &device);
    let sum = burn_ddp::all_reduce_sum_tracked(&group, plain).map_err(e)?;
    println!(
        "untracked {:?}",
        sum.to_data()
            .to_vec::<f32>()
            .map_err(|e| format!("{e:?}"))?
    );
    burn_ddp::destroy_process_group().map_err(e)
}
