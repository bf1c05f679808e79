#!/bin/sh
# gloo_run.sh N PROGRAM [ARGS...] - start N processes of PROGRAM as torchrun
# would, with its variables set by hand (RANK, WORLD_SIZE, LOCAL_RANK,
# MASTER_ADDR, MASTER_PORT on a free port of 127.0.0.1), and wait for all.
# Exits 0 when every process did, else with the first failure's status.
set -u
n=$1
shift
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=""
r=0
while [ "$r" -lt "$n" ]; do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port "$@" &
  pids="$pids $!"
  r=$((r + 1))
done
status=0
for p in $pids; do
  wait "$p"
  s=$?
  if [ "$s" -ne 0 ] && [ "$status" -eq 0 ]; then status=$s; fi
done
exit $status
