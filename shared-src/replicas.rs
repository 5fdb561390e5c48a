//! Checking that every rank holds the same parameters (the module walk; the
//! comparison is burn-ddp-training's `replicas`).

use super::contract::{Kind, ParamView, Visit};
use super::walk::Walker;
use burn_ddp_comm::{ProcessGroup, Result};
use burn_ddp_training::replicas::{self, ParamDigest};

/// Every rank holds exactly rank 0's tensors (see the crate's `check_replicas`).
pub(crate) fn check(group: &ProcessGroup, walk: impl Walker) -> Result<usize> {
    replicas::check_replicas(group, &digests(walk))
}

/// The fingerprint of a module's tensors (see the crate's `parameters_fingerprint`).
pub(crate) fn fingerprint(walk: impl Walker) -> u64 {
    replicas::fingerprint(&digests(walk))
}

/// Every float parameter's values, in the walk's order, as f32 (see the
/// crate's `parameter_values`).
pub(crate) fn values(walk: impl Walker) -> Vec<f32> {
    struct Values(Vec<f32>);
    impl Visit for Values {
        fn param(&mut self, param: &dyn ParamView) {
            if param.kind() == Kind::Float {
                self.0.extend(param.data().iter::<f32>());
            }
        }
    }
    let mut values = Values(Vec::new());
    walk(&mut values);
    values.0
}

fn digests(walk: impl Walker) -> Vec<ParamDigest> {
    let mut digests = Digests::default();
    walk(&mut digests);
    digests.params
}

#[derive(Default)]
struct Digests {
    path: Vec<String>,
    params: Vec<ParamDigest>,
}

impl Visit for Digests {
    fn param(&mut self, param: &dyn ParamView) {
        // Without autodiff no tensor requires gradients: unknown, not "a buffer".
        let trainable = match param.kind() {
            Kind::Float => param.autodiff().then(|| param.require_grad()),
            Kind::Int | Kind::Bool => Some(false),
        };
        self.params.push(ParamDigest::new(
            self.path.join("."),
            trainable,
            &param.dims(),
            param.data().as_bytes(),
        ));
    }

    fn enter_module(&mut self, name: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self) {
        self.path.pop();
    }
}
