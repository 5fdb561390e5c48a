//! The pipeline in one process: a world of one with the device backend
//! forced to `nccl` synchronises anyway (that is what lets one process
//! exercise the GPU path), so every step of the host path runs here. Several
//! ranks are tested with real processes in `tests/multiprocess`.

use super::*;
use crate::element::DType;
use crate::CollectiveBackend;

/// Gradients in plain vectors, as a front-end would hold them.
struct FakeSet {
    params: Vec<ParamInfo>,
    grads: Vec<Option<Vec<f32>>>,
    reads: Vec<usize>,
    writes: Vec<usize>,
}

impl FakeSet {
    fn new(grads: Vec<Option<Vec<f32>>>, shapes: &[&[usize]]) -> Self {
        let params = shapes
            .iter()
            .enumerate()
            .map(|(id, shape)| ParamInfo {
                id: id as u64,
                layout: ParamLayout {
                    shape: shape.to_vec(),
                    dtype: DType::F32,
                },
                placement: Placement::Host,
            })
            .collect();
        Self {
            params,
            grads,
            reads: Vec::new(),
            writes: Vec::new(),
        }
    }
}

impl GradientSet for FakeSet {
    fn params(&self) -> &[ParamInfo] {
        &self.params
    }

    fn has_gradients(&self) -> bool {
        self.grads.iter().any(Option::is_some)
    }

    fn read_host(&mut self, index: usize, out: &mut [u8]) -> Result<()> {
        self.reads.push(index);
        match &self.grads[index] {
            Some(grad) => out.copy_from_slice(bytemuck::cast_slice(grad)),
            None => out.fill(0),
        }
        Ok(())
    }

    fn write_host(&mut self, index: usize, averaged: &[u8]) -> Result<()> {
        self.writes.push(index);
        let values = averaged
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()));
        self.grads[index] = Some(values.collect());
        Ok(())
    }
}

fn forced_group() -> ProcessGroup {
    ProcessGroup::builder(0, 1)
        .device_backend(CollectiveBackend::Nccl)
        .build()
        .unwrap()
}

#[test]
fn every_gradient_is_read_and_written_once_in_bucket_order_and_missing_ones_are_zero() {
    let group = forced_group();
    let config = BucketConfig {
        cap_bytes: 16,
        first_cap_bytes: 8,
    };
    let mut reducer = Reducer::new(&group, config);
    let shapes: &[&[usize]] = &[&[2], &[2, 2], &[1]];
    let mut set = FakeSet::new(vec![Some(vec![1.0, 2.0]), None, Some(vec![5.0])], shapes);
    assert!(reducer.synchronize(&mut set).unwrap().is_some());
    // Last parameter first, as PyTorch orders buckets.
    assert_eq!(set.reads, [2, 1, 0]);
    assert_eq!(set.writes, [2, 1, 0]);
    assert_eq!(set.grads[1], Some(vec![0.0; 4]));
    assert_eq!(set.grads[0], Some(vec![1.0, 2.0]));
    let stats = reducer.stats();
    assert_eq!((stats.syncs, stats.bytes), (1, 4 * 7));
    assert_eq!(stats.buckets as usize, reducer.plan().buckets.len());
}

#[test]
fn bucket_buffers_are_kept_across_steps_and_replaced_with_the_layout() {
    let group = forced_group();
    let mut reducer = Reducer::new(&group, BucketConfig::default());
    let shapes: &[&[usize]] = &[&[300], &[7]];
    let step = |reducer: &mut Reducer| {
        let mut set = FakeSet::new(vec![Some(vec![1.0; 300]), Some(vec![2.0; 7])], shapes);
        reducer.synchronize(&mut set).unwrap();
        reducer.host_buckets[0].bytes(4).as_ptr() as usize
    };
    let first = step(&mut reducer);
    for _ in 0..3 {
        assert_eq!(step(&mut reducer), first, "the bucket buffer is reused");
    }
    let mut other = FakeSet::new(vec![Some(vec![1.0; 3])], &[&[3]]);
    reducer.synchronize(&mut other).unwrap();
    assert_eq!(reducer.plan().order, [0]);
    assert_eq!(reducer.stats().syncs, 5);
}

#[test]
fn a_round_dropped_or_abandoned_leaves_the_next_one_whole() {
    let group = forced_group();
    let config = BucketConfig {
        cap_bytes: 16,
        first_cap_bytes: 8,
    };
    let mut reducer = Reducer::new(&group, config);
    let shapes: &[&[usize]] = &[&[2], &[2, 2], &[1]];
    let grads = || vec![Some(vec![1.0, 2.0]), Some(vec![3.0; 4]), Some(vec![5.0])];
    reducer
        .synchronize(&mut FakeSet::new(grads(), shapes))
        .unwrap();
    // An error between begin and finish drops the round with its buffers.
    let params = FakeSet::new(grads(), shapes).params;
    drop(reducer.begin(&params).unwrap().expect("a round"));
    let mut set = FakeSet::new(grads(), shapes);
    assert!(reducer.synchronize(&mut set).unwrap().is_some());
    assert_eq!(set.grads, grads(), "a world of one averages to itself");
    assert_eq!(set.writes, [2, 1, 0]);
    // Abandoned before anything left: the buffers come back, none is made.
    let kept = reducer.host_buckets[0].bytes(4).as_ptr() as usize;
    let round = reducer.begin(&params).unwrap().expect("a round");
    reducer.abandon(round);
    assert_eq!(reducer.host_buckets[0].bytes(4).as_ptr() as usize, kept);
}

#[test]
fn nothing_moves_without_gradients_parameters_or_peers() {
    let group = forced_group();
    let mut reducer = Reducer::new(&group, BucketConfig::default());
    let mut none = FakeSet::new(vec![None, None], &[&[2], &[3]]);
    assert!(reducer.synchronize(&mut none).unwrap().is_none());
    assert!(none.reads.is_empty());
    let mut empty = FakeSet::new(Vec::new(), &[]);
    assert!(reducer.synchronize(&mut empty).unwrap().is_none());
    // A world of one with the default backend has nothing to average.
    let alone = ProcessGroup::builder(0, 1).build().unwrap();
    let mut set = FakeSet::new(vec![Some(vec![1.0])], &[&[1]]);
    assert!(Reducer::new(&alone, BucketConfig::default())
        .synchronize(&mut set)
        .unwrap()
        .is_none());
    assert!(set.reads.is_empty());
    assert_eq!(reducer.stats(), SyncStats::default());
}

#[test]
fn bad_caps_mixed_devices_and_a_destroyed_group_are_errors() {
    let group = forced_group();
    let zero = BucketConfig {
        cap_bytes: 0,
        first_cap_bytes: 1,
    };
    let mut set = FakeSet::new(vec![Some(vec![1.0])], &[&[1]]);
    let err = Reducer::new(&group, zero)
        .synchronize(&mut set)
        .unwrap_err()
        .to_string();
    assert!(err.contains("a cap must be at least one byte"), "{err}");

    let mut mixed = FakeSet::new(vec![Some(vec![1.0]), Some(vec![1.0])], &[&[1], &[1]]);
    mixed.params[1].placement = Placement::Device { ordinal: 0 };
    let err = Reducer::new(&group, BucketConfig::default())
        .synchronize(&mut mixed)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rank 0: the model's gradients are in two places"),
        "{err}"
    );

    let mut reducer = Reducer::new(&group, BucketConfig::default());
    drop(group);
    assert!(matches!(
        reducer.synchronize(&mut set),
        Err(CommError::Destroyed)
    ));
}

#[test]
fn gradients_handed_over_early_leave_in_complete_buckets_and_are_not_read_again() {
    let group = forced_group();
    let config = BucketConfig {
        cap_bytes: 16,
        first_cap_bytes: 8,
    };
    let shapes: &[&[usize]] = &[&[2], &[2, 2], &[1], &[3]];
    let grads = || {
        vec![
            Some(vec![1.0, 2.0]),
            Some(vec![3.0; 4]),
            None,
            Some(vec![4.0, 5.0, 6.0]),
        ]
    };
    let mut reference = FakeSet::new(grads(), shapes);
    Reducer::new(&group, config)
        .synchronize(&mut reference)
        .unwrap();

    let mut reducer = Reducer::new(&group, config);
    let mut set = FakeSet::new(grads(), shapes);
    let mut round = reducer.begin(set.params()).unwrap().unwrap();
    // Buckets, last parameter first: [3], [2, 1], [0].
    assert_eq!(reducer.plan().members(0), &[3]);
    assert_eq!(reducer.plan().members(1), &[2, 1]);
    let hand_over = |round: &mut SyncRound, param: usize| {
        let grad: Vec<f32> = set.grads[param].clone().unwrap_or(vec![0.0; 1]);
        round
            .ready(param, |out| {
                out.copy_from_slice(bytemuck::cast_slice(&grad));
                Ok(())
            })
            .unwrap();
    };
    round.zero(2); // no gradient: zeros, as finish reads them
    assert_eq!(round.sent(), 0, "nothing leaves on a zero's account");
    hand_over(&mut round, 1);
    assert_eq!(round.sent(), 0, "bucket 1 is complete but bucket 0 not");
    hand_over(&mut round, 3);
    assert_eq!(
        round.sent(),
        2,
        "buckets 0 and 1 leave as soon as they are complete"
    );
    hand_over(&mut round, 3); // a second report changes nothing
    assert_eq!(round.sent(), 2);
    let stats = reducer.finish(round, &mut set).unwrap().unwrap();
    assert_eq!(set.reads, [0], "only what was not handed over is read");
    assert_eq!(set.writes, [3, 2, 1, 0]);
    assert_eq!(set.grads, reference.grads);
    assert_eq!((stats.buckets, stats.bytes), (3, 4 * 10));
    assert_eq!(stats.early_buckets, 2);
}

/// The GPU path's order, with NCCL stood in for: what each step did, on
/// which thread.
mod device_order {
    use super::*;
    use crate::element::DeviceBuffer;
    use crate::reducer::comm_thread::Averaging;
    use crate::reducer::sync_round::Planned;
    use crate::transport::WireCompression;
    use std::sync::Mutex;

    static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

    fn log(what: String) {
        let thread = std::thread::current();
        let on = thread.name().unwrap_or("?");
        let on = if on.starts_with("burn-ddp-comm") {
            "comm"
        } else {
            "caller"
        };
        LOG.lock().unwrap().push(format!("{on}: {what}"));
    }

    /// NCCL's place: notes the bucket (its address is its first member).
    fn fake_mean(_: &ProcessGroup, buffer: DeviceBuffer) -> Result<()> {
        log(format!("mean {}", buffer.ptr));
        Ok(())
    }

    /// A bucket "packed" on the device: its fence notes when it runs.
    fn pending(members: &[usize], numel: usize, dtype: DType) -> Result<PendingDeviceBucket> {
        log(format!("pack {}", members[0]));
        let ptr = members[0] as u64;
        let fence: DeviceFence = Box::new(move || {
            log(format!("fence {ptr}"));
            Ok(DeviceBuffer {
                ptr,
                len: numel,
                dtype,
            })
        });
        // SAFETY: nothing reads the stand-in address but `fake_mean`.
        Ok(unsafe { PendingDeviceBucket::new(fence, Box::new(members.to_vec())) })
    }

    /// Gradients "on the GPU": packing and unpacking are noted.
    struct DeviceSet(Vec<ParamInfo>);

    impl GradientSet for DeviceSet {
        fn params(&self) -> &[ParamInfo] {
            &self.0
        }
        fn read_host(&mut self, _: usize, _: &mut [u8]) -> Result<()> {
            panic!("a device gradient read through the host");
        }
        fn write_host(&mut self, _: usize, _: &[u8]) -> Result<()> {
            panic!("a device gradient written through the host");
        }
        fn pack_device(
            &mut self,
            members: &[usize],
            numel: usize,
            dtype: DType,
        ) -> Result<DeviceBucket> {
            log(format!("pack {} after backward", members[0]));
            let buffer = DeviceBuffer {
                ptr: members[0] as u64,
                len: numel,
                dtype,
            };
            // SAFETY: as above.
            Ok(unsafe { DeviceBucket::new(buffer, Box::new(members.to_vec())) })
        }
        fn unpack_device(
            &mut self,
            members: &[usize],
            _: &[usize],
            bucket: DeviceBucket,
        ) -> Result<()> {
            let kept = bucket.into_keep().downcast::<Vec<usize>>().unwrap();
            assert_eq!(*kept, members, "each bucket comes back with what kept it");
            log(format!("unpack {}", members[0]));
            Ok(())
        }
    }

    #[test]
    fn device_buckets_leave_in_order_each_after_its_fence_on_the_comm_thread() {
        // Six parameters of 4 floats, two to a bucket: buckets {5, 4}, {3, 2}, {1, 0}.
        let infos: Vec<ParamInfo> = (0..6)
            .map(|id| ParamInfo {
                id,
                layout: ParamLayout {
                    shape: vec![4],
                    dtype: DType::F32,
                },
                placement: Placement::Device { ordinal: 0 },
            })
            .collect();
        let layout: Vec<ParamLayout> = infos.iter().map(|p| p.layout.clone()).collect();
        let config = BucketConfig {
            cap_bytes: 32,
            first_cap_bytes: 32,
        };
        let plan = BucketPlan::new(&layout, config);
        let members: Vec<Vec<usize>> = (0..3).map(|b| plan.members(b).to_vec()).collect();
        assert_eq!(members, [vec![5, 4], vec![3, 2], vec![1, 0]]);
        let averaging = Averaging {
            group: forced_group(),
            compression: WireCompression::None,
            device_mean: fake_mean,
        };
        let buffers = (0..3).map(|_| AlignedBuf::default()).collect();
        let planned = Arc::new(Planned::new(layout, plan));
        let mut round = SyncRound::new(averaging, planned, buffers, true);
        assert!(round.on_device());
        let mut pack = pending;

        // Bucket 1 complete first: it waits for bucket 0.
        round.ready_on_device(3, &mut pack).unwrap();
        round.ready_on_device(2, &mut pack).unwrap();
        assert_eq!(round.sent(), 0);
        // Bucket 0's last member sends both, in order; an unused parameter of
        // bucket 2 (zeros) sends nothing, and parameter 1 is left to the end.
        round.ready_on_device(5, &mut pack).unwrap();
        assert_eq!(round.sent(), 0);
        round.zero(0);
        round.ready_on_device(4, &mut pack).unwrap();
        assert_eq!(round.sent(), 2);
        round.ready_on_device(4, &mut pack).unwrap(); // reported twice: nothing more

        let mut set = DeviceSet(infos);
        let stats = round.finish(&mut set).unwrap().unwrap();
        assert_eq!(
            (stats.early_buckets, stats.device_buckets, stats.buckets),
            (2, 3, 3)
        );

        let log = std::mem::take(&mut *LOG.lock().unwrap());
        let on = |thread: &str| -> Vec<&str> {
            log.iter().filter_map(|l| l.strip_prefix(thread)).collect()
        };
        // Each bucket's fence before its mean, on the communication thread,
        // in bucket order.
        assert_eq!(
            on("comm: "),
            ["fence 5", "mean 5", "fence 3", "mean 3"],
            "{log:?}"
        );
        // Packed as they completed, the rest after backward, on the caller's
        // thread; then every bucket back in order.
        assert_eq!(
            on("caller: "),
            [
                "pack 5",
                "pack 3",
                "unpack 5",
                "unpack 3",
                "pack 1 after backward",
                "mean 1",
                "unpack 1"
            ],
            "{log:?}"
        );
    }
}
