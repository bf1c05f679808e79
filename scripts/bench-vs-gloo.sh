#!/usr/bin/env bash
# mpu's gloo backend against torch's ProcessGroupGloo, on the same machine
# and the same load: ROUNDS rounds, each running all_reduce (float32, sum) on
# 4 processes started with torchrun's variables (tests/gloo_run.sh), first
# `mpu bench --backend gloo`, then torch's dist.all_reduce on a gloo group
# (scripts/gloo_torch_bench.py), so that drift in the machine's load touches
# both alike. Prints, for each size, the median over rounds of each side's
# mean time per call (the slowest rank's: each rank's mean, then their
# largest, on both sides; mpu bench -a 3), their ratio, mpu's time with call
# checking on, and the load average seen. Exits 77 with one line when the
# Python (PYTHON, else MPU_PYENV/bin/python, MPU_PYENV defaulting to
# build/pyenv) has no torch.
#
# Usage: [ITERS=200] [PYTHON=...] scripts/bench-vs-gloo.sh [SIZE[,SIZE...]] [ROUNDS (default 3)]
#        SIZE: bytes per rank (8, 1K, 64M); default 8,1K,64K,1M,16M,64M
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=${1:-8,1K,64K,1M,16M,64M} rounds=${2:-3} iters=${ITERS:-200} ranks=4
py=${PYTHON:-${MPU_PYENV:-build/pyenv}/bin/python}
mpu=build/bin/mpu
run=tests/gloo_run.sh
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "bench-vs-gloo.sh: $py cannot import torch (scripts/pyenv.sh installs it in build/pyenv): skipped"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bytes() { # 8, 1K, 64M -> bytes
  local v=${1%[KMG]} u=${1##*[0-9]}
  case $u in K) echo $((v << 10)) ;; M) echo $((v << 20)) ;; G) echo $((v << 30)) ;; *) echo "$v" ;; esac
}
la() { cut -d' ' -f1 /proc/loadavg; }
IFS=, read -r -a size_list <<<"$sizes"
seen=("$(la)")
for ((i = 0; i < rounds; i++)); do
  for s in "${size_list[@]}"; do
    b=$(bytes "$s") n=$iters
    [ "$b" -ge $((16 << 20)) ] && n=$(((iters + 19) / 20)) # the large ones: fewer, still seconds
    "$run" $ranks "$mpu" bench --backend gloo -b "$b" -e "$b" -n "$n" -a 3 --collective all_reduce \
      -c 0 --format json >"$tmp/mpu.$s.$i.json"
    "$run" $ranks "$py" scripts/gloo_torch_bench.py "$b" "$n" >"$tmp/torch.$s.$i.json"
    seen+=("$(la)")
  done
done
"$py" - "$tmp" "$rounds" "$sizes" "$ranks" "${seen[*]}" <<'PY'
import json, os, platform, statistics, sys
tmp, rounds, sizes, ranks, la = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4], [float(x) for x in sys.argv[5].split()]
import torch
med = statistics.median
print("# all_reduce, float32 sum, %s processes on %s (%d CPUs), out of place for mpu, in place for"
      " torch (its only form); median over %d interleaved rounds of each run's mean per call (the"
      " slowest rank's); torch %s; load average %.2f before, %.2f-%.2f during"
      % (ranks, platform.node() or "this host", os.cpu_count(), rounds, torch.__version__, la[0],
         min(la[1:]), max(la[1:])))
print("| size | mpu gloo (us) | torch ProcessGroupGloo (us) | torch / mpu | mpu, calls checked (us) |")
print("| ---: | ---: | ---: | ---: | ---: |")
for s in sizes:
    m, c, t = [], [], []
    for i in range(rounds):
        rows = [r for r in json.load(open(os.path.join(tmp, "mpu.%s.%d.json" % (s, i))))["rows"]
                if not r["in_place"]]
        m.append(rows[0]["mean_us"])
        c.append(rows[0]["checked_us"])
        t.append(json.loads(open(os.path.join(tmp, "torch.%s.%d.json" % (s, i))).read())["mean_us"])
    print("| %s | %.1f | %.1f | %.2fx | %.1f |" % (s, med(m), med(t), med(t) / med(m), med(c)))
PY
