//! f16, bf16 (and f64) on the host path (Flex tensors): collectives on
//! tensors and `sync_gradients` of a model trained in half precision (the
//! Burn 0.21 test's checks, in Burn 0.22's API).

use burn::module::{Module, ModuleMapper, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Device, Tensor, TensorData};
use burn_ddp_22::ReduceOp;

type Res<T> = Result<T, String>;

fn e<E: std::fmt::Display>(err: E) -> String {
    err.to_string()
}

/// `[2, 3]` of (rank + 1) * (index + 1) in `dtype`: small integers, exact in
/// both half formats.
fn mine(rank: usize, dtype: DType) -> Tensor<2> {
    let values: Vec<f32> = (1..=6).map(|i| ((rank + 1) * i) as f32).collect();
    Tensor::<2>::from_data(TensorData::new(values, [2, 3]), &Device::flex()).cast(dtype)
}

fn as_f32(t: Tensor<2>) -> Vec<f32> {
    t.cast(DType::F32).into_data().try_to_vec::<f32>().unwrap()
}

/// Every float parameter cast to `dtype` (a model trained in half precision).
struct Cast(DType);

impl ModuleMapper for Cast {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, tensor.cast(self.0).detach().require_grad(), mapper)
    }
}

pub fn run() -> Res<()> {
    let group = burn_ddp_22::init_process_group().map_err(e)?;
    let (rank, n) = (group.rank(), group.world_size());
    let total: f32 = (1..=n).map(|r| r as f32).sum();
    // f64 too: a host round trip must keep every tensor's own type.
    for dtype in [DType::F16, DType::BF16, DType::F64] {
        let sum = burn_ddp_22::all_reduce(&group, mine(rank, dtype), ReduceOp::Sum).map_err(e)?;
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
        let gathered = burn_ddp_22::all_gather(&group, mine(rank, dtype)).map_err(e)?;
        for (r, t) in gathered.into_iter().enumerate() {
            if as_f32(t) != as_f32(mine(r, DType::F32)) {
                return Err(format!("{dtype:?} all_gather: rank {r}'s part differs"));
            }
        }
        let sent = burn_ddp_22::broadcast(&group, mine(rank, dtype), 0).map_err(e)?;
        if as_f32(sent) != as_f32(mine(0, DType::F32)) {
            return Err(format!("{dtype:?} broadcast differs from rank 0's"));
        }

        // sync_gradients averages half-precision gradients: compare with the
        // mean of every rank's local gradient, gathered in f32.
        let device = Device::flex().autodiff();
        let model: Linear = LinearConfig::new(4, 3).init(&device);
        let model = burn_ddp_22::wrap(model.map(&mut Cast(dtype)), &group).map_err(e)?;
        let x = Tensor::<2>::from_data(
            TensorData::new((0..8).map(|i| (i + rank) as f32 / 8.0).collect(), [2, 4]),
            &device,
        )
        .cast(dtype);
        let grads = || {
            let loss = model.forward(x.clone()).powi_scalar(2).mean();
            GradientsParams::from_grads(loss.backward(), &model)
        };
        let local = grads()
            .get::<2>(model.weight.id)
            .ok_or("no local gradient")?;
        let averaged = burn_ddp_22::sync_gradients(&model, grads())
            .map_err(e)?
            .get::<2>(model.weight.id)
            .ok_or("no averaged gradient")?;
        if averaged.dtype() != dtype {
            return Err(format!(
                "{dtype:?} gradient came back as {:?}",
                averaged.dtype()
            ));
        }
        let locals = burn_ddp_22::all_gather(&group, local.cast(DType::F32)).map_err(e)?;
        let mut want = vec![0f32; 12];
        for t in locals {
            for (w, v) in want
                .iter_mut()
                .zip(t.into_data().try_to_vec::<f32>().unwrap())
            {
                *w += v / n as f32;
            }
        }
        let got = averaged
            .cast(DType::F32)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
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
    burn_ddp_22::destroy_process_group().map_err(e)
}
