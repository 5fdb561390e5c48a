//! Checking that every rank holds the same parameters (the walk and the
//! digests are the shared `replicas`).

use crate::shim;
use burn::module::Module;
use burn_ddp_comm::{CommError, ProcessGroup, Result};

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
    crate::shared::replicas::check(group, shim::walker(model))
}

/// A fingerprint of every parameter tensor of `model` (paths, shapes and
/// bytes; [`burn_ddp_training::replicas::fingerprint`]): print it at the end
/// of two runs to check that they ended with exactly the same parameters.
/// Local: no collective.
pub fn parameters_fingerprint<M: Module>(model: &M) -> u64 {
    crate::shared::replicas::fingerprint(shim::walker(model))
}

/// Every float parameter of `model`, in declaration order, as f32: to
/// compare two runs to a tolerance where their fingerprints cannot agree
/// (another world size sums in another order). Local: no collective.
pub fn parameter_values<M: Module>(model: &M) -> Vec<f32> {
    crate::shared::replicas::values(shim::walker(model))
}

/// Rank 0's model and optimizer state on every rank of `group` (loaded into
/// `model` and `optimizer` on the others, the parameters' ids with them, so
/// the optimizer's state finds its parameters): what a replacement that
/// joined the running job ([`admit_joiners`](crate::admit_joiners)) needs.
/// Wrap the model over `group` afterwards. Collective.
pub fn share_training_state<M: Module>(
    model: M,
    optimizer: burn::optim::ModuleOptimizer,
    group: &ProcessGroup,
) -> Result<(M, burn::optim::ModuleOptimizer)> {
    use burn::store::{ModuleRecord, RecordError};
    use burn::tensor::Bytes;
    use burn_ddp_training::files::Sections;
    let rank = group.rank();
    let failed = |what: &str, e: String| CommError::InvalidArgument {
        rank,
        message: format!("the training state cannot be {what}: {e}"),
    };
    let record_error = |what: &'static str| move |e: RecordError| failed(what, e.to_string());
    let bytes = if rank == 0 {
        let written = record_error("written");
        let weights = model.clone().into_record().into_bytes().map_err(written)?;
        let state = optimizer.into_bytes().map_err(record_error("written"))?;
        let sections = Sections::new()
            .with("model", weights.to_vec())
            .with("optimizer", state.to_vec());
        sections.encode()
    } else {
        Vec::new()
    };
    let bytes = burn_ddp_training::recovery::broadcast_bytes(group, bytes)?;
    if rank == 0 {
        return Ok((model, optimizer));
    }
    let sections = Sections::decode(&bytes).map_err(|e| failed("read", e))?;
    let section = |name: &str| {
        let bytes = sections
            .get(name)
            .ok_or_else(|| failed("read", format!("no {name}")))?;
        Ok::<_, CommError>(Bytes::from_bytes_vec(bytes.to_vec()))
    };
    let weights = ModuleRecord::from_bytes(section("model")?).map_err(record_error("read"))?;
    let model = model
        .try_load_record(weights)
        .map_err(record_error("read"))?;
    let optimizer = optimizer
        .from_bytes(section("optimizer")?)
        .map_err(record_error("read"))?;
    Ok((model, optimizer))
}
