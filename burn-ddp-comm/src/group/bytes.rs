//! The collectives on host bytes of an element type known only at run time: a
//! front-end's tensor data (`TensorData`'s bytes), whatever its framework
//! version, goes through these, so no front-end keeps a table of element
//! types beside the one in [`DType`].

use super::ProcessGroup;
use crate::element::{BufferMut, DType, Element, ReduceOp};
use crate::error::{CommError, Result};

/// Runs `$body` with `$T` bound to the element type of `$dtype`.
macro_rules! with_element_type {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
            DType::F16 => {
                type $T = half::f16;
                $body
            }
            DType::BF16 => {
                type $T = half::bf16;
                $body
            }
        }
    };
}

impl ProcessGroup {
    fn elements<'a, T: Element>(&self, bytes: &'a [u8]) -> Result<&'a [T]> {
        bytemuck::try_cast_slice(bytes).map_err(|err| self.not_elements::<T>(bytes.len(), err))
    }

    fn elements_mut<'a, T: Element>(&self, bytes: &'a mut [u8]) -> Result<&'a mut [T]> {
        let len = bytes.len();
        bytemuck::try_cast_slice_mut(bytes).map_err(|err| self.not_elements::<T>(len, err))
    }

    fn not_elements<T: Element>(&self, len: usize, err: bytemuck::PodCastError) -> CommError {
        CommError::InvalidArgument {
            rank: self.rank(),
            message: format!(
                "{len} bytes are not a whole number of aligned {:?} elements ({err:?})",
                T::DTYPE
            ),
        }
    }

    /// [`all_reduce`](Self::all_reduce) of `bytes` holding `dtype` elements.
    pub fn all_reduce_bytes(&self, dtype: DType, bytes: &mut [u8], op: ReduceOp) -> Result<()> {
        let buffer =
            BufferMut::from_bytes(dtype, bytes).ok_or_else(|| CommError::InvalidArgument {
                rank: self.rank(),
                message: format!("the bytes are not a whole number of aligned {dtype:?} elements"),
            })?;
        self.all_reduce_buffer(buffer, op)
    }

    /// [`broadcast`](Self::broadcast) of `bytes` holding `dtype` elements.
    pub fn broadcast_bytes(&self, dtype: DType, bytes: &mut [u8], root: usize) -> Result<()> {
        with_element_type!(dtype, T => self.broadcast(self.elements_mut::<T>(bytes)?, root))
    }

    /// [`all_gather`](Self::all_gather) of `bytes` holding `dtype` elements:
    /// every rank's bytes, in rank order.
    pub fn all_gather_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<Vec<u8>> {
        with_element_type!(dtype, T => {
            let gathered = self.all_gather(self.elements::<T>(bytes)?)?;
            Ok(bytemuck::cast_slice(&gathered).to_vec())
        })
    }

    /// [`reduce_scatter`](Self::reduce_scatter) of `bytes` holding `dtype`
    /// elements: this rank's chunk of the reduced bytes.
    pub fn reduce_scatter_bytes(
        &self,
        dtype: DType,
        bytes: &[u8],
        op: ReduceOp,
    ) -> Result<Vec<u8>> {
        with_element_type!(dtype, T => {
            let part = self.reduce_scatter(self.elements::<T>(bytes)?, op)?;
            Ok(bytemuck::cast_slice(&part).to_vec())
        })
    }

    /// Checks that dimension 0 of `dims` splits evenly across the ranks, as
    /// `reduce_scatter` on a tensor needs; the error names the shape.
    pub fn check_scatter_dims(&self, dims: &[usize]) -> Result<()> {
        let world = self.world_size();
        match dims.first() {
            Some(rows) if rows.is_multiple_of(world) => Ok(()),
            _ => Err(CommError::InvalidArgument {
                rank: self.rank(),
                message: format!(
                    "reduce_scatter splits dimension 0 across {world} ranks, so it must be a \
                     multiple of {world}; got shape {dims:?}"
                ),
            }),
        }
    }

    /// Checks that `root` is a rank of the group.
    pub fn check_root(&self, root: usize) -> Result<()> {
        if root < self.world_size() {
            return Ok(());
        }
        Err(CommError::InvalidArgument {
            rank: self.rank(),
            message: format!(
                "broadcast from rank {root} in a world of {}",
                self.world_size()
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_of_every_type_move_as_their_elements() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        for dtype in DType::ALL {
            let mut bytes = vec![0u8; 4 * dtype.size()];
            group
                .all_reduce_bytes(dtype, &mut bytes, ReduceOp::Sum)
                .unwrap();
            group.broadcast_bytes(dtype, &mut bytes, 0).unwrap();
            assert_eq!(group.all_gather_bytes(dtype, &bytes).unwrap(), bytes);
            assert_eq!(
                group
                    .reduce_scatter_bytes(dtype, &bytes, ReduceOp::Max)
                    .unwrap(),
                bytes
            );
        }
        let mut values: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        group
            .all_reduce_bytes(DType::F32, &mut values, ReduceOp::Mean)
            .unwrap();
        assert_eq!(&values[..4], &1.5f32.to_le_bytes());
    }

    #[test]
    fn ragged_bytes_and_bad_shapes_are_named() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let err = group
            .all_gather_bytes(DType::F64, &[0u8; 12])
            .unwrap_err()
            .to_string();
        assert!(err.contains("12 bytes") && err.contains("F64"), "{err}");
        let err = group
            .broadcast_bytes(DType::I32, &mut [0u8; 4], 1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("root 1"), "{err}");
        assert!(group
            .check_root(1)
            .unwrap_err()
            .to_string()
            .contains("rank 1 in a world of 1"));
        assert!(group.check_scatter_dims(&[]).is_err());
        assert!(group.check_scatter_dims(&[3, 2]).is_ok());
    }
}
