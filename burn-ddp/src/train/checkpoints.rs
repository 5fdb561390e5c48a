//! Resuming a Learner run by itself: the newest epoch whose checkpoint
//! (Burn 0.21's file checkpointer: `model-N`, `optim-N` and `scheduler-N`,
//! MessagePack, maybe gzipped) is complete and whole. The choice and the
//! check that every rank has it are burn-ddp-training's `LearnerJob`
//! (through `DdpTraining::latest_checkpoint`); what
//! "whole" means for Burn 0.21's files is here.

use burn_ddp_training::snapshots::{LoadError, Snapshot};
use serde::Deserialize;
use std::io::Read;
use std::path::Path;

/// Whether every file of an epoch's checkpoint reads to the end: gzip's
/// checksum where compressed, and one whole MessagePack value (a file cut
/// short by a crash mid-save fails here; what is inside is Burn's to judge).
pub(crate) fn check_whole(snapshot: &Snapshot) -> std::result::Result<(), LoadError> {
    for file in &snapshot.files {
        whole(file)
            .map_err(|why| LoadError::Corrupt(format!("{}: {why}", file.display()).into()))?;
    }
    Ok(())
}

fn whole(file: &Path) -> std::result::Result<(), String> {
    let bytes = std::fs::read(file).map_err(|e| e.to_string())?;
    let bytes = if file.extension().is_some_and(|e| e == "gz") {
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_end(&mut plain)
            .map_err(|e| format!("not whole gzip ({e})"))?;
        plain
    } else {
        bytes
    };
    let mut reader = &bytes[..];
    let mut decoder = rmp_serde::Deserializer::new(&mut reader);
    serde::de::IgnoredAny::deserialize(&mut decoder)
        .map_err(|e| format!("not whole MessagePack ({e})"))?;
    if !reader.is_empty() {
        return Err(format!("{} bytes after the record", reader.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_cut_short_is_not_whole() {
        let dir = std::env::temp_dir().join(format!("ddp-ckpt-whole-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let record = rmp_serde::to_vec_named(&std::collections::BTreeMap::from([(
            "weight",
            vec![1.5f32; 64],
        )]))
        .unwrap();
        let good = dir.join("model-1.mpk");
        std::fs::write(&good, &record).unwrap();
        assert_eq!(whole(&good), Ok(()));
        let cut = dir.join("model-2.mpk");
        std::fs::write(&cut, &record[..record.len() / 2]).unwrap();
        assert!(whole(&cut).unwrap_err().contains("MessagePack"));
        let gz = dir.join("model-3.mpk.gz");
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut encoder, &record).unwrap();
        let compressed = encoder.finish().unwrap();
        std::fs::write(&gz, &compressed).unwrap();
        assert_eq!(whole(&gz), Ok(()));
        std::fs::write(&gz, &compressed[..compressed.len() - 4]).unwrap();
        assert!(whole(&gz).unwrap_err().contains("gzip"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
