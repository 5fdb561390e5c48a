//! A Burn DataLoader over a DistributedDataset yields the sampler's indices.

use burn::backend::NdArray;
use burn::data::dataloader::{batcher::Batcher, DataLoaderBuilder};
use burn::data::dataset::{Dataset, InMemDataset};
use burn::tensor::backend::Backend;
use burn_ddp::data::{DistributedDataset, DistributedSampler};

type B = NdArray;

/// Batches items unchanged, so the test sees exactly which items were loaded.
#[derive(Clone)]
struct Identity;

impl<Bk: Backend> Batcher<Bk, usize, Vec<usize>> for Identity {
    fn batch(&self, items: Vec<usize>, _device: &Bk::Device) -> Vec<usize> {
        items
    }
}

fn loaded(workers: usize) {
    let len = 103;
    let (replicas, rank, batch) = (3, 2, 8);
    // Item i of the dataset is the number i, so loaded items are dataset indices.
    let data = InMemDataset::new((0..len).collect::<Vec<usize>>());
    let sampler = DistributedSampler::new(len, replicas, rank)
        .unwrap()
        .seed(42);
    let reference = sampler.clone();
    let shard = DistributedDataset::new(data, sampler);
    let epochs = shard.epoch_handle();
    let mut builder = DataLoaderBuilder::<B, usize, Vec<usize>>::new(Identity).batch_size(batch);
    if workers > 0 {
        builder = builder.num_workers(workers);
    }
    let loader = builder.build(shard);
    let mut previous = None;
    for epoch in 0..3 {
        epochs.set_epoch(epoch);
        let batches: Vec<Vec<usize>> = loader.iter().collect();
        let mut want = reference.clone();
        want.set_epoch(epoch);
        let want = want.indices();
        let mut got: Vec<usize> = batches.iter().flatten().copied().collect();
        if workers == 0 {
            assert!(batches.iter().all(|b| b.len() <= batch));
            assert_eq!(got, want, "epoch {epoch}");
        } else {
            // Several workers interleave batches; the multiset must still match.
            let mut sorted = want.clone();
            sorted.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, sorted, "epoch {epoch}");
        }
        assert_eq!(loader.num_items(), reference.num_samples());
        assert_ne!(
            previous.as_ref(),
            Some(&want),
            "epoch {epoch} repeated the order"
        );
        previous = Some(want);
    }
}

#[test]
fn single_threaded_loader_yields_the_sampler_order_per_epoch() {
    loaded(0);
}

#[test]
fn multi_worker_loader_yields_the_same_items() {
    loaded(2);
}

#[test]
fn mismatched_dataset_length_is_reported() {
    let data = InMemDataset::new(vec![1u8; 5]);
    let sampler = DistributedSampler::new(6, 2, 0).unwrap();
    let result = std::panic::catch_unwind(|| DistributedDataset::new(data, sampler).len());
    let message = *result.unwrap_err().downcast::<String>().unwrap();
    assert!(
        message.contains("made for 6 items but the dataset has 5"),
        "{message}"
    );
}
