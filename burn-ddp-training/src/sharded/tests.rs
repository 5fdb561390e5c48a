//! One rank's view: saving, opening and every way a folder can be wrong.
//! Several ranks writing and reading each other's parts: burn-ddp's and
//! burn-ddp-22's multiprocess tests (the sharded optimizer's checkpoints).

use super::*;
use burn_ddp_comm::ProcessGroup;
use std::path::{Path, PathBuf};

fn group() -> ProcessGroup {
    ProcessGroup::builder(0, 1).build().unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-ddp-sharded-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn model() -> Vec<ParamShape> {
    vec![
        ParamShape {
            shape: vec![3, 2],
            dtype: "F32".into(),
        },
        ParamShape {
            shape: vec![2],
            dtype: "F32".into(),
        },
    ]
}

/// Saves entries for both parameters (state for the second only) in `dir`.
fn save(dir: &Path) -> PathBuf {
    let mut save = ShardedSave::begin(&group(), dir).unwrap();
    save.write(EntryKind::Param, 0, &[1; 24]);
    save.write(EntryKind::Param, 1, &[2; 8]);
    save.write(EntryKind::OptimizerState, 1, b"moments");
    save.commit(&model(), "epoch 3").unwrap()
}

fn error_of<T>(result: burn_ddp_comm::Result<T>) -> String {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(err) => err.to_string(),
    }
}

#[test]
fn what_is_saved_reads_back_entry_by_entry() {
    let root = scratch("round-trip");
    let dir = save(&root.join("epoch-3"));
    assert!(ShardedCheckpoint::is_complete(&dir));
    let checkpoint = ShardedCheckpoint::open(&dir, 0).unwrap();
    checkpoint.check_model(&model()).unwrap();
    assert_eq!((checkpoint.world_size(), checkpoint.info()), (1, "epoch 3"));
    assert_eq!(
        checkpoint.read(EntryKind::Param, 1).unwrap(),
        Some(vec![2; 8])
    );
    assert_eq!(
        checkpoint.read(EntryKind::OptimizerState, 1).unwrap(),
        Some(b"moments".to_vec())
    );
    assert_eq!(
        checkpoint.read(EntryKind::Param, 0).unwrap(),
        Some(vec![1; 24])
    );
    assert!(!checkpoint.has(EntryKind::OptimizerState, 0));
    assert_eq!(checkpoint.read(EntryKind::OptimizerState, 0).unwrap(), None);
    // Nothing of the save is left beside it.
    let names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["epoch-3"]);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_checkpoint_is_never_written_over() {
    let root = scratch("exists");
    let dir = save(&root.join("epoch-3"));
    let err = error_of(ShardedSave::begin(&group(), &dir));
    assert!(
        err.contains("exists: a checkpoint is never written over"),
        "{err}"
    );
    // Still whole.
    ShardedCheckpoint::open(&dir, 0).unwrap();
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn an_interrupted_save_is_no_checkpoint_and_is_cleared_by_the_next() {
    let root = scratch("interrupted");
    let target = root.join("epoch-4");
    let mut save = ShardedSave::begin(&group(), &target).unwrap();
    save.write(EntryKind::Param, 0, &[1; 24]);
    drop(save); // killed before commit
    assert!(!target.exists() && !ShardedCheckpoint::is_complete(&target));
    let leftovers = || {
        std::fs::read_dir(&root)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().starts_with("epoch-4.partial-")
            })
            .count()
    };
    assert_eq!(leftovers(), 1);
    let err = error_of(ShardedCheckpoint::open(&target, 0));
    assert!(err.contains("not a whole sharded checkpoint"), "{err}");
    save_again(&target);
    assert_eq!(leftovers(), 0);
    let _ = std::fs::remove_dir_all(&root);
}

fn save_again(target: &Path) {
    let mut save = ShardedSave::begin(&group(), target).unwrap();
    save.write(EntryKind::Param, 0, &[1; 24]);
    save.commit(&model(), "again").unwrap();
}

#[test]
fn a_missing_truncated_or_foreign_part_is_named() {
    let root = scratch("parts");
    let dir = save(&root.join("a"));
    let part = dir.join("part-00000.bin");
    let bytes = std::fs::read(&part).unwrap();

    std::fs::write(&part, &bytes[..bytes.len() - 3]).unwrap();
    let err = error_of(ShardedCheckpoint::open(&dir, 0));
    assert!(
        err.contains("rank 0: part-00000.bin (written by rank 0 of 1)")
            && err.contains("truncated"),
        "{err}"
    );

    std::fs::remove_file(&part).unwrap();
    let err = error_of(ShardedCheckpoint::open(&dir, 0));
    assert!(
        err.contains("part-00000.bin") && err.contains("missing"),
        "{err}"
    );

    // Another save's part of the same length under the same name.
    let other = save(&root.join("b"));
    std::fs::copy(other.join("part-00000.bin"), &part).unwrap();
    let err = error_of(ShardedCheckpoint::open(&dir, 0));
    assert!(err.contains("from another save"), "{err}");

    // A damaged byte inside an entry: found when that entry is read.
    let mut damaged = bytes.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 0xff;
    std::fs::write(&part, &damaged).unwrap();
    let checkpoint = ShardedCheckpoint::open(&dir, 0).unwrap();
    let err = error_of(checkpoint.read(EntryKind::OptimizerState, 1));
    assert!(
        err.contains("parameter #1's optimizer state: fails its checksum"),
        "{err}"
    );
    assert_eq!(
        checkpoint.read(EntryKind::Param, 1).unwrap(),
        Some(vec![2; 8])
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn another_model_is_refused_naming_the_parameter() {
    let root = scratch("model");
    let dir = save(&root.join("a"));
    let checkpoint = ShardedCheckpoint::open(&dir, 0).unwrap();
    let mut other = model();
    other[1].shape = vec![4];
    let err = error_of(checkpoint.check_model(&other));
    assert!(
        err.contains("parameter #1 is [2] F32 there and [4] F32 here (2 parameters there, 2 here)"),
        "{err}"
    );
    let err = error_of(checkpoint.check_model(&other[..1]));
    assert!(
        err.contains("parameter #1 is [2] F32 there and absent here"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_rank_that_cannot_write_fails_the_save_and_leaves_nothing() {
    let root = scratch("unwritable");
    let target = root.join("a");
    let mut save = ShardedSave::begin(&group(), &target).unwrap();
    // The folder vanishes under the rank (as on a file system it does not share).
    for entry in std::fs::read_dir(&root).unwrap() {
        std::fs::remove_dir_all(entry.unwrap().path()).unwrap();
    }
    save.write(EntryKind::Param, 0, &[1; 24]);
    let err = error_of(save.commit(&model(), ""));
    assert!(
        err.contains("the checkpoint was not saved: rank 0: the checkpoint's folder")
            && err.contains("is not visible here"),
        "{err}"
    );
    assert!(!target.exists());
    assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn metadata_names_every_entry_in_json() {
    let root = scratch("json");
    let dir = save(&root.join("a"));
    let text = std::fs::read_to_string(dir.join(METADATA_FILE)).unwrap();
    for needle in [
        "\"format\": \"burn-ddp sharded checkpoint\"",
        "\"kind\": \"optimizer_state\"",
        "\"file\": \"part-00000.bin\"",
        "\"info\": \"epoch 3\"",
    ] {
        assert!(text.contains(needle), "{needle} in {text}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_save_folder_never_renamed_is_refused_even_with_its_metadata() {
    let root = scratch("partial-with-metadata");
    let whole = save(&root.join("a"));
    // As a save killed between its metadata and its rename leaves it.
    let partial = root.join("b.partial-0123456789abcdef");
    std::fs::rename(&whole, &partial).unwrap();
    assert!(!ShardedCheckpoint::is_complete(&partial));
    let err = error_of(ShardedCheckpoint::open(&partial, 0));
    assert!(
        err.contains("the folder of a save that did not finish"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_background_save_writes_staged_and_later_entries_and_a_panic_fails_it() {
    let root = scratch("background");
    let begin = |name: &str| ShardedSave::begin(&group(), &root.join(name)).unwrap();
    let mut staged = Staged::default();
    EntrySink::write(&mut staged, EntryKind::Param, 0, &[1; 24]);
    let later = |sink: &mut dyn EntrySink| sink.write(EntryKind::OptimizerState, 1, b"moments");
    let save = begin("a").in_background(staged, later, model(), "epoch 5");
    let dir = save.finish().unwrap();
    let checkpoint = ShardedCheckpoint::open(&dir, 0).unwrap();
    assert_eq!(
        checkpoint.read(EntryKind::Param, 0).unwrap(),
        Some(vec![1; 24])
    );
    assert_eq!(
        checkpoint.read(EntryKind::OptimizerState, 1).unwrap(),
        Some(b"moments".to_vec())
    );
    assert_eq!(checkpoint.info(), "epoch 5");

    let panics = |_: &mut dyn EntrySink| panic!("serialising went wrong");
    let save = begin("b").in_background(Staged::default(), panics, model(), "");
    let err = error_of(save.finish());
    assert!(
        err.contains("rank 0: writing its part panicked: serialising went wrong"),
        "{err}"
    );
    assert!(!root.join("b").exists());
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn the_newest_whole_checkpoint_is_found_and_an_unfinished_one_never() {
    let root = scratch("newest");
    assert_eq!(newest_complete(&root.join("none")), None);
    assert_eq!(newest_complete(&root), None);
    save(&root.join("epoch-1"));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let second = save(&root.join("epoch-2"));
    // Newer, but unfinished: a folder never renamed (metadata written) and
    // one without metadata.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let third = save(&root.join("epoch-3"));
    std::fs::rename(&third, root.join("epoch-3.partial-00000000000000aa")).unwrap();
    let mut unfinished = ShardedSave::begin(&group(), &root.join("epoch-4")).unwrap();
    unfinished.write(EntryKind::Param, 0, &[1; 24]);
    drop(unfinished);
    assert_eq!(newest_complete(&root), Some(second));
    let _ = std::fs::remove_dir_all(&root);
}
