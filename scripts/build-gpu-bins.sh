#!/usr/bin/env bash
# Builds the GPU check's binaries on a machine that reaches only the package
# registries (crates.io, PyPI) and stages them, stripped, in gpu-bin/ (git-
# ignored), the folder scripts/gpu-check.sh runs from on a GPU machine:
#
#   scripts/build-gpu-bins.sh [--only-021] [DEST]     (default DEST: gpu-bin)
#   then, on the GPU machine:  scripts/gpu-check.sh --out "$OUT" gpu-bin
#
# Stripped, Burn 0.22's gpu_check22 (which links toy22's code: one LLVM, not
# two) is about 130 MiB (LLVM with every target, linked statically): over the
# limit, the staged binaries are packed into DEST/bins.tar.xz (about 35 MiB
# for the three), which gpu-check.sh unpacks before it runs.
#
# Burn 0.21's binaries (burn-ddp-run, gpu_check) need nothing but Rust. Burn
# 0.22's CUDA backend compiles kernels through LLVM 23.1 (cubecl-llvm, NVPTX),
# whose build dependency tracel-llvm-bundler 23.1.0-4 downloads a prebuilt
# LLVM from outside the registries unless its install folder already holds
# its sentinel. This script puts PyPI's static LLVM 23.1 build there
# (mlc-llvm-static and its -extra-targets, which carry NVPTX, pinned by
# hash), so the 0.22 build never goes to the network (docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."

ONLY_021=0
DEST=gpu-bin
while [ $# -gt 0 ]; do
  case $1 in
    --only-021) ONLY_021=1; shift;;
    -h|--help) sed -n '2,16p' "$0"; exit 0;;
    *) DEST=$1; shift;;
  esac
done
# The GPU machine receives the folder as carried files: 64 MiB at most.
LIMIT_MIB=${GPU_BIN_LIMIT_MIB:-64}
started=$SECONDS

# --- LLVM 23.1 for Burn 0.22, from PyPI ------------------------------------
# tracel-llvm-bundler 23.1.0-4 looks in dirs::data_local_dir()/tracel/
# tracel-llvm-23.1.0-4 and returns at once when `.tracel-llvm-installed` is
# there; it then links with that folder's `bin/llvm-config --link-static`.
# A folder without the sentinel makes it download (and fail offline), so the
# sentinel is written before any build, and the folder is a link (a failed
# bundler run removes only the link).
prepare_llvm() {
  local sdk="${TRACEL_LLVM_SDK:-/opt/tracel-llvm-sdk}"
  local data="${XDG_DATA_HOME:-$HOME/.local/share}"
  local dest="$data/tracel/tracel-llvm-23.1.0-4"
  local config="$sdk/mlc_llvm_static/static/bin/llvm-config"
  if ! { [ -x "$config" ] && "$config" --targets-built | grep -qw NVPTX; }; then
    echo "== LLVM 23.1 from PyPI (mlc-llvm-static, about 100 MB to download) into $sdk"
    local reqs
    reqs=$(mktemp)
    cat > "$reqs" <<'REQ'
mlc-llvm-static==23.1.1.post0 --hash=sha256:dcfec888abfaa418be77d41af585805f31463584cf9c90582992c00f392c1ac5
mlc-llvm-static-extra-targets==23.1.1.post0 --hash=sha256:c36e834d9a4e9cf9759f27fece65711ece7a2fc2b5a96dbb15d66f5e9e787929
REQ
    python3 -m pip install --no-deps --only-binary=:all: --require-hashes --upgrade \
      --target "$sdk" -r "$reqs"
    rm -f "$reqs"
  fi
  mkdir -p "$data/tracel"
  if [ -e "$dest" ] && [ ! -L "$dest" ] && [ ! -e "$dest/.tracel-llvm-installed" ]; then
    rm -rf "$dest" # a failed bundler run's leftover
  fi
  [ -e "$dest" ] || ln -sfn "$sdk/mlc_llvm_static/static" "$dest"
  # Created once, never touched again: the bundler's build script reruns when
  # the sentinel changes (rerun-if-changed), and with it cubecl-llvm and all of
  # Burn 0.22's CUDA stack (about 35 minutes on 2 cores).
  [ -e "$dest/.tracel-llvm-installed" ] || touch "$dest/.tracel-llvm-installed"
  "$dest/bin/llvm-config" --link-static --targets-built | grep -qw NVPTX || {
    echo "the LLVM in $dest has no NVPTX target"; exit 1; }
  "$dest/bin/llvm-config" --link-static --libs >/dev/null
  echo "== LLVM $("$dest/bin/llvm-config" --version) with NVPTX at $dest"
}

# --- Builds ----------------------------------------------------------------
echo "== Burn 0.21: burn-ddp-run, gpu_check (--features cuda)"
cargo build --release --features cuda -p burn-ddp-run -p burn-ddp-examples --bins --example gpu_check
t021=$((SECONDS - started))
if [ "$ONLY_021" = 0 ]; then
  prepare_llvm
  echo "== Burn 0.22: gpu_check22 (--features cuda; toy22 inside it)"
  cargo build --release --features cuda -p burn-ddp-22-examples --example gpu_check22
fi
t_all=$((SECONDS - started))

# --- Staging ---------------------------------------------------------------
rm -rf "$DEST"
mkdir -p "$DEST/examples"
OUTPUT=${CARGO_TARGET_DIR:-target}/release
cp "$OUTPUT/burn-ddp-run" "$DEST/"
cp "$OUTPUT/examples/gpu_check" "$DEST/examples/"
if [ "$ONLY_021" = 0 ]; then
  cp "$OUTPUT/examples/gpu_check22" "$DEST/examples/"
fi
strip "$DEST/burn-ddp-run" "$DEST"/examples/*
du -b "$DEST/burn-ddp-run" "$DEST"/examples/* | awk '{ printf "   %-34s %6.1f MiB\n", $2, $1 / 1048576 }'
total=$(du -sb "$DEST" | cut -f1)
printf '== %s: %.1f MiB in all (limit %s MiB); built in %d s (Burn 0.21 part: %d s)\n' \
  "$DEST" "$(echo "$total / 1048576" | bc -l)" "$LIMIT_MIB" "$t_all" "$t021"
if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
  # LLVM's code packs well (about 5x): one archive, which scripts/gpu-check.sh
  # unpacks on the GPU machine before it runs.
  tar -cJf "$DEST.tar.xz" -C "$DEST" burn-ddp-run examples
  rm -rf "$DEST"/burn-ddp-run "$DEST"/examples
  mv "$DEST.tar.xz" "$DEST/bins.tar.xz"
  packed=$(du -sb "$DEST" | cut -f1)
  printf '== packed into %s/bins.tar.xz: %.1f MiB\n' "$DEST" "$(echo "$packed / 1048576" | bc -l)"
  if [ "$packed" -gt $((LIMIT_MIB * 1048576)) ]; then
    echo "== still over $LIMIT_MIB MiB: carry Burn 0.21's binaries alone (--only-021)"
    exit 3
  fi
fi
