//! Collectives on Burn 0.22 tensors, mirroring `torch.distributed`'s: the
//! tensor's data goes through the group's host collectives as bytes
//! (`into_data`, the host transports, `from_data`). Float and int tensors of
//! f32, f64, f16, bf16, i32 and i64 elements are supported (f16 and bf16
//! combine in f32 and round once per step, as NCCL's half reductions do).

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

    /// The bytes and their wire type, or the error naming the rank and type
    /// (or `BURN_DDP_BACKEND=nccl`, which this crate cannot honour yet).
    fn bytes(
        &mut self,
        group: &ProcessGroup,
        what: &str,
    ) -> Result<(burn_ddp_comm::DType, &mut [u8])> {
        if group.device_backend() == burn_ddp_comm::CollectiveBackend::Nccl {
            return Err(group.nccl_refused(crate::sync::NO_NCCL_YET));
        }
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
    dims[0] /= group.world_size();
    let mut host = Host::of(tensor);
    let (wire, bytes) = host.bytes(group, "reduce_scatter")?;
    let part = group.reduce_scatter_bytes(wire, bytes, op)?;
    let data = TensorData::from_bytes_vec(part, Shape::from(dims.to_vec()), host.data.dtype());
    Ok(Host::tensor(data, &host.device))
}
