#!/bin/sh
# Runs "$@" on this worker's share of the machine's CPUs: LOCAL_RANK's equal,
# contiguous part of the CPUs this process may use, as burn-ddp-run's
# --cpu-bind cores gives its workers on a machine without SMT (this one
# ignores hardware threads). For launchers that do not bind (torchrun):
#   torchrun --nproc-per-node 2 --no-python scripts/bind-share.sh python train.py
set -eu
cpus=$(nproc)
ranks=${LOCAL_WORLD_SIZE:?run under a launcher that sets LOCAL_WORLD_SIZE}
rank=${LOCAL_RANK:?run under a launcher that sets LOCAL_RANK}
share=$((cpus / ranks))
if [ "$share" -lt 1 ]; then
  exec "$@"  # more workers than CPUs: left to the scheduler, as burn-ddp-run does
fi
# nproc counts the CPUs we may use; taskset -c numbers them on the machine, so
# pick ours from the allowed list.
allowed=$(taskset -cp $$ | sed 's/.*: //' | tr ',' '\n' | while IFS=- read -r a b; do
  seq "$a" "${b:-$a}"
done)
mine=$(echo "$allowed" | sed -n "$((rank * share + 1)),$(((rank + 1) * share))p" | paste -sd, -)
exec taskset -c "$mine" "$@"
