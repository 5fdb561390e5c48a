//! `mnist --learner`: the same CNN and hyper-parameters trained through Burn's
//! Learner (`SupervisedTraining`), the shape of Burn's own MNIST example, made
//! multi-process by burn-ddp's strategy. The lines marked `burn-ddp` are all
//! that differ from a single-process Learner program; the run around `fit`
//! (data, settings, resume choice, stop, saved model) is examples-common's
//! `learner::train`, shared with the Burn 0.22 program.

use crate::net::Net;
use crate::{Mnist, MnistBatcher, MnistCnn};
use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamWConfig;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Int, Tensor};
use burn::train::metric::{AccuracyMetric, LossMetric};
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, SupervisedTraining, TrainOutput, TrainStep,
};
use burn_ddp::train::{DdpSupervisedTraining, DdpTraining, SilentRenderer};
use burn_ddp::ProcessGroup;
use burn_ddp_examples_common::fail;
use burn_ddp_examples_common::idx::Split;
use burn_ddp_examples_common::learner::{print_epoch, LearnerTraining};
use burn_ddp_examples_common::mnist::MnistArgs;
use burn_ddp_examples_common::training::SaveError;
use std::path::{Path, PathBuf};
use std::sync::Arc;

type MnistBatch<B> = (Tensor<B, 4>, Tensor<B, 1, Int>);

impl<B: Backend> Net<B> {
    fn forward_classification(
        &self,
        images: Tensor<B, 4>,
        targets: Tensor<B, 1, Int>,
    ) -> ClassificationOutput<B> {
        let output = self.forward(images);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), targets.clone());
        ClassificationOutput::new(loss, output, targets)
    }
}

impl<B: AutodiffBackend> TrainStep for Net<B> {
    type Input = MnistBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, (images, targets): MnistBatch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let item = self.forward_classification(images, targets);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for Net<B> {
    type Input = MnistBatch<B>;
    type Output = ClassificationOutput<B>;

    fn step(&self, (images, targets): MnistBatch<B>) -> ClassificationOutput<B> {
        self.forward_classification(images, targets)
    }
}

impl<B: AutodiffBackend> LearnerTraining for MnistCnn<B> {
    type Ddp = DdpTraining;
    type Model = Net<B::InnerBackend>;

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

    fn create_artifact_dir(&self, ddp: &DdpTraining) -> burn_ddp::Result<()> {
        ddp.create_artifact_dir()
    }

    fn latest_checkpoint(&self, ddp: &DdpTraining) -> burn_ddp::Result<Option<usize>> {
        ddp.latest_checkpoint()
    }

    fn verify_checkpoint(&self, ddp: &DdpTraining, epoch: usize) -> burn_ddp::Result<()> {
        ddp.verify_checkpoint(epoch)
    }

    fn fit(
        &self,
        ddp: &DdpTraining,
        args: &MnistArgs,
        batch_size: usize,
        (train_set, test_set): (Arc<Split>, Arc<Split>),
        resume: Option<usize>,
    ) -> Net<B::InnerBackend> {
        let rank = ddp.rank();
        let train_set = Mnist(train_set);
        let train_shard = ddp // burn-ddp
            .shard_with(
                train_set.clone(),
                burn_ddp::distributed_sampler(&ddp.group(), train_set.len())
                    .unwrap_or_else(|e| fail(Some(rank), e))
                    .seed(args.seed),
            );
        let test_shard = ddp
            .shard_eval(Mnist(test_set))
            .unwrap_or_else(|e| fail(Some(rank), e)); // burn-ddp
        let loader_train = DataLoaderBuilder::<B, _, _>::new(MnistBatcher)
            .batch_size(batch_size)
            .set_device(self.burn.device.clone())
            .build(train_shard);
        let loader_valid = DataLoaderBuilder::<B::InnerBackend, _, _>::new(MnistBatcher)
            .batch_size(args.test_batch_size)
            .set_device(self.burn.device.clone())
            .build(test_shard);

        B::seed(&self.burn.device, args.seed);
        let model = Net::<B>::new(&self.burn.device);
        let optimizer = AdamWConfig::new().init();
        let mut training = SupervisedTraining::new(&args.artifact_dir, loader_train, loader_valid)
            .metrics((AccuracyMetric::new(), LossMetric::new()))
            // burn-ddp: full precision (Burn's example uses CompactRecorder, half
            // precision), so a run resumed after a restart goes on exactly as an
            // uninterrupted one.
            .with_file_checkpointer(NamedMpkFileRecorder::<FullPrecisionSettings>::new())
            .num_epochs(args.epochs)
            // One line per epoch (print_epoch) instead of a line per iteration.
            .renderer(SilentRenderer);
        if let Some(epoch) = resume {
            training = training.checkpoint(epoch);
        }
        let training = training.ddp(ddp); // burn-ddp
        training
            .launch(Learner::new(model, optimizer, args.lr))
            .model
    }

    fn check_replicas(&self, model: &Self::Model, group: &ProcessGroup) -> burn_ddp::Result<usize> {
        burn_ddp::replicas::check_replicas(model, group)
    }

    fn fingerprint(&self, model: &Self::Model) -> u64 {
        burn_ddp::replicas::parameters_fingerprint(model)
    }

    fn save_model(
        &self,
        model: Self::Model,
        path: &Path,
        _epochs: usize,
    ) -> Result<PathBuf, SaveError> {
        let record = model.into_record();
        Ok(burn_ddp::checkpoint::save_atomic::<B::InnerBackend, _>(
            record, path,
        )?)
    }
}
