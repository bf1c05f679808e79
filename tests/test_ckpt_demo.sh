#!/usr/bin/env bash
# `mpu demo gpt --save/--load` and `mpu ckpt`: the GPT trained 20 steps with
# tp 2 x pp 2 (vp 2) x dp 2 under ZeRO-1 saves after step 10; loaded into
# tp 1 x pp 1 x dp 1, tp 4 x dp 2, pp 4 x dp 2 and tp 2 x dp 4 without ZeRO
# (the global batch kept: dp x micro-batches = 8), every continued run's
# steps 11-20 and final parameters pass the demo's check against the
# uninterrupted one-rank run. Sharded buffers too: a save from --fsdp
# (tp 2 x dp 4) continues in tp 2 x pp 2 x dp 2 under ZeRO-1, one from FSDP2's
# per-parameter layout in FSDP1's flat one, and the ZeRO-1
# save continues under --hsdp 2x2 (tp 2). On thread ranks, and with MPIRUN given also
# under mpirun (saved by MPI processes, loaded by MPI processes). Then the
# tool: inspect accepts the checkpoint (its root, or the iteration's folder), merge
# writes one file, a corrupted or truncated piece is refused naming the tensor and
# the file, bad arguments exit 2. A root with a damaged tracker and what killed
# saves leave still continues from its newest complete iteration.
# Usage: test_ckpt_demo.sh [--quick] MPU              thread ranks and the tool
#        test_ckpt_demo.sh [--quick] MPU MPIRUN...    MPI processes (and threads loading their save)
# --quick (the sanitizer builds): two of the four layouts, tp 1 and tp 2 x dp 4 plain.
set -uo pipefail
quick=0
if [ "$1" = "--quick" ]; then quick=1; shift; fi
mpu=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

layouts=("--tp 1 --pp 1 --dp 1 --micro-batches 8" "--tp 4 --pp 1 --dp 2"
         "--tp 1 --pp 4 --vp 1 --dp 2" "--tp 2 --pp 1 --dp 4 --no-zero --micro-batches 2")
ranks=(1 8 8 8)
if [ $quick -eq 1 ]; then
  layouts=("${layouts[0]}" "${layouts[3]}")
  ranks=(1 8)
fi

run() { # name, launcher words... -- demo args...
  local name=$1
  shift
  "$@" >"$tmp/$name.txt" 2>"$tmp/$name.err"
  local rc=$?
  if [ $rc -eq 0 ] && [ "$(grep -c ': PASS' "$tmp/$name.txt")" -eq 2 ]; then ok
  else bad "$name (exit $rc): $(tail -2 "$tmp/$name.err" "$tmp/$name.txt" | tr '\n' ' ')"; fi
}

check_continued() { # name: the losses shown are steps 11..20
  local steps
  steps=$(grep -E '^ +[0-9]+ ' "$tmp/$1.txt" | awk '{print $1}' | tr '\n' ' ')
  [ "$steps" = "11 12 13 14 15 16 17 18 19 20 " ] && ok || bad "$1 checked steps '$steps', want 11..20"
}

if [ $# -gt 0 ]; then
  run mpi_save "$@" -n 8 "$mpu" demo gpt --backend mpi --steps 20 --save "$tmp/ckm" --save-step 10
  for i in "${!layouts[@]}"; do
    run "mpi_load$i" "$@" -n "${ranks[$i]}" "$mpu" demo gpt --backend mpi --steps 20 ${layouts[$i]} --load "$tmp/ckm"
    check_continued "mpi_load$i"
  done
  # thread ranks load what MPI processes saved
  run mixed "$mpu" demo gpt --steps 20 --tp 2 --pp 2 --dp 2 --load "$tmp/ckm"
  echo "$passes passed, $fails failed"
  [ $fails -eq 0 ]
  exit
fi

run save "$mpu" demo gpt --steps 20 --save "$tmp/ck" --save-step 10
for i in "${!layouts[@]}"; do
  run "load$i" "$mpu" demo gpt --steps 20 ${layouts[$i]} --load "$tmp/ck"
  check_continued "load$i"
done
# sharded buffers: FSDP's pieces saved, loaded into ZeRO-1; ZeRO-1's shards loaded into HSDP
run fsdp_save "$mpu" demo gpt --steps 20 --fsdp --tp 2 --pp 1 --dp 4 --micro-batches 2 --save "$tmp/ckf" --save-step 10
run fsdp_to_zero1 "$mpu" demo gpt --steps 20 --tp 2 --pp 2 --dp 2 --load "$tmp/ckf"
check_continued fsdp_to_zero1
# FSDP2's per-parameter pieces saved, continued in FSDP1's flat layout
run fsdp2_save "$mpu" demo gpt --steps 20 --fsdp --fsdp-layout per_param --tp 2 --pp 1 --dp 4 --micro-batches 2 --save "$tmp/ckf2" --save-step 10
run fsdp2_to_flat "$mpu" demo gpt --steps 20 --fsdp --fsdp-layout flat --tp 2 --pp 1 --dp 4 --micro-batches 2 --load "$tmp/ckf2"
check_continued fsdp2_to_flat
if [ $quick -eq 0 ]; then
  run zero1_to_hsdp "$mpu" demo gpt --steps 20 --hsdp 2x2 --tp 2 --pp 1 --micro-batches 2 --load "$tmp/ck"
  check_continued zero1_to_hsdp
fi
# every continued run's steps 11-20 against the uninterrupted parallel run's (the demo's 1e-4)
same_losses() { # name
  paste <(grep -E '^ +(1[1-9]|20) ' "$tmp/save.txt" | awk '{print $2}') \
        <(grep -E '^ +(1[1-9]|20) ' "$tmp/$1.txt" | awk '{print $2}') |
    awk 'BEGIN { n = 0; bad = 0 } { n++; d = $1 - $2; if (d < 0) d = -d; if (d > 1e-4 * $1) bad++ }
         END { exit !(n == 10 && bad == 0) }' && ok || bad "$1: steps 11-20 differ from the uninterrupted run"
}
for i in "${!layouts[@]}"; do same_losses "load$i"; done
# the tool
"$mpu" ckpt inspect "$tmp/ck" >"$tmp/inspect.txt" && grep -q "step 10" "$tmp/inspect.txt" && ok || bad "inspect"
"$mpu" ckpt inspect "$tmp/ck" --format json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["complete"] and d["step"] == 10 and d["layout"]["tp"] == 2 and d["layout"]["zero1"]
assert len(d["files"]) == 8 and any(t["name"] == "layer3.qkv.weight" and t["shape"] == [192, 64] for t in d["tensors"])
' && ok || bad "inspect --format json"
"$mpu" ckpt merge "$tmp/ck" "$tmp/model.safetensors" >/dev/null && [ -s "$tmp/model.safetensors" ] && ok || bad "merge"
# the root names iteration 10, which holds the files (Megatron's layout)
[ "$(cat "$tmp/ck/latest_checkpointed_iteration.txt")" = "10" ] && [ -s "$tmp/ck/iter_0000010/index.json" ] &&
  [ "$(ls "$tmp/ck")" = "$(printf 'iter_0000010\nlatest_checkpointed_iteration.txt')" ] && ok || bad "the root: $(ls "$tmp/ck")"
# one iteration's folder given directly
"$mpu" ckpt inspect "$tmp/ck/iter_0000010" >"$tmp/inspect.txt" && grep -q "iter_0000010: complete.*step 10" "$tmp/inspect.txt" && ok || bad "inspect of iter_0000010"
# what a save killed later leaves (its .tmp folder, an iteration folder without an index) and
# a damaged tracker: the newest complete iteration is still the one loaded
cp -r "$tmp/ck" "$tmp/later"
mkdir "$tmp/later/iter_0000015.tmp" "$tmp/later/iter_0000020"
cp "$tmp/ck/iter_0000010/rank00000.safetensors" "$tmp/later/iter_0000015.tmp/"
cp "$tmp/ck/iter_0000010/rank00000.safetensors" "$tmp/later/iter_0000020/"
echo 2x >"$tmp/later/latest_checkpointed_iteration.txt"
run later "$mpu" demo gpt --steps 20 ${layouts[0]} --load "$tmp/later"
check_continued later
same_losses later
cp -r "$tmp/ck/iter_0000010" "$tmp/bad"
# flip a byte in the middle of rank 5's data: the load names the tensor and the file
size=$(stat -c %s "$tmp/bad/rank00005.safetensors")
printf '\x7f' | dd of="$tmp/bad/rank00005.safetensors" bs=1 seek=$((size - 100)) conv=notrunc status=none
"$mpu" demo gpt --steps 20 --tp 1 --pp 1 --dp 1 --micro-batches 8 --load "$tmp/bad" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "tensor '.*': piece [0-9]* in file rank00005.safetensors is corrupted" "$tmp/err" && ok || bad "a corrupted piece: $(cat "$tmp/err")"
"$mpu" ckpt inspect "$tmp/bad" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "rank00005.safetensors is corrupted" "$tmp/err" && ok || bad "inspect of a corrupted piece: $(cat "$tmp/err")"
truncate -s -8 "$tmp/bad/rank00002.safetensors"
"$mpu" ckpt inspect "$tmp/bad" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "rank00002.safetensors has .* (truncated)" "$tmp/err" && ok || bad "inspect of a truncated file: $(cat "$tmp/err")"
rm "$tmp/bad/index.json"
"$mpu" ckpt inspect "$tmp/bad" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "did not finish" "$tmp/err" && ok || bad "inspect without an index"
"$mpu" demo gpt --steps 20 --tp 1 --pp 1 --dp 1 --load "$tmp/ck" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "global_batch 8, this run has 4" "$tmp/err" && ok || bad "another global batch: $(cat "$tmp/err")"
"$mpu" demo gpt --steps 20 --hidden 128 --load "$tmp/ck" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "hidden 64, this run has 128" "$tmp/err" && ok || bad "another model: $(cat "$tmp/err")"
for args in "ckpt" "ckpt inspect" "ckpt merge $tmp/ck" "ckpt frob $tmp/ck" "ckpt inspect $tmp/ck --all" \
            "ckpt inspect $tmp/ck --format yaml" "ckpt merge $tmp/ck x --format json" \
            "demo gpt --save-step 3" "demo gpt --save $tmp/x --steps 5 --save-step 6" "demo gpt --bench --load $tmp/ck"; do
  "$mpu" $args >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc -eq 2 ] && [ ! -s "$tmp/out" ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && ok || bad "mpu $args: exit $rc, $(cat "$tmp/err")"
done
"$mpu" ckpt --help | grep >/dev/null "merge DIR OUT" && ok || bad "mpu ckpt --help"
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
