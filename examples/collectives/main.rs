//! Port of `collectives_lab.py`: the four collectives DDP is built from.
//!
//! ```text
//! cargo run --example collectives                       # one process
//! burn-ddp-run --standalone --nproc-per-node 4 target/debug/examples/collectives
//! ```
//!
//! Each rank prints, as the Python script does, `<rank> <collective> <result>`.

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor};
use burn_ddp::collective::ReduceOp;

type B = NdArray;

/// No flags: `--help` and `--version` only.
#[derive(clap::Parser)]
#[command(
    name = "collectives",
    version,
    about = "All-reduce, broadcast, all-gather and reduce-scatter on every rank, as collectives_lab.py."
)]
struct Args {}

fn main() {
    let _: Args = clap::Parser::parse();
    if let Err(err) = run() {
        eprintln!("error: {err}");
        std::process::exit(1);
    }
}

fn run() -> burn_ddp::Result<()> {
    let group = burn_ddp::init_process_group()?;
    let rank = group.rank();
    let world_size = group.world_size();
    let device = Default::default();

    // 1. AllReduce: every rank ends with 0 + 1 + ... + (world_size - 1).
    let x = Tensor::<B, 1>::from_floats([rank as f32], &device);
    let x = burn_ddp::collective::all_reduce(&group, x, ReduceOp::Sum)?;
    println!("{rank} all_reduce {:?}", x.into_scalar());

    // 2. AllGather: every rank collects every rank's value.
    let y = Tensor::<B, 1, Int>::from_ints([rank as i64], &device);
    let gathered = burn_ddp::collective::all_gather(&group, y)?;
    let values: Vec<i64> = gathered.into_iter().map(|t| t.into_scalar()).collect();
    println!("{rank} all_gather {values:?}");

    // 3. Broadcast: rank 0's 2026 reaches everyone.
    let z = Tensor::<B, 1, Int>::from_ints([if rank == 0 { 2026 } else { -1 }], &device);
    let z = burn_ddp::collective::broadcast(&group, z, 0)?;
    println!("{rank} broadcast {}", z.into_scalar());

    // 4. ReduceScatter: every rank gets one reduced block.
    let input = Tensor::<B, 1, Int>::arange(0..(world_size * 2) as i64, &device)
        .float()
        .add_scalar(rank as f32 * 100.0);
    let out = burn_ddp::collective::reduce_scatter(&group, input, ReduceOp::Sum)?;
    println!(
        "{rank} reduce_scatter {:?}",
        out.into_data().to_vec::<f32>().unwrap()
    );

    burn_ddp::destroy_process_group()
}
