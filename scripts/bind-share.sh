#!/usr/bin/env bash
# Runs "$@" on this worker's share of the machine's CPUs, the share
# burn-ddp-run's --cpu-bind cores gives local rank LOCAL_RANK of
# LOCAL_WORLD_SIZE: the CPUs this process may use, in socket and core order,
# cut into equal runs of whole cores (each cut to as many hardware threads
# as the core with the fewest has), or of single hardware threads, first
# threads first, when there are fewer cores than workers; with more workers
# than CPUs, or without taskset and lscpu, no binding. For launchers that do
# not bind (torchrun, a hand-started rank):
#   torchrun --nproc-per-node 2 --no-python scripts/bind-share.sh python train.py
set -euo pipefail
unbound() { echo "bind-share.sh: $*: not bound" >&2; exec "${ARGS[@]}"; }
ARGS=("$@")
command -v taskset >/dev/null && command -v lscpu >/dev/null || unbound "no taskset or lscpu"
ranks=${LOCAL_WORLD_SIZE:?run under a launcher that sets LOCAL_WORLD_SIZE}
rank=${LOCAL_RANK:?run under a launcher that sets LOCAL_RANK}

# The CPUs we may use, one a line (taskset -p prints "... list: 0-3,8").
allowed=$(taskset -cp $$ | sed 's/.*: //' | tr ',' '\n' |
  awk -F- '{ last = ($2 == "") ? $1 : $2; for (c = $1; c <= last; c++) print c }')
# "socket core cpu" for each allowed CPU, in socket, core and CPU order.
topology=$(lscpu -p=CPU,CORE,SOCKET | grep -v '^#' |
  awk -F, -v allowed="$allowed" '
    BEGIN { n = split(allowed, a, "\n"); for (i = 1; i <= n; i++) ok[a[i]] = 1 }
    ok[$1] { print ($3 == "" ? 0 : $3), ($2 == "" ? $1 : $2), $1 }' |
  sort -n -k1,1 -k2,2 -k3,3)
mine=$(echo "$topology" | awk -v ranks="$ranks" -v rank="$rank" '
  BEGIN { cores = 0 }
  { key = $1 " " $2
    if (!(key in index_of)) { index_of[key] = cores; members[cores] = ""; count[cores] = 0; cores++ }
    c = index_of[key]; members[c] = members[c] " " $3; thread[NR] = count[c]; core_of[NR] = c; cpu[NR] = $3; count[c]++ }
  END {
    fewest = count[0]
    for (c = 1; c < cores; c++) if (count[c] < fewest) fewest = count[c]
    if (cores >= ranks) {
      per = int(cores / ranks)
      for (i = 1; i <= NR; i++)
        if (core_of[i] >= rank * per && core_of[i] < (rank + 1) * per && thread[i] < fewest)
          out = out " " cpu[i]
    } else {
      # single threads, first threads of every core first
      n = 0; for (t = 0; n < NR; t++) for (i = 1; i <= NR; i++) if (thread[i] == t) order[n++] = cpu[i]
      per = int(NR / ranks)
      if (per == 0) exit  # more workers than CPUs: left to the scheduler
      for (i = rank * per; i < (rank + 1) * per; i++) out = out " " order[i]
    }
    gsub(/^ +/, "", out); gsub(/ +/, ",", out); print out
  }')
if [ -z "$mine" ]; then
  unbound "$ranks workers on $(echo "$allowed" | wc -l) CPU(s)"
fi
exec taskset -c "$mine" "$@"
