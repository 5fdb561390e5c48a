//! Burn gradients as the reducer's [`GradientSet`]: the glue between a
//! front-end's flattened gradient tensors and burn-ddp-comm's reducer.
//!
//! On the host path each gradient is handed over as its own data: `into_data`
//! of a uniquely held gradient gives its buffer (NdArray, Flex: without a
//! copy), the average is written into that same buffer, and `from_data` makes
//! the tensor of it again, so a step allocates nothing for the gradients. On
//! the GPU path (the `cuda` feature, CUDA gradients) a bucket is concatenated
//! on the device and NCCL averages it there.

pub(crate) use super::contract::FlatGrad;
use super::dtype;
use burn::tensor::{DType, TensorData};
#[cfg(feature = "cuda")]
use burn_ddp_comm::Piece;
use burn_ddp_comm::{GradientSet, HostCopies, ParamInfo, Placement};
use burn_ddp_comm::{ParamLayout, Result};

/// One synchronisation's gradients, in parameter order, flattened.
pub(crate) struct TensorGradients<G: FlatGrad> {
    rank: usize,
    params: Vec<ParamInfo>,
    /// Each gradient until it is read (`None`: this rank has none, so zeros).
    grads: Vec<Option<G>>,
    /// The data each gradient was read into, to write its average back into.
    host: HostCopies<TensorData>,
    averaged: Vec<Option<G>>,
    device: G::Device,
    /// Where the gradients live (all on `device`).
    placement: Placement,
}

impl<G: FlatGrad> TensorGradients<G> {
    /// An empty set for gradients on `device` (without autodiff).
    pub fn new(rank: usize, device: G::Device) -> Self {
        Self {
            rank,
            params: Vec::new(),
            grads: Vec::new(),
            host: HostCopies::new(rank, dtype::element_bytes),
            averaged: Vec::new(),
            placement: G::placement(&device),
            device,
        }
    }

    /// Adds a parameter (`id` for messages), with its flattened gradient if
    /// it has one.
    pub fn push(
        &mut self,
        id: u64,
        shape: Vec<usize>,
        dtype: DType,
        grad: Option<G>,
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
    pub fn device(&self) -> &G::Device {
        &self.device
    }

    /// The averaged gradients in parameter order, flattened, after a
    /// synchronisation (`None` for those it did not produce).
    pub fn into_averaged(self) -> Vec<Option<G>> {
        self.averaged
    }

    /// The gradients as they were given, when no synchronisation ran.
    pub fn into_original(self) -> Vec<Option<G>> {
        self.grads
    }
}

impl<G: FlatGrad> GradientSet for TensorGradients<G> {
    fn params(&self) -> &[ParamInfo] {
        &self.params
    }

    fn has_gradients(&self) -> bool {
        self.grads.iter().any(Option::is_some)
    }

    fn read_host(&mut self, index: usize, out: &mut [u8]) -> Result<()> {
        let data = self.grads[index].take().map(G::into_data);
        self.host.read(index, data, out)
    }

    fn keep_for_average(&mut self, index: usize) {
        // Uniquely held once backward is over: its data without a copy.
        let data = self.grads[index].take().map(G::into_data);
        self.host.keep(index, data);
    }

    fn write_host(&mut self, index: usize, averaged: &[u8]) -> Result<()> {
        let layout = &self.params[index].layout;
        let (dtype, numel) = (dtype::to_burn(layout.dtype), layout.numel());
        // A parameter without a gradient here: its average is new memory.
        let zeros = || TensorData::zeros::<f32, _>([numel]).convert_dtype(dtype);
        let data = self.host.write(index, averaged, zeros)?;
        self.averaged[index] = Some(G::from_data(data, &self.device, dtype));
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn pack_device(
        &mut self,
        members: &[usize],
        numel: usize,
        wire: burn_ddp_comm::DType,
    ) -> Result<burn_ddp_comm::DeviceBucket> {
        let pieces: Vec<Piece> = members.iter().map(|&p| Piece::Param(p)).collect();
        let _ = numel;
        self.pack_device_pieces(&pieces, wire)
    }

    #[cfg(feature = "cuda")]
    fn pack_device_pieces(
        &mut self,
        pieces: &[Piece],
        wire: burn_ddp_comm::DType,
    ) -> Result<burn_ddp_comm::DeviceBucket> {
        let dtype = dtype::to_burn(wire);
        let mut parts = Vec::with_capacity(pieces.len());
        for &piece in pieces {
            parts.push(match piece {
                Piece::Zeros(0) => continue,
                Piece::Zeros(n) => G::zeros(n, &self.device, dtype),
                Piece::Param(p) => match self.grads[p].take() {
                    Some(grad) if grad.dtype() == dtype => grad,
                    // Concatenating would panic; the host path refuses it too.
                    Some(grad) => {
                        return Err(burn_ddp_comm::CommError::InvalidArgument {
                            rank: self.rank,
                            message: format!(
                                "gradient of parameter #{p}: {:?} elements for a {dtype:?} \
                                 parameter",
                                grad.dtype()
                            ),
                        })
                    }
                    None => G::zeros(self.params[p].layout.numel(), &self.device, dtype),
                },
            });
        }
        G::pack(self.rank, G::cat(parts), wire)
    }

    #[cfg(feature = "cuda")]
    fn unpack_device(
        &mut self,
        members: &[usize],
        offsets: &[usize],
        bucket: burn_ddp_comm::DeviceBucket,
    ) -> Result<()> {
        let flat = G::unpack(bucket);
        for (&p, &offset) in members.iter().zip(offsets) {
            let numel = self.params[p].layout.numel();
            self.averaged[p] = Some(flat.narrow(offset, numel));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::contract::testing::{self as shim, TestGrad};

    #[test]
    #[allow(clippy::clone_on_copy)] // Burn 0.21's NdArray device is Copy, 0.22's Flex one is not
    fn gradients_travel_as_bytes_and_come_back() {
        let device = shim::test_device();
        let mut set = TensorGradients::<TestGrad>::new(0, device.clone());
        let grad = <TestGrad as FlatGrad>::from_data(
            TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0], [4]),
            &device,
            DType::F32,
        );
        set.push(7, vec![2, 2], DType::F32, Some(grad)).unwrap();
        set.push(8, vec![3], DType::F32, None).unwrap();
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
        let mut averaged = set.into_averaged().into_iter();
        let first = averaged.next().unwrap().unwrap().into_data();
        assert_eq!(first.as_slice::<f32>().unwrap(), [0.5, 1.0, 1.5, 2.0]);
        let second = averaged.next().unwrap().unwrap().into_data();
        assert_eq!(second.as_slice::<f32>().unwrap(), [0.0; 3]);
    }

    #[test]
    fn integer_parameters_are_refused_naming_the_fix() {
        let mut set = TensorGradients::<TestGrad>::new(3, shim::test_device());
        let err = set
            .push(1, vec![2], DType::I64, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rank 3") && err.contains("cast the parameter"),
            "{err}"
        );
    }
}
