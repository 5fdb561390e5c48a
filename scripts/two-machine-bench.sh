#!/usr/bin/env bash
# All-reduce across two "machines" (network namespaces with their own host name
# and /dev/shm, joined by a bridge, each link shaped with tc), 2 ranks each:
# burn-ddp's flat ring, its hierarchical all-reduce, and PyTorch's gloo, in
# one invocation. Needs root, iproute2, release builds of burn-ddp-run and the
# allreduce_bench example, and (for the gloo row) a Python with torch.
#
#   cargo build --release -p burn-ddp-run -p burn-ddp-comm --bins --example allreduce_bench
#   sudo scripts/two-machine-bench.sh [--rate 1gbit] [--sizes 16M,64M] [--iters 5]
#                                     [--python PATH] [--bin DIR]
#   sudo scripts/two-machine-bench.sh [--rate 1gbit] [--nproc-per-node N] -- PROGRAM ARGS...
#       (instead of the benchmarks: PROGRAM on 2 machines x N ranks (2) under
#       burn-ddp-run, one thread per rank, with this environment; machine 0's
#       output is printed)
#   sudo scripts/two-machine-bench.sh [--nproc-per-node N] --torch "SCRIPT ARGS..." -- PROGRAM ARGS...
#       (then, in the same invocation, the PyTorch SCRIPT on the same machines
#       under torchrun, N ranks each, gloo, one thread per rank: a side-by-side
#       comparison)
# With several ranks a machine, burn-ddp-run binds each to CPUs of its own
# (--cpu-bind cores, its default) and the PyTorch workers are bound the same
# way (scripts/bind-share.sh); --cpu-bind none leaves both to the scheduler.
# (tc's token bucket shapes the rate; netem, for delay, is not in every kernel.)
# --bin DIR takes burn-ddp-run and examples/allreduce_bench from DIR instead of
# target/release (scripts/compare-builds.sh runs two builds this way).
set -euo pipefail
cd "$(dirname "$0")/.."

RATE=1gbit SIZES=16M,64M ITERS=5 PYTHON=${PYTHON:-python3} PROGRAM=() BIN=$PWD/target/release TORCH= PER=2
CPU_BIND=cores
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; PROGRAM=("$@"); break ;;
    --rate) RATE=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    --torch) TORCH=$2; shift 2 ;;
    --bin) BIN=$(cd "$2" && pwd); shift 2 ;;
    --nproc-per-node) PER=$2; shift 2 ;;
    --cpu-bind) CPU_BIND=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ ${#PROGRAM[@]} -eq 0 ] && [ "$PER" != 2 ]; then
  echo "--nproc-per-node is for PROGRAM runs (after --); the benchmarks run 2 ranks each" >&2
  exit 2
fi
LAUNCHER=$BIN/burn-ddp-run
BENCH=$BIN/examples/allreduce_bench
for f in "$LAUNCHER" "$BENCH"; do
  [ -x "$f" ] || { echo "$f is missing: build it first (see --help)" >&2; exit 2; }
done

TAG="bb$$"
NS=("${TAG}m0" "${TAG}m1")
SW="${TAG}sw"
ADDR=("10.99.0.1" "10.99.0.2")
HOLDERS=()
cleanup() {
  for ns in "${NS[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  ip netns del "$SW" 2>/dev/null || true
}
trap cleanup EXIT

ip netns add "$SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for i in 0 1; do
  ns=${NS[$i]}
  ip netns add "$ns"
  ip link add "${TAG}i$i" type veth peer name "${TAG}o$i"
  ip link set "${TAG}i$i" netns "$ns"
  ip link set "${TAG}o$i" netns "$SW"
  ip -n "$ns" link set "${TAG}i$i" name eth0
  ip -n "$ns" addr add "${ADDR[$i]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$SW" link set "${TAG}o$i" master br0
  ip -n "$SW" link set "${TAG}o$i" up
  # Each machine's outgoing traffic limited: a full-duplex link of RATE.
  ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$RATE" burst 256kb latency 50ms
  # A holder keeps the machine's host name and /dev/shm for its processes.
  ip netns exec "$ns" unshare --uts --mount --propagation private \
    sh -c "hostname machine-$i && mount -t tmpfs tmpfs /dev/shm && exec sleep 100000" \
    </dev/null >/dev/null 2>&1 &
  HOLDERS[$i]=$!
  disown  # killed by cleanup: no "Killed" report from the shell
done
sleep 0.5
on() { local i=$1; shift; nsenter -t "${HOLDERS[$i]}" --net --uts --mount --wd="$PWD" -- "$@"; }

if [ ${#PROGRAM[@]} -gt 0 ]; then
  pids=()
  for i in 0 1; do
    # One thread per rank unless set, as the PyTorch side gets (the launcher sets these
    # itself only for several ranks per machine).
    on "$i" env BURN_DDP_JOB_TOKEN=job OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" \
      RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-1}" \
      "$LAUNCHER" --nnodes 2 --node-rank "$i" --cpu-bind "$CPU_BIND" \
      --nproc-per-node "$PER" --master-addr "${ADDR[0]}" --master-port 29506 \
      "${PROGRAM[@]}" > "/tmp/$TAG-program-$i.log" 2>&1 &
    pids+=($!)
  done
  status=0
  wait "${pids[@]}" || status=$?
  echo "# ${PROGRAM[*]} on two machines x $PER ranks, links $RATE each way (machine 0's output)"
  cat "/tmp/$TAG-program-0.log"
  if [ -n "$TORCH" ]; then
    TORCHRUN="$(dirname "$PYTHON")/torchrun"
    [ -x "$TORCHRUN" ] || { echo "--torch needs torchrun beside $PYTHON (pass --python)" >&2; exit 2; }
    # The same binding as burn-ddp's workers had.
    BIND=()
    if [ "$CPU_BIND" = cores ]; then
      BIND=(--no-python "$PWD/scripts/bind-share.sh" "$PYTHON")
    fi
    pids=()
    for i in 0 1; do
      # shellcheck disable=SC2086 # the script and its arguments, split on purpose
      on "$i" env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 "$TORCHRUN" --nnodes 2 \
        --node-rank "$i" --nproc-per-node "$PER" --master-addr "${ADDR[0]}" --master-port 29507 \
        ${BIND[@]+"${BIND[@]}"} $TORCH > "/tmp/$TAG-torch-$i.log" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}" || status=$?
    echo
    echo "# $TORCH on the same machines, torchrun (machine 0's output)"
    grep -vE 'Warning|_conversion_method_template|socket.cpp|^\s*$' "/tmp/$TAG-torch-0.log" || true
  fi
  rm -f /tmp/$TAG-*
  exit $status
fi

echo "# two machines x 2 ranks, links $RATE each way, f32 sum, median of $ITERS"
echo
run_burn_ddp() {
  local algorithm=$1 port=$2 compression=${3:-none} pids=()
  for i in 0 1; do
    on "$i" env BURN_DDP_ALGORITHM="$algorithm" BURN_DDP_COMPRESSION="$compression" \
      BURN_DDP_JOB_TOKEN=bench \
      "$LAUNCHER" --nnodes 2 --node-rank "$i" --nproc-per-node 2 --cpu-bind "$CPU_BIND" \
      --master-addr "${ADDR[0]}" --master-port "$port" \
      "$BENCH" --sizes "$SIZES" --iters "$ITERS" --warmup 1 > "/tmp/$TAG-$algorithm-$i.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  echo "## burn-ddp, $algorithm, compression $compression"
  grep -E '^\|' "/tmp/$TAG-$algorithm-0.log" || cat "/tmp/$TAG-$algorithm-0.log"
  echo
}
run_burn_ddp ring 29501
run_burn_ddp hierarchical 29502
run_burn_ddp hierarchical 29505 bf16

# The same job started by PyTorch's torchrun on both machines (its agent hosts
# a c10d store; burn-ddp's ranks use it), when the Python has torch.
TORCHRUN="$(dirname "$PYTHON")/torchrun"
if [ -x "$TORCHRUN" ]; then
  pids=()
  for i in 0 1; do
    on "$i" env BURN_DDP_JOB_TOKEN=bench "$TORCHRUN" --nnodes 2 --node-rank "$i" \
      --nproc-per-node 2 --master-addr "${ADDR[0]}" --master-port 29504 --no-python \
      "$BENCH" --sizes "$SIZES" --iters "$ITERS" --warmup 1 > "/tmp/$TAG-torchrun-$i.log" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  echo "## burn-ddp under torchrun (hierarchical)"
  grep -E '^\|' "/tmp/$TAG-torchrun-0.log" || cat "/tmp/$TAG-torchrun-0.log"
  echo
fi

if "$PYTHON" -c 'import torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; then
  cat > "/tmp/$TAG-gloo.py" <<'PY'
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
iters = int(sys.argv[2])
if dist.get_rank() == 0:
    print("| size | median latency | algbw |")
    print("| ---: | ---: | ---: |")
for text in sys.argv[1].split(","):
    n = int(text[:-1]) << {"K": 10, "M": 20, "G": 30}[text[-1]]
    t = torch.ones(n // 4)
    times = []
    for i in range(iters + 1):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        if i:
            times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    if dist.get_rank() == 0:
        print(f"| {n >> 20} MiB | {median * 1e3:.3f} ms | {n / median / 1e9:.2f} GB/s |")
dist.destroy_process_group()
PY
  # Bound as burn-ddp's ranks were.
  GLOO_BIND=()
  if [ "$CPU_BIND" = cores ]; then
    GLOO_BIND=("$PWD/scripts/bind-share.sh")
  fi
  pids=()
  for i in 0 1; do
    for l in 0 1; do
      rank=$((2 * i + l))
      on "$i" env RANK=$rank WORLD_SIZE=4 LOCAL_RANK=$l LOCAL_WORLD_SIZE=2 \
        MASTER_ADDR="${ADDR[0]}" MASTER_PORT=29503 GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
        ${GLOO_BIND[@]+"${GLOO_BIND[@]}"} "$PYTHON" "/tmp/$TAG-gloo.py" "$SIZES" "$ITERS" > "/tmp/$TAG-gloo-$rank.log" 2>&1 &
      pids+=($!)
    done
  done
  wait "${pids[@]}"
  echo "## PyTorch gloo ($("$PYTHON" -c 'import torch; print(torch.__version__)'))"
  grep -E '^\|' "/tmp/$TAG-gloo-0.log" || cat "/tmp/$TAG-gloo-0.log"
else
  echo "## PyTorch gloo: skipped ($PYTHON has no torch with gloo; pass --python)"
fi
rm -f /tmp/$TAG-*
