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

    /// Every rank's `bytes` (any length, any contents: a serialised record)
    /// on rank `root`, in rank order; `None` on the other ranks. Collective.
    ///
    /// One small all-gather of the lengths, then each rank's bytes broadcast
    /// in turn (the other ranks receive and drop them: a rank holds one
    /// part at a time beside its own).
    pub fn gather_bytes(&self, root: usize, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        self.check_root(root)?;
        let lengths = self.all_gather(&[bytes.len() as i64])?;
        let mut parts = Vec::with_capacity(lengths.len());
        for (sender, &len) in lengths.iter().enumerate() {
            let len = len as usize;
            let mut words = vec![0i64; len.div_ceil(8)];
            let raw: &mut [u8] = bytemuck::cast_slice_mut(&mut words);
            if sender == self.rank() {
                raw[..len].copy_from_slice(bytes);
            }
            // The root has its own; everyone takes part in the others'.
            if sender != root && len > 0 {
                self.broadcast(&mut words, sender)?;
            }
            if self.rank() == root {
                let raw: &[u8] = bytemuck::cast_slice(&words);
                parts.push(raw[..len].to_vec());
            }
        }
        Ok((self.rank() == root).then_some(parts))
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
    fn a_world_of_one_gathers_its_own_bytes_whatever_their_length() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        for bytes in [&[][..], &[7u8][..], &[1, 2, 3, 4, 5, 6, 7, 8, 9][..]] {
            assert_eq!(
                group.gather_bytes(0, bytes).unwrap(),
                Some(vec![bytes.to_vec()])
            );
        }
        assert!(group.gather_bytes(1, &[1]).is_err());
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
