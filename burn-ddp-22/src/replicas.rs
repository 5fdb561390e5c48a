//! Checking that every rank holds the same parameters (the glue: the
//! comparison is burn-ddp-comm's `replicas`).

use crate::{ProcessGroup, Result};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::kind::Basic;
use burn::tensor::{Bool, Int, Tensor, TensorData};
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
pub fn check_replicas<M: Module>(model: &M, group: &ProcessGroup) -> Result<usize> {
    let mut digests = Digests::default();
    model.visit(&mut digests);
    burn_ddp_comm::replicas::check_replicas(group, &digests.params)
}

/// A fingerprint of every parameter tensor of `model` (paths, shapes and
/// bytes; [`burn_ddp_comm::replicas::fingerprint`]): print it at the end of
/// two runs to check that they ended with exactly the same parameters. Local:
/// no collective.
pub fn parameters_fingerprint<M: Module>(model: &M) -> u64 {
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
    fn push<const D: usize, K: Basic>(&mut self, tensor: Tensor<D, K>, trainable: Option<bool>) {
        let shape = tensor.dims().to_vec();
        let data: TensorData = tensor.into_data();
        self.params.push(ParamDigest::new(
            self.path.join("."),
            trainable,
            &shape,
            data.as_bytes(),
        ));
    }
}

impl ModuleVisitor for Digests {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let value = param.val();
        // Without autodiff no tensor requires gradients: unknown, not "a buffer".
        let trainable = value.is_autodiff().then(|| value.is_require_grad());
        self.push(value, trainable);
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        self.push(param.val(), Some(false));
    }

    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        self.push(param.val(), Some(false));
    }
}
