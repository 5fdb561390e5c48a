//! A module walk written once for both Burns.
//!
//! Burn's `ModuleVisitor` and `ModuleMapper` carry the backend as a type
//! parameter in Burn 0.21 and not in Burn 0.22, so no function generic over
//! a module can be written for both. The shared code walks through these
//! traits instead; each front-end's shim implements Burn's visitor and
//! mapper once, for any [`Visit`] or [`Rewrite`], and hands out the walk of
//! a module as a closure (`shim::walker(&model)`, `shim::rewriter(model)`).

use super::collective::CollectiveTensor;
use crate::{ProcessGroup, Result};
use burn::tensor::{DType, TensorData};

/// Which kind of tensor a parameter holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Float,
    Int,
    Bool,
}

/// One parameter of a module, as the shared code reads it.
pub(crate) trait ParamView {
    /// Float, int or bool.
    fn kind(&self) -> Kind;
    /// Burn's `ParamId`, which survives optimizer steps.
    fn id(&self) -> u64;
    fn dims(&self) -> Vec<usize>;
    fn dtype(&self) -> DType;
    /// Whether it is trained: a float tensor that requires gradients.
    fn require_grad(&self) -> bool;
    /// Whether its device tracks gradients at all (int and bool: `false`).
    fn autodiff(&self) -> bool;
    /// Its values.
    fn data(&self) -> TensorData;
}

/// What the shared code reads of a parameter's tensor: each shim implements
/// it for its Burn's float, int and bool tensors.
pub(crate) trait TensorFacts: Clone {
    fn dims(&self) -> Vec<usize>;
    fn dtype(&self) -> DType;
    fn into_data(self) -> TensorData;
}

/// A parameter as a shim's walk hands it over: what Burn says of it, and its
/// tensor (taken out while a [`Rewrite`] replaces it).
pub(crate) struct Held<T> {
    pub kind: Kind,
    pub id: u64,
    pub require_grad: bool,
    pub autodiff: bool,
    pub tensor: Option<T>,
}

impl<T> Held<T> {
    /// The tensor (there while no rewrite holds it).
    pub fn tensor(&self) -> &T {
        self.tensor.as_ref().expect("a parameter's tensor")
    }
}

impl<T: TensorFacts> ParamView for Held<T> {
    fn kind(&self) -> Kind {
        self.kind
    }
    fn id(&self) -> u64 {
        self.id
    }
    fn dims(&self) -> Vec<usize> {
        self.tensor().dims()
    }
    fn dtype(&self) -> DType {
        self.tensor().dtype()
    }
    fn require_grad(&self) -> bool {
        self.require_grad
    }
    fn autodiff(&self) -> bool {
        self.autodiff
    }
    fn data(&self) -> TensorData {
        self.tensor().clone().into_data()
    }
}

/// Marks a tensor a collective replaced as a parameter again (float:
/// `require_grad`; int: as it is). Each shim implements it.
pub(crate) trait Retrain {
    fn retrain(self) -> Self;
}

impl<T: TensorFacts + CollectiveTensor + Retrain> ParamSlot for Held<T> {
    fn broadcast(&mut self, group: &ProcessGroup, root: usize) -> Result<()> {
        let tensor = self.tensor.take().expect("a parameter's tensor");
        let result = super::collective::broadcast(group, tensor.clone(), root);
        self.tensor = Some(match &result {
            Ok(value) if self.require_grad => value.clone().retrain(),
            Ok(value) => value.clone(),
            Err(_) => tensor, // the module is dropped with the error
        });
        result.map(drop)
    }
}

/// What a read-only walk does with each parameter, in declaration order.
pub(crate) trait Visit {
    fn param(&mut self, param: &dyn ParamView);
    /// A submodule (field, list element) begins: `name` is its field name
    /// or index.
    fn enter_module(&mut self, _name: &str) {}
    fn exit_module(&mut self) {}
}

/// A parameter a [`Rewrite`] may replace.
pub(crate) trait ParamSlot: ParamView {
    /// Takes rank `root`'s value (the tensor collective: NCCL for CUDA
    /// tensors), keeping whether it requires gradients.
    fn broadcast(&mut self, group: &ProcessGroup, root: usize) -> Result<()>;
}

/// What a rewriting walk does with each float and int parameter, in
/// declaration order (bool parameters are left as they are).
pub(crate) trait Rewrite {
    fn param(&mut self, param: &mut dyn ParamSlot);
}

/// The walk of one module: calls the visitor with each of its parameters.
pub(crate) trait Walker: Fn(&mut dyn Visit) {}
impl<F: Fn(&mut dyn Visit)> Walker for F {}

/// The id of a module's first trainable parameter, which names its scope in
/// the session.
pub(crate) fn first_trainable(walk: impl Walker) -> Option<u64> {
    struct First(Option<u64>);
    impl Visit for First {
        fn param(&mut self, param: &dyn ParamView) {
            if self.0.is_none() && param.require_grad() {
                self.0 = Some(param.id());
            }
        }
    }
    let mut first = First(None);
    walk(&mut first);
    first.0
}
