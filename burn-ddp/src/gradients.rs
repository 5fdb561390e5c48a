//! Burn gradients as the reducer's [`GradientSet`]: the tensor glue between
//! Burn 0.21 and burn-ddp-comm's reducer, and nothing else.
//!
//! On the host path each gradient's own data is handed over and taken back:
//! `into_data` of a uniquely held gradient gives its buffer without a copy,
//! the average is written into that same buffer, and `from_data` makes the
//! tensor of it again, so a step allocates nothing for the gradients. On the
//! GPU path a bucket is concatenated on the device and NCCL averages it there
//! (`device`).

use crate::{dtype, ParamLayout, Result};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_backend::tensor::FloatTensor;
use burn_ddp_comm::reducer::HostCopies;
use burn_ddp_comm::{GradientSet, ParamInfo, Placement};

/// One synchronisation's gradients, in parameter order.
pub(crate) struct TensorGradients<I: Backend> {
    rank: usize,
    params: Vec<ParamInfo>,
    /// Each gradient until it is read (`None`: this rank has none, so zeros).
    grads: Vec<Option<FloatTensor<I>>>,
    /// The data each gradient was read into, to write its average back into.
    host: HostCopies<TensorData>,
    averaged: Vec<Option<FloatTensor<I>>>,
    device: I::Device,
}

impl<I: Backend> TensorGradients<I> {
    /// An empty set for gradients on `device`.
    pub fn new(rank: usize, device: I::Device) -> Self {
        Self {
            rank,
            params: Vec::new(),
            grads: Vec::new(),
            host: HostCopies::new(rank, dtype::bytes_mut),
            averaged: Vec::new(),
            device,
        }
    }

    /// Adds a parameter (`id` for messages), with its gradient if it has one.
    pub fn push(
        &mut self,
        id: u64,
        shape: Vec<usize>,
        dtype: burn::tensor::DType,
        grad: Option<FloatTensor<I>>,
    ) -> Result<()> {
        let layout = ParamLayout {
            shape,
            dtype: dtype::gradient_wire(self.rank, dtype)?,
        };
        self.params.push(ParamInfo {
            id,
            layout,
            placement: crate::device::placement::<I>(&self.device),
        });
        self.grads.push(grad);
        self.host.push();
        self.averaged.push(None);
        Ok(())
    }

    /// The placement of the gradients (all on one device).
    pub fn placement(&self) -> Placement {
        crate::device::placement::<I>(&self.device)
    }

    /// The averaged gradients in parameter order, after a synchronisation
    /// (`None` for those it did not produce: the reducer skipped the step).
    pub fn into_averaged(self) -> Vec<Option<FloatTensor<I>>> {
        self.averaged
    }

    /// The gradients as they were given, when no synchronisation ran.
    pub fn into_original(self) -> Vec<Option<FloatTensor<I>>> {
        self.grads
    }
}

impl<I: Backend> GradientSet for TensorGradients<I> {
    fn params(&self) -> &[ParamInfo] {
        &self.params
    }

    fn has_gradients(&self) -> bool {
        self.grads.iter().any(Option::is_some)
    }

    fn read_host(&mut self, index: usize, out: &mut [u8]) -> Result<()> {
        let data = self.grads[index].take().map(|grad| {
            let flat = I::float_reshape(grad, [self.params[index].layout.numel()].into());
            Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(flat)).into_data()
        });
        self.host.read(index, data, out)
    }

    fn write_host(&mut self, index: usize, averaged: &[u8]) -> Result<()> {
        let layout = self.params[index].layout.clone();
        let burn_dtype = dtype::to_burn(layout.dtype);
        // A parameter without a gradient here: its average is new memory.
        let zeros = || TensorData::zeros::<f32, _>([layout.numel()]).convert_dtype(burn_dtype);
        let data = self.host.write(index, averaged, zeros)?;
        let flat = Tensor::<I, 1>::from_data(data, (&self.device, burn_dtype));
        let shaped = I::float_reshape(flat.into_primitive().tensor(), layout.shape.into());
        self.averaged[index] = Some(shaped);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn pack_device(
        &mut self,
        members: &[usize],
        numel: usize,
        wire: burn_ddp_comm::DType,
    ) -> Result<burn_ddp_comm::DeviceBucket> {
        let parts: Vec<Tensor<I, 1>> = members
            .iter()
            .map(|&p| {
                let numel = self.params[p].layout.numel();
                let flat = match self.grads[p].take() {
                    Some(grad) => I::float_reshape(grad, [numel].into()),
                    None => {
                        I::float_zeros([numel].into(), &self.device, dtype::to_burn(wire).into())
                    }
                };
                Tensor::from_primitive(TensorPrimitive::Float(flat))
            })
            .collect();
        let bucket = Tensor::cat(parts, 0).into_primitive().tensor();
        debug_assert_eq!(
            burn_backend::TensorMetadata::shape(&bucket).num_elements(),
            numel
        );
        crate::device::cuda::pack::<I>(self.rank, bucket)
    }

    #[cfg(feature = "cuda")]
    fn unpack_device(
        &mut self,
        members: &[usize],
        offsets: &[usize],
        bucket: burn_ddp_comm::DeviceBucket,
    ) -> Result<()> {
        let flat = Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(
            crate::device::cuda::unpack::<I>(bucket),
        ));
        for (&p, &offset) in members.iter().zip(offsets) {
            let layout = &self.params[p].layout;
            let part = flat
                .clone()
                .slice(offset..offset + layout.numel())
                .into_primitive()
                .tensor();
            self.averaged[p] = Some(I::float_reshape(part, layout.shape.clone().into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;

    type I = NdArray;

    #[test]
    fn gradients_travel_as_bytes_and_come_back_in_their_shape() {
        let device = Default::default();
        let mut set = TensorGradients::<I>::new(0, device);
        let grad = Tensor::<I, 2>::from_floats([[1.0, 2.0], [3.0, 4.0]], &Default::default());
        set.push(
            7,
            vec![2, 2],
            burn::tensor::DType::F32,
            Some(grad.into_primitive().tensor()),
        )
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
        let first =
            Tensor::<I, 2>::from_primitive(TensorPrimitive::Float(averaged[0].clone().unwrap()));
        assert_eq!(first.dims(), [2, 2]);
        assert_eq!(
            first.into_data().to_vec::<f32>().unwrap(),
            [0.5, 1.0, 1.5, 2.0]
        );
        assert!(averaged[1].is_some());
    }

    #[test]
    fn integer_parameters_are_refused_naming_the_fix() {
        let mut set = TensorGradients::<I>::new(3, Default::default());
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
