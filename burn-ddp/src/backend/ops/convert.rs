//! Moving backend-generic structs between `Ddp<B>` and `B`.
//!
//! `Ddp<B>` shares `B`'s tensor types, but structs generic over the backend
//! (`TensorPrimitive<B>`, pooling results, ...) are distinct types for each, so
//! their fields are moved across one by one.

use crate::backend::Ddp;
use crate::tracking::TrackedAutodiff;
use burn_backend::ops::{
    DeformConv2dBackward, MaxPool1dBackward, MaxPool1dWithIndices, MaxPool2dBackward,
    MaxPool2dWithIndices, TransactionPrimitive,
};
use burn_backend::quantization::QuantizationParametersPrimitive;
use burn_backend::TensorPrimitive;

pub fn primitive_to_inner<B: TrackedAutodiff>(p: TensorPrimitive<Ddp<B>>) -> TensorPrimitive<B> {
    match p {
        TensorPrimitive::Float(t) => TensorPrimitive::Float(t),
        TensorPrimitive::QFloat(t) => TensorPrimitive::QFloat(t),
    }
}

pub fn primitive_from_inner<B: TrackedAutodiff>(p: TensorPrimitive<B>) -> TensorPrimitive<Ddp<B>> {
    match p {
        TensorPrimitive::Float(t) => TensorPrimitive::Float(t),
        TensorPrimitive::QFloat(t) => TensorPrimitive::QFloat(t),
    }
}

pub fn qparams_to_inner<B: TrackedAutodiff>(
    q: QuantizationParametersPrimitive<Ddp<B>>,
) -> QuantizationParametersPrimitive<B> {
    QuantizationParametersPrimitive { scales: q.scales }
}

/// The read order lives in a private field that `execute_async` has already
/// taken out before calling `tr_execute`, so the constructor loses nothing.
pub fn transaction_to_inner<B: TrackedAutodiff>(
    t: TransactionPrimitive<Ddp<B>>,
) -> TransactionPrimitive<B> {
    TransactionPrimitive::new(t.read_floats, t.read_qfloats, t.read_ints, t.read_bools)
}

pub fn deform_conv2d_backward_from_inner<B: TrackedAutodiff>(
    b: DeformConv2dBackward<B>,
) -> DeformConv2dBackward<Ddp<B>> {
    DeformConv2dBackward::new(
        b.x_grad,
        b.offset_grad,
        b.weight_grad,
        b.mask_grad,
        b.bias_grad,
    )
}

pub fn max_pool1d_with_indices_from_inner<B: TrackedAutodiff>(
    r: MaxPool1dWithIndices<B>,
) -> MaxPool1dWithIndices<Ddp<B>> {
    MaxPool1dWithIndices::new(r.output, r.indices)
}

pub fn max_pool1d_backward_from_inner<B: TrackedAutodiff>(
    r: MaxPool1dBackward<B>,
) -> MaxPool1dBackward<Ddp<B>> {
    MaxPool1dBackward::new(r.x_grad)
}

pub fn max_pool2d_with_indices_from_inner<B: TrackedAutodiff>(
    r: MaxPool2dWithIndices<B>,
) -> MaxPool2dWithIndices<Ddp<B>> {
    MaxPool2dWithIndices::new(r.output, r.indices)
}

pub fn max_pool2d_backward_from_inner<B: TrackedAutodiff>(
    r: MaxPool2dBackward<B>,
) -> MaxPool2dBackward<Ddp<B>> {
    MaxPool2dBackward::new(r.x_grad)
}
