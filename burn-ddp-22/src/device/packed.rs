//! Packed device buffers for collectives.
//!
//! NCCL reads and writes `numel` elements packed from a raw device address. A
//! cubecl tensor's buffer need not hold its values so: a slice or a transpose
//! shares its parent's buffer with the parent's strides; on CUDA cubecl's
//! allocator pads the rows of tensors of rank 2 or more to an aligned pitch
//! (`PitchedMemoryLayoutPolicy`, for every `Optimized` allocation: kernel
//! outputs, `empty_device_dtype`); and since cubecl 0.11 a tensor may be
//! storage-tiled for a matmul, its buffer ordered tile by tile (its physical
//! strides can then look packed while its values are not in row-major
//! order). The helpers here hand out buffers that hold exactly the tensor's
//! values in row-major order. Nothing here is CUDA-specific: every cubecl
//! runtime's tensor is the same `CubeTensor` in Burn 0.22.

use crate::shared::layout::is_packed;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::Shape;
use burn_cubecl::cubecl::zspace::metadata::Metadata;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

/// Whether a buffer laid out as `meta` holds its values packed, in row-major
/// order: untiled, with the packed strides.
pub(crate) fn holds_values_packed(meta: &Metadata) -> bool {
    !meta.is_tiled() && is_packed(meta.shape(), meta.strides())
}

/// Whether `tensor`'s buffer holds its values packed, in row-major order.
pub(crate) fn is_packed_tensor(tensor: &CubeTensor) -> bool {
    holds_values_packed(&tensor.meta)
}

/// A tensor with `tensor`'s values in a packed buffer, for a collective to
/// read: `tensor` itself when it already is one. (Burn 0.22's
/// `into_contiguous` untiles, and copies anything whose strides are not the
/// packed ones, pitched rows included; the check after it keeps that a
/// guarantee of this module's own, as `pin`'s does.)
pub(crate) fn readable(tensor: CubeTensor) -> CubeTensor {
    let tensor = into_contiguous(tensor);
    if is_packed_tensor(&tensor) {
        tensor
    } else {
        packed_copy(&tensor)
    }
}

/// A tensor with `tensor`'s values in a packed buffer shared with nobody, for
/// a collective to write in place: `tensor` itself when it is one, else a
/// packed copy. (Not `CubeTensor::is_contiguous_buffer`: it compares with the
/// allocation's size, rounded up to the allocator's alignment, so it is false
/// for most tensors; nor `copy()`, whose output may be pitched.)
pub(crate) fn writable(tensor: CubeTensor) -> CubeTensor {
    let tensor = into_contiguous(tensor);
    if tensor.can_mut() && is_packed_tensor(&tensor) {
        tensor
    } else {
        packed_copy(&tensor)
    }
}

/// A copy of an untiled `tensor` in a new packed buffer (cubecl's
/// `into_contiguous` always allocates one with `client.empty` and copies,
/// strided input or not).
fn packed_copy(tensor: &CubeTensor) -> CubeTensor {
    let output = burn_cubecl::cubecl::std::tensor::into_contiguous(
        &tensor.client,
        tensor.clone().binding(),
        dtype_to_storage_type(tensor.dtype),
    );
    CubeTensor::new(
        tensor.client.clone(),
        output.handle,
        *output.metadata,
        tensor.device.clone(),
        tensor.dtype,
    )
}

/// A new uninitialised packed tensor like the untiled `like`, its first
/// dimension resized (a collective's output: `rows` gives the new number of
/// rows).
pub(crate) fn empty_packed_like(
    like: &CubeTensor,
    rows: impl FnOnce(usize) -> usize,
) -> CubeTensor {
    let mut dims = like.meta.shape().to_vec();
    dims[0] = rows(dims[0]);
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::from(dims),
        like.dtype,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::layout::packed_strides;
    use burn_cubecl::cubecl::zspace::Tiling;

    fn meta(shape: &[usize], strides: &[usize]) -> Metadata {
        Metadata::new(shape.to_vec(), strides.to_vec())
    }

    #[test]
    fn only_untiled_row_major_buffers_hold_their_values_packed() {
        assert!(holds_values_packed(&meta(
            &[4, 6],
            &packed_strides(&[4, 6])
        )));
        assert!(holds_values_packed(&meta(&[100], &[1])));
        // CUDA's pitched rows: 10 floats padded to 128 (512 bytes).
        assert!(!holds_values_packed(&meta(&[3, 10], &[128, 1])));
        // A transpose.
        assert!(!holds_values_packed(&meta(&[5, 3], &[1, 5])));
        // A [64, 64] matrix stored as 2 x 2 tiles of 32 x 32: its physical
        // strides are packed, its values are not in row-major order.
        let physical = [2, 2, 32, 32];
        let tiled = meta(&physical, &packed_strides(&physical))
            .with_tiling(Tiling::new(&[2, 2]).unwrap())
            .unwrap();
        assert!(tiled.is_tiled());
        assert!(!holds_values_packed(&tiled));
    }
}
