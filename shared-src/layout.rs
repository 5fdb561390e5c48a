//! Which device buffers NCCL may be handed: it reads and writes `numel`
//! elements packed from the buffer's start, while cubecl's allocator may pad
//! every row of a tensor of rank 2 or more to an aligned pitch (on CUDA and
//! HIP, for its `Optimized` strategy: `empty_device_dtype`, kernels' outputs;
//! each front-end tests this against its cubecl's own policies). A tensor is
//! safe for NCCL only if its strides are the packed row-major ones. Both Burn
//! front-ends' device code asks here.

/// The row-major strides of a packed tensor of `shape`.
pub fn packed_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// Whether `strides` lay `shape` out packed, row after row with no gap (a
/// dimension of size 1 may have any stride: it is never stepped over).
pub fn is_packed(shape: &[usize], strides: &[usize]) -> bool {
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

    #[test]
    fn packed_strides_are_row_major() {
        assert_eq!(packed_strides(&[2, 3, 5]), [15, 5, 1]);
        assert_eq!(packed_strides(&[7]), [1]);
        assert!(packed_strides(&[]).is_empty());
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
