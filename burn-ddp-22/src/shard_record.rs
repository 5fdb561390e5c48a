//! Burn 0.22's optimizer records re-keyed and merged, for the sharded
//! optimizer: a `ModuleOptimizer`'s record is a burnpack whose every entry
//! names its parameter id (tensors `"{id}.{field}"` with `param_id`,
//! scalars `"{id}.{...}"`, the path under `"{id}"`), and its fields are
//! private, so the parts are moved through the burnpack format itself.

use crate::{CommError, Result};
use burn::optim::record::OptimizerRecord;
use burn::tensor::Bytes;
use burn_pack::{Reader, Scalar, Writer};
use std::collections::BTreeMap;

/// A record's entries, as the burnpack format holds them.
struct Parts {
    tensors: Vec<burn_pack::Tensor>,
    scalars: BTreeMap<String, Scalar>,
    metadata: BTreeMap<String, String>,
}

impl Parts {
    fn read(rank: usize, record: OptimizerRecord) -> Result<Self> {
        let bytes = record.into_bytes().map_err(|err| error(rank, err))?;
        let reader = Reader::from_bytes(bytes).map_err(|err| error(rank, err))?;
        Ok(Self {
            scalars: reader.scalars().clone(),
            metadata: reader.metadata().clone(),
            tensors: reader.into_tensors().map_err(|err| error(rank, err))?,
        })
    }

    fn write(self, rank: usize) -> Result<OptimizerRecord> {
        let mut writer = Writer::new(self.tensors);
        for (key, value) in &self.scalars {
            writer = writer.with_scalar(key, *value);
        }
        for (key, value) in &self.metadata {
            writer = writer.with_metadata(key, value);
        }
        let bytes = writer.into_bytes().map_err(|err| error(rank, err))?;
        OptimizerRecord::from_bytes(bytes).map_err(|err| error(rank, err))
    }
}

/// `record` with each parameter id `id` replaced by `key(id)`: `Some(new)`
/// renames its entries, `None` drops them, an error stops. Entries that name
/// no parameter are kept as they are.
pub(crate) fn rekey(
    rank: usize,
    record: OptimizerRecord,
    mut key: impl FnMut(u64) -> Result<Option<u64>>,
) -> Result<OptimizerRecord> {
    let parts = Parts::read(rank, record)?;
    let mut out = Parts {
        tensors: Vec::with_capacity(parts.tensors.len()),
        scalars: BTreeMap::new(),
        metadata: BTreeMap::new(),
    };
    for tensor in parts.tensors {
        let Some(id) = tensor.param_id else {
            out.tensors.push(tensor);
            continue;
        };
        if let Some(new) = key(id)? {
            let (name, dtype, shape, _, bytes) =
                tensor.into_parts().map_err(|err| error(rank, err))?;
            let name = renamed(&name, id, new);
            out.tensors
                .push(burn_pack::Tensor::new(name, dtype, shape, Some(new), bytes));
        }
    }
    for (name, value) in parts.scalars {
        match key_id(&name) {
            Some(id) => {
                if let Some(new) = key(id)? {
                    out.scalars.insert(renamed(&name, id, new), value);
                }
            }
            None => {
                out.scalars.insert(name, value);
            }
        }
    }
    for (name, value) in parts.metadata {
        match key_id(&name) {
            Some(id) => {
                if let Some(new) = key(id)? {
                    out.metadata.insert(renamed(&name, id, new), value);
                }
            }
            None => {
                out.metadata.insert(name, value);
            }
        }
    }
    out.write(rank)
}

/// One record holding every entry of `records` (parts of disjoint
/// parameters).
pub(crate) fn merge(rank: usize, records: Vec<OptimizerRecord>) -> Result<OptimizerRecord> {
    let mut all = Parts {
        tensors: Vec::new(),
        scalars: BTreeMap::new(),
        metadata: BTreeMap::new(),
    };
    for record in records {
        let parts = Parts::read(rank, record)?;
        all.tensors.extend(parts.tensors);
        all.scalars.extend(parts.scalars);
        all.metadata.extend(parts.metadata);
    }
    all.write(rank)
}

/// A record from bytes received from another rank.
pub(crate) fn from_bytes(rank: usize, bytes: Vec<u8>) -> Result<OptimizerRecord> {
    OptimizerRecord::from_bytes(Bytes::from_bytes_vec(bytes)).map_err(|err| error(rank, err))
}

/// A record as bytes, to send.
pub(crate) fn to_bytes(rank: usize, record: OptimizerRecord) -> Result<Vec<u8>> {
    Ok(record
        .into_bytes()
        .map_err(|err| error(rank, err))?
        .to_vec())
}

/// The parameter id a scalar or path key starts with (`"{id}"` or
/// `"{id}.{...}"`).
fn key_id(name: &str) -> Option<u64> {
    name.split('.').next()?.parse().ok()
}

/// `name` with its leading `id` replaced by `new`.
fn renamed(name: &str, id: u64, new: u64) -> String {
    let old = id.to_string();
    match name.strip_prefix(&old) {
        Some(rest) if rest.is_empty() || rest.starts_with('.') => format!("{new}{rest}"),
        _ => name.to_string(),
    }
}

fn error(rank: usize, err: impl std::fmt::Display) -> CommError {
    CommError::InvalidArgument {
        rank,
        message: format!("the sharded optimizer's record: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_renamed_only_at_their_start() {
        assert_eq!(renamed("12.moment_1", 12, 3), "3.moment_1");
        assert_eq!(renamed("12", 12, 3), "3");
        assert_eq!(renamed("123.x", 12, 3), "123.x");
        assert_eq!(key_id("77.__rank"), Some(77));
        assert_eq!(key_id("lr"), None);
    }
}
