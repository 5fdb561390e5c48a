#!/usr/bin/env bash
# Builds and tests burn-ddp-22's unchanged sources against Burn 0.23.0-pre.1:
# a scratch package (outside the workspace, so the workspace keeps one Burn
# 0.22 build) with burn-ddp-22's src/ (its shared/ front-end sources copied
# in, not linked), tests/ and guide, the shared core by
# path, Burn pinned to the pre-release, and the `train` feature on (the
# Learner strategy and its multi-process tests) with `flex` (SyncBatchNorm
# on the tests' backend). CI runs it (.ci/run) with
# the workspace's target dir, so Burn 0.23 is supported the week it is out.
#
#   scripts/burn-023-check.sh [SCRATCH_DIR]     (default /tmp/burn-ddp-023-check)
#   BURN_023_VERSION='=0.23.0' scripts/burn-023-check.sh   (another release)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-/tmp/burn-ddp-023-check}"
version="${BURN_023_VERSION:-=0.23.0-pre.1}"
mkdir -p "$dir/docs"
rm -rf "$dir/src" "$dir/tests"
cp -rL "$repo/burn-ddp-22/src" "$repo/burn-ddp-22/tests" "$dir/"
cp "$repo/docs/burn-0.22.md" "$dir/docs/"
sed -i 's#include_str!("../../docs/burn-0.22.md")#include_str!("../docs/burn-0.22.md")#' "$dir/src/lib.rs"
cat > "$dir/Cargo.toml" <<TOML
[package]
name = "burn-ddp-023-check"
version = "0.1.0"
edition = "2021"
publish = false

build = "build.rs"

[lib]
name = "burn_ddp_22"
path = "src/lib.rs"

[features]
train = ["burn/train"]
# SyncBatchNorm's backend extension routed to Flex, the tests' backend.
# (Burn 0.23 has no NdArray backend: no `ndarray` feature here.)
flex = ["burn/flex"]
default = ["train", "flex"]

[dependencies]
burn = { version = "$version", default-features = false, features = ["std", "optim", "dataset", "autodiff", "extension"] }
burn-ddp-comm = { path = "$repo/burn-ddp-comm" }
burn-ddp-training = { path = "$repo/burn-ddp-training" }
burn-ddp-sampler = { path = "$repo/burn-ddp-sampler", features = ["group"] }
burn-pack = { version = "$version", default-features = false, features = ["std"] }
log = "0.4"
half = { version = "2", features = ["bytemuck"] }
bytemuck = "1"

[dev-dependencies]
burn = { version = "$version", default-features = false, features = ["std", "optim", "dataset", "flex", "autodiff", "train"] }
burn-ddp-testkit = { path = "$repo/testkit" }
libc = "0.2"

[[test]]
name = "multiprocess"
path = "tests/multiprocess/main.rs"
harness = false

[[test]]
name = "learner"
path = "tests/learner/main.rs"
harness = false

# The few Learner events and progress loggers Burn 0.23 changed are
# cfg(burn_023) in the sources (src/train/burn_version.rs).
[lints.rust]
unexpected_cfgs = { level = "warn", check-cfg = ["cfg(burn_023)", 'cfg(feature, values("cuda", "ndarray"))'] }

[workspace]
TOML
cat > "$dir/build.rs" <<'RS'
fn main() {
    println!("cargo::rustc-cfg=burn_023");
}
RS
cd "$dir"
cargo test
echo "burn-ddp-22's sources pass against burn $version"
