#!/usr/bin/env bash
# Runs "$@" on this worker's share of the machine's CPUs, the share
# burn-ddp-run's --cpu-bind cores gives local rank LOCAL_RANK of
# LOCAL_WORLD_SIZE: the CPUs this process may use, in socket and core order,
# cut into equal runs of whole cores (of single hardware threads, first
# threads first, when there are fewer cores than workers, or cores differ in
# their thread counts); with more workers than CPUs, no binding. For
# launchers that do not bind (torchrun, a hand-started rank):
#   torchrun --nproc-per-node 2 --no-python scripts/bind-share.sh python train.py
set -euo pipefail
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
    even = 1
    for (c = 1; c < cores; c++) if (count[c] != count[0]) even = 0
    if (cores >= ranks && even) {
      per = int(cores / ranks)
      for (c = rank * per; c < (rank + 1) * per; c++) out = out members[c]
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
  echo "bind-share.sh: $ranks workers on $(echo "$allowed" | wc -l) CPUs: not bound" >&2
  exec "$@"
fi
exec taskset -c "$mine" "$@"
