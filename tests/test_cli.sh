#!/usr/bin/env bash
# The mpu tool's contract: --help everywhere, exit 2 with one line on stderr
# (and nothing on stdout) for bad arguments, data formats that parse.
# Usage: test_cli.sh PATH_TO_MPU
set -uo pipefail
mpu=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

expect_usage_error() { # args... (a refusal comes at once: a hang is a failure too)
  timeout 60 "$mpu" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [ $rc -eq 2 ] || { bad "mpu $* exited $rc, want 2"; return; }
  [ ! -s "$tmp/out" ] || { bad "mpu $* printed on stdout"; return; }
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || { bad "mpu $* printed $(wc -l <"$tmp/err") lines on stderr"; return; }
  ok
}

"$mpu" --help | grep "bench" >/dev/null && ok || bad "mpu --help lists no bench"
"$mpu" bench --help | grep -c -- "--maxbytes" >/dev/null && ok || bad "mpu bench --help"
expect_usage_error
expect_usage_error frobnicate
# one version everywhere: the tool, the library it loads, the header
v=$(sed -n 's/^#define MPU_VERSION_STRING "\(.*\)"/\1/p' "$(dirname "$0")/../include/mpu/version.h")
[ "$("$mpu" --version)" = "mpu $v (libmpu $v)" ] && ok || bad "mpu --version says '$("$mpu" --version)', want $v"
expect_usage_error bench --bogus
expect_usage_error bench -t 0
expect_usage_error bench -n 0
expect_usage_error bench -c 2
expect_usage_error bench -g 2
expect_usage_error bench --collective barrier
expect_usage_error bench --collective all_gather_v
expect_usage_error bench -i 0
expect_usage_error bench -t 2,x
expect_usage_error bench --workers 0
expect_usage_error bench -b 1Q
expect_usage_error bench -b 64M -e 8
expect_usage_error bench --collective all_sum
expect_usage_error bench --collective all_reduce,all_reduce
expect_usage_error bench -d float8
# nccl-tests' flags mpu cannot honour: one line saying why
for a in "-d f8e4m3" "-d f8e5m2" "-o mulsum" "-m 4" "-G 1" "-a 4" "-z 4" "--columns csv" "--columns nccl-tests --format json"; do
  expect_usage_error bench $a
done
"$mpu" bench -d f8e4m3 2>"$tmp/err" >/dev/null; grep -q "mpu has no f8e4m3 elements" "$tmp/err" && ok || bad "bench -d f8e4m3 does not say why"
for dt in int8 uint32 uint64; do
  "$mpu" bench -t 2 -e 64 -n 2 -d $dt -o all >/dev/null && ok || bad "bench -d $dt"
done
"$mpu" bench -t 2 -e 64 -n 2 -a 2 -z 1 -m 1 -G 0 -d uint8 --format json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["time"] == "the least of the ranks\x27 means" and d["dtype"] == "uint8", d
assert all(r["type"] == "uint8" and r["raw_mpi_us"] is None and r["checked_us"] is None and r["root"] is None for r in d["rows"])
' && ok || bad "bench -a 2 -z 1 -d uint8 json (null where absent)"
expect_usage_error bench --format xml
expect_usage_error bench --backend nonesuch
expect_usage_error bench --backend gloo # outside a torchrun job: RANK and WORLD_SIZE unset
# empty list elements, overflowing sizes, wrong limits in messages
expect_usage_error bench -t 2,,4
expect_usage_error bench -t 2,
expect_usage_error bench -t ,2
expect_usage_error bench --collective all_reduce,,
expect_usage_error mesh --shape 2,,4
expect_usage_error mesh --shape 2,4 --names a,,b
expect_usage_error plan --world-size 8 --order tp--dp
expect_usage_error plan --world-size 8 --order ""
expect_usage_error plan --world-size 8 --order -tp-dp-pp-
expect_usage_error plan --world-size 1073741824 --tp 65536 --pp 65536
expect_usage_error plan --world-size 1073741824 --tp 65536 --pp 65536 --flavor deepspeed
expect_usage_error demo hsdp --mesh 4294967296x4294967296
expect_usage_error demo hsdp --mesh 2147483647x2
expect_usage_error demo hsdp --mesh -2x1
expect_usage_error demo hsdp --mesh 3x
expect_usage_error bench --check-calls maybe
expect_usage_error bench -e 1T
expect_usage_error bench --memcpy-bytes 1M
expect_usage_error bench --csv ""
expect_usage_error bench --csv /nonexistent/dir/out.csv
expect_message() { # text, args...
  local want=$1
  shift
  "$mpu" "$@" >"$tmp/msg" 2>&1
  grep -qF -- "$want" "$tmp/msg" && ok || bad "mpu $* says '$(cat "$tmp/msg")', want '$want'"
}
expect_message "expert_model_parallel_size (3)" plan --world-size 8 --ep 3
# the picture's title states every size (their product is the world)
"$mpu" plan --world-size 16 --tp 2 --pp 2 --cp 2 --format svg >"$tmp/title.svg"
grep -q "world 16 = tp 2 x cp 2 x pp 2 x dp 2" "$tmp/title.svg" &&
  ok || bad "svg title leaves a size out"
# the picture draws every kind of group the layout builds (a small grid each),
# for each flavour, and the page is self-contained (no network)
for args in "--flavor deepspeed --world-size 32 --tp 2 --pp 2 --fp8" "--flavor deepspeed --world-size 16 --sp 4" \
            "--world-size 32 --tp 2 --pp 2 --cp 2 --ep 2 --vp 2"; do
  # shellcheck disable=SC2086
  kinds=$("$mpu" plan $args --format json | python3 -c 'import json, sys; print(sum(1 for g in json.load(sys.stdin)["groups"].values() if g))')
  # shellcheck disable=SC2086
  drawn=$("$mpu" plan $args --format svg | grep -c '<g class="kind"')
  [ "$kinds" = "$drawn" ] && ok || bad "plan $args --format svg draws $drawn kinds of $kinds"
  # shellcheck disable=SC2086
  "$mpu" plan $args --format html >"$tmp/page.html"
  sed 's|xmlns="http://www.w3.org/2000/svg"||g' "$tmp/page.html" >"$tmp/page.stripped"
  grep -q "<script>" "$tmp/page.html" && ! grep -Eq 'src=|href=|https?:' "$tmp/page.stripped" && ok ||
    bad "plan $args --format html is not a self-contained page"
done
"$mpu" plan --world-size 16 --tp 2 --pp 2 --cp 2 --ep 2 --format svg >"$tmp/legend.svg"
grep -q "frame = tensor-parallel group (tp)" "$tmp/legend.svg" &&
  grep -q "colour and the small number in a cell = data-parallel group (dp), 8 groups" "$tmp/legend.svg" && ok || bad "svg has no legend"
# every kind captioned by what it is (core-0.19's too), no caption a bare "group"
"$mpu" plan --flavor core-0.19 --world-size 32 --tp 2 --pp 2 --cp 2 --ep 4 --etp 1 --hcp 2 --dist-opt-instances 2 --format svg >"$tmp/c019.svg"
! grep -q '<text x="[0-9]*" y="[0-9]*" fill="#444">group</text>' "$tmp/c019.svg" && grep -q "expert tensor-parallel group" "$tmp/c019.svg" &&
  grep -q "hierarchical context-parallel group, level 0" "$tmp/c019.svg" && ok || bad "core-0.19 kinds captioned 'group'"
# the schedule: every block labelled F m.c / B m.c or with a tooltip, coloured by chunk, a time axis
"$mpu" plan --schedule interleaved --pp 4 --vp 2 --micro-batches 8 --format svg >"$tmp/sched.svg"
# at most 1380 px drawn, scaled to the window (viewBox, width 100%); narrow forwards say m
grep -q '^<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 1380 [0-9]*" width="100%"' "$tmp/sched.svg" &&
  "$mpu" plan --schedule 1f1b --pp 2 --micro-batches 4 --format svg >"$tmp/wide.svg" &&
  grep -q '>F 0.0</text>' "$tmp/wide.svg" &&
  grep -q 'text-anchor="middle">3</text>' "$tmp/sched.svg" &&
  [ "$(grep -c '<g class="block"><title>' "$tmp/sched.svg")" -eq 128 ] &&
  grep -q '>B 7.1</text>' "$tmp/sched.svg" && grep -q "time, in forwards of one model chunk" "$tmp/sched.svg" &&
  grep -q 'fill="url(#idle)"' "$tmp/sched.svg" && [ "$(grep -o 'fill="#[0-9a-f]*" stroke="#fff"/><text' "$tmp/sched.svg" | sort -u | wc -l)" -eq 4 ] &&
  ok || bad "schedule svg: labels, chunk colours, axis, bubble"
"$mpu" mesh --shape 2,2,4 --names pp,dp,tp --format svg >"$tmp/mesh.svg"
[ "$(grep -c '<g class="kind"' "$tmp/mesh.svg")" = 3 ] && ok || bad "mesh svg"
"$mpu" mesh --shape 2,4 --format html >"$tmp/mesh.html"
grep -q "</html>" "$tmp/mesh.html" && ok || bad "mesh html"
expect_usage_error mesh --format png
expect_usage_error plan --world-size 8 --format png
expect_usage_error bench --block --backend mpi
"$mpu" -V | grep >/dev/null "^mpu " && ok || bad "mpu -V"
# a million ranks: a bounded summary picture, at once
timeout 10 "$mpu" plan --world-size 1048576 --tp 8 --pp 8 --format svg >"$tmp/big.svg" &&
  grep -q "too many to draw" "$tmp/big.svg" && grep -q "</svg>" "$tmp/big.svg" && ok || bad "plan svg of a million ranks"
timeout 10 "$mpu" plan --world-size 1048576 --tp 8 --pp 8 --cp 2 --ep 4 --format html >"$tmp/big.html" &&
  grep -q "</html>" "$tmp/big.html" && ok || bad "plan html of a million ranks"
for junk in nan inf -1 0 1e999 abc; do # refused with a warning, the default used: the run works
  MPU_TIMEOUT=$junk "$mpu" bench -t 2 -b 8 -e 8 -n 2 >"$tmp/o" 2>"$tmp/e" &&
    grep -q "ignoring MPU_TIMEOUT=$junk" "$tmp/e" && ok || bad "MPU_TIMEOUT=$junk not refused"
done
if "$mpu" bench --backend mpi --help >/dev/null 2>&1 && [ "$(ASAN_OPTIONS=detect_leaks=0 "$mpu" demo train --backend mpi 2>&1 >/dev/null | wc -l)" -eq 1 ]; then ok
elif ! "$mpu" bench --backend mpi --help >/dev/null 2>&1; then ok
else bad "demo train --backend mpi outside mpirun does not say why in one line"; fi
expect_message "1..1073741824" plan --world-size 2147483646
expect_message "--steps wants a whole number 1..1048576, not '0'" demo train --steps 0
expect_usage_error bench -i
expect_usage_error bench stray

# nccl-tests' flags and columns: both placements, #wrong checked, the roofline
"$mpu" bench -t 3 --collective all -b 8 -e 64K -f 8 -n 3 --csv "$tmp/b.csv" >"$tmp/text" || bad "bench run failed"
grep -q "out-of-place" "$tmp/text" && grep -q "in-place" "$tmp/text" && grep -q "roof" "$tmp/text" && ok ||
  bad "text output lacks nccl-tests' columns"
grep -q "^# Out of bounds values : 0 OK" "$tmp/text" && ok || bad "results not all right"
[ "$(grep -c '^# all_to_all, 3 thread ranks' "$tmp/text")" -eq 1 ] && ok || bad "no all_to_all block"
[ "$(head -1 "$tmp/b.csv")" = "collective,backend,ranks,dtype,op,in_place,bytes,count,mean_us,median_us,algbw_gbps,busbw_gbps,wrong,roofline_us,raw_mpi_us" ] && ok || bad "csv header"
[ "$(grep -c '^all_reduce,threads,3,float32,sum,[01],' "$tmp/b.csv")" -eq 10 ] && ok || bad "csv all_reduce rows (5 sizes x 2 placements)"
# -b 8 with 3 ranks: all_gather rounds up to one element per rank and says so (12 B)
grep -q '^all_gather,threads,3,float32,none,0,12,1,' "$tmp/b.csv" && ok || bad "sizes not rounded up to one element per rank"
[ "$(grep -c ',0,[0-9.]*,[0-9.-]*$' "$tmp/b.csv")" -ge 60 ] && ok || bad "csv: not every row checked with 0 wrong"
# -i adds instead of multiplying
"$mpu" bench -b 1K -e 3K -i 1K -n 2 -c 0 --format json >"$tmp/step.json" &&
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert sorted({r["bytes"] for r in d["rows"]}) == [1024, 2048, 3072]; assert all(r["wrong"] is None for r in d["rows"])' "$tmp/step.json" &&
  ok || bad "-i stepbytes, -c 0"
for dt in float16 bfloat16 int32 int64 uint8 float64; do
  for op in sum prod min max avg; do
    "$mpu" bench -t 3 --collective all_reduce,reduce_scatter,reduce -b 1K -e 1K -n 1 -d $dt -o $op >"$tmp/chk" 2>&1 &&
      grep -q "^# Out of bounds values : 0 OK" "$tmp/chk" && ok || bad "bench check $dt $op: $(grep 'Out of bounds' "$tmp/chk")"
  done
done

"$mpu" bench -t 2 -b 1K -e 4K -n 3 -d bf16 --format json >"$tmp/json" || bad "json run failed"
if command -v python3 >/dev/null; then
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["dtype"] == "bfloat16" and d["ranks"] == [2] and d["wrong"] == 0, d
assert [r["bytes"] for r in d["rows"]] == [1024, 1024, 2048, 2048, 4096, 4096], d["rows"]
assert [r["in_place"] for r in d["rows"][:2]] == [False, True]
assert all(r["busbw_gbps"] > 0 and r["median_us"] > 0 and r["roofline_fraction"] > 0 for r in d["rows"])
' "$tmp/json" && ok || bad "json output"
else
  grep -q '"rows"' "$tmp/json" && ok || bad "json output"
fi
# mpu mesh: the tutorial's mesh, as text and JSON, and the query benchmark
"$mpu" mesh --help | grep -- "--shape" >/dev/null && ok || bad "mpu mesh --help"
expect_usage_error mesh --shape 2,0
expect_usage_error mesh --shape 2,4 --names a
expect_usage_error mesh --shape 2,4 --names a,a
expect_usage_error mesh --shape 2,4 --rank 8
"$mpu" mesh --shape 2,4 --names replicate,shard --rank 5 >"$tmp/mesh" || bad "mpu mesh failed"
grep -q "rank 5 is local rank 1 of \[4, 5, 6, 7\]" "$tmp/mesh" && ok || bad "mesh: shard group of rank 5"
grep -q "\[0, 4\] \[1, 5\] \[2, 6\] \[3, 7\]" "$tmp/mesh" && ok || bad "mesh: replicate groups"
"$mpu" mesh --bench --shape 64,128,128 --iters 1000 --format json >"$tmp/meshb" || bad "mesh --bench failed"
if command -v python3 >/dev/null; then
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ranks"] == 1048576 and d["group_sizes"] == [64, 128, 128], d
assert d["memory_bytes"] < 8192, d
m = json.load(open(sys.argv[2]))
assert m["dims"][1]["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]], m
' "$tmp/meshb" <("$mpu" mesh --shape 2,4 --names replicate,shard --format json) && ok || bad "mesh json"
fi

# mpu demo hsdp: trains and checks itself against one rank
"$mpu" demo --help | grep hsdp >/dev/null && ok || bad "mpu demo --help"
expect_usage_error demo
expect_usage_error demo nosuch
expect_usage_error demo hsdp --mesh 2x
expect_usage_error demo hsdp --batch 63
"$mpu" demo hsdp --steps 5 >"$tmp/hsdp" && ok || bad "demo hsdp exited non-zero"
grep -q "PASS" "$tmp/hsdp" && ok || bad "demo hsdp did not pass its check"
[ "$(grep -cE '^ +[0-9]+ ' "$tmp/hsdp")" -eq 5 ] && ok || bad "demo hsdp: want 5 step lines"
"$mpu" demo hsdp --mesh 1x1 --steps 3 --batch 8 --format json | grep >/dev/null '"pass": true' && ok || bad "demo hsdp 1x1"
"$mpu" demo hsdp --mesh 3x2 --steps 3 --batch 24 | grep >/dev/null PASS && ok || bad "demo hsdp 3x2"

# mpu plan: groups, getters, invalid layouts (exit 2, one line naming the check, empty stdout)
"$mpu" plan --help | grep -- "--split-rank" >/dev/null && ok || bad "mpu plan --help"
expect_usage_error plan
expect_usage_error plan --world-size 10 --tp 4
expect_usage_error plan --flavor deepspeed --world-size 8 --tp 2 --sp 2
expect_usage_error plan --world-size 16 --tp 2 --pp 2 --ep 2 --order tp-ep-pp-dp
expect_usage_error plan --world-size 8 --rank 8
expect_usage_error plan --world-size 8 --format yaml
"$mpu" plan --world-size 10 --tp 4 2>"$tmp/err" >/dev/null
grep -q "world_size (10) is not divisible by tensor_model_parallel_size (4)" "$tmp/err" \
  && ok || bad "plan: the failed check's message"
"$mpu" plan --flavor deepspeed --world-size 16 --tp 2 --pp 4 >"$tmp/plan" || bad "plan text failed"
grep -q "\[0, 2\] \[1, 3\] \[4, 6\] \[5, 7\] \[8, 10\] \[9, 11\] \[12, 14\] \[13, 15\]" "$tmp/plan" \
  && ok || bad "plan: the docstring's data-parallel groups"
grep -q "stage 3   \[12 13\] \[14 15\]" "$tmp/plan" && ok || bad "plan: rank grid"
"$mpu" plan --flavor deepspeed --world-size 8 --tp 2 --pp 2 --rank 6 | grep >/dev/null "pipeline  rank 1 of 2, first 2, last 6" \
  && ok || bad "plan --rank"
"$mpu" plan --world-size 16 --tp 2 --pp 2 --format svg >"$tmp/plan.svg" && grep -q "<svg" "$tmp/plan.svg" && ok || bad "plan svg"
if command -v python3 >/dev/null; then
  python3 -c '
import json, subprocess, sys
mpu = sys.argv[1]
d = json.loads(subprocess.check_output([mpu, "plan", "--flavor", "deepspeed", "--world-size", "8",
    "--tp", "2", "--pp", "2", "--per-rank", "--format", "json"]))
g = d["groups"]
assert set(g) == {"dp", "sp", "sdp", "mp", "tp", "pp", "embedding", "position_embedding", "amax"}, g.keys()
assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]] and g["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
assert g["sp"] == [[r] for r in range(8)] and g["amax"] == []
r6 = d["per_rank"][6]
assert r6["rank"] == 6 and r6["tp_src"] == 6 and r6["pp_first"] == 2 and r6["is_last_stage"] is True
assert r6["embedding_global_ranks"] == [2, 6] and r6["in_embedding_group"] is True
assert len(d["per_rank"]) == 8 and all(p["rank"] == i for i, p in enumerate(d["per_rank"]))
c = json.loads(subprocess.check_output([mpu, "plan", "--world-size", "16", "--tp", "2", "--pp", "2",
    "--cp", "2", "--ep", "2", "--per-rank", "--format", "json"]))
need = {"dp", "dp_cp", "cp", "tp_pp", "tp_ep_pp", "tp", "pp", "embedding", "position_embedding",
        "tp_dp_cp", "tp_dp", "tp_cp", "tp_ep", "ep", "dp_modulo_ep", "dp_cp_modulo_ep"}
assert set(c["groups"]) == need, c["groups"].keys()
assert c["groups"]["tp_ep"][0] == [0, 1, 4, 5]
p5 = c["per_rank"][5]
assert p5["ep_rank"] == 1 and p5["ep_size"] == 2 and p5["tp_ep_rank"] == 3 and p5["cp_rank"] == 0
for grp in c["groups"].values():
    for x in grp: assert x == sorted(x)
' "$mpu" && ok || bad "plan json"
fi

# mpu demo mappings: the mpu/mappings.py walkthrough's values (tp 2, pp 2, 8 ranks)
expect_usage_error demo mappings --tp 3
expect_usage_error demo mappings --world-size 6 --tp 4
"$mpu" demo mappings >"$tmp/map" && ok || bad "demo mappings failed"
grep -q "rank 6 > Before reduce: tensor(\[6.\])  After reduce: tensor(\[13.\])" "$tmp/map" && ok || bad "mappings text"
if command -v python3 >/dev/null; then
  python3 -c '
import json, subprocess, sys
d = json.loads(subprocess.check_output([sys.argv[1], "demo", "mappings", "--format", "json"]))
assert sorted(d, key=int) == [str(r) for r in range(8)]
for r in (6, 7):
    assert d[str(r)]["reduce"]["output"] == [13]
    assert d[str(r)]["copy_to"]["copy_grad"] == [13]
    assert d[str(r)]["reduce_from"]["loss"] == 170
    assert d[str(r)]["scatter_to"]["x_grad"] == [6, 7]
assert d["6"]["reduce_from"]["x_grad"] == [12] and d["7"]["reduce_from"]["x_grad"] == [14]
assert d["3"]["split"]["output"] == [1] and d["2"]["gather"]["output"] == [2, 3]
sp = d["6"]["sp_gather"]
assert len(sp["output"]) == 8 and sp["input_grad"][0] == [15, 17, 19]
assert d["6"]["sp_gather_no_tp_output_grad"]["input_grad"][0] == [7, 8, 9]
' "$mpu" && ok || bad "mappings json"
fi

# mpu plan --compare: the three flavours side by side
"$mpu" plan --compare --world-size 16 --tp 2 --pp 2 --cp 2 --ep 2 --format json | python3 -c '
import json, sys
d = json.load(sys.stdin)["flavors"]
assert "refused" in d["deepspeed"]
assert d["core"]["expert parallel"][0] == [0, 4] and d["core-0.19"]["expert parallel"][0] == [0, 2]
assert d["core"]["data parallel"] == d["core-0.19"]["data parallel"]
' && ok || bad "plan --compare json"
"$mpu" plan --compare --world-size 8 --tp 2 --pp 2 | grep >/dev/null "^  deepspeed  \[0, 2\] \[1, 3\]" && ok || bad "plan --compare text"
expect_usage_error plan --compare --world-size 8 --tp 3
"$mpu" plan --compare --world-size 32 --tp 2 --pp 2 --cp 2 --ep 2 >"$tmp/cmp"
[ "$(grep -c refuses "$tmp/cmp")" -eq 1 ] && ok || bad "plan --compare says a flavour's refusal more than once"
! grep -q '\.\.\.\|…' "$tmp/cmp" && grep -q "\[30, 31\]" "$tmp/cmp" && ok || bad "plan --compare cuts a kind's groups"
# --compare answers at once on any world: past 4,096 ranks each kind's count, size and first group
timeout 10 "$mpu" plan --compare --world-size 1073741824 --tp 1073741824 >"$tmp/cmpbig" &&
  [ "$(wc -c <"$tmp/cmpbig")" -lt 20000 ] && grep -q "too many groups to list" "$tmp/cmpbig" &&
  grep -q "^  core       1 group of 1073741824; rank 0's: \[0, \.\.\.\]" "$tmp/cmpbig" \
  && ok || bad "plan --compare of a billion ranks (tp a billion): $(head -c 300 "$tmp/cmpbig")"
timeout 10 "$mpu" plan --compare --world-size 1073741824 --tp 1024 --pp 1024 --format json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["world_size"] == 1073741824 and "summary" in d, d
for f in ("deepspeed", "core", "core-0.19"):
    tp = d["flavors"][f]["tensor parallel"]
    assert tp == {"groups": 1048576, "size": 1024, "rank": 0, "first_members": list(range(12))}, (f, tp)
    pp = d["flavors"][f]["pipeline"]
    assert pp["groups"] == 1048576 and pp["size"] == 1024 and pp["first_members"][:2] == [0, 1048576], (f, pp)
' && ok || bad "plan --compare json summary of a billion ranks"
timeout 10 "$mpu" plan --world-size 1073741824 --tp 1073741824 --format svg >"$tmp/bigtp.svg" &&
  grep -q "size 1073741824 \[0, \.\.\.\]" "$tmp/bigtp.svg" && ok || bad "plan svg of a billion-rank tensor-parallel group"
# an option the chosen plan does not use is refused, naming it
for a in "--format svg" "--format html" "--rank 3" "--flavor deepspeed" "--per-rank" "--schedule 1f1b" "--micro-batches 4"; do
  expect_usage_error plan --compare --world-size 8 --tp 2 $a
  w=${a%% *}
  grep -q -- "--compare .*${w#--}" "$tmp/err" && ok || bad "plan --compare $a: $(cat "$tmp/err")"
done
expect_usage_error plan --world-size 8 --micro-batches 4
grep -q -- "--micro-batches (it is for --schedule)" "$tmp/err" && ok || bad "plan --micro-batches without --schedule: $(cat "$tmp/err")"
expect_usage_error plan --schedule 1f1b --pp 2 --world-size 8
expect_usage_error plan --schedule 1f1b --pp 2 --rank 1
expect_usage_error plan --bench --world-size 8
# the rank grid names its rows' groups: dp_cp where cp is not 1
"$mpu" plan --world-size 16 --tp 2 --pp 2 --cp 2 | grep >/dev/null "data- and context-parallel group (dp_cp" && ok || bad "plan's rank grid with cp 2"
! "$mpu" plan --world-size 16 --tp 2 --pp 2 --cp 2 | grep >/dev/null "form a data-parallel group" && ok || bad "plan's rank grid calls dp_cp rows data-parallel"
# every format refuses a rank outside the mesh
for f in text json svg html; do expect_usage_error mesh --shape 2,4 --rank 9 --format $f; done
# the demos, gpt first among them
"$mpu" --help | grep "demo .*(gpt, " >/dev/null && ok || bad "mpu --help does not list the gpt demo"

# mpu demo gpt: the main job, its two checks (losses and parameters) on several layouts
expect_usage_error demo gpt --tp 3
expect_usage_error demo gpt --bench --tp 4
# --bench --tp N: that tp only (what scripts/perf-report.sh's profile table samples)
"$mpu" demo gpt --bench --tp 2 --steps 1 --format json 2>/dev/null | python3 -c '
import json, sys
runs = json.load(sys.stdin)["runs"]
sys.exit(0 if [r["tp"] for r in runs] == [2] and runs[0]["tokens_per_s"] > 0 else 1)
' && ok || bad "demo gpt --bench --tp 2 ran another tp"
expect_usage_error demo gpt --layers 3
expect_usage_error demo gpt --micro-batches 1
expect_usage_error demo gpt --layers 512
expect_usage_error demo gpt --text /nonexistent/corpus.txt
expect_usage_error demo gpt --seq 100000
# --text reads regular files: a directory, /proc/self/mem (whose reads fail) and a
# FIFO nobody writes to (whose open would block) are one-line errors at once
mkfifo "$tmp/fifo"
for t in . /proc/self/mem "$tmp/fifo"; do
  expect_usage_error demo gpt --text "$t"
  grep -q -e "not a regular file" -e "cannot read" "$tmp/err" && ok || bad "demo gpt --text $t: $(cat "$tmp/err")"
done
"$mpu" demo gpt --steps 6 >"$tmp/gpt" && ok || bad "demo gpt exited non-zero"
[ "$(grep -c PASS "$tmp/gpt")" -eq 2 ] && ok || bad "demo gpt did not pass both checks"
grep -q "tokens/s" "$tmp/gpt" && grep -q "bubble 0.125" "$tmp/gpt" && ok || bad "demo gpt speed line"
"$mpu" demo gpt --tp 4 --pp 1 --dp 2 --no-sp --steps 4 --format json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["pass"] and d["params_pass"] and not d["sequence_parallel"] and d["schedule"] == "no-pipelining"
' && ok || bad "demo gpt tp 4 json"
"$mpu" demo gpt --tp 1 --pp 4 --vp 2 --dp 1 --layers 8 --micro-batches 8 --steps 3 | grep -c PASS | grep >/dev/null 2 && ok || bad "demo gpt pp 4 vp 2"
"$mpu" demo gpt --tp 2 --pp 2 --vp 1 --dp 2 --no-zero --dropout 0 --steps 3 | grep -c PASS | grep >/dev/null 2 && ok || bad "demo gpt 1f1b plain"
# sharded data parallelism with the tp layers: FULL_SHARD over dp, HYBRID_SHARD on (2, 4)
expect_usage_error demo gpt --hsdp 2x
expect_usage_error demo gpt --hsdp 2x4 --dp 4
expect_usage_error demo gpt --fsdp --hsdp 2x2
"$mpu" demo gpt --fsdp --steps 4 >"$tmp/gpt_fsdp" && ok || bad "demo gpt --fsdp exited non-zero"
[ "$(grep -c PASS "$tmp/gpt_fsdp")" -eq 2 ] && grep -q "dp 2 (FULL_SHARD)" "$tmp/gpt_fsdp" && ok || bad "demo gpt --fsdp checks"
# FSDP2's per-parameter layout: the same values as one rank, other elements per rank
expect_usage_error demo gpt --fsdp --fsdp-layout fsdp3
expect_usage_error demo gpt --fsdp-layout per_param
"$mpu" demo gpt --fsdp --fsdp-layout per_param --steps 4 >"$tmp/gpt_fsdp2" && ok || bad "demo gpt --fsdp-layout per_param exited non-zero"
[ "$(grep -c PASS "$tmp/gpt_fsdp2")" -eq 2 ] && grep -q "FSDP2 per-parameter" "$tmp/gpt_fsdp2" && ok || bad "demo gpt --fsdp-layout per_param checks"
"$mpu" demo gpt --hsdp 2x4 --pp 1 --steps 3 >"$tmp/gpt_hsdp" && ok || bad "demo gpt --hsdp exited non-zero"
[ "$(grep -c PASS "$tmp/gpt_hsdp")" -eq 2 ] && grep -q "HYBRID_SHARD, replicate 2 x shard 4" "$tmp/gpt_hsdp" && ok || bad "demo gpt --hsdp 2x4 checks"
# activation recompute: each mode checked against one rank with full recompute
expect_usage_error demo gpt --recompute some
expect_usage_error demo gpt --recompute none --recompute-layers 1
"$mpu" demo gpt --recompute none --steps 3 --format json | python3 -c '
import json, sys
d = json.load(sys.stdin)
a = d["activation_bytes_per_micro_batch"]
assert d["pass"] and d["params_pass"] and d["recompute"] == "none"
assert a["none"] > a["selective"] > a["full"] > 0
' && ok || bad "demo gpt --recompute none"
"$mpu" demo gpt --recompute selective --steps 3 | grep -c PASS | grep >/dev/null 2 && ok || bad "demo gpt --recompute selective"
"$mpu" demo gpt --recompute full --recompute-layers 1 --layers 4 --vp 1 --steps 3 | grep -c PASS | grep >/dev/null 2 && ok || bad "demo gpt --recompute-layers"

# mpu demo train: the simpler model on the training blocks, and its self-check
expect_usage_error demo train --tp 3
expect_usage_error demo train --layers 3 --pp 2
"$mpu" demo train --steps 8 >"$tmp/train" && ok || bad "demo train exited non-zero"
grep -q "PASS" "$tmp/train" && ok || bad "demo train did not pass its check"
"$mpu" demo train --tp 4 --pp 1 --dp 2 --steps 5 --format json | grep >/dev/null '"pass": true' && ok || bad "demo train tp 4"
"$mpu" demo train --tp 1 --pp 4 --dp 1 --layers 4 --steps 5 | grep >/dev/null PASS && ok || bad "demo train pp 4"
"$mpu" demo train --zero --steps 5 >"$tmp/zero" && grep -q "ZeRO-1" "$tmp/zero" && grep -q PASS "$tmp/zero" && ok || bad "demo train --zero"
# mpu bench --block, tiny
"$mpu" bench --block --hidden 64 --tokens 64 --iters 1 --format json | grep >/dev/null '"tp": 2' && ok || bad "bench --block"

# a schedule's output is bounded: past the listing limit each stage's phases are
# given, not every step (a million micro-batches would be hundreds of MB of SVG)
for f in text json svg; do
  timeout 60 "$mpu" plan --schedule 1f1b --pp 2 --micro-batches 262144 --format $f >"$tmp/sched.$f" &&
    [ "$(wc -c <"$tmp/sched.$f")" -lt 100000 ] && ok || bad "plan --schedule --format $f: $(wc -c <"$tmp/sched.$f") bytes"
done
grep -q "too many to draw" "$tmp/sched.svg" && ok || bad "plan --schedule svg does not say it summarises"
# and past thousands of stages the first and last ones are given (the timeline of a
# deep pipe is linear in its steps, not a sweep over every stage per step)
for f in text json svg; do
  timeout 120 "$mpu" plan --schedule 1f1b --pp 131072 --micro-batches 1 --format $f >"$tmp/deep.$f" &&
    [ "$(wc -c <"$tmp/deep.$f")" -lt 1000000 ] && ok || bad "plan --schedule --pp 131072 --format $f: $(wc -c <"$tmp/deep.$f") bytes"
done
grep -q "stages 2048 to 129023 are not listed" "$tmp/deep.text" && grep -q "stages 32 to 131039 are not drawn" "$tmp/deep.svg" &&
  ok || bad "plan --schedule with many stages does not say which are left out"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert not d['steps_listed'] and d['stages'][1]['phases'][1]['steps'] == 524288" "$tmp/sched.json" && ok || bad "plan --schedule json summary"
expect_usage_error plan --schedule 1f1b --pp 2 --micro-batches 1000000 --format svg
grep -q "at most 1048576" "$tmp/err" && ok || bad "plan --schedule past the limit: $(cat "$tmp/err")"
expect_usage_error plan --bench --format svg

# the main job's first lines say in plain words what tp, pp, vp, dp and the bubble are
"$mpu" demo gpt --steps 1 >"$tmp/gpt.txt" 2>&1 || bad "demo gpt --steps 1 failed"
for w in "tp, tensor parallel:" "pp, pipeline parallel:" "vp, virtual pipeline:" "dp, data parallel:" \
  "pipeline bubble:"; do
  head -5 "$tmp/gpt.txt" | grep >/dev/null "^# $w" && ok || bad "demo gpt's first lines do not explain '$w'"
done
# README's first command builds the tool alone, without the tests
src=$(dirname "$0")/..
grep -q -- '--target mpu_tool' "$src/scripts/run.sh" && grep -q -- '-DMPU_BUILD_TESTS=OFF' "$src/scripts/run.sh" &&
  grep -q -- '-DMPU_BUILD_TESTS=ON' "$src/scripts/test.sh" && ok || bad "scripts/run.sh builds more than the tool"

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
