//! SyncBatchNorm's training pass, written once for both Burns: which group
//! the statistics are combined over, the statistics themselves (one
//! collective per layer), the running statistics, the normalisation, and the
//! errors.
//!
//! Per channel, each rank sums `x - K`, `(x - K)²` and its sample count,
//! where `K` is the running mean (the same on every rank, detached): sums
//! around a value close to the batch mean lose little to cancellation in the
//! one-pass variance. One sum over the ranks that autodiff goes through
//! (its backward sums the gradient over the ranks) gives every rank the
//! global batch's mean and biased variance; normalising by them, every
//! rank's input gets the gradient of one process holding the whole batch
//! (the statistics' gradients, PyTorch's `sum(dy)` and `sum(dy·x̂)`, are what
//! that backward sums). Counts are summed, not assumed equal: uneven batches
//! and a rank with no samples (it contributes zeros and still joins both
//! collectives) are exact.

use super::session::default_group;
use burn_ddp_comm::{CommError, LaunchEnv, ProcessGroup};

/// The group a SyncBatchNorm in training combines its statistics over: the
/// default group when it has several ranks; `None` in a world of one (then
/// it is Burn's BatchNorm).
///
/// # Panics
///
/// When the launcher started several ranks but `init_process_group` has not
/// been called: each rank would otherwise normalise by its own batch alone.
pub(crate) fn statistics_group(channels: usize) -> Option<ProcessGroup> {
    if let Some(group) = default_group() {
        return (group.world_size() > 1).then_some(group);
    }
    match LaunchEnv::from_env() {
        Ok(env) if env.world_size > 1 => panic!(
            "rank {}: SyncBatchNorm with {channels} channels ran in training before \
             init_process_group: the launcher started {} ranks, and without the process group \
             each rank would normalise by its own batch alone; call init_process_group() first",
            env.rank, env.world_size
        ),
        _ => None,
    }
}

/// The statistics could not be combined: names the rank, the layer and the
/// likeliest cause.
pub(crate) fn combine_failed(group: &ProcessGroup, channels: usize, err: CommError) -> ! {
    if let CommError::Config { .. } = err {
        panic!(
            "rank {}: SyncBatchNorm with {channels} channels: {err}",
            group.rank()
        )
    }
    panic!(
        "rank {}: SyncBatchNorm with {channels} channels: its statistics could not be summed \
         over the ranks ({err}); every rank must run the same SyncBatchNorm layers, with the \
         same channel counts, in the same order",
        group.rank()
    )
}

/// A layer's first training pass on `group`: every rank's layer at this
/// place has `channels` channels (one small all-gather per layer and
/// process), so ranks that built different layers fail naming it, before
/// their statistics (of different lengths) would mix.
pub(crate) fn check_ranks_agree(group: &ProcessGroup, layer: u64, channels: usize) {
    let gathered = group
        .gather_once(layer, channels as i64)
        .unwrap_or_else(|err| combine_failed(group, channels, err));
    let Some((place, all)) = gathered else {
        return;
    };
    if let Some((rank, theirs)) = all.iter().enumerate().find(|(_, c)| **c != channels as i64) {
        panic!(
            "rank {}: SyncBatchNorm with {channels} channels (the #{} this rank trained): rank \
             {rank}'s layer there has {theirs} channels; every rank must run the same \
             SyncBatchNorm layers, with the same channel counts, in the same order",
            group.rank(),
            place + 1
        );
    }
}

/// `input`'s channel count (its second axis) must be the layer's.
pub(crate) fn check_channels(group: &ProcessGroup, dims: &[usize], channels: usize) {
    assert!(
        dims.len() >= 2 && dims[1] == channels,
        "rank {}: SyncBatchNorm with {channels} channels got an input of shape {dims:?}; it \
         needs [batch, {channels}, ...]",
        group.rank()
    );
}

/// The training pass over the ranks of `$group`, for a layer `$norm` with
/// BatchNorm's fields and a `$sum` (the crate's tracked sum over the ranks,
/// `fn(&ProcessGroup, 1-d tensor) -> Result<1-d tensor>`): the normalised
/// `$input`, the running statistics updated alike on every rank. A macro
/// because the two Burns spell the tensor type differently (`Tensor<B, D>`,
/// `Tensor<D>`) while every operation on it is the same.
macro_rules! normalise_over_ranks {
    ($norm:expr, $input:expr, $group:expr, $sum:path, $dims:expr) => {{
        let norm = $norm;
        let input = $input;
        let group: &::burn_ddp_comm::ProcessGroup = $group;
        let device = input.device();
        let dims = input.dims();
        let channels = norm.gamma.val().dims()[0];
        $crate::shared::sync_batch_norm::check_channels(group, &dims, channels);
        $crate::shared::sync_batch_norm::check_ranks_agree(group, norm.gamma.id.val(), channels);
        let (batch, rest) = (dims[0], dims[2..].iter().product::<usize>());
        let mut unsqueezed = [1; $dims];
        unsqueezed[1] = channels;
        let shift = norm.running_mean.value().to_device(&device).detach();
        // [batch, channels, rest] is a view, not a copy: no transposition.
        let centred = input.clone().reshape([batch, channels, rest])
            - shift.clone().reshape([1, channels, 1]);
        let sums = centred.clone().sum_dim(2).sum_dim(0).reshape([channels]);
        let squares = centred.square().sum_dim(2).sum_dim(0).reshape([channels]);
        let counts = sums.zeros_like().detach().add_scalar((batch * rest) as f64);
        let global =
            $sum(group, Tensor::cat(vec![sums, squares, counts], 0)).unwrap_or_else(|err| {
                $crate::shared::sync_batch_norm::combine_failed(group, channels, err)
            });
        let total = global.clone().narrow(0, 2 * channels, channels);
        // 1, or 0 when no rank has a sample (all-empty global batch): then
        // the sums divide by one (zero offsets; the output has no elements)
        // and the running statistics stay as they are.
        let present = total.clone().clamp_max(1.0).detach();
        let absent = present.clone().neg().add_scalar(1.0);
        let total = total.clamp_min(1.0);
        let offset = global.clone().narrow(0, 0, channels) / total.clone();
        let mean = shift + offset.clone();
        let var = (global.narrow(0, channels, channels) / total - offset.square()).clamp_min(0.0);

        // Burn's update, kept exactly (x * 1 + old * 0 is x) unless absent.
        let momentum = norm.momentum;
        let running_mean = norm.running_mean.value_sync().to_device(&device);
        let running_var = norm.running_var.value_sync().to_device(&device);
        let new_mean = running_mean.clone().mul_scalar(1.0 - momentum)
            + mean.clone().detach().mul_scalar(momentum);
        let new_var = running_var.clone().mul_scalar(1.0 - momentum)
            + var.clone().detach().mul_scalar(momentum);
        norm.running_mean
            .update((new_mean * present.clone() + running_mean * absent.clone()).detach());
        norm.running_var
            .update((new_var * present + running_var * absent).detach());

        // (x - mean) / std * gamma + beta as x * scale + offset: two passes
        // over the input instead of four.
        let scale = norm.gamma.val() / var.add_scalar(norm.epsilon).sqrt();
        let offset = norm.beta.val() - mean * scale.clone();
        input * scale.reshape(unsqueezed) + offset.reshape(unsqueezed)
    }};
}
pub(crate) use normalise_over_ranks;
