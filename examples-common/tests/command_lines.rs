//! The trainers' command lines: each toy program's `--backend` default, the
//! flags' spellings and checks, `--resume`'s values.

use burn_ddp_examples_common::cli::{positive, BackendChoice};
use burn_ddp_examples_common::mnist::{MnistArgs, ResumeFrom};
use burn_ddp_examples_common::toy::ToyArgs;
use burn_ddp_examples_common::toy::{FlexByDefault as OnFlex, NdArrayByDefault as OnNdArray};
use clap::{CommandFactory, Parser};
use std::path::PathBuf;

#[test]
fn each_program_has_its_own_backend_default_in_values_and_help() {
    let args = ToyArgs::<OnNdArray>::parse_from(["toy"]);
    assert_eq!(args.backend, BackendChoice::Ndarray);
    let args = ToyArgs::<OnFlex>::parse_from(["toy"]);
    assert_eq!(args.backend, BackendChoice::Flex);
    let args = ToyArgs::<OnFlex>::parse_from(["toy", "--backend", "ndarray"]);
    assert_eq!(args.backend, BackendChoice::Ndarray);
    let help = ToyArgs::<OnNdArray>::command()
        .render_long_help()
        .to_string();
    assert!(help.contains("[default: ndarray]"), "{help}");
    let help = ToyArgs::<OnFlex>::command().render_long_help().to_string();
    assert!(help.contains("[default: flex]"), "{help}");
    ToyArgs::<OnFlex>::command().debug_assert();
}

#[test]
fn flags_take_dashes_or_underscores() {
    let args = ToyArgs::<OnFlex>::parse_from([
        "toy",
        "--batch_size",
        "32",
        "--dataset-size",
        "100",
        "--resume",
        "auto",
    ]);
    assert_eq!((args.batch_size, args.dataset_size), (32, 100));
    assert_eq!(args.resume.as_deref(), Some(std::path::Path::new("auto")));
    assert!(ToyArgs::<OnFlex>::try_parse_from(["toy", "--batch-size", "0"]).is_err());
    assert!(ToyArgs::<OnFlex>::try_parse_from([
        "toy",
        "--batch-size",
        "8",
        "--global-batch-size",
        "16"
    ])
    .is_err());
}

#[test]
fn resume_takes_an_epoch_or_auto() {
    let resume = |value: &str| {
        MnistArgs::try_parse_from([
            "mnist",
            "--checkpoint-dir",
            "c",
            &format!("--resume={value}"),
        ])
        .map(|args| args.resume)
        .map_err(|err| err.to_string())
    };
    assert_eq!(resume("auto"), Ok(Some(ResumeFrom::Auto)));
    assert_eq!(resume("3"), Ok(Some(ResumeFrom::Epoch(3))));
    for bad in ["0", "-1", "Auto", "2.5", "latest"] {
        let err = resume(bad).unwrap_err();
        assert!(
            err.contains(&format!(
                "{bad:?} is neither an epoch (1, 2, ...) nor `auto`"
            )),
            "{err}"
        );
    }
}

#[test]
fn command_line_parses_as_documented() {
    MnistArgs::command().debug_assert();
    let args = MnistArgs::parse_from(["mnist"]);
    assert_eq!((args.epochs, args.batch_size, args.lr), (2, 128, 0.001));
    assert_eq!(args.backend, BackendChoice::Flex);
    assert_eq!(args.resume, None);
    let args = MnistArgs::parse_from([
        "mnist",
        "--data_dir",
        "d",
        "--checkpoint-dir",
        "c",
        "--resume",
        "auto",
    ]);
    assert_eq!(args.data_dir, Some(PathBuf::from("d")));
    assert_eq!(args.resume, Some(ResumeFrom::Auto));
    // --artifact-dir needs --learner; --max-steps refuses it.
    assert!(MnistArgs::try_parse_from(["mnist", "--artifact-dir", "x"]).is_err());
    assert!(MnistArgs::try_parse_from(["mnist", "--learner", "--max-steps", "2"]).is_err());
}

#[test]
fn positive_counts_refuse_zero_and_words() {
    assert_eq!(positive("3"), Ok(3));
    assert_eq!(positive("0"), Err("\"0\" is not a positive integer".into()));
    assert!(positive("three").is_err());
    assert!(positive("-1").is_err());
}
