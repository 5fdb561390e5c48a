#!/usr/bin/env bash
# burn-ddp GPU check: NCCL correctness, the toy trainer on CUDA, and bucket
# all-reduce timings, ending in a verdict table.
#
#   scripts/gpu-check.sh [--out DIR] [BIN_DIR]
#
# BIN_DIR (default target/release) must hold burn-ddp-run and
# examples/gpu_check built with `--features cuda`; gpu_check links the toy
# trainer's own code (`gpu_check toy` is examples/toy on Ddp<Autodiff<Cuda>>).
# With examples/gpu_check22 there too (Burn 0.22's, built with `--features
# cuda` by scripts/build-gpu-bins.sh; it links toy22's code as `gpu_check22
# toy`), the same run also checks Burn 0.22's NCCL path; without it, a SKIP
# row.
# The script never builds: a GPU machine without Rust runs binaries carried
# from a build machine (docs/gpu.md). Nothing here needs network access.
#
# It ends within GPU_CHECK_BUDGET seconds (default 360, 6 minutes): each
# step gets at most its own limit and never more than what is left; a step
# that no longer fits is reported as SKIP. With --out DIR (or $OUT set) the
# whole log (gpu-check.log), the verdict table (verdict.md) and every step's
# log are written there.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT_DIR="${OUT:-}"
BIN=target/release
while [ $# -gt 0 ]; do
  case $1 in
    --out) OUT_DIR=$2; shift 2;;
    --out=*) OUT_DIR=${1#--out=}; shift;;
    -h|--help) sed -n '2,20p' "$0"; exit 0;;
    *) BIN=$1; shift;;
  esac
done
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# Binaries carried packed (scripts/build-gpu-bins.sh packs them when they
# would not fit the carried folder's limit): unpacked here first.
if [ -f "$BIN/bins.tar.xz" ]; then
  mkdir -p "$WORK/bin"
  tar -xJf "$BIN/bins.tar.xz" -C "$WORK/bin" || { echo "cannot unpack $BIN/bins.tar.xz"; exit 2; }
  BIN="$WORK/bin"
fi
if [ -n "$OUT_DIR" ]; then
  mkdir -p "$OUT_DIR" || { echo "cannot create $OUT_DIR"; exit 2; }
  exec > >(tee "$OUT_DIR/gpu-check.log") 2>&1
fi
BUDGET=${GPU_CHECK_BUDGET:-360}
DEADLINE=$((SECONDS + BUDGET))
ROWS=()
FAILED=0

row() { # name verdict detail
  ROWS+=("$1|$2|$3")
  [ "$2" = FAIL ] && FAILED=1
  printf '== %-34s %s  %s\n' "$1" "$2" "$3"
}

if ! [ -x "$BIN/burn-ddp-run" ] || ! [ -x "$BIN/examples/gpu_check" ]; then
  echo "missing binaries in $BIN (burn-ddp-run, examples/gpu_check);"
  echo "build them on a machine with Rust: cargo build --release --features cuda -p burn-ddp-run -p burn-ddp-examples --bins --example gpu_check"
  exit 2
fi

# --- What this machine has -------------------------------------------------
GPUS=0
if command -v nvidia-smi >/dev/null 2>&1; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  nvidia-smi -L 2>/dev/null | sed 's/^/   /'
fi
row "gpus visible" "$([ "$GPUS" -gt 0 ] && echo PASS || echo FAIL)" \
  "$GPUS (nvidia-smi -L)${CUDA_VISIBLE_DEVICES:+, CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES kept}"
[ "$GPUS" -gt 0 ] || { echo "no GPU: nothing more to check"; }

# Where a bare GPU machine keeps CUDA's pieces: the loader's paths, the CUDA
# toolkit, and pip's wheels (nvidia/<package>/lib, and nvidia/cu13 for CUDA 13)
# in any Python environment, /opt/torch/.venv included.
SITE_DIRS=$( { python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null
  ls -d /opt/torch/.venv/lib/python3*/site-packages ${VIRTUAL_ENV:+$VIRTUAL_ENV/lib/python3*/site-packages} 2>/dev/null
  echo "${GPU_CHECK_SITE_PACKAGES:-}"; } | grep . | sort -u)
lib_dirs() {
  local path="${LD_LIBRARY_PATH:-}" site
  for d in ${path//:/ }; do echo "$d"; done
  echo /usr/local/cuda/lib64
  echo /usr/local/cuda/targets/x86_64-linux/lib
  echo /usr/lib/x86_64-linux-gnu
  for site in $SITE_DIRS; do
    ls -d "$site"/nvidia/*/lib "$site"/nvidia/cu1*/lib 2>/dev/null
  done
}
find_lib() { # name -> path of the first match
  local name=$1 dir
  ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }' | grep . && return 0
  for dir in $(lib_dirs); do
    [ -e "$dir/$name" ] && { echo "$dir/$name"; return 0; }
  done
  return 1
}
use_dir() { # a folder the binaries must load from: put it on LD_LIBRARY_PATH
  case ":${LD_LIBRARY_PATH:-}:" in *":$1:"*) ;; *) export LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}";; esac
}

NCCL=$(find_lib libnccl.so || true)
if [ -z "$NCCL" ]; then
  NCCL2=$(find_lib libnccl.so.2 || true)
  if [ -n "$NCCL2" ]; then
    # pip's nvidia-nccl wheels ship only libnccl.so.2; cudarc opens libnccl.so.
    mkdir -p "$WORK/lib" && ln -s "$NCCL2" "$WORK/lib/libnccl.so"
    use_dir "$WORK/lib"
    use_dir "$(dirname "$NCCL2")"
    NCCL="$NCCL2 (linked as libnccl.so for this run)"
  fi
else
  use_dir "$(dirname "$NCCL")"
fi
row "libnccl" "$([ -n "$NCCL" ] && echo PASS || echo FAIL)" "${NCCL:-not found; install NCCL 2.18+ (pip: nvidia-nccl-cu13)}"

# NCCL's version from the library itself: averaging uses ncclAvg (2.10), the
# in-place check a pre-multiplied sum (2.11).
if [ -n "$NCCL" ]; then
  NCCL_CODE=$(python3 -c '
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1]); v = ctypes.c_int()
print(v.value if lib.ncclGetVersion(ctypes.byref(v)) == 0 else "")' "${NCCL%% *}" 2>/dev/null)
  if [ -n "$NCCL_CODE" ]; then
    major=$((NCCL_CODE / 10000)); minor=$((NCCL_CODE / 100 % 100)); patch=$((NCCL_CODE % 100))
    if [ "$NCCL_CODE" -lt 10000 ]; then major=$((NCCL_CODE / 1000)); minor=$((NCCL_CODE / 100 % 10)); fi
    ok=$([ "$major" -gt 2 ] || { [ "$major" -eq 2 ] && [ "$minor" -ge 11 ]; } && echo PASS || echo FAIL)
    row "nccl version (>= 2.11)" "$ok" "$major.$minor.$patch"
  else
    row "nccl version (>= 2.11)" SKIP "could not read it from the library (python3 ctypes, ncclGetVersion)"
  fi
fi

NVRTC=$(find_lib libnvrtc.so || find_lib libnvrtc.so.13 || find_lib libnvrtc.so.12 || true)
if [ -n "$NVRTC" ]; then
  use_dir "$(dirname "$NVRTC")"
  if [ "$(basename "$NVRTC")" != libnvrtc.so ]; then
    # cudarc opens libnvrtc.so; wheels ship only the versioned name.
    mkdir -p "$WORK/lib" && ln -sf "$NVRTC" "$WORK/lib/libnvrtc.so" && use_dir "$WORK/lib"
    NVRTC="$NVRTC (linked as libnvrtc.so for this run)"
  fi
fi
row "libnvrtc (Burn's kernels)" "$([ -n "$NVRTC" ] && echo PASS || echo FAIL)" "${NVRTC:-not found; install NVRTC (pip: nvidia-cuda-nvrtc)}"

# The CUDA headers cubecl compiles kernels against: CUDA_PATH, /usr/local/cuda,
# or a wheel's include folder (then CUDA_PATH points at it for this run).
HEADERS=""
for root in ${CUDA_PATH:-} /usr/local/cuda /opt/cuda $(for site in $SITE_DIRS; do ls -d "$site"/nvidia/cu1* "$site"/nvidia/cuda_runtime 2>/dev/null; done); do
  if [ -f "$root/include/cuda_runtime.h" ]; then HEADERS=$root; break; fi
done
if [ -n "$HEADERS" ] && [ "$HEADERS" != "${CUDA_PATH:-}" ]; then export CUDA_PATH=$HEADERS; fi
if [ -n "$HEADERS" ]; then
  row "cuda headers (cuda_runtime.h)" PASS "CUDA_PATH=$HEADERS"
else
  row "cuda headers (cuda_runtime.h)" FAIL "not found under CUDA_PATH, /usr/local/cuda, /opt/cuda or the pip wheels (nvidia/cu13)"
fi

# --- Checks ------------------------------------------------------------------
last_lines() { tail -2 "$1" | tr '\n' ' ' | cut -c1-200; }

left() { echo $((DEADLINE - SECONDS)); }

fits() { # row-name: whether a step still has 20 s of the budget; SKIP row if not
  if [ "$(left)" -ge 20 ]; then return 0; fi
  row "$1" SKIP "no time left in the ${BUDGET} s budget"
  return 1
}

run() { # log-name limit command...: at most `limit` s, never past the deadline
  local log="$WORK/$1.log" limit=$2 rest; shift 2
  rest=$(( $(left) - 5 ))
  [ "$rest" -lt "$limit" ] && limit=$rest
  [ "$limit" -lt 1 ] && limit=1
  timeout -k 5 "$limit" "$@" >"$log" 2>&1
  local code=$?
  [ "$code" -eq 124 ] && echo "(stopped after $limit s)" >>"$log"
  echo $code
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
  if fits "nccl world=1 collectives"; then
  code=$(BURN_DDP_BACKEND=nccl run nccl1 40 "$BIN/examples/gpu_check" nccl)
  read -r verdict detail <<<"$(results_of "$WORK/nccl1.log")"
  [ "$code" -ne 0 ] && verdict=FAIL
  row "nccl world=1 collectives" "$verdict" "$detail"
  fi

  if fits "toy cuda world=1 over nccl"; then
  code=$(BURN_DDP_BACKEND=nccl run toy1 40 "$BIN/burn-ddp-run" --standalone --nproc-per-node 1 \
    "$BIN/examples/gpu_check" toy --epochs 2 --loss-precision 9 --checkpoint-dir "$WORK")
  read -r verdict detail <<<"$(toy_verdict "$WORK/toy1.log" "$code" gpu)"
  row "toy cuda world=1 over nccl" "$verdict" "$detail"
  fi

  # The same on Burn's fused CUDA backend (burn-cuda's default features).
  if fits "toy fused cuda world=1 over nccl"; then
  code=$(BURN_DDP_BACKEND=nccl run toyfused 40 "$BIN/burn-ddp-run" --standalone \
    --nproc-per-node 1 "$BIN/examples/gpu_check" toy-fused --epochs 2 --loss-precision 9 \
    --checkpoint-dir "$WORK")
  read -r verdict detail <<<"$(toy_verdict "$WORK/toyfused.log" "$code" gpu)"
  row "toy fused cuda world=1 over nccl" "$verdict" "$detail"
  fi

  # Both must train exactly as plain Autodiff<Cuda> does (losses to 1e-6).
  if fits "toy over nccl = Autodiff<Cuda>"; then
  code=$(run toyref 40 "$BIN/examples/gpu_check" toy-reference --epochs 2 --loss-precision 9 \
    --checkpoint-dir "$WORK")
  ref=$(grep -o 'Avg Loss: [0-9.e+-]*' "$WORK/toyref.log" 2>/dev/null | tail -1 | cut -d' ' -f3)
  if [ "$code" -ne 0 ] || [ -z "$ref" ]; then
    row "toy over nccl = Autodiff<Cuda>" FAIL "reference exit $code; $(last_lines "$WORK/toyref.log")"
  else
    gaps=""
    for log in toy1 toyfused; do
      got=$(grep -o 'Avg Loss: [0-9.e+-]*' "$WORK/$log.log" 2>/dev/null | tail -1 | cut -d' ' -f3)
      gaps="$gaps $log=$(awk -v a="${got:-nan}" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; s = (b < 0 ? -b : b); if (s < 1e-12) s = 1e-12; if (a == "nan") print "missing"; else printf "%.2e", d / s }')"
    done
    worst=$(echo "$gaps" | tr ' ' '\n' | cut -d= -f2 | grep . | sort -g | tail -1)
    ok=$(awk -v w="$worst" 'BEGIN { print (w != "missing" && w + 0 <= 1e-6) ? "PASS" : "FAIL" }')
    row "toy over nccl = Autodiff<Cuda>" "$ok" "reference loss $ref; relative gaps$gaps"
  fi
  fi

  if fits "toy cuda world=2 one gpu over tcp"; then
  # Both ranks on the first visible GPU (of an existing CUDA_VISIBLE_DEVICES, if set).
  first_gpu=${CUDA_VISIBLE_DEVICES:-0}
  code=$(CUDA_VISIBLE_DEVICES=${first_gpu%%,*} BURN_DDP_BACKEND=tcp run toy2 40 \
    "$BIN/burn-ddp-run" --standalone --nproc-per-node 2 "$BIN/examples/gpu_check" toy \
    --epochs 2 --batch-size 64 --loss-precision 9 --checkpoint-dir "$WORK")
  read -r verdict detail <<<"$(toy_verdict "$WORK/toy2.log" "$code" host)"
  row "toy cuda world=2 one gpu over tcp" "$verdict" "$detail"
  fi

  # 2 ranks x 64 must train as 1 rank x 128 (losses to 1e-5: the sums differ in order).
  if fits "toy world=2 = world 1, twice the batch"; then
  code=$(run toyref2 40 "$BIN/examples/gpu_check" toy-reference --epochs 2 --batch-size 128 \
    --loss-precision 9 --checkpoint-dir "$WORK")
  ref=$(grep -o 'Avg Loss: [0-9.e+-]*' "$WORK/toyref2.log" 2>/dev/null | tail -1 | cut -d' ' -f3)
  got=$(grep -o 'Avg Loss: [0-9.e+-]*' "$WORK/toy2.log" 2>/dev/null | tail -1 | cut -d' ' -f3)
  if [ "$code" -ne 0 ] || [ -z "$ref" ] || [ -z "$got" ]; then
    row "toy world=2 = world 1, twice the batch" FAIL "reference exit $code; $(last_lines "$WORK/toyref2.log")"
  else
    gap=$(awk -v a="$got" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; s = (b < 0 ? -b : b); if (s < 1e-12) s = 1e-12; printf "%.2e", d / s }')
    ok=$(awk -v g="$gap" 'BEGIN { print (g + 0 <= 1e-5) ? "PASS" : "FAIL" }')
    row "toy world=2 = world 1, twice the batch" "$ok" "2x64 loss $got, 1x128 loss $ref, relative gap $gap"
  fi
  fi

  if [ "$GPUS" -ge 2 ]; then
    fits "nccl world=$GPUS collectives" && {
    code=$(BURN_DDP_BACKEND=nccl run ncclN 40 "$BIN/burn-ddp-run" --standalone \
      --nproc-per-node "$GPUS" "$BIN/examples/gpu_check" nccl)
    read -r verdict detail <<<"$(results_of "$WORK/ncclN.log")"
    [ "$code" -ne 0 ] && verdict=FAIL
    row "nccl world=$GPUS collectives" "$verdict" "$detail"
    }
    fits "toy cuda world=$GPUS over nccl" && {
    code=$(run toyN 40 "$BIN/burn-ddp-run" --standalone --nproc-per-node "$GPUS" \
      "$BIN/examples/gpu_check" toy --epochs 2 --checkpoint-dir "$WORK")
    read -r verdict detail <<<"$(toy_verdict "$WORK/toyN.log" "$code" gpu)"
    row "toy cuda world=$GPUS over nccl" "$verdict" "$detail"
    }
  else
    row "multi-rank nccl" "SKIP" "one GPU: NCCL refuses two ranks on one device"
  fi

  if fits "ddp overhead world=1"; then
  code=$(BURN_DDP_BACKEND=nccl run overhead 40 "$BIN/examples/gpu_check" overhead)
  ratio=$(awk '/^OVERHEAD/ { print $2 }' "$WORK/overhead.log")
  if [ "$code" -ne 0 ] || [ -z "$ratio" ]; then
    row "ddp overhead world=1" FAIL "exit $code; $(last_lines "$WORK/overhead.log")"
  else
    # A speed goal, not a correctness check: a miss is reported, not failed.
    goal=$(awk -v r="$ratio" 'BEGIN { print (r <= 1.03) ? "PASS" : "MISS" }')
    row "ddp overhead world=1, nccl path (goal <= 1.03)" "$goal" "$(grep '^OVERHEAD' "$WORK/overhead.log" | cut -d' ' -f2-)"
  fi
  fi

  BENCH_RANKS=$GPUS
  if fits "bucket all-reduce timings"; then
  code=$(BURN_DDP_BACKEND=nccl run bench 40 "$BIN/burn-ddp-run" --standalone \
    --nproc-per-node "$BENCH_RANKS" "$BIN/examples/gpu_check" bench)
  if [ "$code" -eq 0 ] && grep -q '^TABLE | 1024 MiB' "$WORK/bench.log"; then
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
fi

# --- Burn 0.22 (burn-ddp-22) ------------------------------------------------
# gpu_check22 built with --features cuda (scripts/build-gpu-bins.sh builds it
# with LLVM 23.1 from PyPI, which Burn 0.22's CUDA backend links): Burn 0.22's
# CUDA tensors through NCCL (`gpu_check22 nccl`), and the toy trainer on Burn
# 0.22's CUDA device (`gpu_check22 toy`, toy22's code), its gradients
# averaged by sync_gradients over NCCL in place.
toy22() { # log backend ranks extra...: toy22 --backend cuda through the launcher
  local log=$1 backend=$2 ranks=$3; shift 3
  BURN_DDP_BACKEND=$backend run "$log" 60 "$BIN/burn-ddp-run" --standalone --nproc-per-node "$ranks" \
    "$BIN/examples/gpu_check22" toy --backend cuda --epochs 2 --loss-precision 9 --checkpoint-dir "$WORK" "$@"
}
final_loss() { grep -o 'Avg Loss: [0-9.e+-]*' "$WORK/$1.log" 2>/dev/null | tail -1 | cut -d' ' -f3; }
relative_gap() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; s = (b < 0 ? -b : b); if (s < 1e-12) s = 1e-12; printf "%.2e", d / s }'; }
if [ "$GPUS" -gt 0 ] && ! [ -x "$BIN/examples/gpu_check22" ]; then
  row "burn 0.22: nccl world=1 collectives" SKIP "no $BIN/examples/gpu_check22: scripts/build-gpu-bins.sh builds it"
elif [ "$GPUS" -gt 0 ] && fits "burn 0.22: nccl world=1 collectives"; then
  code=$(BURN_DDP_BACKEND=nccl run nccl22 40 "$BIN/examples/gpu_check22" nccl)
  read -r verdict detail <<<"$(results_of "$WORK/nccl22.log")"
  [ "$code" -ne 0 ] && verdict=FAIL
  row "burn 0.22: nccl world=1 collectives" "$verdict" "$detail"
fi
if [ "$GPUS" -gt 0 ] && [ -x "$BIN/examples/gpu_check22" ]; then
  if fits "burn 0.22: toy22 cuda world=1 over nccl"; then
  code=$(toy22 toy22nccl nccl 1)
  read -r verdict detail <<<"$(toy_verdict "$WORK/toy22nccl.log" "$code" gpu)"
  row "burn 0.22: toy22 cuda world=1 over nccl" "$verdict" "$detail"
  fi
  # NCCL in place must train exactly as the host path does (losses to 1e-6).
  if fits "burn 0.22: toy22 over nccl = host path"; then
  code=$(toy22 toy22host tcp 1)
  ref=$(final_loss toy22host) got=$(final_loss toy22nccl)
  if [ "$code" -ne 0 ] || [ -z "$ref" ] || [ -z "$got" ]; then
    row "burn 0.22: toy22 over nccl = host path" FAIL "host run exit $code; $(last_lines "$WORK/toy22host.log")"
  else
    gap=$(relative_gap "$got" "$ref")
    ok=$(awk -v g="$gap" 'BEGIN { print (g + 0 <= 1e-6) ? "PASS" : "FAIL" }')
    row "burn 0.22: toy22 over nccl = host path" "$ok" "nccl loss $got, host loss $ref, relative gap $gap"
  fi
  fi
  # 2 ranks x 64 on one GPU (host path) must train as 1 rank x 128.
  if fits "burn 0.22: toy22 world=2 = world 1, twice the batch"; then
  first_gpu=${CUDA_VISIBLE_DEVICES:-0}
  code=$(CUDA_VISIBLE_DEVICES=${first_gpu%%,*} toy22 toy22two tcp 2 --batch-size 64)
  code2=$(toy22 toy22big tcp 1 --batch-size 128)
  got=$(final_loss toy22two) ref=$(final_loss toy22big)
  if [ "$code" -ne 0 ] || [ "$code2" -ne 0 ] || [ -z "$got" ] || [ -z "$ref" ]; then
    row "burn 0.22: toy22 world=2 = world 1, twice the batch" FAIL "exit $code / $code2; $(last_lines "$WORK/toy22two.log")"
  else
    gap=$(relative_gap "$got" "$ref")
    ok=$(awk -v g="$gap" 'BEGIN { print (g + 0 <= 1e-5) ? "PASS" : "FAIL" }')
    row "burn 0.22: toy22 world=2 = world 1, twice the batch" "$ok" "2x64 loss $got, 1x128 loss $ref, relative gap $gap"
  fi
  fi
  if [ "$GPUS" -ge 2 ] && fits "burn 0.22: toy22 cuda world=$GPUS over nccl"; then
    code=$(toy22 toy22N nccl "$GPUS")
    read -r verdict detail <<<"$(toy_verdict "$WORK/toy22N.log" "$code" gpu)"
    row "burn 0.22: toy22 cuda world=$GPUS over nccl" "$verdict" "$detail"
  fi
fi

# --- Verdict -----------------------------------------------------------------
verdict_table() {
  echo "| check | verdict | detail |"
  echo "| --- | --- | --- |"
  for r in "${ROWS[@]}"; do
    IFS='|' read -r name verdict detail <<<"$r"
    echo "| $name | $verdict | $detail |"
  done
}
echo
verdict_table
if [ -f "$WORK/bench.log" ]; then
  echo
  echo "Bucket all-reduce (mean), world=${BENCH_RANKS:-0}; busbw = bytes/time x 2(n-1)/n:"
  grep '^TABLE' "$WORK/bench.log" | sed 's/^TABLE //' | sed '1a| --- | --- | --- | --- | --- | --- |'
fi
echo
echo "Took $SECONDS s of the ${BUDGET} s budget."
if [ -n "$OUT_DIR" ]; then
  verdict_table >"$OUT_DIR/verdict.md"
  cp "$WORK"/*.log "$OUT_DIR"/ 2>/dev/null || true
fi
for log in "$WORK"/*.log; do
  [ -e "$log" ] || continue
  if grep -q 'FAIL\|panicked\|error' "$log"; then
    echo; echo "--- $(basename "$log") (last lines) ---"; tail -15 "$log"
  fi
done
exit $FAILED
