//! Checking that every rank holds the same parameters (the glue: the
//! comparison is burn-ddp-comm's `replicas`).

use crate::{ProcessGroup, Result};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{BasicOps, Bool, Int, Tensor};
use burn_ddp_comm::replicas::ParamDigest;

/// Checks that every rank of `group` holds exactly rank 0's parameters, every
/// parameter tensor of `model` (trained or not) compared by a digest of its
/// shape and bytes. Returns how many tensors were compared; a difference is an
/// error on every rank naming the first parameter that differs (its path in
/// the module) and the ranks it differs on. Collective: every rank calls it at
/// the same point, for example after training.
///
/// Saved records cannot be compared with `cmp`: they embed each process's
/// parameter ids.
pub fn check_replicas<B: Backend, M: Module<B>>(model: &M, group: &ProcessGroup) -> Result<usize> {
    let mut digests = Digests::default();
    model.visit(&mut digests);
    burn_ddp_comm::replicas::check_replicas(group, &digests.params)
}

/// A fingerprint of every parameter tensor of `model` (paths, shapes and
/// bytes; [`burn_ddp_comm::replicas::fingerprint`]): print it at the end of
/// two runs to check that they ended with exactly the same parameters (a run
/// restarted from snapshots and an uninterrupted one, say). Local: no
/// collective.
pub fn parameters_fingerprint<B: Backend, M: Module<B>>(model: &M) -> u64 {
    let mut digests = Digests::default();
    model.visit(&mut digests);
    burn_ddp_comm::replicas::fingerprint(&digests.params)
}

#[derive(Default)]
struct Digests {
    path: Vec<String>,
    params: Vec<ParamDigest>,
}

impl Digests {
    fn push<B: Backend, const D: usize, K: BasicOps<B>>(
        &mut self,
        tensor: Tensor<B, D, K>,
        trainable: Option<bool>,
    ) {
        let shape = tensor.dims().to_vec();
        let data = tensor.into_data();
        self.params.push(ParamDigest::new(
            self.path.join("."),
            trainable,
            &shape,
            data.as_bytes(),
        ));
    }
}

impl<B: Backend> ModuleVisitor<B> for Digests {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        // Without autodiff no tensor requires gradients: unknown, not "a buffer".
        let trainable = B::ad_enabled(&value.device()).then(|| value.is_require_grad());
        self.push(value, trainable);
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        self.push(param.val(), Some(false));
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        self.push(param.val(), Some(false));
    }
}
