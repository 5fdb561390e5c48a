//! The tensor collectives on float and int tensors of rank 2, each against
//! its closed form; empty tensors, f64, a bad root and a refused element type.

use super::{e, Res};
use crate::shim::ddp::collective::ReduceOp;
use crate::shim::{self, ddp, Tensor};
use burn::tensor::{DType, Int, TensorData};

pub fn run() -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let (rank, n) = (group.rank(), group.world_size());
    let device = shim::host_device();
    let same = |what: &str, got: TensorData, want: TensorData| {
        if got == want {
            Ok(())
        } else {
            Err(format!("{what}: got {got:?}, want {want:?}"))
        }
    };

    // A [2, 3] float tensor: value (rank + 1) * (index + 1).
    let mine = |r: usize| {
        Tensor::<1, Int>::arange(1..7, &device)
            .float()
            .mul_scalar((r + 1) as f32)
            .reshape([2, 3])
    };
    let total: f32 = (1..=n).map(|r| r as f32).sum();
    let sum = ddp::collective::all_reduce(&group, mine(rank), ReduceOp::Sum).map_err(e)?;
    same(
        "sum",
        sum.into_data(),
        mine(0).mul_scalar(total).into_data(),
    )?;
    let mean = ddp::collective::all_reduce(&group, mine(rank), ReduceOp::Mean).map_err(e)?;
    mean.into_data().assert_approx_eq::<f32>(
        &mine(0).mul_scalar(total / n as f32).into_data(),
        Default::default(),
    );
    let max = ddp::collective::all_reduce(&group, mine(rank), ReduceOp::Max).map_err(e)?;
    same("max", max.into_data(), mine(n - 1).into_data())?;

    let ints = Tensor::<2, Int>::from_ints([[rank as i64, -(rank as i64)]], &device);
    let gathered = ddp::collective::all_gather(&group, ints).map_err(e)?;
    if gathered.len() != n {
        return Err(format!("all_gather returned {} tensors", gathered.len()));
    }
    for (r, t) in gathered.into_iter().enumerate() {
        let want = Tensor::<2, Int>::from_ints([[r as i64, -(r as i64)]], &device);
        same("all_gather", t.into_data(), want.into_data())?;
    }

    // An empty tensor gathers as one empty tensor per rank.
    let empty = ddp::collective::all_gather(&group, Tensor::<1>::zeros([0], &device)).map_err(e)?;
    if empty.len() != n || empty.iter().any(|t| t.dims() != [0]) {
        return Err(format!(
            "all_gather of empty tensors gave {} tensors",
            empty.len()
        ));
    }

    let root = n - 1;
    let value = if rank == root {
        mine(7)
    } else {
        mine(rank).zeros_like()
    };
    let got = ddp::collective::broadcast(&group, value, root).map_err(e)?;
    same("broadcast", got.into_data(), mine(7).into_data())?;

    // [2n, 3] split along dim 0: rank r gets rows 2r..2r+2 summed over ranks.
    let rows = Tensor::<1, Int>::arange(0..(6 * n) as i64, &device)
        .float()
        .reshape([2 * n, 3]);
    let scattered = ddp::collective::reduce_scatter(
        &group,
        rows.clone().add_scalar(rank as f32),
        ReduceOp::Sum,
    )
    .map_err(e)?;
    let offset: f32 = (0..n).map(|r| r as f32).sum();
    let want = rows
        .slice(2 * rank..2 * rank + 2)
        .mul_scalar(n as f32)
        .add_scalar(offset);
    same("reduce_scatter", scattered.into_data(), want.into_data())?;

    // f64 keeps its type through the host round trip.
    let wide = TensorData::new(vec![rank as f64 + 0.5], [1]);
    let wide = Tensor::<1>::from_data(wide, (&device, DType::F64));
    let wide = ddp::collective::all_reduce(&group, wide, ReduceOp::Sum).map_err(e)?;
    let want: f64 = (0..n).map(|r| r as f64 + 0.5).sum();
    same(
        "f64 sum",
        wide.into_data(),
        TensorData::new(vec![want], [1]),
    )?;

    if n > 1 {
        let odd = Tensor::<2>::zeros([2 * n + 1, 1], &device);
        let err = ddp::collective::reduce_scatter(&group, odd, ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        if !err.contains("multiple of") {
            return Err(format!("bad reduce_scatter error: {err}"));
        }
        let err = ddp::collective::broadcast(&group, mine(0), n)
            .unwrap_err()
            .to_string();
        if !err.contains(&format!("broadcast from rank {n} in a world of {n}")) {
            return Err(format!("bad broadcast error: {err}"));
        }
    }
    let bytes = TensorData::new(vec![1u8, 2], [2]);
    let bytes = Tensor::<1, Int>::from_data(bytes, (&device, DType::U8));
    match ddp::collective::all_reduce(&group, bytes, ReduceOp::Sum) {
        Err(err) if err.to_string().contains("not U8") => {}
        other => return Err(format!("a u8 tensor should be refused: {other:?}")),
    }
    ddp::destroy_process_group().map_err(e)?;
    println!("done yes");
    Ok(())
}
