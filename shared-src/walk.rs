//! A module walk written once for both Burns.
//!
//! Burn's `ModuleVisitor` and `ModuleMapper` carry the backend as a type
//! parameter in Burn 0.21 and not in Burn 0.22, so no function generic over
//! a module can be written for both. The shared code walks through the
//! contract's `Visit` and `Rewrite` instead; each front-end's shim
//! implements Burn's visitor and mapper once, for any of them, and hands
//! out the walk of a module as a closure (`shim::walker(&model)`,
//! `shim::rewrite(model, ..)`). Here: the parameter as a walk holds it, and
//! the walks the shared code needs more than once.

use super::contract::{CollectiveTensor, Kind, ParamSlot, ParamView, Retrain, TensorFacts, Visit};
use burn::tensor::{DType, TensorData};
use burn_ddp_comm::{ProcessGroup, Result};

/// A parameter as a shim's walk hands it over: what Burn says of it, and its
/// tensor (taken out while a rewrite replaces it).
pub(crate) struct Held<T> {
    pub kind: Kind,
    pub id: u64,
    pub require_grad: bool,
    pub autodiff: bool,
    pub tensor: Option<T>,
}

impl<T> Held<T> {
    /// A float parameter: trained when it requires gradients (`autodiff`:
    /// whether its device tracks them at all).
    pub fn float(id: u64, tensor: T, require_grad: bool, autodiff: bool) -> Self {
        Self {
            kind: Kind::Float,
            id,
            require_grad,
            autodiff,
            tensor: Some(tensor),
        }
    }

    /// An int or bool parameter (never trained).
    pub fn other(kind: Kind, id: u64, tensor: T) -> Self {
        Self {
            kind,
            id,
            require_grad: false,
            autodiff: false,
            tensor: Some(tensor),
        }
    }

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

    fn load(&mut self, data: TensorData) {
        let device = self.tensor().device();
        let value = T::from_data(data, &device);
        self.tensor = Some(if self.require_grad {
            value.retrain()
        } else {
            value
        });
    }
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
