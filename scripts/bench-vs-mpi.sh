#!/usr/bin/env bash
# The threads backend against raw Open MPI at one size, every collective, on
# the same machine: ROUNDS rounds, each running `mpu bench -t 2` and then
# `mpirun -n 2 mpu bench --backend mpi` (whose raw-MPI column is MPI's own
# call), so that drift in the machine's load touches both alike. Prints the
# mean over rounds of each side's mean time and their ratio, with the load.
# Usage: [ITERS=500] scripts/bench-vs-mpi.sh [SIZE (default 1M)] [ROUNDS (default 5)]
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-1M} rounds=${2:-5} iters=${ITERS:-500}
mpu=build/bin/mpu
mpirun=(mpirun --allow-run-as-root --oversubscribe -n 2)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((i = 0; i < rounds; i++)); do
  "$mpu" bench -t 2 -b "$size" -e "$size" -n "$iters" --collective all -c 0 --format json >"$tmp/threads.$i.json"
  "${mpirun[@]}" "$mpu" bench --backend mpi -b "$size" -e "$size" -n "$iters" --collective all -c 0 --format json \
    >"$tmp/mpi.$i.json"
done
python3 - "$tmp" "$rounds" "$size" <<'PY'
import json, os, sys
tmp, rounds, size = sys.argv[1], int(sys.argv[2]), sys.argv[3]
t, m = {}, {}
for i in range(rounds):
    for r in json.load(open(os.path.join(tmp, "threads.%d.json" % i)))["rows"]:
        if not r["in_place"]:
            t.setdefault(r["collective"], []).append(r["mean_us"])
    for r in json.load(open(os.path.join(tmp, "mpi.%d.json" % i)))["rows"]:
        if not r["in_place"] and (r["raw_mpi_us"] or 0) > 0:
            m.setdefault(r["collective"], []).append(r["raw_mpi_us"])
print("# %s per call, 2 ranks, float32 sum, out of place; mean over %d interleaved rounds;"
      " load average %s" % (size, rounds, open("/proc/loadavg").read().split()[0]))
print("# %-14s %14s %14s %10s" % ("collective", "threads (us)", "raw MPI (us)", "MPI/threads"))
for c in t:
    a = sum(t[c]) / len(t[c])
    b = sum(m[c]) / len(m[c]) if c in m else float("nan")
    print("  %-14s %14.1f %14.1f %9.2fx" % (c, a, b, b / a))
PY
