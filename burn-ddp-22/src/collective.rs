//! Collectives on Burn 0.22 tensors, mirroring `torch.distributed`'s.
//!
//! CUDA tensors go over NCCL on the GPU when the group uses it (the `cuda`
//! feature, [`crate::device`]); every other tensor's data goes through the
//! group's host collectives as bytes (`into_data`, the host transports,
//! `from_data`). Float and int tensors of f32, f64, f16, bf16, i32 and i64
//! elements are supported (f16 and bf16 combine in f32 and round once per
//! step, as NCCL's half reductions do).

use crate::device::{tensor_collective, TensorOp};
use crate::{dtype, CommError, ProcessGroup, ReduceOp, Result};
use burn::tensor::{DType, Shape};
use burn::tensor::{Device, Tensor, TensorData};

/// The kinds of tensors the collectives take (float and int).
pub trait CollectiveKind: burn::tensor::kind::Basic {}
impl CollectiveKind for burn::tensor::Float {}
impl CollectiveKind for burn::tensor::Int {}

/// A tensor's data, with what is needed to make a tensor of it again.
struct Host {
    data: TensorData,
    device: Device,
}

impl Host {
    fn of<const D: usize, K: CollectiveKind>(tensor: Tensor<D, K>) -> Self {
        let device = tensor.device();
        Self {
            data: tensor.into_data(),
            device,
        }
    }

    /// The bytes and their wire type, or the error naming the rank and type.
    fn bytes(
        &mut self,
        group: &ProcessGroup,
        what: &str,
    ) -> Result<(burn_ddp_comm::DType, &mut [u8])> {
        let rank = group.rank();
        let dtype = self.data.dtype();
        dtype::wire_or_error(rank, dtype, what)?;
        dtype::bytes_mut(&mut self.data).ok_or_else(|| CommError::InvalidArgument {
            rank,
            message: format!("{what}: the tensor's data is not laid out as {dtype:?} elements"),
        })
    }

    /// A tensor of this data's own element type: `from_data` alone would take
    /// the device's default (an f16 tensor would come back as f32).
    fn tensor<const D: usize, K: CollectiveKind>(
        data: TensorData,
        device: &Device,
    ) -> Tensor<D, K> {
        let dtype: DType = data.dtype();
        Tensor::from_data(data, (device, dtype))
    }
}

/// Reduces `tensor` over all ranks; every rank gets the result (`dist.all_reduce`).
///
/// ```no_run
/// use burn::tensor::Tensor;
/// use burn_ddp_22::ReduceOp;
///
/// # fn main() -> burn_ddp_22::Result<()> {
/// let group = burn_ddp_22::init_process_group()?;
/// let loss = Tensor::<1>::from_floats([0.5], &Default::default());
/// let mean = burn_ddp_22::all_reduce(&group, loss, ReduceOp::Mean)?; // the same on every rank
/// if group.rank() == 0 {
///     println!("loss {}", mean.into_scalar::<f32>());
/// }
/// # Ok(())
/// # }
/// ```
pub fn all_reduce<const D: usize, K: CollectiveKind>(
    group: &ProcessGroup,
    tensor: Tensor<D, K>,
    op: ReduceOp,
) -> Result<Tensor<D, K>> {
    let tensor = match tensor_collective(group, tensor, TensorOp::AllReduce(op))? {
        Ok(done) => return Ok(done),
        Err(on_host) => on_host,
    };
    let mut host = Host::of(tensor);
    let (wire, bytes) = host.bytes(group, "all_reduce")?;
    group.all_reduce_bytes(wire, bytes, op)?;
    Ok(Host::tensor(host.data, &host.device))
}

/// Copies rank `root`'s `tensor` to every rank (`dist.broadcast`).
pub fn broadcast<const D: usize, K: CollectiveKind>(
    group: &ProcessGroup,
    tensor: Tensor<D, K>,
    root: usize,
) -> Result<Tensor<D, K>> {
    group.check_root(root)?;
    let tensor = match tensor_collective(group, tensor, TensorOp::Broadcast(root))? {
        Ok(done) => return Ok(done),
        Err(on_host) => on_host,
    };
    let mut host = Host::of(tensor);
    let (wire, bytes) = host.bytes(group, "broadcast")?;
    group.broadcast_bytes(wire, bytes, root)?;
    Ok(Host::tensor(host.data, &host.device))
}

/// Every rank's `tensor`, in rank order (`dist.all_gather`). All ranks must
/// pass tensors of the same shape.
pub fn all_gather<const D: usize, K: CollectiveKind>(
    group: &ProcessGroup,
    tensor: Tensor<D, K>,
) -> Result<Vec<Tensor<D, K>>> {
    let rows = tensor.dims().first().copied().unwrap_or(1);
    let tensor = match tensor_collective(group, tensor, TensorOp::AllGather)? {
        Ok(gathered) => return Ok(split_rows(gathered, group.world_size(), rows)),
        Err(on_host) => on_host,
    };
    let shape = tensor.shape();
    let mut host = Host::of(tensor);
    let (wire, bytes) = host.bytes(group, "all_gather")?;
    let gathered = group.all_gather_bytes(wire, bytes)?;
    let dtype = host.data.dtype();
    let per_rank = gathered.len() / group.world_size();
    Ok((0..group.world_size())
        .map(|r| {
            let part = gathered[r * per_rank..(r + 1) * per_rank].to_vec();
            let data = TensorData::from_bytes_vec(part, shape.clone(), dtype);
            Host::tensor(data, &host.device)
        })
        .collect())
}

/// The ranks' tensors, `rows` each, side by side along dimension 0 of
/// `gathered` (what the device all-gather writes), one by one.
fn split_rows<const D: usize, K: CollectiveKind>(
    gathered: Tensor<D, K>,
    world: usize,
    rows: usize,
) -> Vec<Tensor<D, K>> {
    (0..world)
        .map(|r| gathered.clone().narrow(0, r * rows, rows))
        .collect()
}

/// Reduces `tensor` over all ranks and returns this rank's slice of the
/// result along dimension 0 (`dist.reduce_scatter_tensor`). Dimension 0 must
/// be a multiple of the world size.
pub fn reduce_scatter<const D: usize, K: CollectiveKind>(
    group: &ProcessGroup,
    tensor: Tensor<D, K>,
    op: ReduceOp,
) -> Result<Tensor<D, K>> {
    let mut dims = tensor.dims();
    group.check_scatter_dims(&dims)?;
    let tensor = match tensor_collective(group, tensor, TensorOp::ReduceScatter(op))? {
        Ok(part) => return Ok(part),
        Err(on_host) => on_host,
    };
    dims[0] /= group.world_size();
    let mut host = Host::of(tensor);
    let (wire, bytes) = host.bytes(group, "reduce_scatter")?;
    let part = group.reduce_scatter_bytes(wire, bytes, op)?;
    let data = TensorData::from_bytes_vec(part, Shape::from(dims.to_vec()), host.data.dtype());
    Ok(Host::tensor(data, &host.device))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Int;

    fn group(backend: burn_ddp_comm::CollectiveBackend) -> ProcessGroup {
        ProcessGroup::builder(0, 1)
            .device_backend(backend)
            .build()
            .unwrap()
    }

    #[test]
    fn cpu_tensors_take_the_host_path_unless_nccl_is_forced() {
        use burn_ddp_comm::CollectiveBackend;
        let ones = || Tensor::<1>::ones([3], &Device::flex());
        for backend in [CollectiveBackend::Auto, CollectiveBackend::Host] {
            let sum = all_reduce(&group(backend), ones(), ReduceOp::Sum).unwrap();
            assert_eq!(sum.into_data().try_to_vec::<f32>().unwrap(), [1.0; 3]);
        }
        let err = all_reduce(&group(CollectiveBackend::Nccl), ones(), ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        let why = if cfg!(feature = "cuda") {
            "this tensor is on Device<Flex"
        } else {
            "burn-ddp-22 was built without its `cuda` feature"
        };
        assert!(
            err.contains(&format!("rank 0: BURN_DDP_BACKEND=nccl, but {why}")),
            "{err}"
        );
    }

    #[test]
    fn a_device_gather_is_split_into_each_ranks_rows() {
        let device = Device::flex();
        let gathered = Tensor::<1, Int>::arange(0..12, &device).reshape([6, 2]);
        let parts = split_rows(gathered, 3, 2);
        let values: Vec<Vec<i64>> = parts
            .into_iter()
            .map(|part| {
                assert_eq!(part.dims(), [2, 2]);
                part.into_data().convert::<i64>().try_to_vec().unwrap()
            })
            .collect();
        assert_eq!(values, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]);
    }
}
