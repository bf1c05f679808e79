#!/usr/bin/env bash
# Regenerate the measured tables of docs/bench.md and docs/train.md.
#
# Each table is one command run here; the report gives it with the machine,
# the load average just before it (the machine's load apart from the
# benchmark) and the date. The docs hold the last report between
# `<!-- perf-report NAME -->` and `<!-- /perf-report NAME -->` lines: --write
# puts the new tables there, otherwise they go to stdout only.
#
# Usage: [ROUNDS=3] scripts/perf-report.sh [--write] [--quick] [--compare-torch] [--load N[,N...]]
#                                           [--only NAME]...
#   --quick          fewer iterations and rounds (a smoke run: its figures are not for the docs)
#   --compare-torch  also time the same GPT in PyTorch (scripts/gpt_torch.py), interleaved with
#                    `mpu demo gpt --bench`, on 1 and 2 threads; PYTHON (default python3) must
#                    import torch, else one line says so and the rest goes on. torch is never
#                    needed to build or test mpu.
#   --load N[,N...]  also the contention table: the 8-byte and 1 MiB all_reduce of 2 thread ranks
#                    against raw Open MPI under N busy-loop processes each (0: none), which
#                    scripts/bench-vs-mpi.sh starts and always stops; needs mpirun; ITERS8 and
#                    ITERS1M (default 5000 and 500) set the iterations per run
#   --only NAME      just that table (sweep, collectives, roof16, gather, steady, small, mpi, contention,
#                    checked, plan, gpt, profile, torch, gloo); profile needs perf
# The gloo table (--compare-torch too) times mpu's gloo backend beside torch's ProcessGroupGloo
# on 4 processes (scripts/bench-vs-gloo.sh), with PYTHON's torch.
set -euo pipefail
cd "$(dirname "$0")/.."
write=0 quick=0 torch=0 only=() loads=
while [ $# -gt 0 ]; do
  case "$1" in
  --write) write=1 ;;
  --quick) quick=1 ;;
  --compare-torch) torch=1 ;;
  --load) loads=$2; shift ;;
  --only) only+=("$2"); shift ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "perf-report.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
mpu=build/bin/mpu
[ -x "$mpu" ] || { echo "perf-report.sh: build first ($mpu is missing)" >&2; exit 2; }
PYTHON=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/report.md
rounds=${ROUNDS:-3} iters=
[ $quick = 1 ] && rounds=1 iters="-n 5 -w 1"

machine() {
  local cpu; cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
  echo "${cpu:-unknown CPU}, $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
}
load() { cut -d' ' -f1 /proc/loadavg; }
wanted() { [ ${#only[@]} = 0 ] && return 0; local n; for n in "${only[@]}"; do [ "$n" = "$1" ] && return 0; done; return 1; }
# header NAME COMMAND...: the block's opening marker and its provenance
header() {
  local name=$1; shift
  printf '<!-- perf-report %s -->\n' "$name" >>"$out"
  printf '```sh\n%s\n```\n\n' "$*" >>"$out"
  printf '_%s; load %s before it; %s._\n\n' "$(machine)" "$(load)" "$(date -u '+%Y-%m-%d %H:%M UTC')" >>"$out"
}
footer() { printf '\n<!-- /perf-report %s -->\n' "$1" >>"$out"; }

# bench JSON files -> a markdown table (python3 only formats)
table() { "$@" >>"$out"; }
fmt_bench() { # MODE FILES...: sweep | collectives | ranks
  python3 - "$@" <<'PY'
import json, sys
mode, files = sys.argv[1], sys.argv[2:]
runs = [[r for r in json.load(open(f))["rows"] if not r["in_place"]] for f in files]
def size(b):
    for u, s in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= u and b % u == 0: return "%d %s" % (b // u, s)
    return "%d B" % b
if mode == "sweep":
    print("| size | time (us) | median (us) | busbw (GB/s) | roof |")
    print("| --- | --- | --- | --- | --- |")
    for r in runs[0]:
        print("| %s | %.1f | %.1f | %.1f | %.0f%% |" % (size(r["bytes"]), r["mean_us"], r["median_us"],
              r["busbw_gbps"], 100 * r["roofline_fraction"]))
elif mode == "collectives":
    print("| collective | ranks | size | time (us), each run | roof, each run |")
    print("| --- | --- | --- | --- | --- |")
    for i, r in enumerate(runs[0]):
        rs = [run[i] for run in runs]
        print("| %s | %d | %s | %s | %s |" % (r["collective"], r["ranks"], size(r["bytes"]),
              " / ".join("%.0f" % x["mean_us"] for x in rs),
              " / ".join("%.0f%%" % (100 * x["roofline_fraction"]) for x in rs)))
    worst = max(100 * x["roofline_fraction"] for run in runs for x in run)
    print("\nHighest roof of any row: %.0f%%." % worst)
PY
}

: >"$out"
bench() { "$mpu" bench "$@" -c 0 --format json; }

if wanted sweep; then
  cmd="$mpu bench -t 2 -b 1M -e 256M -f 2 $iters"
  header sweep "$cmd"
  # shellcheck disable=SC2086
  bench -t 2 -b 1M -e 256M -f 2 $iters >"$tmp/sweep.json"
  table fmt_bench sweep "$tmp/sweep.json"
  footer sweep
fi
if wanted collectives; then
  for t in 2 8; do
    cmd="$mpu bench -t $t -b 8 -e 64M --collective all $iters   # $rounds runs"
    header "collectives-$t" "$cmd"
    files=()
    for ((i = 0; i < rounds; i++)); do
      # shellcheck disable=SC2086
      bench -t $t -b 8 -e 64M --collective all $iters >"$tmp/coll$t.$i.json"
      files+=("$tmp/coll$t.$i.json")
    done
    table fmt_bench collectives "${files[@]}"
    footer "collectives-$t"
  done
fi
if wanted roof16; then
  # the roof as a ceiling: every row of every collective at 16 MiB, five runs on 2 and on 8 ranks
  runs=5
  [ $quick = 1 ] && runs=1
  header roof16 "$mpu bench -t 2|8 -b 16M -e 16M --collective all $iters   # $runs runs each"
  for t in 2 8; do
    for ((i = 0; i < runs; i++)); do
      # shellcheck disable=SC2086
      bench -t $t -b 16M -e 16M --collective all $iters >"$tmp/roof16.$t.$i.json"
    done
  done
  python3 - "$tmp" "$runs" >>"$out" <<'PY'
import json, sys
tmp, runs = sys.argv[1], int(sys.argv[2])
print("| collective | placement | roof on 2 ranks, each run | roof on 8 ranks, each run |")
print("| --- | --- | --- | --- |")
data = {t: [json.load(open("%s/roof16.%d.%d.json" % (tmp, t, i)))["rows"] for i in range(runs)] for t in (2, 8)}
for j, r in enumerate(data[2][0]):
    cell = lambda t: " / ".join("%.0f%%" % (100 * run[j]["roofline_fraction"]) for run in data[t])
    print("| %s | %s | %s | %s |" % (r["collective"], "in place" if r["in_place"] else "out of place", cell(2), cell(8)))
print("\nHighest roof of any row: %.0f%%." % max(100 * x["roofline_fraction"] for t in data for run in data[t] for x in run))
PY
  footer roof16
fi
if wanted gather; then
  # all_gather and all_to_all from 1 MiB on 2 ranks: each row against its roof, run after run
  header gather "$mpu bench -t 2 -b 1M -e 16M -f 2 --collective all_gather,all_to_all $iters   # $rounds runs"
  for ((i = 0; i < rounds; i++)); do
    # shellcheck disable=SC2086
    bench -t 2 -b 1M -e 16M -f 2 --collective all_gather,all_to_all $iters >"$tmp/gather.$i.json"
  done
  python3 - "$tmp" "$rounds" >>"$out" <<'PY'
import json, sys
tmp, runs = sys.argv[1], int(sys.argv[2])
data = [json.load(open("%s/gather.%d.json" % (tmp, i)))["rows"] for i in range(runs)]
print("| collective | placement | size | time (us), each run | roof, each run |")
print("| --- | --- | --- | --- | --- |")
for j, r in enumerate(data[0]):
    rs = [run[j] for run in data]
    print("| %s | %s | %d MiB | %s | %s |" % (r["collective"], "in place" if r["in_place"] else "out of place",
          r["bytes"] >> 20, " / ".join("%.0f" % x["mean_us"] for x in rs),
          " / ".join("%.0f%%" % (100 * x["roofline_fraction"]) for x in rs)))
fr = [100 * x["roofline_fraction"] for run in data for x in run]
print("\nRoof of the rows: %.0f%% to %.0f%%." % (min(fr), max(fr)))
PY
  footer gather
fi
if wanted steady; then
  # run to run: the 8 MiB all_reduce against itself and against 2 MiB's bus bandwidth
  runs=10
  [ $quick = 1 ] && runs=2
  header steady "$mpu bench -t 2 --collective all_reduce -b 2M -e 8M -f 4 -n 200   # $runs runs"
  for ((i = 0; i < runs; i++)); do
    bench -t 2 --collective all_reduce -b 2M -e 8M -f 4 -n 200 >"$tmp/steady.$i.json"
  done
  python3 - "$tmp" "$runs" >>"$out" <<'PY'
import json, sys
tmp, runs = sys.argv[1], int(sys.argv[2])
print("| run | 2 MiB median (us) | 2 MiB busbw (GB/s) | 8 MiB median (us) | 8 MiB busbw (GB/s) | 8 MiB busbw / 2 MiB's |")
print("| --- | --- | --- | --- | --- | --- |")
eights, ratios = [], []
for i in range(runs):
    two, eight = [r for r in json.load(open("%s/steady.%d.json" % (tmp, i)))["rows"] if not r["in_place"]]
    eights.append(eight["median_us"])
    ratios.append(eight["busbw_gbps"] / two["busbw_gbps"])
    print("| %d | %.0f | %.1f | %.0f | %.1f | %.2f |" % (i + 1, two["median_us"], two["busbw_gbps"],
          eight["median_us"], eight["busbw_gbps"], ratios[-1]))
print("\n8 MiB medians from %.0f to %.0f us (the slowest %.0f%% above the fastest); 8 MiB's busbw %.2f-%.2f of "
      "2 MiB's. busbw from each row's median; out of place." % (min(eights), max(eights),
      100 * (max(eights) / min(eights) - 1), min(ratios), max(ratios)))
PY
  footer steady
fi
if wanted small; then
  header small "$mpu bench -t 2 -b 8 -e 8 -n 5000 -c 0; taskset -c 0 $mpu bench -t 2 -b 8 -e 8 -n 5000 -c 0"
  two=$(bench -t 2 -b 8 -e 8 -n 5000 | python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["rows"][0]["median_us"])')
  one=$(taskset -c 0 "$mpu" bench -t 2 -b 8 -e 8 -n 5000 -c 0 --format json | python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["rows"][0]["median_us"])')
  printf '| 8-byte all_reduce, 2 ranks | median |\n| --- | --- |\n| each rank on its own CPU | %s us |\n| both ranks pinned to one CPU | %s us |\n' "$two" "$one" >>"$out"
  footer small
fi
if wanted mpi; then
  if command -v mpirun >/dev/null && [[ $("$mpu" bench --help) == *--backend* ]]; then
    header mpi "bash scripts/bench-vs-mpi.sh 1M $rounds"
    ITERS=${iters:+50} bash scripts/bench-vs-mpi.sh 1M "$rounds" | sed -n '2,$p' |
      awk 'NR == 1 {print "| collective | threads (us) | raw MPI (us) | MPI / threads |"; print "| --- | --- | --- | --- |"; next}
           {printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4}' >>"$out"
    footer mpi
  else
    echo "perf-report.sh: no mpirun here: the table against Open MPI is skipped" >&2
  fi
fi
if [ -n "$loads" ] && wanted contention; then
  if command -v mpirun >/dev/null && [[ $("$mpu" bench --help) == *--backend* ]]; then
    n8=${ITERS8:-5000} n1m=${ITERS1M:-500}
    [ $quick = 1 ] && n8=200 n1m=20
    header contention "ITERS=$n8 bash scripts/bench-vs-mpi.sh --load $loads --collective all_reduce 8 $rounds; ITERS=$n1m ... 1M $rounds"
    for s in 8 1M; do
      n=$n8
      [ $s = 1M ] && n=$n1m
      ITERS=$n bash scripts/bench-vs-mpi.sh --load "$loads" --collective all_reduce $s "$rounds"
    done | python3 -c '
import re, sys
print("| size | busy processes | load average during | threads mean (us) | raw MPI mean (us) | MPI / threads | threads median (us) | raw MPI median (us) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for line in sys.stdin:
    m = re.match(r"# (\S+) per call.*?; (\d+) busy processes; load average \S+ before them, (\S+) during", line)
    if m:
        size, busy, during = m.groups()
    elif not line.startswith("#"):
        f = line.split()
        print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (size + ("" if size[-1].isalpha() else " B"), busy, during, *f[1:]))
' >>"$out"
    printf '
Each size and load: %s rounds, each a `mpu bench -t 2` run and then a `mpirun -n 2 mpu bench --backend mpi` run whose raw column is Open MPI'"'"'s own call; the median over rounds of each run'"'"'s mean.
' "$rounds" >>"$out"
    footer contention
  else
    echo "perf-report.sh: no mpirun here: the contention table is skipped" >&2
  fi
fi
if wanted checked; then
  if command -v mpirun >/dev/null && [[ $("$mpu" bench --help) == *--backend* ]]; then
    n8=3000
    [ $quick = 1 ] && n8=300
    header checked "mpirun --allow-run-as-root --oversubscribe [-x MPU_TIMEOUT=300] -n 2|8 $mpu bench --backend mpi -b 8 -e 8 -n $n8 -c 0 --format json   # $rounds rounds"
    for ((i = 0; i < rounds; i++)); do
      for n in 2 8; do
        for t in none 300; do
          env=()
          [ $t != none ] && env=(-x MPU_TIMEOUT=$t)
          mpirun --allow-run-as-root --oversubscribe "${env[@]}" -n $n "$mpu" bench --backend mpi -b 8 -e 8 \
            -n $n8 -c 0 --format json >"$tmp/checked.$n.$t.$i.json"
        done
      done
    done
    python3 - "$tmp" "$rounds" >>"$out" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
print("| ranks | timeout | unchecked (us) | raw MPI (us) | checked (us) | checked / raw, each round | median |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for n in (2, 8):
    for t in ("none", "300"):
        rows = [[r for r in json.load(open("%s/checked.%d.%s.%d.json" % (tmp, n, t, i)))["rows"] if not r["in_place"]][0]
                for i in range(rounds)]
        span = lambda k: "%.2f-%.2f" % (min(r[k] for r in rows), max(r[k] for r in rows))
        ratios = [r["checked_median_us"] / r["raw_mpi_median_us"] for r in rows]
        print("| %d | %s | %s | %s | %s | %s | %.2fx |" % (n, "none (default)" if t == "none" else t + " s",
              span("median_us"), span("raw_mpi_median_us"), span("checked_median_us"),
              " / ".join("%.2fx" % x for x in ratios), statistics.median(ratios)))
print("\nMedians of 8-byte float32 sum all_reduce, out of place; each run times the three iteration by iteration interleaved on the same buffers.")
PY
    footer checked
  else
    echo "perf-report.sh: no mpirun here: the call-checking table is skipped" >&2
  fi
fi
if wanted plan; then
  header plan "$mpu plan --bench"
  { echo '```text'; "$mpu" plan --bench; echo '```'; } >>"$out"
  footer plan
fi
if wanted gpt; then
  header gpt "$mpu demo gpt --bench   # and --recompute selective, full"
  { echo '```text'; "$mpu" demo gpt --bench 2>/dev/null | grep -v '^# comm share'
    for m in selective full; do "$mpu" demo gpt --bench --recompute "$m" 2>/dev/null | awk -v m="$m" '/^ +[12] / {print $0 "   (recompute " m ")"}'; done
    echo '```'; } >>"$out"
  footer gpt
fi
if wanted profile; then
  # where a rank's time goes: perf's cpu-clock samples of each rank's thread, by kind of work
  steps=20
  [ $quick = 1 ] && steps=4
  if ! command -v perf >/dev/null || ! perf record -q -e cpu-clock -o "$tmp/probe.data" true 2>/dev/null; then
    echo "perf-report.sh: no perf here (or perf_event_paranoid forbids it): the profile table is skipped" >&2
  else
    header profile "perf record -e cpu-clock -F 999 $mpu demo gpt --bench --tp 1|2 --steps $steps"
    for t in 1 2; do
      perf record -q -e cpu-clock -F 999 -o "$tmp/prof$t.data" "$mpu" demo gpt --bench --tp $t --steps $steps \
        --format json 2>/dev/null >"$tmp/prof$t.json"
      perf script -i "$tmp/prof$t.data" -F tid,ip,sym 2>/dev/null >"$tmp/prof$t.txt"
    done
    python3 - "$tmp" >>"$out" <<'PY'
import collections, json, re, sys
tmp = sys.argv[1]
kinds = [  # (row, symbol pattern), first match wins
    ("OpenBLAS's sgemm kernel (the linears' weight gradient)", r"^sgemm_kernel"),
    ("mpu's kernel (`src/layers/gemm.c`): the linears' input gradient dx = dy W and forward x W^T, and the attention's q k^T, P v, dout v^T, dS k", r"^(one_tile|kernel|kernel_packed)\b"),
    ("OpenBLAS packing operands and scaling C (`sgemm_*copy`, `sgemm_beta`)", r"^sgemm_(i|o)[nt]copy|^sgemm_beta"),
    ("the attention's dv and dk (OpenBLAS's small-matrix kernels)", r"^sgemm_small"),
    ("memory copies and clears", r"^__mem(move|cpy|set)"),
    ("AdamW and the clip's sum of squares", r"^(update_run|squares)"),
    ("LayerNorm and softmax, forward and backward", r"^(norm_row|softmax_row)"),
    ("GeLU forward and backward (fc1's bias added, and its gradient summed, in them)", r"^mpu_(bias_)?gelu"),
    ("the collectives' own work (copies, sums)", r"^(reduce_f32|mpu__t|copy_chunk)"),
    ("waiting for the other rank: the scheduler, futexes", r"^(finish_task_switch|_raw_spin|__schedule|schedule|futex|__futex|syscall|entry_SYSCALL|do_syscall|sched_|pthread_cond|__pthread|sem_)"),
    ("page faults (first touch)", r"^(clear_page|exc_page_fault|do_huge_pmd|folio_|handle_mm_fault|__handle_mm)"),
    ("the untimed set-up: drawing the initial weights", r"^(mpu_rng|__cos|__sin|__ieee754_log|__log|log@|mpu_init_normal|__logf)"),
]
cols = {}
for t in (1, 2):
    threads = collections.defaultdict(collections.Counter)
    for line in open("%s/prof%d.txt" % (tmp, t)):
        p = line.split(None, 2)  # tid, address, symbol
        if len(p) == 3 and p[0].isdigit():
            threads[p[0]][p[2].strip()] += 1
    # the bench runs the tp three times: its 3 t rank threads are the busiest (the main thread
    # only times a GEMM between them)
    ranks = sorted(threads, key=lambda k: -sum(threads[k].values()))[:3 * t]
    c = collections.Counter()
    for r in ranks: c.update(threads[r])
    n = sum(c.values()) or 1
    got = collections.Counter()
    for sym, k in c.items():
        row = next((name for name, pat in kinds if re.search(pat, sym)), "everything else: the model's own loops (embedding, loss, bias gradients, residuals), the kernel")
        got[row] += k
    cols[t] = {row: 100.0 * k / n for row, k in got.items()}
    cols[t]["_rate"] = json.load(open("%s/prof%d.json" % (tmp, t)))["runs"][0]["of_gemm_rate"]
rows = [name for name, _ in kinds] + ["everything else: the model's own loops (embedding, loss, bias gradients, residuals), the kernel"]
print("| where a rank's time goes | tp 1 | tp 2 (each rank) |")
print("| --- | --- | --- |")
for row in rows:
    print("| %s | %.1f%% | %.1f%% |" % (row, cols[1].get(row, 0.0), cols[2].get(row, 0.0)))
print("\nEach rank's model FLOP rate in the same runs: %.0f%% (tp 1) and %.0f%% (tp 2) of one core's `cblas_sgemm` 256^3." % (100 * cols[1]["_rate"], 100 * cols[2]["_rate"]))
print("Samples of the rank threads of the three runs of each tp (the whole run: the set-up and the untimed first step too).")
PY
    footer profile
  fi
fi
if [ $torch = 1 ] && wanted gloo; then
  if ! "$PYTHON" -c 'import torch' 2>/dev/null || [ ! -e build/lib/libmpu_gloo.so.0 ]; then
    echo "perf-report.sh: no torch in $PYTHON or no gloo backend in build/: the gloo table is skipped"
  else
    header gloo "bash scripts/bench-vs-gloo.sh 8,1K,64K,1M,16M,64M $rounds"
    PYTHON=$PYTHON ITERS=${iters:+20} bash scripts/bench-vs-gloo.sh 8,1K,64K,1M,16M,64M "$rounds" >"$tmp/gloo.txt"
    { grep '^|' "$tmp/gloo.txt"; echo; sed -n 's/^# /_/p' "$tmp/gloo.txt" | sed 's/$/._/'; } >>"$out"
    footer gloo
  fi
fi
if [ $torch = 1 ] && wanted torch; then
  if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "perf-report.sh: $PYTHON cannot import torch: the PyTorch comparison is skipped (PYTHON=... names one that can)"
  else
    header torch "$mpu demo gpt --bench --format json; $PYTHON scripts/gpt_torch.py --threads 1|2   # $rounds interleaved rounds"
    for ((i = 0; i < rounds; i++)); do
      "$mpu" demo gpt --bench --format json 2>/dev/null >"$tmp/mpu.$i.json"
      for t in 1 2; do "$PYTHON" scripts/gpt_torch.py --threads $t >"$tmp/torch$t.$i.json"; done
    done
    python3 - "$tmp" "$rounds" >>"$out" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
mpu = [json.load(open("%s/mpu.%d.json" % (tmp, i))) for i in range(rounds)]
th = {t: [json.load(open("%s/torch%d.%d.json" % (tmp, t, i))) for i in range(rounds)] for t in (1, 2)}
print("| | mpu (tokens/s, each round) | PyTorch %s (tokens/s, each round) | mpu / torch (median) | mpu of one core's sgemm |" % th[1][0]["torch"])
print("| --- | --- | --- | --- | --- |")
for tp in (1, 2):
    m = [r["runs"][tp - 1]["tokens_per_s"] for r in mpu]
    t = [r["tokens_per_s"] for r in th[tp]]
    share = statistics.median(r["runs"][tp - 1]["of_gemm_rate"] for r in mpu)
    print("| tp %d vs %d thread%s | %s | %s | %.2fx | %.0f%% per rank |" % (tp, tp, "s" if tp > 1 else "",
          " / ".join("%.0f" % x for x in m), " / ".join("%.0f" % x for x in t),
          statistics.median(m) / statistics.median(t), 100 * share))
print("\nmpu: recompute %s; PyTorch: no recompute, scaled_dot_product_attention, the same model and step." % mpu[0]["recompute"])
PY
    footer torch
  fi
fi

cat "$out"
if [ $write = 1 ]; then
  python3 - "$out" docs/bench.md docs/train.md docs/mpi.md <<'PY'
import re, sys
blocks = dict(re.findall(r"<!-- perf-report (\S+) -->\n(.*?)\n<!-- /perf-report \1 -->", open(sys.argv[1]).read(), re.S))
for doc in sys.argv[2:]:
    text = open(doc).read()
    def put(m):
        return "<!-- perf-report %s -->\n%s\n<!-- /perf-report %s -->" % (m.group(1), blocks[m.group(1)], m.group(1)) if m.group(1) in blocks else m.group(0)
    # an empty block too (its markers on two lines): it is filled like any other
    new = re.sub(r"<!-- perf-report (\S+) -->\n(?:.*?\n)?<!-- /perf-report \1 -->", put, text, flags=re.S)
    if new != text:
        open(doc, "w").write(new)
        print("perf-report.sh: %s updated" % doc, file=sys.stderr)
PY
fi
