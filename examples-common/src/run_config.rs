//! A trainer's hyper-parameters (any serde type), saved next to its
//! checkpoints so a resumed run can check that it continues the same run. The
//! file is the pretty JSON Burn's `Config::save` writes, and it is read back as
//! Burn's `Config::load` reads it, with the same errors.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Saves `config` as JSON at `path`, atomically (a reader sees the old file or
/// the new one, never half of one).
pub fn save<C: Serialize>(config: &C, path: &Path) -> Result<(), String> {
    let partial = PathBuf::from(format!("{}.partial", path.display()));
    serde_json::to_string_pretty(config)
        .map_err(std::io::Error::other)
        .and_then(|json| std::fs::write(&partial, json))
        .and_then(|()| std::fs::rename(&partial, path))
        .map_err(|err| {
            let _ = std::fs::remove_file(&partial);
            format!(
                "cannot save the run's configuration to {}: {err}; check that the folder \
                 exists and is writable",
                path.display()
            )
        })
}

/// Reads a configuration [`save`] wrote; the error reads as Burn's
/// `ConfigError` does (`Config error => File not found: ...` or
/// `Config error => Invalid format: ...`).
pub fn load<C: DeserializeOwned>(path: &Path) -> Result<C, String> {
    let content = std::fs::read_to_string(path)
        .map_err(|_| format!("Config error => File not found: {}", path.to_string_lossy()))?;
    serde_json::from_str(&content).map_err(|err| format!("Config error => Invalid format: {err}"))
}

/// The fields whose values differ between a saved configuration and this
/// run's, as `name: saved -> now`, leaving out `ignored` (e.g. `epochs`,
/// which a resume usually raises).
pub fn differences<C: Serialize>(saved: &C, now: &C, ignored: &[&str]) -> Vec<String> {
    let (Ok(serde_json::Value::Object(saved)), Ok(serde_json::Value::Object(now))) =
        (serde_json::to_value(saved), serde_json::to_value(now))
    else {
        return vec!["the configurations are not JSON objects".into()];
    };
    let mut names: Vec<&String> = saved.keys().chain(now.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|name| !ignored.contains(&name.as_str()))
        .filter_map(|name| {
            let show =
                |v: Option<&serde_json::Value>| v.map_or("(absent)".into(), |v| v.to_string());
            let (before, after) = (saved.get(name), now.get(name));
            (before != after).then(|| format!("{name}: {} -> {}", show(before), show(after)))
        })
        .collect()
}

/// What a resumed run should know about the configuration saved at `path`:
/// `None` when it matches, otherwise a warning that says what differs (or why
/// nothing could be compared).
pub fn resume_warning<C: Serialize + DeserializeOwned>(
    now: &C,
    path: &Path,
    ignored: &[&str],
) -> Option<String> {
    if !path.exists() {
        return Some(format!(
            "no {} beside the checkpoint, so this run cannot check that it continues the \
             same run",
            path.display()
        ));
    }
    match load::<C>(path) {
        Ok(saved) => {
            let changed = differences(&saved, now, ignored);
            (!changed.is_empty()).then(|| {
                format!(
                    "resuming with other hyper-parameters than {} saved: {}",
                    path.display(),
                    changed.join(", ")
                )
            })
        }
        Err(err) => Some(format!("cannot read {}: {err}", path.display())),
    }
}
