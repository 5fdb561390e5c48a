#!/usr/bin/env bash
# burn-ddp GPU check: NCCL correctness, the toy trainer on CUDA, and bucket
# all-reduce timings, ending in a verdict table.
#
#   scripts/gpu-check.sh [BIN_DIR]
#
# BIN_DIR (default target/release) must hold burn-ddp-run and
# examples/gpu_check built with `--features cuda`; gpu_check links the toy
# trainer's own code (`gpu_check toy` is examples/toy on Ddp<Autodiff<Cuda>>).
# Where cargo is available and they are missing, the script builds them; a GPU
# machine without Rust runs the binaries carried from a build machine (see
# docs/gpu.md). Nothing here needs network access.
set -uo pipefail
cd "$(dirname "$0")/.."

BIN="${1:-target/release}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
ROWS=()
FAILED=0

row() { # name verdict detail
  ROWS+=("$1|$2|$3")
  [ "$2" = FAIL ] && FAILED=1
  printf '== %-34s %s  %s\n' "$1" "$2" "$3"
}

have_binaries() {
  [ -x "$BIN/burn-ddp-run" ] && [ -x "$BIN/examples/gpu_check" ]
}

if ! have_binaries && command -v cargo >/dev/null 2>&1 && [ "$BIN" = target/release ]; then
  echo "building the release binaries with --features cuda ..."
  cargo build --release --features cuda -p burn-ddp-run -p burn-ddp-examples \
    --bins --example gpu_check || { echo "build failed"; exit 2; }
fi
if ! have_binaries; then
  echo "missing binaries in $BIN (burn-ddp-run, examples/gpu_check);"
  echo "build them with: cargo build --release --features cuda -p burn-ddp-run -p burn-ddp-examples --bins --example gpu_check"
  exit 2
fi

# --- What this machine has -------------------------------------------------
GPUS=0
if command -v nvidia-smi >/dev/null 2>&1; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  nvidia-smi -L 2>/dev/null | sed 's/^/   /'
fi
row "gpus visible" "$([ "$GPUS" -gt 0 ] && echo PASS || echo FAIL)" "$GPUS (nvidia-smi -L)"
[ "$GPUS" -gt 0 ] || { echo "no GPU: nothing more to check"; }

find_lib() { # name -> path of the first match on the loader's paths, pip wheels included
  local name=$1 dir
  ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }' | grep . && return 0
  local path="${LD_LIBRARY_PATH:-}"
  for dir in ${path//:/ } /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu \
    $(python3 -c 'import site,sys; print(" ".join(site.getsitepackages()))' 2>/dev/null | \
      xargs -I{} sh -c 'ls -d {}/nvidia/*/lib 2>/dev/null'); do
    [ -e "$dir/$name" ] && { echo "$dir/$name"; return 0; }
  done
  return 1
}

NCCL=$(find_lib libnccl.so || true)
if [ -z "$NCCL" ]; then
  NCCL2=$(find_lib libnccl.so.2 || true)
  if [ -n "$NCCL2" ]; then
    # pip's nvidia-nccl wheels ship only libnccl.so.2; cudarc opens libnccl.so.
    mkdir -p "$WORK/lib" && ln -s "$NCCL2" "$WORK/lib/libnccl.so"
    export LD_LIBRARY_PATH="$WORK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    NCCL="$NCCL2 (linked as libnccl.so for this run)"
  fi
fi
row "libnccl" "$([ -n "$NCCL" ] && echo PASS || echo FAIL)" "${NCCL:-not found; install NCCL 2.18+}"
NVRTC=$(find_lib libnvrtc.so || find_lib libnvrtc.so.12 || find_lib libnvrtc.so.13 || true)
row "libnvrtc (Burn's kernels)" "$([ -n "$NVRTC" ] && echo PASS || echo FAIL)" "${NVRTC:-not found; install NVRTC from the CUDA toolkit}"

# --- Checks ------------------------------------------------------------------
last_lines() { tail -2 "$1" | tr '\n' ' ' | cut -c1-200; }

run() { # log-name timeout command...
  local log="$WORK/$1.log" limit=$2; shift 2
  timeout "$limit" "$@" >"$log" 2>&1
  echo $?
}

results_of() { # log -> verdict detail from RESULT lines
  local log=$1 fails
  fails=$(grep '^RESULT .* FAIL' "$log" | head -3 | cut -c1-160 | tr '\n' ';')
  if [ -z "$fails" ] && grep -q '^RESULT .* PASS' "$log"; then
    echo "PASS $(grep -c '^RESULT .* PASS' "$log") checks passed"
  elif [ -n "$fails" ]; then
    echo "FAIL $fails"
  else
    echo "FAIL no results: $(last_lines "$log")"
  fi
}

toy_verdict() { # log code expect(gpu|host)
  local log=$1 code=$2 expect=$3 line buckets on_gpu
  line=$(grep '^Gradient sync:' "$log" | tail -1)
  buckets=$(echo "$line" | awk '{print $3}')
  on_gpu=$(echo "$line" | awk '{print $5}')
  if [ "$code" -ne 0 ] || ! grep -q 'Training complete.' "$log" || [ -z "$line" ]; then
    echo "FAIL exit $code; $(last_lines "$log")"
  elif [ "$expect" = gpu ] && [ "$on_gpu" != "$buckets" ]; then
    echo "FAIL only $on_gpu of $buckets buckets went over NCCL"
  elif [ "$expect" = host ] && [ "$on_gpu" != 0 ]; then
    echo "FAIL $on_gpu buckets went over NCCL, expected the host path"
  else
    echo "PASS $(grep 'Avg Loss' "$log" | tail -1), $line"
  fi
}

if [ "$GPUS" -gt 0 ]; then
  code=$(BURN_DDP_BACKEND=nccl run nccl1 120 "$BIN/examples/gpu_check" nccl)
  read -r verdict detail <<<"$(results_of "$WORK/nccl1.log")"
  [ "$code" -ne 0 ] && verdict=FAIL
  row "nccl world=1 collectives" "$verdict" "$detail"

  code=$(BURN_DDP_BACKEND=nccl run toy1 600 "$BIN/burn-ddp-run" --standalone --nproc-per-node 1 \
    "$BIN/examples/gpu_check" toy --epochs 2 --checkpoint-dir "$WORK")
  read -r verdict detail <<<"$(toy_verdict "$WORK/toy1.log" "$code" gpu)"
  row "toy cuda world=1 over nccl" "$verdict" "$detail"

  code=$(CUDA_VISIBLE_DEVICES=0 BURN_DDP_BACKEND=tcp run toy2 600 "$BIN/burn-ddp-run" --standalone \
    --nproc-per-node 2 "$BIN/examples/gpu_check" toy --epochs 2 --checkpoint-dir "$WORK")
  read -r verdict detail <<<"$(toy_verdict "$WORK/toy2.log" "$code" host)"
  row "toy cuda world=2 one gpu over tcp" "$verdict" "$detail"

  if [ "$GPUS" -ge 2 ]; then
    code=$(BURN_DDP_BACKEND=nccl run ncclN 300 "$BIN/burn-ddp-run" --standalone \
      --nproc-per-node "$GPUS" "$BIN/examples/gpu_check" nccl)
    read -r verdict detail <<<"$(results_of "$WORK/ncclN.log")"
    [ "$code" -ne 0 ] && verdict=FAIL
    row "nccl world=$GPUS collectives" "$verdict" "$detail"

    code=$(run toyN 600 "$BIN/burn-ddp-run" --standalone --nproc-per-node "$GPUS" \
      "$BIN/examples/gpu_check" toy --epochs 2 --checkpoint-dir "$WORK")
    read -r verdict detail <<<"$(toy_verdict "$WORK/toyN.log" "$code" gpu)"
    row "toy cuda world=$GPUS over nccl" "$verdict" "$detail"
  else
    row "multi-rank nccl" "SKIP" "one GPU: NCCL refuses two ranks on one device"
  fi

  code=$(run overhead 600 "$BIN/examples/gpu_check" overhead)
  ratio=$(awk '/^OVERHEAD/ { print $2 }' "$WORK/overhead.log")
  if [ "$code" -ne 0 ] || [ -z "$ratio" ]; then
    row "ddp overhead world=1" FAIL "exit $code; $(last_lines "$WORK/overhead.log")"
  else
    # A speed goal, not a correctness check: a miss is reported, not failed.
    goal=$(awk -v r="$ratio" 'BEGIN { print (r <= 1.03) ? "PASS" : "MISS" }')
    row "ddp overhead world=1 (goal <= 1.03)" "$goal" "$(grep '^OVERHEAD' "$WORK/overhead.log" | cut -d' ' -f2-)"
  fi

  BENCH_RANKS=$GPUS
  code=$(BURN_DDP_BACKEND=nccl run bench 600 "$BIN/burn-ddp-run" --standalone \
    --nproc-per-node "$BENCH_RANKS" "$BIN/examples/gpu_check" bench)
  if [ "$code" -eq 0 ] && grep -q '^TABLE | 256 MiB' "$WORK/bench.log"; then
    row "bucket all-reduce timings" PASS "world=$BENCH_RANKS, table below"
    # Goal with several GPUs: the bucket path keeps >= 90% of NCCL's bus
    # bandwidth from 25 MiB up, i.e. path/NCCL time <= 1/0.9.
    worst=$(awk -F'|' '/^TABLE \| [0-9]/ { split($2, s, " "); if (s[1] >= 25 && $5 + 0 > w) w = $5 + 0 } END { print w }' "$WORK/bench.log")
    if [ "$BENCH_RANKS" -ge 2 ]; then
      goal=$(awk -v w="$worst" 'BEGIN { print (w <= 1 / 0.9) ? "PASS" : "MISS" }')
      row "bucket busbw >= 90% of NCCL from 25 MiB" "$goal" "worst path/NCCL time ratio $worst"
    else
      row "bucket busbw >= 90% of NCCL from 25 MiB" SKIP "needs two GPUs (worst time ratio at world 1: $worst)"
    fi
  else
    row "bucket all-reduce timings" FAIL "exit $code; $(last_lines "$WORK/bench.log")"
  fi
fi

# --- Verdict -----------------------------------------------------------------
echo
echo "| check | verdict | detail |"
echo "| --- | --- | --- |"
for r in "${ROWS[@]}"; do
  IFS='|' read -r name verdict detail <<<"$r"
  echo "| $name | $verdict | $detail |"
done
if [ -f "$WORK/bench.log" ]; then
  echo
  echo "Bucket all-reduce (mean), world=${BENCH_RANKS:-0}; busbw = bytes/time x 2(n-1)/n:"
  grep '^TABLE' "$WORK/bench.log" | sed 's/^TABLE //' | sed '1a| --- | --- | --- | --- | --- | --- |'
fi
for log in "$WORK"/*.log; do
  [ -e "$log" ] || continue
  if grep -q 'FAIL\|panicked\|error' "$log"; then
    echo; echo "--- $(basename "$log") (last lines) ---"; tail -15 "$log"
  fi
done
exit $FAILED
