#!/usr/bin/env bash
# The demos under mpirun give what they give on thread ranks: mappings JSON
# identical, train losses identical (and the self-check passes).
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
cmp -s "$tmp/mpi.txt" "$tmp/threads.txt" && passes=$((passes+1)) || { echo "FAIL: train losses differ between MPI and threads"; fails=$((fails+1)); }
"$@" -n 4 "$mpu" demo train --backend mpi --steps 3 2>"$tmp/err" >/dev/null
[ $? -ne 0 ] && grep -q "the layout wants 8" "$tmp/err" && passes=$((passes+1)) || { echo "FAIL: a job of the wrong size"; fails=$((fails+1)); }
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
