//! Per-rank figures summed over the group (correct predictions, items seen,
//! a summed loss), exact for integers.

use burn_ddp_comm::ProcessGroup;
use burn_ddp_comm::ReduceOp;
use burn_ddp_comm::Result;

/// A number [`sum_over_ranks`] adds up: integer counts travel as `i64` (exact),
/// floats as `f64`.
pub trait RankSum: Copy {
    /// The type it is summed in.
    type Wire: burn_ddp_comm::Element;
    /// Into the summed type.
    fn to_wire(self) -> Self::Wire;
    /// Back from it.
    fn from_wire(wire: Self::Wire) -> Self;
}

macro_rules! rank_sum {
    ($wire:ty: $($ty:ty),*) => {$(
        impl RankSum for $ty {
            type Wire = $wire;
            fn to_wire(self) -> $wire {
                self as $wire
            }
            fn from_wire(wire: $wire) -> Self {
                wire as $ty
            }
        }
    )*};
}

rank_sum!(i64: usize, u32, u64, i32, i64);
rank_sum!(f64: f32, f64);

/// Sums per-rank figures (correct predictions, items seen, a summed loss) over
/// all ranks; every rank gets the totals. Integers (`usize`, `u64`, `i64`,
/// ...) are summed exactly, floats in `f64`; all values of one call have one
/// type.
///
/// ```no_run
/// # fn main() -> burn_ddp_comm::Result<()> {
/// let group = burn_ddp_comm::ProcessGroup::from_env()?;
/// let (correct, seen): (usize, usize) = (97, 100); // this rank's evaluation shard
/// let [correct, seen] = burn_ddp_training::sum::sum_over_ranks(&group, [correct, seen])?;
/// if group.is_main() {
///     println!("accuracy {:.2}%", 100.0 * correct as f64 / seen as f64);
/// }
/// # Ok(())
/// # }
/// ```
pub fn sum_over_ranks<T: RankSum, const N: usize>(
    group: &ProcessGroup,
    values: [T; N],
) -> Result<[T; N]> {
    let mut wire = values.map(RankSum::to_wire);
    group.all_reduce(&mut wire, ReduceOp::Sum)?;
    Ok(wire.map(RankSum::from_wire))
}
