//! Which device buffers NCCL may be handed: it reads and writes `numel`
//! elements packed from the buffer's start, while cubecl's allocator may pad
//! every row of a tensor of rank 2 or more to an aligned pitch (its
//! `Optimized` strategy, used by `empty_device_dtype` and by kernels' outputs).
//! A tensor is safe for NCCL only if its strides are the packed row-major ones.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

/// The row-major strides of a packed tensor of `shape`.
pub(crate) fn packed_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// Whether `strides` lay `shape` out packed, row after row with no gap (a
/// dimension of size 1 may have any stride: it is never stepped over).
pub(crate) fn is_packed(shape: &[usize], strides: &[usize]) -> bool {
    shape.len() == strides.len()
        && (shape.iter().product::<usize>() == 0
            || shape
                .iter()
                .zip(strides)
                .zip(packed_strides(shape))
                .all(|((&dim, &stride), packed)| dim == 1 || stride == packed))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cubecl's pitched layout, as `PitchedMemoryLayoutPolicy` computes it for
    /// the `Optimized` strategy: rows padded to the next power of two of their
    /// byte width, at least 16 and at most the buffer alignment.
    fn pitched_strides(shape: &[usize], elem_size: usize, buffer_align: usize) -> Vec<usize> {
        let rank = shape.len();
        let width = *shape.last().unwrap_or(&1);
        let align = if width == 1 {
            elem_size
        } else {
            (width * elem_size)
                .next_power_of_two()
                .clamp(16, buffer_align)
        };
        let pitch = (width * elem_size).next_multiple_of(align);
        let mut strides = vec![1; rank];
        if rank > 1 {
            strides[rank - 2] = pitch / elem_size;
        }
        for i in (0..rank.saturating_sub(2)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        strides
    }

    #[test]
    fn packed_strides_are_row_major() {
        assert_eq!(packed_strides(&[2, 3, 5]), [15, 5, 1]);
        assert_eq!(packed_strides(&[7]), [1]);
        assert!(packed_strides(&[]).is_empty());
    }

    #[test]
    fn pitched_rows_are_not_packed_unless_the_width_fills_the_pitch() {
        // The MNIST CNN's shapes and a bucket of rank-2 gradients.
        for (shape, packed) in [
            (vec![10usize, 500], false), // 2000 bytes pitched to 2048
            (vec![32, 1, 5, 5], false),  // 20-byte rows pitched to 32
            (vec![3, 10], false),
            (vec![4, 16], true), // 64-byte rows are already aligned
            (vec![100], true),   // rank 1 is never pitched
            (vec![5, 1], true),  // one column: element-aligned
        ] {
            let strides = pitched_strides(&shape, 4, 256);
            assert_eq!(is_packed(&shape, &strides), packed, "{shape:?} {strides:?}");
            assert!(is_packed(&shape, &packed_strides(&shape)));
        }
    }

    #[test]
    fn transposes_and_slices_are_not_packed_and_unit_dims_do_not_matter() {
        // A transposed [3, 4]: shape [4, 3], strides [1, 4].
        assert!(!is_packed(&[4, 3], &[1, 4]));
        // Rows 1..3 of a [4, 8] keep the parent's strides: packed layout,
        // (the offset is the handle's business, not the strides').
        assert!(is_packed(&[2, 8], &[8, 1]));
        // Columns 0..4 of a [4, 8]: rows are 8 apart, 4 wide.
        assert!(!is_packed(&[4, 4], &[8, 1]));
        assert!(is_packed(&[1, 6], &[999, 1]));
        assert!(is_packed(&[0, 6], &[7, 1]));
        assert!(!is_packed(&[2, 3], &[3]));
    }
}
