//! `mnist22 --learner`: the same CNN and hyper-parameters trained through
//! Burn 0.22's Learner (`SupervisedTraining`), the shape of Burn's own MNIST
//! example, made multi-process by burn-ddp-22's strategy. The lines marked
//! `burn-ddp` are all that differ from a single-process Learner program.

use crate::{load, MnistBatcher, Net};
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::Dataset;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamWConfig;
use burn::tensor::{Device, Int, Tensor};
use burn::train::metric::{AccuracyMetric, LossMetric};
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep,
};
use burn_ddp_22::train::{DdpSupervisedTraining, DdpTraining, SilentRenderer};
use burn_ddp_examples_common::learner::{
    announce_resume, print_epoch, refuse_another_run, stopped_before_the_end,
};
use burn_ddp_examples_common::mnist::{MnistArgs, MnistTrainingConfig, ResumeFrom};
use burn_ddp_examples_common::{fail, run_config};

type MnistBatch = (Tensor<4>, Tensor<1, Int>);

impl Net {
    fn forward_classification(
        &self,
        images: Tensor<4>,
        targets: Tensor<1, Int>,
    ) -> ClassificationOutput {
        let output = self.forward(images);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), targets.clone());
        ClassificationOutput::new(loss, output, targets)
    }
}

impl TrainStep for Net {
    type Input = MnistBatch;
    type Output = ClassificationOutput;

    fn step(&self, (images, targets): MnistBatch) -> TrainOutput<ClassificationOutput> {
        let item = self.forward_classification(images, targets);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl InferenceStep for Net {
    type Input = MnistBatch;
    type Output = ClassificationOutput;

    fn step(&self, (images, targets): MnistBatch) -> ClassificationOutput {
        self.forward_classification(images, targets)
    }
}

pub fn train(args: &MnistArgs, device: Device) {
    let group = burn_ddp_22::init_process_group().unwrap_or_else(|e| fail(None, e)); // burn-ddp
    let rank = group.rank();
    // Each rank's loader batch: the ranks together train with world_size times it.
    let batch_size = match args.global_batch_size {
        Some(global) => burn_ddp_22::data::batch_size_per_rank(&group, global) // burn-ddp
            .unwrap_or_else(|e| fail(None, e)),
        None => args.batch_size,
    };
    let (train_set, test_set) = load(args, rank);
    let directory = &args.artifact_dir;
    let config = MnistTrainingConfig::new(
        args.epochs,
        batch_size,
        group.world_size(),
        args.lr,
        args.seed,
        train_set.len(),
    );
    // burn-ddp: the run's handle; one line per epoch from the global figures.
    let ddp = DdpTraining::new(&group, directory).on_epoch_end(print_epoch);
    // Rank 0 creates the folder, the others wait (kept as it is: a resume needs
    // its checkpoints; `recreate_artifact_dir` would empty it first).
    ddp.create_artifact_dir().unwrap_or_else(|e| fail(None, e)); // burn-ddp
    let resume = match args.resume {
        // burn-ddp: Burn 0.22's launch loads it on every rank; check they all have it.
        Some(ResumeFrom::Epoch(epoch)) => {
            ddp.verify_checkpoint(epoch)
                .unwrap_or_else(|e| fail(None, e));
            Some(epoch)
        }
        Some(ResumeFrom::Auto) => {
            refuse_another_run(&config, &directory.join("config.json"), &group);
            // burn-ddp: rank 0 finds the newest whole checkpoint, every rank takes it.
            let latest = ddp.latest_checkpoint().unwrap_or_else(|e| fail(None, e));
            if ddp.is_main() {
                announce_resume(latest, directory);
            }
            latest
        }
        None => None,
    };
    if ddp.is_main() {
        // burn-ddp: one writer per file; every rank would write the same config.
        run_config::save(&config, &directory.join("config.json"))
            .unwrap_or_else(|e| fail(Some(rank), e));
    }
    let train_shard = ddp // burn-ddp
        .shard_with(
            train_set.clone(),
            burn_ddp_22::distributed_sampler(&group, train_set.len())
                .unwrap_or_else(|e| fail(Some(rank), e))
                .seed(args.seed),
        );
    let test_shard = ddp
        .shard_eval(test_set)
        .unwrap_or_else(|e| fail(Some(rank), e)); // burn-ddp
    let loader_train = DataLoaderBuilder::new(MnistBatcher)
        .batch_size(batch_size)
        .set_device(device.clone())
        .build(train_shard);
    let loader_valid = DataLoaderBuilder::new(MnistBatcher)
        .batch_size(args.test_batch_size)
        .set_device(device.clone().inner())
        .build(test_shard);

    device.seed(args.seed);
    let model = Net::new(&device);
    let mut training = SupervisedTraining::new(directory, loader_train, loader_valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .with_default_checkpointers()
        .num_epochs(args.epochs)
        // One line per epoch (print_epoch) instead of a line per iteration.
        .renderer(Box::new(SilentRenderer));
    if let Some(epoch) = resume {
        training = training.checkpoint(epoch);
    }
    let training = training.ddp(&ddp); // burn-ddp
    let result = training.launch(Learner::new(model, AdamWConfig::new().init(), args.lr));
    if let Some(error) = &result.error {
        fail(Some(rank), format!("training failed: {error}"));
    }
    // burn-ddp: a Ctrl-C or SIGTERM on any rank stopped every rank at the same
    // iteration (unless it came after the last one: then the run is complete).
    // Stop here: the model in hand is half-trained, and must not replace a
    // finished one; the checkpoints are what to go on from.
    if let Some(signal) = stopped_before_the_end(&group, directory, args.epochs) {
        burn_ddp_22::destroy_process_group().unwrap_or_else(|e| fail(Some(rank), e));
        std::process::exit(128 + signal);
    }
    // burn-ddp: every rank holds rank 0's parameters (a digest per tensor).
    let compared = burn_ddp_22::replicas::check_replicas(&result.model, &group)
        .unwrap_or_else(|e| fail(None, e));
    if group.is_main() {
        println!(
            "replicas identical: {compared} parameter tensors on {} ranks",
            group.world_size()
        );
        // Equal for two runs exactly when they ended with the same parameters.
        println!(
            "parameters fingerprint: {:016x}",
            burn_ddp_22::replicas::parameters_fingerprint(&result.model)
        );
        // burn-ddp: rank 0 alone saves, for every rank, atomically.
        let path = burn_ddp_22::checkpoint::save_atomic(
            directory.join("model"),
            &result.model,
            None,
            args.epochs,
        )
        .unwrap_or_else(|e| fail(Some(rank), e));
        println!("saved {}", path.display());
    }
    burn_ddp_22::destroy_process_group().unwrap_or_else(|e| fail(Some(rank), e));
    // burn-ddp
}
