//! Where gradient synchronisation spends its time: per synchronisation, and
//! summed per reducer (one per model); whoever owns several reducers sums
//! theirs.

use std::time::{Duration, Instant};

/// Where gradient synchronisation spent its time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SyncStats {
    /// Synchronisations (backward passes or `sync_gradients` calls) that
    /// moved gradients.
    pub syncs: u64,
    /// Buckets reduced.
    pub buckets: u64,
    /// Gradient bytes reduced.
    pub bytes: u64,
    /// Buckets averaged on the GPU over NCCL (the others went through host memory).
    pub device_buckets: u64,
    /// Buckets sent while backward still ran (the front-end handed their
    /// gradients over as they became final), their all-reduce overlapping
    /// the rest of backward.
    pub early_buckets: u64,
    /// Waiting for the slowest rank to finish its backward pass (load imbalance,
    /// not communication).
    pub wait: Duration,
    /// Flattening gradients into buckets (and, on the host path, reading them
    /// out of the backend).
    pub pack: Duration,
    /// The collectives themselves (on the GPU path, including the wait for the
    /// kernels that fill the bucket). On the host path they run on a
    /// communication thread while the next bucket is packed, so `pack`,
    /// `reduce` and `unpack` may add up to more than the wall time.
    pub reduce: Duration,
    /// Writing buckets back and splitting them into gradients.
    pub unpack: Duration,
}

impl SyncStats {
    /// One bucket of `bytes`, with how long it took to reduce and unpack
    /// (its packing is counted as it happens, parameter by parameter).
    pub(super) fn count_bucket(&mut self, bytes: usize, reduce: Duration, unpack: Duration) {
        self.buckets += 1;
        self.bytes += bytes as u64;
        self.reduce += reduce;
        self.unpack += unpack;
    }

    /// One bucket of `bytes`, packed, reduced and unpacked one after the
    /// other from `started` (unpacking lasts until now).
    pub(super) fn count_bucket_since(
        &mut self,
        bytes: usize,
        [started, packed, reduced]: [Instant; 3],
    ) {
        self.pack += packed - started;
        self.count_bucket(bytes, reduced - packed, reduced.elapsed());
    }

    /// Adds `other`'s counts and times to these.
    pub fn add(&mut self, other: &SyncStats) {
        self.syncs += other.syncs;
        self.buckets += other.buckets;
        self.bytes += other.bytes;
        self.device_buckets += other.device_buckets;
        self.early_buckets += other.early_buckets;
        self.wait += other.wait;
        self.pack += other.pack;
        self.reduce += other.reduce;
        self.unpack += other.unpack;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_add_up() {
        let one = SyncStats {
            syncs: 1,
            buckets: 2,
            bytes: 30,
            device_buckets: 1,
            early_buckets: 1,
            wait: Duration::from_millis(1),
            pack: Duration::from_millis(2),
            reduce: Duration::from_millis(3),
            unpack: Duration::from_millis(4),
        };
        let mut total = SyncStats::default();
        total.add(&one);
        total.add(&one);
        assert_eq!(total.bytes, 60);
        assert_eq!(total.buckets, 4);
        assert_eq!(total.unpack, Duration::from_millis(8));
    }
}
