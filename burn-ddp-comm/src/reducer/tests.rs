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
