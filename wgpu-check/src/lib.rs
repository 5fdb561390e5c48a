//! Nothing to use here: this package holds `tests/wgpu.rs`, which trains on
//! `Ddp<Autodiff<Wgpu>>` (Burn's default, fused WebGPU backend) on two ranks
//! and compares it with one process on the global batch.
