//! Collectives on Burn tensors, mirroring `torch.distributed`'s: the device
//! path first (CUDA tensors over NCCL, when the group uses it), else a host
//! round trip (`into_data`, the group's host collectives on the bytes,
//! `from_data`). Float and int tensors of f32, f64, f16, bf16, i32 and i64
//! elements are supported (f16 and bf16 combine in f32 and round once per
//! step, as NCCL's half reductions do).

pub(crate) use super::contract::TensorOp;
use super::contract::{CollectiveTensor, ElementType};
use super::dtype;
use burn::tensor::TensorData;
use burn_ddp_comm::{CommError, ProcessGroup, ReduceOp, Result};

/// `data`'s elements as bytes and their wire type, or the error naming the
/// rank, the type and the fix.
fn host_bytes<'a>(
    rank: usize,
    data: &'a mut TensorData,
    what: &str,
) -> Result<(burn_ddp_comm::DType, &'a mut [u8])> {
    let dtype = data.element_type();
    dtype::wire_or_error(rank, dtype, what)?;
    dtype::bytes_mut(data).ok_or_else(|| CommError::InvalidArgument {
        rank,
        message: format!("{what}: the tensor's data is not laid out as {dtype:?} elements"),
    })
}

/// Reduces `tensor` over all ranks; every rank gets the result.
pub(crate) fn all_reduce<T: CollectiveTensor>(
    group: &ProcessGroup,
    tensor: T,
    op: ReduceOp,
) -> Result<T> {
    let tensor = match tensor.on_device(group, TensorOp::AllReduce(op))? {
        Ok(done) => return Ok(done),
        Err(on_host) => on_host,
    };
    let device = tensor.device();
    let mut data = tensor.into_data();
    let (wire, bytes) = host_bytes(group.rank(), &mut data, "all_reduce")?;
    group.all_reduce_bytes(wire, bytes, op)?;
    Ok(T::from_data(data, &device))
}

/// Rank `root`'s `tensor` on every rank.
pub(crate) fn broadcast<T: CollectiveTensor>(
    group: &ProcessGroup,
    tensor: T,
    root: usize,
) -> Result<T> {
    group.check_root(root)?;
    let tensor = match tensor.on_device(group, TensorOp::Broadcast(root))? {
        Ok(done) => return Ok(done),
        Err(on_host) => on_host,
    };
    let device = tensor.device();
    let mut data = tensor.into_data();
    let (wire, bytes) = host_bytes(group.rank(), &mut data, "broadcast")?;
    group.broadcast_bytes(wire, bytes, root)?;
    Ok(T::from_data(data, &device))
}

/// Every rank's `tensor`, in rank order (all of the same shape).
pub(crate) fn all_gather<T: CollectiveTensor>(group: &ProcessGroup, tensor: T) -> Result<Vec<T>> {
    let dims = tensor.dims();
    let rows = dims.first().copied().unwrap_or(1);
    let tensor = match tensor.on_device(group, TensorOp::AllGather)? {
        Ok(gathered) => return Ok(split_rows(&gathered, group.world_size(), rows)),
        Err(on_host) => on_host,
    };
    let device = tensor.device();
    let mut data = tensor.into_data();
    let dtype = data.element_type();
    let (wire, bytes) = host_bytes(group.rank(), &mut data, "all_gather")?;
    let gathered = group.all_gather_bytes(wire, bytes)?;
    let per_rank = gathered.len() / group.world_size();
    Ok((0..group.world_size())
        .map(|r| {
            let part = gathered[r * per_rank..(r + 1) * per_rank].to_vec();
            T::from_data(
                TensorData::from_bytes_vec(part, dims.clone(), dtype),
                &device,
            )
        })
        .collect())
}

/// The ranks' tensors, `rows` each, side by side along dimension 0 of
/// `gathered` (what the device all-gather writes), one by one.
fn split_rows<T: CollectiveTensor>(gathered: &T, world: usize, rows: usize) -> Vec<T> {
    (0..world)
        .map(|r| gathered.narrow_rows(r * rows, rows))
        .collect()
}

/// Reduces `tensor` over all ranks and returns this rank's slice of the
/// result along dimension 0, which the world size must divide.
pub(crate) fn reduce_scatter<T: CollectiveTensor>(
    group: &ProcessGroup,
    tensor: T,
    op: ReduceOp,
) -> Result<T> {
    let mut dims = tensor.dims();
    group.check_scatter_dims(&dims)?;
    let tensor = match tensor.on_device(group, TensorOp::ReduceScatter(op))? {
        Ok(part) => return Ok(part),
        Err(on_host) => on_host,
    };
    dims[0] /= group.world_size();
    let device = tensor.device();
    let mut data = tensor.into_data();
    let dtype = data.element_type();
    let (wire, bytes) = host_bytes(group.rank(), &mut data, "reduce_scatter")?;
    let part = group.reduce_scatter_bytes(wire, bytes, op)?;
    Ok(T::from_data(
        TensorData::from_bytes_vec(part, dims, dtype),
        &device,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::contract::testing as shim;
    use burn_ddp_comm::CollectiveBackend;

    fn group(backend: CollectiveBackend) -> ProcessGroup {
        ProcessGroup::builder(0, 1)
            .device_backend(backend)
            .build()
            .unwrap()
    }

    #[test]
    fn cpu_tensors_take_the_host_path_unless_nccl_is_forced() {
        let ones = || shim::test_tensor(vec![1.0, 1.0, 1.0]);
        for backend in [CollectiveBackend::Auto, CollectiveBackend::Host] {
            let sum = all_reduce(&group(backend), ones(), ReduceOp::Sum).unwrap();
            assert_eq!(sum.into_data().as_slice::<f32>().unwrap(), [1.0; 3]);
        }
        let err = all_reduce(&group(CollectiveBackend::Nccl), ones(), ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        assert!(err.contains("rank 0: BURN_DDP_BACKEND=nccl, but "), "{err}");
    }

    #[test]
    fn a_device_gather_is_split_into_each_ranks_rows() {
        let gathered = shim::test_tensor((0..12).map(|v| v as f32).collect());
        let parts = split_rows(&gathered, 3, 4);
        let values: Vec<Vec<f32>> = parts
            .into_iter()
            .map(|part| part.into_data().to_vec_f32())
            .collect();
        assert_eq!(
            values,
            [
                [0.0, 1.0, 2.0, 3.0],
                [4.0, 5.0, 6.0, 7.0],
                [8.0, 9.0, 10.0, 11.0]
            ]
        );
    }

    trait F32s {
        fn to_vec_f32(&self) -> Vec<f32>;
    }

    impl F32s for TensorData {
        fn to_vec_f32(&self) -> Vec<f32> {
            self.as_slice::<f32>().unwrap().to_vec()
        }
    }
}
