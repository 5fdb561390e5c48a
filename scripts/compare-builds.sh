#!/usr/bin/env bash
# The benchmarks of docs/benchmarks.md for two builds in one invocation, each
# benchmark run for one build then the other, twice (before, after, before,
# after), so drift in the machine's speed shows as a spread, not a regression:
# same-host all-reduce (shared memory and TCP), buckets against one collective
# per parameter, the gradient sync's share of a 2-rank MNIST step (and what it
# allocates), world-1 overhead, and, as root, the two-machine bench.
#
#   # each DIR holds burn-ddp-run and examples/{allreduce_bench,ddp_bench}
#   # from `cargo build --release -p burn-ddp-run -p burn-ddp-comm
#   #   -p burn-ddp-examples --bins --examples`
#   scripts/compare-builds.sh BEFORE_DIR AFTER_DIR [--rounds 2] [--no-machines]
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 2 ] || { sed -n '2,12p' "$0"; exit 2; }
DIRS=("$(cd "$1" && pwd)" "$(cd "$2" && pwd)")
NAMES=(before after)
shift 2
ROUNDS=2 MACHINES=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --no-machines) MACHINES=0; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
for dir in "${DIRS[@]}"; do
  for f in burn-ddp-run examples/allreduce_bench examples/ddp_bench; do
    [ -x "$dir/$f" ] || { echo "$dir/$f is missing" >&2; exit 2; }
  done
done

# Runs "$@" for each build (with $L and $E pointing into it), ROUNDS times.
each() {
  local title=$1; shift
  for round in $(seq "$ROUNDS"); do
    for i in 0 1; do
      echo "### $title — ${NAMES[$i]} (round $round)"
      L=${DIRS[$i]}/burn-ddp-run E=${DIRS[$i]}/examples "$@" | grep -E '^\||^MNIST|^gradient' || true
      echo
    done
  done
}
allreduce() { BURN_DDP_TRANSPORT=$1 $L --standalone --nproc-per-node 2 "$E/allreduce_bench" \
  --sizes 4K,64K,1M,16M,100M --iters 20; }
buckets() { BURN_DDP_TRANSPORT=$1 $L --standalone --nproc-per-node 2 "$E/ddp_bench" --mode buckets \
  --iters 30; }
share() { $L --standalone --nproc-per-node 2 "$E/ddp_bench" --mode share --iters 20; }
overhead() { "$E/ddp_bench" --mode overhead --iters 15; }

echo "# ${NAMES[0]}: ${DIRS[0]}"
echo "# ${NAMES[1]}: ${DIRS[1]}"
echo "# $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
echo
each "all-reduce, shared memory" allreduce shm
each "all-reduce, TCP" allreduce tcp
each "buckets, TCP" buckets tcp
each "buckets, shared memory" buckets shm
each "sync share of a 2-rank MNIST step" share
each "world-1 overhead" overhead
if [ "$MACHINES" = 1 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "### two machines: skipped (needs root; rerun with sudo or pass --no-machines)"
  else
    for round in $(seq "$ROUNDS"); do
      for i in 0 1; do
        echo "### two machines x 2 ranks — ${NAMES[$i]} (round $round)"
        scripts/two-machine-bench.sh --bin "${DIRS[$i]}" --iters 5 | grep -E '^#|^\|' || true
        echo
      done
    done
  fi
fi
