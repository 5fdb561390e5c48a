//! A run's saved settings: the file Burn's `Config::save` wrote, read back,
//! compared field by field, and the warning a resume prints.

use burn_ddp_examples_common::mnist::MnistTrainingConfig;
use burn_ddp_examples_common::run_config::{differences, load, resume_warning, save};
use burn_ddp_examples_common::toy::ToyTrainingConfig;
use std::path::PathBuf;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "burn-ddp-examples-common-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn saved_configuration_is_burns_pretty_json_and_loads_back() {
    let dir = scratch("round-trip");
    let path = dir.join("mnist_config.json");
    let config = MnistTrainingConfig::new(2, 128, 2, 0.001, 0, 60000).with_max_steps(Some(5));
    save(&config, &path).unwrap();
    // What Burn 0.21's `Config::save` wrote for this struct, byte for byte.
    let expected = "{\n  \"epochs\": 2,\n  \"batch_size\": 128,\n  \"world_size\": 2,\n  \
                    \"lr\": 0.001,\n  \"seed\": 0,\n  \"train_samples\": 60000,\n  \
                    \"max_steps\": 5\n}";
    assert_eq!(std::fs::read_to_string(&path).unwrap(), expected);
    assert!(!dir.join("mnist_config.json.partial").exists());
    let loaded: MnistTrainingConfig = load(&path).unwrap();
    assert!(differences(&loaded, &config, &[]).is_empty());
    assert_eq!(resume_warning(&config, &path, &[]), None);

    // Without `max_steps` the field is null, and a file without it loads as unset.
    let unlimited = MnistTrainingConfig::new(2, 128, 2, 0.001, 0, 60000);
    save(&unlimited, &path).unwrap();
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .contains("\"max_steps\": null"));
    std::fs::write(
        &path,
        r#"{"epochs": 2, "batch_size": 128, "world_size": 2, "lr": 0.001, "seed": 0, "train_samples": 60000}"#,
    )
    .unwrap();
    let loaded: MnistTrainingConfig = load(&path).unwrap();
    assert_eq!(loaded.max_steps, None);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn differences_name_each_changed_field_but_the_ignored() {
    let saved = ToyTrainingConfig::new(5, 64, 2, 0.01, 2048, 0);
    let now = ToyTrainingConfig::new(10, 32, 2, 0.01, 2048, 1);
    assert_eq!(
        differences(&saved, &now, &["epochs"]),
        ["batch_size: 64 -> 32", "seed: 0 -> 1"]
    );
    assert_eq!(
        differences(&saved, &now, &[]),
        ["batch_size: 64 -> 32", "epochs: 5 -> 10", "seed: 0 -> 1"]
    );
    assert!(differences(&saved, &saved.clone(), &[]).is_empty());
    let limited = MnistTrainingConfig::new(2, 128, 2, 0.001, 0, 100).with_max_steps(Some(3));
    let unlimited = MnistTrainingConfig::new(2, 128, 2, 0.001, 0, 100);
    assert_eq!(
        differences(&limited, &unlimited, &[]),
        ["max_steps: 3 -> null"]
    );
}

#[test]
fn resume_warning_says_what_differs_or_why_nothing_was_compared() {
    let dir = scratch("warning");
    let path = dir.join("toy_config.json");
    let now = ToyTrainingConfig::new(5, 64, 2, 0.01, 2048, 0);
    let missing = resume_warning(&now, &path, &["epochs"]).unwrap();
    assert!(
        missing.starts_with("no ") && missing.contains("toy_config.json"),
        "{missing}"
    );

    save(&ToyTrainingConfig::new(3, 64, 2, 0.02, 2048, 0), &path).unwrap();
    let changed = resume_warning(&now, &path, &["epochs"]).unwrap();
    assert!(
        changed.starts_with("resuming with other hyper-parameters than")
            && changed.ends_with("saved: lr: 0.02 -> 0.01"),
        "{changed}"
    );

    std::fs::write(&path, "{ not json").unwrap();
    let unreadable = resume_warning(&now, &path, &["epochs"]).unwrap();
    assert!(
        unreadable.starts_with("cannot read ")
            && unreadable.contains("Config error => Invalid format: "),
        "{unreadable}"
    );
    let err = load::<ToyTrainingConfig>(&dir.join("absent.json")).unwrap_err();
    assert!(err.starts_with("Config error => File not found: "), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_save_into_a_missing_folder_says_so_and_leaves_nothing() {
    let dir = scratch("unwritable");
    let path = dir.join("absent").join("config.json");
    let err = save(&ToyTrainingConfig::new(1, 1, 1, 0.1, 1, 0), &path).unwrap_err();
    assert!(
        err.starts_with("cannot save the run's configuration to")
            && err.contains("check that the folder exists and is writable"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
