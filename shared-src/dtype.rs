//! The one table between Burn's element types and the ones the collectives
//! move, and the bytes of a `TensorData` that go with it.

use super::contract::ElementType;
use burn::tensor::{DType, TensorData};
use burn_ddp_comm::DType as Wire;
use burn_ddp_comm::Result;

/// Burn's types the collectives move, and their wire types.
const TABLE: [(DType, Wire); 6] = [
    (DType::F32, Wire::F32),
    (DType::F64, Wire::F64),
    (DType::I32, Wire::I32),
    (DType::I64, Wire::I64),
    (DType::F16, Wire::F16),
    (DType::BF16, Wire::BF16),
];

/// The wire type of a Burn element type, if the collectives move it.
pub(crate) fn to_wire(dtype: DType) -> Option<Wire> {
    TABLE
        .iter()
        .find(|(burn, _)| *burn == dtype)
        .map(|(_, wire)| *wire)
}

/// The Burn element type of a wire type.
pub(crate) fn to_burn(wire: Wire) -> DType {
    TABLE
        .iter()
        .find(|(_, w)| *w == wire)
        .map(|(burn, _)| *burn)
        .expect("every wire type is in the table")
}

/// [`to_wire`], or an error naming the rank, the type and the fix.
pub(crate) fn wire_or_error(rank: usize, dtype: DType, what: &str) -> Result<Wire> {
    to_wire(dtype).ok_or_else(|| Wire::unsupported(rank, what, &dtype))
}

/// The wire type of a gradient: floats only.
pub(crate) fn gradient_wire(rank: usize, dtype: DType) -> Result<Wire> {
    match to_wire(dtype) {
        Some(wire) if wire.is_float() => Ok(wire),
        _ => Err(Wire::unsupported_gradient(rank, &dtype)),
    }
}

/// `data`'s elements as bytes to write, and their wire type (`None` when the
/// type is not moved or the data is not laid out as its elements).
pub(crate) fn bytes_mut(data: &mut TensorData) -> Option<(Wire, &mut [u8])> {
    let wire = to_wire(data.element_type())?;
    let bytes: &mut [u8] = match wire {
        Wire::F32 => bytemuck::cast_slice_mut(data.as_mut_slice::<f32>().ok()?),
        Wire::F64 => bytemuck::cast_slice_mut(data.as_mut_slice::<f64>().ok()?),
        Wire::I32 => bytemuck::cast_slice_mut(data.as_mut_slice::<i32>().ok()?),
        Wire::I64 => bytemuck::cast_slice_mut(data.as_mut_slice::<i64>().ok()?),
        Wire::F16 => bytemuck::cast_slice_mut(data.as_mut_slice::<half::f16>().ok()?),
        Wire::BF16 => bytemuck::cast_slice_mut(data.as_mut_slice::<half::bf16>().ok()?),
    };
    Some((wire, bytes))
}

/// [`bytes_mut`] without the type, for the reducer's `HostCopies`.
pub(crate) fn element_bytes(data: &mut TensorData) -> Option<&mut [u8]> {
    bytes_mut(data).map(|(_, bytes)| bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_round_trips_and_refuses_the_rest() {
        for (burn, wire) in TABLE {
            assert_eq!(to_wire(burn), Some(wire));
            assert_eq!(to_burn(wire), burn);
        }
        for other in [DType::U8, DType::I8, DType::U32, DType::U16] {
            assert_eq!(to_wire(other), None);
            let err = wire_or_error(2, other, "broadcast")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("rank 2: broadcast") && err.contains(&format!("{other:?}")),
                "{err}"
            );
        }
        assert!(gradient_wire(0, DType::I64).is_err());
        assert_eq!(gradient_wire(0, DType::BF16).unwrap(), Wire::BF16);
    }

    #[test]
    fn bytes_are_the_elements_in_order() {
        let mut data = TensorData::new(vec![1.0f32, -2.0], [2]);
        let (wire, bytes) = bytes_mut(&mut data).unwrap();
        assert_eq!((wire, bytes.len()), (Wire::F32, 8));
        bytes[..4].copy_from_slice(&3.5f32.to_le_bytes());
        assert_eq!(data.as_slice::<f32>().unwrap(), [3.5, -2.0]);
    }
}
