#!/usr/bin/env bash
# The Burn 0.21 front-end (burn-ddp) and the Burn 0.22 one (burn-ddp-22) side
# by side in one invocation, alternating (0.21, 0.22, 0.21, 0.22, ...) so
# drift in the machine's speed shows as a spread: the gradient sync's share of
# a 2-rank MNIST CNN step, the world-1 overhead against the plain step, and
# the MNIST trainer's epoch time on 2 processes (real MNIST, Flex).
#
#   cargo build --release -p burn-ddp-run -p burn-ddp-examples -p burn-ddp-22-examples \
#       --bins --example ddp_bench --example mnist --example ddp_bench22 --example mnist22
#   scripts/front-end-bench.sh [--rounds 2] [--epoch-samples N] [--out FILE]
#
# --epoch-samples limits the epoch-time runs to the first N training images
# (default: all 60000, about 3 minutes per trainer per round here).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=2 SAMPLES="" OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --epoch-samples) SAMPLES=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
R=target/release
L=$R/burn-ddp-run
for f in $L $R/examples/ddp_bench $R/examples/mnist $R/examples/ddp_bench22 $R/examples/mnist22; do
  [ -x "$f" ] || { echo "$f is missing: build it first (see the top of $0)" >&2; exit 2; }
done
DATA=../shared/data/mnist
[ -f $DATA/train-images-idx3-ubyte.gz ] || { echo "no MNIST files in $DATA" >&2; exit 2; }
[ -n "$OUT" ] && exec > >(tee "$OUT") 2>&1

declare -A BENCH=([0.21]=ddp_bench [0.22]=ddp_bench22)
declare -A MNIST=([0.21]=mnist [0.22]=mnist22)
# One number out of a table row: the row's label, then which field.
field() { grep -F "| $2" <<<"$1" | head -n 1 | awk -F'|' -v f="$3" '{print $f}' | sed 's/^ *//; s/ *$//'; }

declare -A SHARE WAIT OVERHEAD EPOCH
for round in $(seq 1 "$ROUNDS"); do
  for v in 0.21 0.22; do
    echo "== round $round, Burn $v: gradient sync share, 2 ranks"
    out=$($L --standalone --nproc-per-node 2 $R/examples/${BENCH[$v]} --mode share --iters 20)
    echo "$out"
    SHARE[$v]+="$(field "$out" "sync work" 3 | sed 's/.*= //; s/ of the step//') "
    WAIT[$v]+="$(field "$out" "waiting for" 3 | sed 's/.*= //; s/ of the step//') "
    echo "== round $round, Burn $v: world-1 overhead"
    out=$($R/examples/${BENCH[$v]} --mode overhead --iters 20)
    echo "$out"
    OVERHEAD[$v]+="$(tail -n 1 <<<"$out" | awk -F'|' '{print $4}' | tr -d ' ') "
    echo "== round $round, Burn $v: MNIST epoch, 2 processes"
    out=$($L --standalone --nproc-per-node 2 $R/examples/${MNIST[$v]} --epochs 1 \
      --data-dir $DATA --output /tmp/front-end-bench-$$ ${SAMPLES:+--train-samples $SAMPLES} 2>&1)
    echo "$out" | grep '^epoch='
    EPOCH[$v]+="$(grep -o 'epoch_time=[0-9.]*s' <<<"$out" | head -n 1 | cut -d= -f2) "
  done
done
rm -f /tmp/front-end-bench-$$*

echo
echo "| measure (round by round) | Burn 0.21, burn-ddp | Burn 0.22, burn-ddp-22 |"
echo "| --- | ---: | ---: |"
echo "| sync work, share of a 2-rank MNIST step (goal <= 2%) | ${SHARE[0.21]}| ${SHARE[0.22]}|"
echo "| waiting for the slower rank, share of the step | ${WAIT[0.21]}| ${WAIT[0.22]}|"
echo "| world-1 step / plain step (goal <= 1.03) | ${OVERHEAD[0.21]}| ${OVERHEAD[0.22]}|"
echo "| MNIST epoch, 2 processes${SAMPLES:+, $SAMPLES images} | ${EPOCH[0.21]}| ${EPOCH[0.22]}|"
