//! `mnist22 --learner`: the same CNN and hyper-parameters trained through
//! Burn 0.22's Learner (`SupervisedTraining`), the shape of Burn's own MNIST
//! example, made multi-process by burn-ddp-22's strategy. The lines marked
//! `burn-ddp` are all that differ from a single-process Learner program; the
//! run around `fit` (data, settings, resume choice, stop, saved model) is
//! examples-common's `learner::train`, shared with the Burn 0.21 program.

use crate::{Mnist, MnistBatcher, MnistCnn, Net};
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::Dataset;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamWConfig;
use burn::tensor::{Int, Tensor};
use burn::train::metric::{AccuracyMetric, LossMetric};
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep,
};
use burn_ddp_22::train::{DdpSupervisedTraining, DdpTraining, SilentRenderer};
use burn_ddp_22::ProcessGroup;
use burn_ddp_examples_common::fail;
use burn_ddp_examples_common::idx::Split;
use burn_ddp_examples_common::learner::{print_epoch, LearnerTraining};
use burn_ddp_examples_common::mnist::MnistArgs;
use burn_ddp_examples_common::training::SaveError;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

impl LearnerTraining for MnistCnn {
    type Ddp = DdpTraining;
    type Model = Net;

    fn ddp(&self, group: &ProcessGroup, directory: &Path) -> DdpTraining {
        // burn-ddp: under `burn-ddp-run --on-failure continue`, a rank that
        // is gone costs a step, not the run.
        DdpTraining::new(group, directory)
            .on_epoch_end(print_epoch)
            .with_recovery()
    }

    fn group(&self, ddp: &DdpTraining) -> ProcessGroup {
        ddp.group()
    }

    fn create_artifact_dir(&self, ddp: &DdpTraining) -> burn_ddp_22::Result<()> {
        ddp.create_artifact_dir()
    }

    fn latest_checkpoint(&self, ddp: &DdpTraining) -> burn_ddp_22::Result<Option<usize>> {
        ddp.latest_checkpoint()
    }

    fn verify_checkpoint(&self, ddp: &DdpTraining, epoch: usize) -> burn_ddp_22::Result<()> {
        ddp.verify_checkpoint(epoch)
    }

    fn fit(
        &self,
        ddp: &DdpTraining,
        args: &MnistArgs,
        batch_size: usize,
        (train_set, test_set): (Arc<Split>, Arc<Split>),
        resume: Option<usize>,
    ) -> Net {
        let rank = ddp.rank();
        let train_set = Mnist(train_set);
        let train_shard = ddp // burn-ddp
            .shard_with(
                train_set.clone(),
                burn_ddp_22::distributed_sampler(&ddp.group(), train_set.len())
                    .unwrap_or_else(|e| fail(Some(rank), e))
                    .seed(args.seed),
            );
        let test_shard = ddp
            .shard_eval(Mnist(test_set))
            .unwrap_or_else(|e| fail(Some(rank), e)); // burn-ddp
        let loader_train = DataLoaderBuilder::new(MnistBatcher)
            .batch_size(batch_size)
            .set_device(self.burn.device.clone())
            .build(train_shard);
        let loader_valid = DataLoaderBuilder::new(MnistBatcher)
            .batch_size(args.test_batch_size)
            .set_device(self.burn.device.clone().inner())
            .build(test_shard);

        self.burn.device.seed(args.seed);
        let model = Net::new(&self.burn.device);
        let mut training = SupervisedTraining::new(&args.artifact_dir, loader_train, loader_valid)
            .metrics((AccuracyMetric::new(), LossMetric::new()))
            .with_default_checkpointers()
            .num_epochs(args.epochs)
            // One line per epoch (print_epoch) instead of a line per iteration.
            .renderer(Box::new(SilentRenderer));
        if let Some(epoch) = resume {
            training = training.checkpoint(epoch);
        }
        let training = training.ddp(ddp); // burn-ddp
        let result = training.launch(Learner::new(model, AdamWConfig::new().init(), args.lr));
        if let Some(error) = &result.error {
            fail(Some(rank), format!("training failed: {error}"));
        }
        result.model
    }

    fn check_replicas(&self, model: &Net, group: &ProcessGroup) -> burn_ddp_22::Result<usize> {
        burn_ddp_22::replicas::check_replicas(model, group)
    }

    fn fingerprint(&self, model: &Net) -> u64 {
        burn_ddp_22::replicas::parameters_fingerprint(model)
    }

    fn save_model(&self, model: Net, path: &Path, epochs: usize) -> Result<PathBuf, SaveError> {
        Ok(burn_ddp_22::checkpoint::save_atomic(
            path, &model, None, epochs,
        )?)
    }
}
