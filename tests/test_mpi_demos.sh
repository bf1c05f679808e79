#!/usr/bin/env bash
# The demos under mpirun give what they give on thread ranks, on every layout
# shape their thread runs cover (dp 1, pp > 1, tp 1 included): mappings JSON
# identical, train, gpt and hsdp losses identical and their self-checks pass;
# the header says what the ranks are; one process reports (a size error is
# printed once, the progress line comes from one process).
# Usage: test_mpi_demos.sh MPU MPIRUN...
set -uo pipefail
mpu=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { passes=$((passes+1)); }
bad() { echo "FAIL: $*"; fails=$((fails+1)); }

# same N DEMO ARGS...: the demo on N MPI processes and on N thread ranks print
# the same step lines, every check passes on both, and stderr holds no more
# progress lines than one process writes (one every 2 s)
same() {
  local n=$1 demo=$2
  shift 2
  local tag="$demo $*"
  local t0=$SECONDS
  "${mpirun[@]}" -n "$n" "$mpu" demo "$demo" --backend mpi "$@" >"$tmp/mpi.txt" 2>"$tmp/mpi.err" || { bad "$tag: under mpirun -n $n"; cat "$tmp/mpi.err"; return; }
  local spent=$((SECONDS - t0))
  "$mpu" demo "$demo" "$@" >"$tmp/threads.txt" 2>/dev/null || { bad "$tag: on thread ranks"; return; }
  local checks
  checks=$(grep -c 'check: .*PASS' "$tmp/threads.txt")
  [ "$checks" -ge 1 ] && [ "$(grep -c 'check: .*PASS' "$tmp/mpi.txt")" -eq "$checks" ] && ! grep -q FAIL "$tmp/mpi.txt" && ok || bad "$tag: under mpirun -n $n the checks do not pass"
  local steps
  steps=$(grep -cE '^ +[0-9]+ ' "$tmp/mpi.txt")
  [ "$steps" -ge 1 ] && cmp -s <(grep -E '^ +[0-9]+ ' "$tmp/mpi.txt") <(grep -E '^ +[0-9]+ ' "$tmp/threads.txt") && ok || bad "$tag: step lines differ between MPI and threads"
  ! grep -qE '^ +[0-9]+ +0\.000000000 ' "$tmp/mpi.txt" && ok || bad "$tag: zero losses under MPI"
  [ "$(grep -c '^\[' "$tmp/mpi.err")" -le $((spent / 2 + 2)) ] && ok || bad "$tag: progress lines from more than one process"
}
mpirun=("$@")

"$@" -n 8 "$mpu" demo mappings --backend mpi --format json >"$tmp/mpi.json" || bad "mappings under mpirun"
"$mpu" demo mappings --format json >"$tmp/threads.json"
cmp -s "$tmp/mpi.json" "$tmp/threads.json" && ok || bad "mappings JSON differs between MPI and threads"

# train: the thread runs' shapes (tests/test_cli.sh)
same 8 train --steps 6
head -1 "$tmp/mpi.txt" | grep >/dev/null "^# 8 MPI processes:" && head -1 "$tmp/threads.txt" | grep >/dev/null "^# 8 thread ranks:" && ok || bad "train's header does not say what the ranks are"
same 8 train --tp 4 --pp 1 --dp 2 --steps 4
same 4 train --tp 1 --pp 4 --dp 1 --layers 4 --steps 4

# gpt: the default (tp 2 x pp 2 x dp 2, interleaved), dp 1, pp > 1 with tp 1, 1F1B, tp only
same 8 gpt --steps 4
same 4 gpt --dp 1 --steps 3
same 2 gpt --tp 1 --pp 2 --dp 1 --steps 3
same 4 gpt --tp 1 --pp 4 --dp 1 --vp 1 --steps 3
same 4 gpt --tp 1 --pp 4 --vp 2 --dp 1 --layers 8 --micro-batches 8 --steps 2
same 8 gpt --tp 4 --pp 1 --dp 2 --no-sp --steps 3
same 8 gpt --tp 2 --pp 2 --vp 1 --dp 2 --no-zero --dropout 0 --steps 2
# sharded data parallelism: FULL_SHARD over dp 2, HYBRID_SHARD 2x4 with tp 2 (16 ranks)
same 8 gpt --fsdp --steps 3
same 16 gpt --hsdp 2x4 --pp 1 --steps 2

# hsdp: the default 2x4 mesh, 1x1, 3x2
same 8 hsdp --steps 5
same 1 hsdp --mesh 1x1 --steps 3 --batch 8
same 6 hsdp --mesh 3x2 --steps 3 --batch 24

# a job of the wrong size: one line, from one process
"$@" -n 4 "$mpu" demo train --backend mpi --steps 3 2>"$tmp/err" >/dev/null
[ $? -ne 0 ] && [ "$(grep -c "the command wants 8" "$tmp/err")" -eq 1 ] && ok || { bad "a job of the wrong size: want one line"; cat "$tmp/err"; }
"$@" -n 2 "$mpu" demo gpt --backend mpi --steps 3 2>"$tmp/err" >/dev/null
[ $? -ne 0 ] && [ "$(grep -c "the command wants 8" "$tmp/err")" -eq 1 ] && ok || { bad "gpt, a job of the wrong size: want one line"; cat "$tmp/err"; }
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
