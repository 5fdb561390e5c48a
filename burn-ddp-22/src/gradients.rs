//! Burn 0.22 gradients as the reducer's [`GradientSet`]: the tensor glue
//! between `GradientsParams` and burn-ddp-comm's reducer, and nothing else.
//!
//! On the host path each gradient is handed over as its own data: `into_data`
//! of a uniquely held gradient gives its buffer (Flex: without a copy), the
//! average is written into that same buffer, and `from_data` makes the tensor
//! of it again. On the GPU path (the `cuda` feature, CUDA gradients) a bucket
//! is concatenated on the device and NCCL averages it there (`device`).

use crate::{dtype, ParamLayout, Result};
use burn::tensor::{Device, Tensor, TensorData};
use burn_ddp_comm::reducer::HostCopies;
use burn_ddp_comm::{GradientSet, ParamInfo, Placement};

/// One synchronisation's gradients, in parameter order, flattened.
pub(crate) struct TensorGradients {
    rank: usize,
    params: Vec<ParamInfo>,
    /// Each gradient until it is read (`None`: this rank has none, so zeros).
    grads: Vec<Option<Tensor<1>>>,
    /// The data each gradient was read into, to write its average back into.
    host: HostCopies<TensorData>,
    averaged: Vec<Option<Tensor<1>>>,
    device: Device,
    /// Where the gradients live (all on `device`).
    placement: Placement,
}

impl TensorGradients {
    /// An empty set for gradients on `device` (the gradients' device, without
    /// autodiff).
    pub fn new(rank: usize, device: Device) -> Self {
        Self {
            rank,
            params: Vec::new(),
            grads: Vec::new(),
            host: HostCopies::new(rank, dtype::element_bytes),
            averaged: Vec::new(),
            placement: crate::device::placement(&device),
            device,
        }
    }

    /// Adds a parameter (`id` for messages), with its gradient if it has one.
    pub fn push(
        &mut self,
        id: u64,
        shape: Vec<usize>,
        dtype: burn::tensor::DType,
        grad: Option<Tensor<1>>,
    ) -> Result<()> {
        let layout = ParamLayout {
            shape,
            dtype: dtype::gradient_wire(self.rank, dtype)?,
        };
        self.params.push(ParamInfo {
            id,
            layout,
            placement: self.placement,
        });
        self.grads.push(grad);
        self.host.push();
        self.averaged.push(None);
        Ok(())
    }

    /// Where the gradients live.
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// The gradients' device (without autodiff).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The averaged gradients in parameter order, flattened, after a
    /// synchronisation (`None` for those it did not produce).
    pub fn into_averaged(self) -> Vec<Option<Tensor<1>>> {
        self.averaged
    }

    /// The gradients as they were given, when no synchronisation ran.
    pub fn into_original(self) -> Vec<Option<Tensor<1>>> {
        self.grads
    }
}

impl GradientSet for TensorGradients {
    fn params(&self) -> &[ParamInfo] {
        &self.params
    }

    fn has_gradients(&self) -> bool {
        self.grads.iter().any(Option::is_some)
    }

    fn read_host(&mut self, index: usize, out: &mut [u8]) -> Result<()> {
        let data = self.grads[index].take().map(Tensor::into_data);
        self.host.read(index, data, out)
    }

    fn write_host(&mut self, index: usize, averaged: &[u8]) -> Result<()> {
        let layout = &self.params[index].layout;
        let (dtype, numel) = (dtype::to_burn(layout.dtype), layout.numel());
        // A parameter without a gradient here: its average is new memory.
        let zeros = || TensorData::zeros::<f32, _>([numel]).convert_dtype(dtype);
        let data = self.host.write(index, averaged, zeros)?;
        self.averaged[index] = Some(Tensor::from_data(data, (&self.device, dtype)));
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn pack_device(
        &mut self,
        members: &[usize],
        numel: usize,
        wire: burn_ddp_comm::DType,
    ) -> Result<burn_ddp_comm::DeviceBucket> {
        let dtype = dtype::to_burn(wire);
        let mut parts = Vec::with_capacity(members.len());
        for &p in members {
            let numel = self.params[p].layout.numel();
            parts.push(match self.grads[p].take() {
                Some(grad) if grad.dtype() == dtype => grad,
                // Concatenating would panic; the host path refuses it too.
                Some(grad) => {
                    return Err(crate::CommError::InvalidArgument {
                        rank: self.rank,
                        message: format!(
                            "gradient of parameter #{p}: {:?} elements for a {dtype:?} parameter",
                            grad.dtype()
                        ),
                    })
                }
                None => Tensor::zeros([numel], (&self.device, dtype)),
            });
        }
        let bucket = Tensor::cat(parts, 0);
        debug_assert_eq!(bucket.dims(), [numel]);
        crate::device::cuda::pack(self.rank, bucket, wire)
    }

    #[cfg(feature = "cuda")]
    fn unpack_device(
        &mut self,
        members: &[usize],
        offsets: &[usize],
        bucket: burn_ddp_comm::DeviceBucket,
    ) -> Result<()> {
        let flat = crate::device::cuda::unpack(bucket);
        for (&p, &offset) in members.iter().zip(offsets) {
            let numel = self.params[p].layout.numel();
            self.averaged[p] = Some(flat.clone().narrow(0, offset, numel));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gradients_travel_as_bytes_and_come_back() {
        let device = Device::flex();
        let mut set = TensorGradients::new(0, device.clone());
        let grad = Tensor::<1>::from_floats([1.0, 2.0, 3.0, 4.0], &device);
        set.push(7, vec![2, 2], burn::tensor::DType::F32, Some(grad))
            .unwrap();
        set.push(8, vec![3], burn::tensor::DType::F32, None)
            .unwrap();
        assert!(set.has_gradients());
        assert_eq!(set.params()[0].placement, Placement::Host);
        let mut out = [0u8; 16];
        set.read_host(0, &mut out).unwrap();
        let values: Vec<f32> = out
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(values, [1.0, 2.0, 3.0, 4.0]);
        let mut zeros = [1u8; 12];
        set.read_host(1, &mut zeros).unwrap();
        assert_eq!(zeros, [0; 12]);
        let halved: Vec<u8> = [0.5f32, 1.0, 1.5, 2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        set.write_host(0, &halved).unwrap();
        set.write_host(1, &[0u8; 12]).unwrap();
        let averaged = set.into_averaged();
        let first = averaged[0].clone().unwrap();
        assert_eq!(
            first.into_data().try_to_vec::<f32>().unwrap(),
            [0.5, 1.0, 1.5, 2.0]
        );
        assert_eq!(averaged[1].clone().unwrap().dims(), [3]);
    }

    #[test]
    fn integer_parameters_are_refused_naming_the_fix() {
        let mut set = TensorGradients::new(3, Device::flex());
        let err = set
            .push(1, vec![2], burn::tensor::DType::I64, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rank 3") && err.contains("cast the parameter"),
            "{err}"
        );
    }
}
