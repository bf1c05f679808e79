#!/usr/bin/env bash
# The threads backend against raw Open MPI, on the same machine and the same
# load: ROUNDS rounds, each running `mpu bench -t 2` and then
# `mpirun -n 2 mpu bench --backend mpi` (whose raw-MPI column is MPI's own
# call), so that drift in the machine's load touches both alike. Prints, for
# each size and each --load level, the median over rounds of each side's mean
# time and their ratio, with the load average seen.
#
# --load N[,N...]  run every round under N busy-loop processes of this script
#                  (0: none), one level after the other; the script starts
#                  them and stops them when the level ends, and on any exit,
#                  error or signal (a loader also ends by itself within a
#                  second of this script dying by SIGKILL)
# --collective C   one collective (all_reduce, ...); default: every one
# SIZE             bytes per rank, or a comma list (8,1M); default 1M
#
# Usage: [ITERS=500] scripts/bench-vs-mpi.sh [--load N[,N...]] [--collective C]
#                                            [SIZE[,SIZE...]] [ROUNDS (default 5)]
set -euo pipefail
cd "$(dirname "$0")/.."
loads=0 collective=all
while [ $# -gt 0 ]; do
  case "$1" in
  --load) loads=$2; shift ;;
  --collective) collective=$2; shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  -*) echo "bench-vs-mpi.sh: unknown option '$1'" >&2; exit 2 ;;
  *) break ;;
  esac
  shift
done
sizes=${1:-1M} rounds=${2:-5} iters=${ITERS:-500}
[[ $loads =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "bench-vs-mpi.sh: --load takes counts like 2 or 0,2,4" >&2; exit 2; }
mpu=build/bin/mpu
mpirun=(mpirun --allow-run-as-root --oversubscribe -n 2)
tmp=$(mktemp -d)
loaders=()

# A busy loop that checks every few hundred milliseconds that this script is
# still alive, so that not even a SIGKILL of the script leaves it running.
busy() {
  local parent=$1 j
  while kill -0 "$parent" 2>/dev/null; do
    for ((j = 0; j < 100000; j++)); do :; done
  done
}
stop_load() {
  if [ ${#loaders[@]} -gt 0 ]; then
    kill "${loaders[@]}" 2>/dev/null || true
    wait "${loaders[@]}" 2>/dev/null || true
  fi
  loaders=()
}
start_load() {
  local i
  for ((i = 0; i < $1; i++)); do
    busy $$ &
    loaders+=($!)
  done
}
trap 'stop_load; rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

la() { cut -d' ' -f1 /proc/loadavg; }
fail() { echo "bench-vs-mpi.sh: $1 failed (exit status $2)" >&2; exit 1; }
IFS=, read -r -a load_list <<<"$loads"
IFS=, read -r -a size_list <<<"$sizes"
for L in "${load_list[@]}"; do
  before=$(la)
  start_load "$L"
  [ "$L" -gt 0 ] && sleep 1 # let the loaders take their CPUs
  seen=()
  for ((i = 0; i < rounds; i++)); do
    for s in "${size_list[@]}"; do
      seen+=("$(la)")
      "$mpu" bench -t 2 -b "$s" -e "$s" -n "$iters" --collective "$collective" -c 0 --format json \
        >"$tmp/threads.$L.$s.$i.json" || fail "mpu bench -t 2 at $s, round $i, $L busy" $?
      "${mpirun[@]}" "$mpu" bench --backend mpi -b "$s" -e "$s" -n "$iters" --collective "$collective" \
        -c 0 --format json >"$tmp/mpi.$L.$s.$i.json" || fail "mpirun ... --backend mpi at $s, round $i, $L busy" $?
    done
  done
  seen+=("$(la)")
  stop_load
  printf '%s %s\n' "$before" "${seen[*]}" >"$tmp/load.$L"
done
python3 - "$tmp" "$rounds" "$loads" "$sizes" <<'PY'
import json, os, statistics, sys
tmp, rounds, loads, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4].split(",")
def rows(path):
    return [r for r in json.load(open(path))["rows"] if not r["in_place"]]
for L in loads:
    la = [float(x) for x in open(os.path.join(tmp, "load." + L)).read().split()]
    for s in sizes:
        t, m, tmed, mmed = {}, {}, {}, {}
        for i in range(rounds):
            for r in rows(os.path.join(tmp, "threads.%s.%s.%d.json" % (L, s, i))):
                t.setdefault(r["collective"], []).append(r["mean_us"])
                tmed.setdefault(r["collective"], []).append(r["median_us"])
            for r in rows(os.path.join(tmp, "mpi.%s.%s.%d.json" % (L, s, i))):
                if (r["raw_mpi_us"] or 0) > 0:
                    m.setdefault(r["collective"], []).append(r["raw_mpi_us"])
                    mmed.setdefault(r["collective"], []).append(r["raw_mpi_median_us"])
        print("# %s per call, 2 ranks, float32 sum, out of place; median over %d interleaved rounds of"
              " each run's mean; %s busy processes; load average %.2f before them, %.2f-%.2f during"
              % (s, rounds, L, la[0], min(la[1:]), max(la[1:])))
        print("# %-14s %14s %14s %10s %16s %16s" % ("collective", "threads (us)", "raw MPI (us)",
              "MPI/threads", "threads median", "raw MPI median"))
        med = statistics.median
        for c in t:
            a = med(t[c])
            b = med(m[c]) if c in m else float("nan")
            print("  %-14s %14.2f %14.2f %9.2fx %16.2f %16.2f" % (c, a, b, b / a, med(tmed[c]),
                  med(mmed[c]) if c in mmed else float("nan")))
PY
