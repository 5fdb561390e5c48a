#!/usr/bin/env bash
# Ddp<Autodiff<Wgpu>> (Burn's default WebGPU backend: fusion and autotune on)
# across two real processes, against one process on the global batch:
# wgpu-check/tests/wgpu.rs. Run it on a machine with a Vulkan, Metal or DX12
# device; it builds its own package (wgpu-check/, outside the main workspace,
# so Burn's WebGPU stack never enters the main build) and needs no launcher.
#
#   scripts/wgpu-check.sh                 # build (about 12 minutes on 2 cores) and run
#   CARGO_TARGET_DIR=target scripts/wgpu-check.sh   # reuse the main target dir
#
# Exit 0: the two ranks stay bitwise identical and equal the single process
# (relative 1e-4), every bucket over host memory. Before that, a probe checks
# Burn's Wgpu backend itself against the CPU on the same model; where the
# backend computes wrong values it says so (WRONG_VALUES) and fails, since
# nothing about Ddp can be learnt there. Mesa's software Vulkan (lavapipe) is
# such a device today: see docs/training.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export BURN_DDP_REQUIRE_WGPU=1
exec cargo test --manifest-path wgpu-check/Cargo.toml --test wgpu "$@"
