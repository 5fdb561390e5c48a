//! `--mode checkpoint`: the sharded optimizer's checkpoints of the Linear
//! stack with AdamW, in parts (`save_parts`/`load_parts`) or whole
//! (`consolidate`, one file written by rank 0), with each rank's peak
//! resident memory while it trains and while it saves or loads. Save on
//! one world size (`--checkpoint-dir DIR`), resume on another (`--resume`):
//! the resume trains `--iters` steps after loading, so its training peak
//! is measured in the same process. With `--compare FILE` each step's
//! global batch is the same whatever the world size: the save goes on 2
//! steps past the save and rank 0 writes the parameters to FILE (the
//! uninterrupted run); the resume's first 2 steps are those, and every rank
//! prints how far its parameters then are from FILE.

use crate::zero::Stack;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::Device;
use burn_ddp_22::{ProcessGroup, ShardedOptimizer};
use burn_ddp_examples_common::bench::median;
use burn_ddp_examples_common::fail;
use std::path::Path;
use std::time::Instant;

/// How the checkpoint is written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum Format {
    /// Each rank writes its part (`save_parts`), each reads its part (`load_parts`).
    Parts,
    /// Rank 0 gathers the whole state and writes one file (`consolidate`);
    /// every rank reads all of it.
    Whole,
    /// In parts, written by a thread while training goes on
    /// (`save_parts_in_background`); resumed as `parts`.
    Background,
}

/// Forgets the peak so far: `VmHWM` starts again from the current size.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The peak resident memory since the last reset (`VmHWM`), in MiB.
fn peak_mib() -> f64 {
    crate::zero::peak_rss_mib()
}

pub struct Run<'a> {
    pub group: &'a ProcessGroup,
    pub width: usize,
    pub layers: usize,
    pub iters: usize,
    pub batch: usize,
    pub device: &'a Device,
    pub dir: &'a Path,
    pub format: Format,
    pub resume: bool,
    /// The uninterrupted run's parameters, written or compared against.
    pub compare: Option<&'a Path>,
}

/// Steps past the save that the uninterrupted run and the resume compare.
const COMPARED_STEPS: u64 = 2;

pub fn run(args: Run<'_>) {
    let Run {
        group,
        width,
        layers,
        iters,
        batch,
        device,
        dir,
        format,
        resume,
        compare,
    } = args;
    let rank = group.rank();
    let world = group.world_size();
    // Each step's global batch from its number (with --compare), or fresh.
    let step = |model: Stack, optimizer: &mut ShardedOptimizer, number: u64| {
        let loss = match compare {
            Some(_) => model.loss_of_step(number, (rank, world), batch, width, device),
            None => model.loss(batch, width, device),
        };
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let model = optimizer
            .step(1e-4, model, grads)
            .unwrap_or_else(|e| fail(Some(rank), e));
        model.layers[0].weight.val().into_data(); // waits for the step's kernels
        model
    };
    let whole_file = dir.join("whole");
    let mut optimizer = ShardedOptimizer::new(AdamWConfig::new().init(), group)
        .unwrap_or_else(|e| fail(Some(rank), e));
    let model = Stack::new(width, layers, device);
    reset_peak();
    let started = Instant::now();
    // The number of the next step: the saved run's count after a resume.
    let mut next: u64 = 0;
    let model = if resume {
        match format {
            Format::Parts | Format::Background => {
                let (model, info) = optimizer
                    .load_parts(model, dir)
                    .unwrap_or_else(|e| fail(Some(rank), e));
                next = steps_saved(&info);
                model
            }
            Format::Whole => {
                let checkpoint = burn_ddp_22::checkpoint::load(&whole_file)
                    .unwrap_or_else(|e| fail(Some(rank), e));
                let model = checkpoint
                    .load_model(model)
                    .unwrap_or_else(|e| fail(Some(rank), e));
                let whole = checkpoint
                    .load_optimizer(AdamWConfig::new().init())
                    .unwrap_or_else(|e| fail(Some(rank), e));
                optimizer =
                    ShardedOptimizer::new(whole, group).unwrap_or_else(|e| fail(Some(rank), e));
                next = checkpoint.epoch as u64;
                model
            }
        }
    } else {
        model
    };
    let (load_s, load_peak) = (started.elapsed().as_secs_f64(), peak_mib());
    let mut model = burn_ddp_22::wrap(model, group).unwrap_or_else(|e| fail(Some(rank), e));
    group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
    reset_peak();
    let mut steps = Vec::new();
    for i in 0..iters {
        let started = Instant::now();
        model = step(model, &mut optimizer, next);
        next += 1;
        steps.push(started.elapsed().as_secs_f64());
        if let (true, Some(file), true) = (resume, compare, i as u64 + 1 == COMPARED_STEPS) {
            compare_with(&model, file, rank);
        }
    }
    let train_peak = peak_mib();
    let params = model.parameters();
    if resume {
        println!(
            "rank {rank}/{world}: {params} parameters, {format:?}: load {load_s:.1} s, peak RSS \
             while loading {load_peak:.0} MiB; training {iters} steps afterwards: peak RSS \
             {train_peak:.0} MiB; load / training = {:.2}",
            load_peak / train_peak
        );
        return;
    }
    group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
    reset_peak();
    let started = Instant::now();
    match format {
        Format::Parts => {
            optimizer
                .save_parts(&model, dir, &format!("{iters} steps"))
                .unwrap_or_else(|e| fail(Some(rank), e));
        }
        Format::Background => {
            let save = optimizer
                .save_parts_in_background(&model, dir, &format!("{iters} steps"))
                .unwrap_or_else(|e| fail(Some(rank), e));
            let copied = started.elapsed().as_secs_f64();
            // As many steps as before, while the thread writes.
            let mut during = Vec::new();
            while during.len() < iters {
                let started = Instant::now();
                model = step(model, &mut optimizer, next);
                next += 1;
                during.push(started.elapsed().as_secs_f64());
            }
            let written = save.is_written();
            let waited = Instant::now();
            save.finish().unwrap_or_else(|e| fail(Some(rank), e));
            let (with, without) = (median(during), median(steps.clone()));
            println!(
                "rank {rank}: background save: copied out in {copied:.2} s; {iters} steps \
                 during it (written when they ended: {written}): median step {:.0} ms, \
                 without a save {:.0} ms ({:.2}); finish waited {:.2} s",
                with * 1e3,
                without * 1e3,
                with / without,
                waited.elapsed().as_secs_f64()
            );
        }
        Format::Whole => {
            let whole = optimizer
                .consolidate(&model)
                .unwrap_or_else(|e| fail(Some(rank), e));
            if let Some(whole) = whole {
                std::fs::create_dir_all(dir).unwrap_or_else(|e| fail(Some(rank), e));
                burn_ddp_22::checkpoint::save_atomic(&whole_file, &model, Some(&whole), iters)
                    .unwrap_or_else(|e| fail(Some(rank), e));
            }
            group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
        }
    }
    let (save_s, save_peak) = (started.elapsed().as_secs_f64(), peak_mib());
    if let (Some(file), Format::Parts | Format::Whole) = (compare, format) {
        // The uninterrupted run: on past the save, then rank 0 keeps the result.
        for _ in 0..COMPARED_STEPS {
            model = step(model, &mut optimizer, next);
            next += 1;
        }
        if rank == 0 {
            let bytes: Vec<u8> = model
                .values()
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            std::fs::write(file, bytes).unwrap_or_else(|e| fail(Some(rank), e));
        }
    }
    println!(
        "rank {rank}/{world}: {params} parameters, {format:?}: training {iters} steps: peak RSS \
         {train_peak:.0} MiB; save {save_s:.1} s, peak RSS while saving {save_peak:.0} MiB; \
         save / training = {:.2}",
        save_peak / train_peak
    );
}

/// The step count a save in parts recorded in its info (`"N steps"`).
fn steps_saved(info: &str) -> u64 {
    info.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Prints how far `model`'s parameters are from the uninterrupted run's in
/// `file` (the largest difference relative to the largest magnitude).
fn compare_with(model: &Stack, file: &Path, rank: usize) {
    let bytes = std::fs::read(file).unwrap_or_else(|e| fail(Some(rank), e));
    let reference: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let values = model.values();
    if values.len() != reference.len() {
        fail(
            Some(rank),
            "--compare: the file holds another model's parameters",
        );
    }
    let scale = reference
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    let gap = (values.iter().zip(&reference)).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
    println!(
        "rank {rank}: {COMPARED_STEPS} steps after the resume, {gap:e} from the uninterrupted \
         run (largest difference / largest magnitude)"
    );
}
