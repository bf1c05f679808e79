#!/usr/bin/env bash
# mpu demo gpt and mpu bench on the gloo backend, 4 processes started the way
# torchrun starts them: by hand (MODE hand: tests/gloo_run.sh sets RANK,
# WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; rank 0 serves the store)
# or by torchrun itself (MODE torchrun: torchrun --standalone
# --nproc_per_node 4 --no-python, whose agent serves the store,
# TORCHELASTIC_USE_AGENT_STORE=True). The demo's step lines equal the thread
# ranks' and its checks pass; the bench finds 0 wrong elements.
# torchrun mode exits 77 with one line when PYENV's Python has no torch.
# Usage: test_gloo_demos.sh hand|torchrun MPU GLOO_RUN PYENV
set -uo pipefail
mode=$1 mpu=$2 gloo_run=$3 py=$4/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { passes=$((passes+1)); }
bad() { echo "FAIL: $*"; fails=$((fails+1)); }
# what the ranks said on stderr, without torchrun's banner and blank lines
said() { grep -v -e '^\*\*\*' -e 'OMP_NUM_THREADS' -e '^ *$' "$1" | head -40; }
if [ "$mode" = torchrun ]; then
  "$py" -c 'import torch' 2>/dev/null || { echo "test_gloo_demos.sh: no torch in $4: skipped"; exit 77; }
  launch() { "$py" -m torch.distributed.run --standalone --nproc_per_node 4 --no-python "$mpu" "$@"; }
else
  launch() { "$gloo_run" 4 "$mpu" "$@"; }
fi

layout=(--tp 2 --pp 2 --dp 1 --steps 4)
launch demo gpt --backend gloo "${layout[@]}" >"$tmp/gloo.txt" 2>"$tmp/gloo.err" || bad "demo gpt failed; its stderr:
$(said "$tmp/gloo.err")"
"$mpu" demo gpt "${layout[@]}" >"$tmp/threads.txt" 2>/dev/null || bad "demo gpt on thread ranks"
grep -q '4 gloo processes' "$tmp/gloo.txt" && ok || bad "demo gpt: the header does not say '4 gloo processes'"
checks=$(grep -c 'check: .*PASS' "$tmp/threads.txt")
[ "$checks" -ge 1 ] && [ "$(grep -c 'check: .*PASS' "$tmp/gloo.txt")" -eq "$checks" ] && ! grep -q FAIL "$tmp/gloo.txt" && ok || bad "demo gpt: the checks do not pass on gloo"
[ "$(grep -cE '^ +[0-9]+ ' "$tmp/gloo.txt")" -ge 4 ] && cmp -s <(grep -E '^ +[0-9]+ ' "$tmp/gloo.txt") <(grep -E '^ +[0-9]+ ' "$tmp/threads.txt") && ok || bad "demo gpt: step lines differ between gloo and threads"

launch bench --backend gloo -b 8 -e 64K -f 64 -n 3 -w 1 --collective all >"$tmp/bench.txt" 2>"$tmp/bench.err" && ok || bad "bench failed; its stderr:
$(said "$tmp/bench.err")"
grep -q '# Out of bounds values : 0 OK' "$tmp/bench.txt" && ok || bad "bench: wrong elements"
[ "$(grep -c '^# all_to_all, 4 gloo processes' "$tmp/bench.txt")" -eq 1 ] && ok || bad "bench: no all_to_all block on 4 gloo processes"

# on a machine without a GPU (or without the NCCL backend), --backend nccl says so in one line
# that names what runs on CPUs
if [ "$mode" = hand ] && ! "$mpu" demo gpt --backend nccl --steps 1 >/dev/null 2>"$tmp/nccl.err"; then
  [ "$(wc -l <"$tmp/nccl.err")" -eq 1 ] && grep -q 'gloo' "$tmp/nccl.err" &&
    grep -qi 'mpi' "$tmp/nccl.err" && grep -q 'threads' "$tmp/nccl.err" &&
    ok || bad "demo gpt --backend nccl without a GPU: $(cat "$tmp/nccl.err")"
fi

echo "test_gloo_demos.sh $mode: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
