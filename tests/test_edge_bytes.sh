#!/usr/bin/env bash
# The dtype edge cases on threads and on MPI (shared memory and TCP), every
# rank's output buffers compared byte for byte.
# usage: test_edge_bytes.sh BINARY MPIRUN...
set -euo pipefail
bin=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
for n in 1 2 3 4 8; do
  "$bin" threads "$n" "$dir/threads$n"
  "$@" -n "$n" "$bin" mpi "$dir/shm$n"
  "$@" --mca btl tcp,self -n "$n" "$bin" mpi "$dir/tcp$n"
  for ((r = 0; r < n; r++)); do
    [ -s "$dir/threads$n.$r" ] || { echo "no output from thread rank $r of $n"; exit 1; }
    cmp "$dir/threads$n.$r" "$dir/shm$n.$r"
    cmp "$dir/threads$n.$r" "$dir/tcp$n.$r"
  done
  echo "$n ranks: threads, MPI shared memory and MPI TCP agree byte for byte ($(stat -c %s "$dir/threads$n.0") bytes per rank)"
done
