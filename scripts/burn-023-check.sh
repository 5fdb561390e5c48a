#!/usr/bin/env bash
# Builds and tests burn-ddp-22's unchanged sources against Burn 0.23.0-pre.1:
# a scratch package (outside the workspace, so the workspace keeps one Burn
# 0.22 build) with burn-ddp-22's src/, tests/ and guide, the shared core by
# path, and Burn pinned to the pre-release. Not part of CI (it is a third Burn
# build); run it when Burn 0.23 moves.
#
#   scripts/burn-023-check.sh [SCRATCH_DIR]     (default /tmp/burn-ddp-023-check)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-/tmp/burn-ddp-023-check}"
version="${BURN_023_VERSION:-=0.23.0-pre.1}"
mkdir -p "$dir/docs"
rm -rf "$dir/src" "$dir/tests"
cp -r "$repo/burn-ddp-22/src" "$repo/burn-ddp-22/tests" "$dir/"
cp "$repo/docs/burn-0.22.md" "$dir/docs/"
sed -i 's#include_str!("../../docs/burn-0.22.md")#include_str!("../docs/burn-0.22.md")#' "$dir/src/lib.rs"
cat > "$dir/Cargo.toml" <<TOML
[package]
name = "burn-ddp-023-check"
version = "0.1.0"
edition = "2021"
publish = false

[lib]
name = "burn_ddp_22"
path = "src/lib.rs"

[dependencies]
burn = { version = "$version", default-features = false, features = ["std", "optim", "dataset"] }
burn-ddp-comm = { path = "$repo/burn-ddp-comm" }
burn-ddp-sampler = { path = "$repo/burn-ddp-sampler", features = ["group"] }
log = "0.4"
half = { version = "2", features = ["bytemuck"] }
bytemuck = "1"

[dev-dependencies]
burn = { version = "$version", default-features = false, features = ["std", "optim", "dataset", "flex", "autodiff"] }
burn-ddp-testkit = { path = "$repo/testkit" }
libc = "0.2"

[[test]]
name = "multiprocess"
path = "tests/multiprocess/main.rs"
harness = false

[workspace]
TOML
cd "$dir"
cargo test
echo "burn-ddp-22's sources pass against burn $version"
