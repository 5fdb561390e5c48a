//! Packed device buffers for collectives, on any cubecl runtime.
//!
//! A collective library handed a raw device address (NCCL) reads and writes
//! `numel` elements packed from that address. A cubecl tensor's buffer need
//! not hold its values so: a slice or a transpose shares its parent's buffer
//! with the parent's strides, and on CUDA and HIP cubecl's allocator pads the
//! rows of tensors of rank 2 or more to an aligned pitch
//! (`PitchedMemoryLayoutPolicy`, used for every `Optimized` allocation: kernel
//! outputs, `empty_device_dtype`). WebGPU and the CPU runtime allocate packed
//! (`ContiguousMemoryLayoutPolicy`). The helpers here hand out buffers that
//! hold exactly the tensor's values in row-major order, whatever the runtime.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use crate::shared::layout::is_packed;
use burn_backend::Shape;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;

/// Whether `tensor`'s buffer holds its values packed, in row-major order.
pub(crate) fn is_packed_tensor<R: CubeRuntime>(tensor: &CubeTensor<R>) -> bool {
    is_packed(tensor.meta.shape(), tensor.meta.strides())
}

/// A tensor with `tensor`'s values in a packed buffer, for a collective to
/// read: `tensor` itself when it already is one.
pub(crate) fn readable<R: CubeRuntime>(tensor: CubeTensor<R>) -> CubeTensor<R> {
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
pub(crate) fn writable<R: CubeRuntime>(tensor: CubeTensor<R>) -> CubeTensor<R> {
    let tensor = into_contiguous(tensor);
    if tensor.can_mut() && is_packed_tensor(&tensor) {
        tensor
    } else {
        packed_copy(&tensor)
    }
}

/// A copy of `tensor` in a new packed buffer (cubecl's `into_contiguous`
/// always allocates one with `client.empty` and copies, strided input or not).
fn packed_copy<R: CubeRuntime>(tensor: &CubeTensor<R>) -> CubeTensor<R> {
    let output = cubecl::std::tensor::into_contiguous(
        &tensor.client,
        tensor.clone().binding(),
        tensor.dtype.into(),
    );
    CubeTensor::new(
        tensor.client.clone(),
        output.handle,
        *output.metadata,
        tensor.device.clone(),
        tensor.dtype,
    )
}

/// A new uninitialised packed tensor like `like`, its first dimension resized
/// (a collective's output: `rows` gives the new number of rows).
pub(crate) fn empty_packed_like<R: CubeRuntime>(
    like: &CubeTensor<R>,
    rows: impl FnOnce(usize) -> usize,
) -> CubeTensor<R> {
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

    /// The layouts cubecl's own allocator policies give: CUDA's (pitched,
    /// with cubecl-cuda's 512-byte alignment) and WebGPU's (packed).
    mod allocator {
        use super::*;
        use cubecl::stream_id::StreamId;
        use cubecl_runtime::allocator::{ContiguousMemoryLayoutPolicy, PitchedMemoryLayoutPolicy};
        use cubecl_runtime::server::{MemoryLayoutDescriptor, MemoryLayoutPolicy};

        fn strides(
            policy: &impl MemoryLayoutPolicy,
            descriptor: MemoryLayoutDescriptor,
        ) -> Vec<usize> {
            let (_, layouts) = policy.apply(StreamId::current(), &[descriptor]);
            layouts[0].strides.to_vec()
        }

        #[test]
        fn cuda_pads_the_rows_that_webgpu_and_contiguous_requests_pack() {
            let cuda = PitchedMemoryLayoutPolicy::new(512);
            let wgpu = ContiguousMemoryLayoutPolicy::new(256);
            // The MNIST CNN's parameter shapes, a small matrix, and shapes
            // whose rows need no padding.
            for (dims, cuda_pads) in [
                (vec![10usize, 500], true), // 2000-byte rows
                (vec![32, 1, 5, 5], true),  // 20-byte rows
                (vec![64, 32, 5, 5], true),
                (vec![3, 10], true),
                (vec![4, 128], false), // 256 to 1024-byte rows: powers of two
                (vec![100], false),    // rank 1 is never pitched
                (vec![5, 1], false),   // one column: element-aligned
            ] {
                let shape = Shape::from(dims.clone());
                for elem_size in [2, 4, 8] {
                    let optimized = strides(
                        &cuda,
                        MemoryLayoutDescriptor::optimized(shape.clone(), elem_size),
                    );
                    assert_eq!(
                        !is_packed(&dims, &optimized),
                        cuda_pads,
                        "CUDA, {dims:?} x {elem_size} bytes: strides {optimized:?}"
                    );
                    // What `empty_packed_like` (and `into_contiguous`) ask for.
                    let contiguous = strides(
                        &cuda,
                        MemoryLayoutDescriptor::contiguous(shape.clone(), elem_size),
                    );
                    assert_eq!(
                        contiguous,
                        packed_strides(&dims),
                        "CUDA contiguous {dims:?}"
                    );
                    let webgpu = strides(
                        &wgpu,
                        MemoryLayoutDescriptor::optimized(shape.clone(), elem_size),
                    );
                    assert_eq!(webgpu, packed_strides(&dims), "WebGPU {dims:?}");
                }
            }
        }
    }

    /// The helpers on a real WebGPU device: the buffer a collective would be
    /// handed, read back raw, holds the tensor's values in order.
    mod webgpu {
        use super::*;
        use burn::tensor::{Tensor, TensorData, TensorPrimitive};
        use burn_cubecl::CubeBackend;
        use burn_wgpu::{WgpuDevice, WgpuRuntime};

        type Gpu = CubeBackend<WgpuRuntime, f32, i32, u32>;
        const REQUIRE: &str = "BURN_DDP_REQUIRE_VULKAN";

        /// The device, or `None` (said on stderr) where there is no Vulkan
        /// driver and CI did not ask for one.
        fn device() -> Option<WgpuDevice> {
            let drivers = ["/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d"]
                .iter()
                .filter_map(|dir| std::fs::read_dir(dir).ok())
                .flatten()
                .count();
            if drivers == 0 && std::env::var_os(REQUIRE).is_none() {
                eprintln!("skipped: no Vulkan driver ({REQUIRE}=1 requires one; Debian: mesa-vulkan-drivers)");
                return None;
            }
            Some(WgpuDevice::default())
        }

        fn values(count: usize) -> Vec<f32> {
            (0..count).map(|i| i as f32 * 0.5 - 7.0).collect()
        }

        fn tensor<const D: usize>(dims: [usize; D], device: &WgpuDevice) -> Tensor<Gpu, D> {
            let count = dims.iter().product();
            Tensor::from_data(TensorData::new(values(count), dims), device)
        }

        fn cube<const D: usize>(tensor: Tensor<Gpu, D>) -> CubeTensor<WgpuRuntime> {
            match tensor.into_primitive() {
                TensorPrimitive::Float(primitive) => primitive,
                TensorPrimitive::QFloat(_) => unreachable!("not quantized"),
            }
        }

        /// What a collective would see at the buffer's address: the first
        /// `numel` elements of the handle's bytes.
        fn raw(tensor: &CubeTensor<WgpuRuntime>) -> Vec<f32> {
            assert!(
                is_packed_tensor(tensor),
                "strides {:?}",
                tensor.meta.strides()
            );
            let bytes = tensor
                .client
                .read_one(tensor.handle.clone())
                .expect("read back");
            let numel = tensor.meta.shape().num_elements();
            assert!(
                bytes.len() >= numel * 4,
                "{} bytes for {numel} elements",
                bytes.len()
            );
            bytes[..numel * 4]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect()
        }

        fn expected<const D: usize>(tensor: Tensor<Gpu, D>) -> Vec<f32> {
            tensor.into_data().to_vec().unwrap()
        }

        #[test]
        fn buffers_for_collectives_hold_the_values_in_order() {
            let Some(device) = device() else { return };
            let all = values(4 * 6);

            // A fresh tensor: kept as it is, and the raw buffer is its values.
            let fresh = cube(tensor([4, 6], &device));
            assert_eq!(raw(&writable(fresh.clone())), all);
            assert_eq!(raw(&readable(fresh)), all);

            // Rows 1..3 and columns 1..4 (Burn 0.21's cubecl backends copy a
            // slice into a buffer of its own, so these arrive packed).
            let rows = tensor([4, 6], &device).slice([1..3, 0..6]);
            let want = expected(rows.clone());
            assert_eq!(want, all[6..18]);
            assert_eq!(raw(&writable(cube(rows.clone()))), want);
            assert_eq!(raw(&readable(cube(rows))), want);
            let columns = tensor([4, 6], &device).slice([0..4, 1..4]);
            let want: Vec<f32> = (0..4)
                .flat_map(|r| all[r * 6 + 1..r * 6 + 4].to_vec())
                .collect();
            assert_eq!(expected(columns.clone()), want);
            assert_eq!(raw(&writable(cube(columns.clone()))), want);
            assert_eq!(raw(&readable(cube(columns))), want);

            // A transpose, last dimension 3 (not a power of two).
            let transposed = tensor([3, 5], &device).transpose();
            let source = values(15);
            let want: Vec<f32> = (0..5)
                .flat_map(|c| (0..3).map(|r| source[r * 5 + c]).collect::<Vec<_>>())
                .collect();
            assert_eq!(expected(transposed.clone()), want);
            assert!(
                !is_packed_tensor(&cube(transposed.clone())),
                "a transpose is a view"
            );
            assert_eq!(raw(&writable(cube(transposed.clone()))), want);
            assert_eq!(raw(&readable(cube(transposed))), want);

            // A bucket: rank-2 gradients flattened and concatenated, as Ddp
            // packs them.
            let parts = [
                tensor([3, 10], &device),
                tensor([2, 7], &device).transpose(),
                tensor([5, 1], &device),
            ];
            let want: Vec<f32> = parts.iter().flat_map(|p| expected(p.clone())).collect();
            let bucket = Tensor::cat(parts.into_iter().map(|p| p.flatten::<1>(0, 1)).collect(), 0);
            assert_eq!(raw(&writable(cube(bucket))), want);
        }

        #[test]
        fn a_shared_tensor_is_copied_before_a_collective_writes_it() {
            let Some(device) = device() else { return };
            let original = cube(tensor([4, 6], &device));
            let shared = original.clone();
            let buffer = writable(shared);
            assert!(buffer.can_mut(), "the buffer written in place is shared");
            // Write into it in place, as NCCL would (Burn's cubecl kernels
            // write a tensor shared with nobody in place), and look at the
            // original.
            let written =
                Tensor::<Gpu, 2>::from_primitive(TensorPrimitive::Float(buffer)).add_scalar(1.0);
            let plus_one: Vec<f32> = values(24).iter().map(|v| v + 1.0).collect();
            assert_eq!(expected(written), plus_one);
            assert_eq!(
                expected(Tensor::<Gpu, 2>::from_primitive(TensorPrimitive::Float(
                    original
                ))),
                values(24)
            );

            // Shared with nobody and packed: the same buffer, no copy.
            let alone = cube(tensor([4, 6], &device));
            let handle = format!("{:?}", alone.handle);
            assert_eq!(format!("{:?}", writable(alone).handle), handle);
        }

        #[test]
        fn outputs_are_packed_and_sized_for_every_rank() {
            let Some(device) = device() else { return };
            let input = cube(tensor([3, 10], &device));
            for (world, rows) in [(1, 3), (2, 6), (3, 9)] {
                let output = empty_packed_like(&input, |r| r * world);
                assert_eq!(output.meta.shape().to_vec(), [rows, 10]);
                assert_eq!(output.meta.strides().to_vec(), packed_strides(&[rows, 10]));
                assert!(output.handle.size() as usize >= rows * 10 * 4);
            }
        }
    }
}
