//! The small pieces: seeded data, what a stop says, where snapshots go.

use burn_ddp_examples_common::learner::{last_checkpoint, stopped_line};
use burn_ddp_examples_common::resume::snapshot_path;
use burn_ddp_examples_common::stopped::{signal_name, Stopped};
use burn_ddp_examples_common::toy::toy_data;
use burn_ddp_examples_common::Normal;
use std::path::Path;

#[test]
fn normal_numbers_are_seeded_and_standard() {
    let draw = |seed| {
        let mut normal = Normal::new(seed);
        (0..20_000).map(|_| normal.sample()).collect::<Vec<f32>>()
    };
    let values = draw(7);
    assert_eq!(values, draw(7));
    assert_ne!(values, draw(8));
    let n = values.len() as f64;
    let mean = values.iter().map(|v| *v as f64).sum::<f64>() / n;
    let variance = values
        .iter()
        .map(|v| (*v as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    assert!(mean.abs() < 0.05, "mean {mean}");
    assert!((variance - 1.0).abs() < 0.05, "variance {variance}");
}

#[test]
fn toy_data_is_the_same_for_a_seed() {
    let (features, labels) = toy_data(16, 3);
    assert_eq!((features.len(), labels.len()), (16, 16));
    assert_eq!(toy_data(16, 3), (features.clone(), labels));
    assert_ne!(toy_data(16, 4).0, features);
}

#[test]
fn a_stop_names_its_signal_step_and_exit_code() {
    let stop = Stopped {
        signal: 2,
        epoch: 1,
        step: 2,
    };
    assert_eq!(
        stop.describe(),
        "Stopped by SIGINT: every rank stopped before step 3 of epoch 2"
    );
    assert_eq!(
        stop.rank_line(1),
        "Rank 1 stopped by SIGINT before step 3 of epoch 2"
    );
    assert_eq!(stop.exit_code(), 130);
    assert_eq!(signal_name(15), "SIGTERM");
    assert_eq!(signal_name(9), "signal 9");
}

#[test]
fn stopped_line_says_how_to_go_on() {
    assert_eq!(
        stopped_line(15, Some(2)),
        "Stopped by SIGTERM before the end of training; go on with --resume 2"
    );
    assert_eq!(
        stopped_line(2, None),
        "Stopped by SIGINT before the end of training; no epoch was finished"
    );
}

#[test]
fn no_checkpoint_folder_means_no_finished_epoch() {
    let dir = std::env::temp_dir().join(format!(
        "burn-ddp-examples-common-learner-{}",
        std::process::id()
    ));
    assert_eq!(last_checkpoint(&dir), None);
}

#[test]
fn snapshot_paths_count_the_epochs_done() {
    assert_eq!(
        snapshot_path(Path::new("runs/a"), 3),
        Path::new("runs/a/model_epoch_3")
    );
}
