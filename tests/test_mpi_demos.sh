#!/usr/bin/env bash
# The demos under mpirun give what they give on thread ranks: mappings JSON
# identical, train and hsdp losses identical (and the self-checks pass); the
# header says what the ranks are.
# Usage: test_mpi_demos.sh MPU MPIRUN...
set -uo pipefail
mpu=$1
shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
"$@" -n 8 "$mpu" demo mappings --backend mpi --format json >"$tmp/mpi.json" || { echo "FAIL: mappings under mpirun"; fails=$((fails+1)); }
"$mpu" demo mappings --format json >"$tmp/threads.json"
cmp -s "$tmp/mpi.json" "$tmp/threads.json" && passes=$((passes+1)) || { echo "FAIL: mappings JSON differs between MPI and threads"; fails=$((fails+1)); }
"$@" -n 8 "$mpu" demo train --backend mpi --steps 10 >"$tmp/mpi.txt" || { echo "FAIL: train under mpirun"; fails=$((fails+1)); }
"$mpu" demo train --steps 10 >"$tmp/threads.txt"
grep -q PASS "$tmp/mpi.txt" && passes=$((passes+1)) || { echo "FAIL: train under mpirun did not pass"; fails=$((fails+1)); }
cmp -s <(tail -n +2 "$tmp/mpi.txt") <(tail -n +2 "$tmp/threads.txt") && passes=$((passes+1)) || { echo "FAIL: train losses differ between MPI and threads"; fails=$((fails+1)); }
head -1 "$tmp/mpi.txt" | grep -q "^# 8 MPI processes:" && head -1 "$tmp/threads.txt" | grep -q "^# 8 thread ranks:" && passes=$((passes+1)) || { echo "FAIL: train's header does not say what the ranks are"; fails=$((fails+1)); }
"$@" -n 8 "$mpu" demo gpt --backend mpi --steps 6 >"$tmp/gpt_mpi.txt" || { echo "FAIL: gpt under mpirun"; fails=$((fails+1)); }
"$mpu" demo gpt --steps 6 >"$tmp/gpt_threads.txt"
[ "$(grep -c PASS "$tmp/gpt_mpi.txt")" -eq 2 ] && passes=$((passes+1)) || { echo "FAIL: gpt under mpirun did not pass"; fails=$((fails+1)); }
cmp -s <(grep -E '^ +[0-9]+ ' "$tmp/gpt_mpi.txt") <(grep -E '^ +[0-9]+ ' "$tmp/gpt_threads.txt") && passes=$((passes+1)) || { echo "FAIL: gpt losses differ between MPI and threads"; fails=$((fails+1)); }
"$@" -n 8 "$mpu" demo hsdp --backend mpi >"$tmp/hsdp_mpi.txt" || { echo "FAIL: hsdp under mpirun"; fails=$((fails+1)); }
"$mpu" demo hsdp >"$tmp/hsdp_threads.txt"
grep -q PASS "$tmp/hsdp_mpi.txt" && cmp -s <(tail -n +2 "$tmp/hsdp_mpi.txt") <(tail -n +2 "$tmp/hsdp_threads.txt") && passes=$((passes+1)) || { echo "FAIL: hsdp under mpirun differs from threads"; fails=$((fails+1)); }
"$@" -n 4 "$mpu" demo train --backend mpi --steps 3 2>"$tmp/err" >/dev/null
[ $? -ne 0 ] && grep -q "the command wants 8" "$tmp/err" && passes=$((passes+1)) || { echo "FAIL: a job of the wrong size"; fails=$((fails+1)); }
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
