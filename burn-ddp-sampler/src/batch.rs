//! The per-rank batch size for a global one.
//!
//! Under data parallelism every rank's loader takes its own batch, so the
//! optimizer step sees `world_size` times the batch a loader is given. A program
//! that states the batch one process would train with splits it here, and a
//! split that would silently shrink the global batch (64 over 3 ranks is 21
//! each, 63 in all) is refused instead.

use std::fmt;

/// Why a global batch cannot be split evenly.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BatchSplitError {
    /// The global batch or the world size is zero.
    Zero {
        /// The global batch asked for.
        global_batch: usize,
        /// The number of ranks.
        world_size: usize,
    },
    /// The global batch is not a multiple of the world size.
    Indivisible {
        /// The global batch asked for.
        global_batch: usize,
        /// The number of ranks.
        world_size: usize,
    },
}

impl fmt::Display for BatchSplitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            BatchSplitError::Zero {
                global_batch,
                world_size,
            } => write!(
                f,
                "cannot split a global batch of {global_batch} over {world_size} rank(s): both \
                 must be at least 1"
            ),
            BatchSplitError::Indivisible {
                global_batch,
                world_size,
            } => {
                let below = global_batch / world_size * world_size;
                let above = below + world_size;
                let choices = if below == 0 {
                    format!("{above}")
                } else {
                    format!("{below} or {above}")
                };
                write!(
                    f,
                    "a global batch of {global_batch} does not divide over {world_size} ranks \
                     (each rank's loader takes the same batch, so {global_batch} would train \
                     with {below}): choose a multiple of {world_size} such as {choices}, or give \
                     the loaders a per-rank batch size yourself"
                )
            }
        }
    }
}

impl std::error::Error for BatchSplitError {}

/// Each rank's batch size so that the ranks together train with
/// `global_batch` items per optimizer step.
///
/// ```
/// use burn_ddp_sampler::split_global_batch;
/// assert_eq!(split_global_batch(128, 2), Ok(64));
/// assert!(split_global_batch(64, 3).unwrap_err().to_string().contains("63 or 66"));
/// ```
pub fn split_global_batch(
    global_batch: usize,
    world_size: usize,
) -> Result<usize, BatchSplitError> {
    if global_batch == 0 || world_size == 0 {
        return Err(BatchSplitError::Zero {
            global_batch,
            world_size,
        });
    }
    if !global_batch.is_multiple_of(world_size) {
        return Err(BatchSplitError::Indivisible {
            global_batch,
            world_size,
        });
    }
    Ok(global_batch / world_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divides_exactly_or_names_the_nearest_multiples() {
        assert_eq!(split_global_batch(64, 1), Ok(64));
        assert_eq!(split_global_batch(128, 4), Ok(32));
        assert_eq!(split_global_batch(3, 3), Ok(1));
        let message = split_global_batch(64, 3).unwrap_err().to_string();
        assert_eq!(
            message,
            "a global batch of 64 does not divide over 3 ranks (each rank's loader takes the \
             same batch, so 64 would train with 63): choose a multiple of 3 such as 63 or 66, or \
             give the loaders a per-rank batch size yourself"
        );
        let message = split_global_batch(2, 4).unwrap_err().to_string();
        assert!(message.contains("such as 4,"), "{message}");
        assert!(message.contains("would train with 0"), "{message}");
    }

    #[test]
    fn refuses_zero() {
        assert_eq!(
            split_global_batch(0, 2),
            Err(BatchSplitError::Zero {
                global_batch: 0,
                world_size: 2
            })
        );
        assert!(split_global_batch(8, 0)
            .unwrap_err()
            .to_string()
            .contains("at least 1"));
    }
}
