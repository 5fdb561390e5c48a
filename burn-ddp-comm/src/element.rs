//! Element types the collectives move, and how they combine.

use crate::error::CommError;
use bytemuck::Pod;

/// A reduction applied element-wise across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum over ranks.
    Sum,
    /// Sum over ranks divided by the world size (integer division for integers).
    Mean,
    /// Largest value over ranks.
    Max,
    /// Smallest value over ranks.
    Min,
}

/// The element type of a buffer, as carried on the wire and checked across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// IEEE half precision (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    BF16,
}

impl DType {
    /// Every element type, in the order of their codes ([`DType::code`]).
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::BF16,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// Whether it is a floating-point type.
    pub fn is_float(self) -> bool {
        !matches!(self, DType::I32 | DType::I64)
    }

    /// A small number that stands for the type in cross-rank comparisons
    /// (layouts, call signatures): its index in [`DType::ALL`].
    pub fn code(self) -> i64 {
        Self::ALL.iter().position(|d| *d == self).unwrap() as i64
    }

    /// The error for a front-end's element type the collectives do not move
    /// (`what`: the operation, for the message).
    pub fn unsupported(rank: usize, what: &str, name: &dyn std::fmt::Debug) -> CommError {
        CommError::InvalidArgument {
            rank,
            message: format!(
                "{what}: burn-ddp moves f32, f64, f16, bf16, i32 and i64 tensors, not \
                 {name:?}; convert the tensor first (e.g. `.cast(DType::F32)`)"
            ),
        }
    }

    /// The error for a parameter whose gradients cannot be averaged.
    pub fn unsupported_gradient(rank: usize, name: &dyn std::fmt::Debug) -> CommError {
        CommError::InvalidArgument {
            rank,
            message: format!(
                "burn-ddp averages f32, f64, f16 and bf16 gradients; a parameter has \
                 {name:?} (train in one of those, or cast the parameter)"
            ),
        }
    }

    /// The type a [`DType::code`] stands for.
    pub fn from_code(code: i64) -> Option<Self> {
        usize::try_from(code)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }
}

/// A plain numeric type the collectives can reduce.
pub trait Element: Pod + PartialOrd + Send + Sync + std::fmt::Debug + 'static {
    /// Its tag.
    const DTYPE: DType;

    /// `self + other`, wrapping for integers (a sum of ranks' values never panics).
    fn add(self, other: Self) -> Self;

    /// `self / world_size`, for [`ReduceOp::Mean`].
    fn div_count(self, count: usize) -> Self;

    /// Wraps a slice as a type-erased buffer.
    fn buffer(data: &mut [Self]) -> BufferMut<'_>;
}

macro_rules! float_element {
    ($ty:ty, $dtype:ident) => {
        impl Element for $ty {
            const DTYPE: DType = DType::$dtype;
            fn add(self, other: Self) -> Self {
                self + other
            }
            fn div_count(self, count: usize) -> Self {
                self / count as $ty
            }
            fn buffer(data: &mut [Self]) -> BufferMut<'_> {
                BufferMut::$dtype(data)
            }
        }
    };
}

macro_rules! int_element {
    ($ty:ty, $dtype:ident) => {
        impl Element for $ty {
            const DTYPE: DType = DType::$dtype;
            fn add(self, other: Self) -> Self {
                self.wrapping_add(other)
            }
            fn div_count(self, count: usize) -> Self {
                self / count as $ty
            }
            fn buffer(data: &mut [Self]) -> BufferMut<'_> {
                BufferMut::$dtype(data)
            }
        }
    };
}

/// Half-precision floats combine in f32 and round once per step, as NCCL does
/// for its native f16/bf16 reductions.
macro_rules! half_element {
    ($ty:ty, $dtype:ident) => {
        impl Element for $ty {
            const DTYPE: DType = DType::$dtype;
            fn add(self, other: Self) -> Self {
                <$ty>::from_f32(self.to_f32() + other.to_f32())
            }
            fn div_count(self, count: usize) -> Self {
                <$ty>::from_f32(self.to_f32() / count as f32)
            }
            fn buffer(data: &mut [Self]) -> BufferMut<'_> {
                BufferMut::$dtype(data)
            }
        }
    };
}

half_element!(half::f16, F16);
half_element!(half::bf16, BF16);
float_element!(f32, F32);
float_element!(f64, F64);
int_element!(i32, I32);
int_element!(i64, I64);

/// A host buffer of any supported element type, so transports stay object-safe.
#[derive(Debug)]
pub enum BufferMut<'a> {
    /// f32 elements.
    F32(&'a mut [f32]),
    /// f64 elements.
    F64(&'a mut [f64]),
    /// i32 elements.
    I32(&'a mut [i32]),
    /// i64 elements.
    I64(&'a mut [i64]),
    /// f16 elements.
    F16(&'a mut [half::f16]),
    /// bf16 elements.
    BF16(&'a mut [half::bf16]),
}

impl<'a> BufferMut<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            BufferMut::F32(data) => data.len(),
            BufferMut::F64(data) => data.len(),
            BufferMut::I32(data) => data.len(),
            BufferMut::I64(data) => data.len(),
            BufferMut::F16(data) => data.len(),
            BufferMut::BF16(data) => data.len(),
        }
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its element type.
    pub fn dtype(&self) -> DType {
        match self {
            BufferMut::F32(_) => DType::F32,
            BufferMut::F64(_) => DType::F64,
            BufferMut::I32(_) => DType::I32,
            BufferMut::I64(_) => DType::I64,
            BufferMut::F16(_) => DType::F16,
            BufferMut::BF16(_) => DType::BF16,
        }
    }

    /// `bytes` seen as elements of `dtype`, or `None` when they are not a
    /// whole number of suitably aligned elements.
    pub fn from_bytes(dtype: DType, bytes: &'a mut [u8]) -> Option<Self> {
        Some(match dtype {
            DType::F32 => BufferMut::F32(bytemuck::try_cast_slice_mut(bytes).ok()?),
            DType::F64 => BufferMut::F64(bytemuck::try_cast_slice_mut(bytes).ok()?),
            DType::I32 => BufferMut::I32(bytemuck::try_cast_slice_mut(bytes).ok()?),
            DType::I64 => BufferMut::I64(bytemuck::try_cast_slice_mut(bytes).ok()?),
            DType::F16 => BufferMut::F16(bytemuck::try_cast_slice_mut(bytes).ok()?),
            DType::BF16 => BufferMut::BF16(bytemuck::try_cast_slice_mut(bytes).ok()?),
        })
    }
}

/// A region of device memory the collectives read or write: `len` elements of
/// `dtype` at device address `ptr` (a `CUdeviceptr`) on the communicator's GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBuffer {
    /// Device address of the first element.
    pub ptr: u64,
    /// Number of elements.
    pub len: usize,
    /// Element type.
    pub dtype: DType,
}

/// A reusable byte buffer aligned for every element type, so buffers that
/// are needed again and again (a bucket, a transport's pieces) are allocated
/// once and grown when needed, never per call.
#[derive(Debug, Default)]
pub(crate) struct AlignedBuf {
    words: Vec<u64>,
}

impl AlignedBuf {
    /// `len` bytes (any contents), 8-byte aligned.
    pub(crate) fn bytes(&mut self, len: usize) -> &mut [u8] {
        let words = len.div_ceil(8);
        if self.words.len() < words {
            self.words.resize(words, 0);
        }
        let raw: &mut [u8] = bytemuck::cast_slice_mut(&mut self.words[..words]);
        &mut raw[..len]
    }
}

/// Combines `incoming` into `acc` element-wise. Mean accumulates as a sum; the
/// caller divides once at the end.
pub fn reduce_into<T: Element>(op: ReduceOp, acc: &mut [T], incoming: &[T]) {
    debug_assert_eq!(acc.len(), incoming.len());
    // One loop per op keeps each loop branch-free so it vectorises.
    match op {
        ReduceOp::Sum | ReduceOp::Mean => {
            for (a, b) in acc.iter_mut().zip(incoming) {
                *a = a.add(*b);
            }
        }
        // NaN wins, as in PyTorch: a diverged rank must show in a max or min
        // of the loss, not vanish because every comparison with NaN is false.
        ReduceOp::Max => {
            for (a, b) in acc.iter_mut().zip(incoming) {
                if !is_nan(a) && (is_nan(b) || *b > *a) {
                    *a = *b;
                }
            }
        }
        ReduceOp::Min => {
            for (a, b) in acc.iter_mut().zip(incoming) {
                if !is_nan(a) && (is_nan(b) || *b < *a) {
                    *a = *b;
                }
            }
        }
    }
}

/// NaN is the one value not ordered against itself (never true for integers).
fn is_nan<T: PartialOrd>(value: &T) -> bool {
    value.partial_cmp(value).is_none()
}

/// Applies the final step of `op` (the division of a mean) to a reduced buffer.
pub fn finish_reduce<T: Element>(op: ReduceOp, data: &mut [T], world_size: usize) {
    if op == ReduceOp::Mean && world_size > 1 {
        for value in data {
            *value = value.div_count(world_size);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_codes_round_trip_and_reject_strangers() {
        for dtype in DType::ALL {
            assert_eq!(DType::from_code(dtype.code()), Some(dtype));
        }
        assert_eq!(DType::from_code(-1), None);
        assert_eq!(DType::from_code(DType::ALL.len() as i64), None);
        assert!(DType::BF16.is_float() && !DType::I64.is_float());
    }

    #[test]
    fn each_op_combines_element_wise() {
        let incoming = [3.0f32, -1.0, 2.0];
        let mut sum = [1.0f32, 1.0, 1.0];
        reduce_into(ReduceOp::Sum, &mut sum, &incoming);
        assert_eq!(sum, [4.0, 0.0, 3.0]);
        let mut max = [1.0f32, 1.0, 1.0];
        reduce_into(ReduceOp::Max, &mut max, &incoming);
        assert_eq!(max, [3.0, 1.0, 2.0]);
        let mut min = [1.0f32, 1.0, 1.0];
        reduce_into(ReduceOp::Min, &mut min, &incoming);
        assert_eq!(min, [1.0, -1.0, 1.0]);
    }

    #[test]
    fn half_precision_combines_in_f32_and_rounds_once() {
        use half::{bf16, f16};
        let mut acc = [f16::from_f32(1.0), f16::from_f32(2048.0)];
        reduce_into(
            ReduceOp::Sum,
            &mut acc,
            &[f16::from_f32(2.5), f16::from_f32(1.0)],
        );
        // 2049 is not an f16: the sum rounds to even, as NCCL's does.
        assert_eq!(acc, [f16::from_f32(3.5), f16::from_f32(2048.0)]);
        let mut mean = [bf16::from_f32(3.0), bf16::from_f32(-6.0)];
        finish_reduce(ReduceOp::Mean, &mut mean, 3);
        assert_eq!(mean, [bf16::from_f32(1.0), bf16::from_f32(-2.0)]);
        let mut max = [bf16::from_f32(1.0), bf16::NAN];
        reduce_into(
            ReduceOp::Max,
            &mut max,
            &[bf16::from_f32(4.0), bf16::from_f32(9.0)],
        );
        assert_eq!(max[0], bf16::from_f32(4.0));
        assert!(max[1].is_nan());
        assert_eq!(
            (DType::F16.size(), DType::BF16.size(), DType::F64.size()),
            (2, 2, 8)
        );
    }

    #[test]
    fn nan_wins_max_and_min_from_either_side() {
        for op in [ReduceOp::Max, ReduceOp::Min] {
            let mut acc = [1.0f32, f32::NAN, f32::NAN, 2.0];
            reduce_into(op, &mut acc, &[f32::NAN, 5.0, f32::NAN, 3.0]);
            assert!(acc[..3].iter().all(|v| v.is_nan()), "{op:?}: {acc:?}");
            let expected = if op == ReduceOp::Max { 3.0 } else { 2.0 };
            assert_eq!(acc[3], expected, "{op:?}");
            let mut acc = [4.0f64];
            reduce_into(op, &mut acc, &[f64::NAN]);
            assert!(acc[0].is_nan(), "{op:?}");
        }
        let mut ints = [3i64, -2];
        reduce_into(ReduceOp::Max, &mut ints, &[1, 5]);
        assert_eq!(ints, [3, 5]);
        reduce_into(ReduceOp::Min, &mut ints, &[-7, 9]);
        assert_eq!(ints, [-7, 5]);
    }

    #[test]
    fn mean_divides_once_and_integers_wrap_instead_of_panicking() {
        let mut data = [6.0f64, 3.0];
        finish_reduce(ReduceOp::Mean, &mut data, 3);
        assert_eq!(data, [2.0, 1.0]);
        let mut ints = [i64::MAX];
        reduce_into(ReduceOp::Sum, &mut ints, &[1]);
        assert_eq!(ints, [i64::MIN]);
        let mut ints = [7i32];
        finish_reduce(ReduceOp::Mean, &mut ints, 2);
        assert_eq!(ints, [3]);
    }
}
