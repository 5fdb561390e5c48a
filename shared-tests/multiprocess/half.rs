//! f16, bf16 (and f64) on the host path (Flex tensors): collectives on
//! tensors and the averaged gradients of a model trained in half precision.

use super::contract::DdpModel;
use super::{e, Res};
use crate::shim::ddp::collective::ReduceOp;
use crate::shim::{self, ddp, HalfTensor};
use burn::nn::LinearConfig;
use burn::tensor::{DType, TensorData};

/// `[2, 3]` of (rank + 1) * (index + 1) in `dtype`: small integers, exact in
/// both half formats.
fn mine(rank: usize, dtype: DType) -> HalfTensor<2> {
    let values: Vec<f32> = (1..=6).map(|i| ((rank + 1) * i) as f32).collect();
    HalfTensor::<2>::from_data(TensorData::new(values, [2, 3]), &shim::half_device()).cast(dtype)
}

fn as_f32(t: HalfTensor<2>) -> Vec<f32> {
    shim::floats(t.cast(DType::F32).into_data())
}

pub fn run() -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let (rank, n) = (group.rank(), group.world_size());
    let total: f32 = (1..=n).map(|r| r as f32).sum();
    // f64 too: a host round trip must keep every tensor's own type.
    for dtype in [DType::F16, DType::BF16, DType::F64] {
        let sum =
            ddp::collective::all_reduce(&group, mine(rank, dtype), ReduceOp::Sum).map_err(e)?;
        if sum.dtype() != dtype {
            return Err(format!("{dtype:?} sum came back as {:?}", sum.dtype()));
        }
        let want: Vec<f32> = as_f32(mine(0, DType::F32))
            .iter()
            .map(|v| v * total)
            .collect();
        if as_f32(sum) != want {
            return Err(format!("{dtype:?} sum differs from {want:?}"));
        }
        let gathered = ddp::collective::all_gather(&group, mine(rank, dtype)).map_err(e)?;
        for (r, t) in gathered.into_iter().enumerate() {
            if as_f32(t) != as_f32(mine(r, DType::F32)) {
                return Err(format!("{dtype:?} all_gather: rank {r}'s part differs"));
            }
        }
        let sent = ddp::collective::broadcast(&group, mine(rank, dtype), 0).map_err(e)?;
        if as_f32(sent) != as_f32(mine(0, DType::F32)) {
            return Err(format!("{dtype:?} broadcast differs from rank 0's"));
        }

        // Half-precision gradients averaged over the ranks: compare with the
        // mean of every rank's local gradient, gathered in f32.
        let device = shim::half_training_device();
        let model: shim::HalfLinear = LinearConfig::new(4, 3).init(&device);
        let model = shim::cast_params(model, dtype).wrap(&group)?;
        let x = shim::HalfTrainedTensor::<2>::from_data(
            TensorData::new((0..8).map(|i| (i + rank) as f32 / 8.0).collect(), [2, 4]),
            &device,
        )
        .cast(dtype);
        let loss = || model.forward(x.clone()).powi_scalar(2).mean();
        let local =
            shim::grad_of(&model.local_grads(loss()), &model.weight).ok_or("no local gradient")?;
        let averaged = shim::grad_of(&model.synced_grads(loss())?, &model.weight)
            .ok_or("no averaged gradient")?;
        if averaged.dtype() != dtype {
            return Err(format!(
                "{dtype:?} gradient came back as {:?}",
                averaged.dtype()
            ));
        }
        let locals = ddp::collective::all_gather(&group, local.cast(DType::F32)).map_err(e)?;
        let mut want = vec![0f32; 12];
        for t in locals {
            for (w, v) in want.iter_mut().zip(shim::floats(t.into_data())) {
                *w += v / n as f32;
            }
        }
        let got = shim::floats(averaged.cast(DType::F32).into_data());
        // One rounding per reduction step in half precision.
        let tolerance = match dtype {
            DType::F16 => 2e-3,
            DType::BF16 => 2e-2,
            _ => 1e-6,
        };
        for (g, w) in got.iter().zip(&want) {
            if (g - w).abs() > tolerance * w.abs().max(1.0) {
                return Err(format!(
                    "{dtype:?} averaged gradient {got:?}, want {want:?}"
                ));
            }
        }
    }
    println!("done yes");
    ddp::destroy_process_group().map_err(e)
}
