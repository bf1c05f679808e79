#!/usr/bin/env bash
# multihost.sh - mpu across three hosts, and faults between them.
#
# The hosts are network namespaces on this machine: h0, h1 and h2, each with
# its own interface (a veth pair to a bridge in a fourth, "switch" namespace),
# its own address (10.X.Y.1-3/24, picked per run), its own hostname (a UTS
# namespace) and /etc/hosts. Open MPI runs across them as across machines:
# mpirun on h0 starts its daemons on h1 and h2 through an rsh agent (this
# script with --agent) that enters the host's namespaces where ssh would log
# in; MPI traffic uses the TCP BTL only and Open MPI's own traffic the same
# network. Eight ranks: 3 on h0, 3 on h1, 2 on h2.
#
# Runs, each bounded in time:
#   1. the conformance suite (test_conformance_mpi), 8 ranks
#   2. the parallel state and a device mesh on tp 2 x pp 2 x dp 2
#      (test_state_mpi), and `mpu demo mappings --backend mpi` byte for byte
#      against thread ranks
#   3. `mpu demo gpt --backend mpi`: both its checks pass, losses equal to
#      thread ranks'
#   4. h2's link set down in the middle of all_reduce calls: every rank
#      returns MPU_ERR_TIMEOUT within MPU_TIMEOUT + 1 s of the fault, the job
#      ends, no process is left on any host
#   5. h2's link throttled to 10 Mbit/s (tc tbf, both ways): 1 MiB
#      all_reduce calls still exact with a timeout that covers them; with a
#      timeout shorter than one call, every rank returns MPU_ERR_TIMEOUT
#      instead (never a wrong result), and the job ends
#   6. a rank on h2 killed (SIGKILL) in the middle of the calls: mpirun sees
#      it, the job ends within MPU_TIMEOUT + 10 s of the kill, no surviving
#      rank reports success or a wrong result, no process is left
#
# The hosts' kernels are set to notice a dead peer within seconds
# (net.ipv4.tcp_retries2, Open MPI's oob keepalive), as clusters tuned for
# failure detection are: without it Open MPI's daemons would wait out TCP's
# default 15 minutes before they notice the lost host. The library's promise,
# errors within the timeout, does not depend on it; the job's end does.
#
# With --gloo, two hosts (h0, h1) and the gloo backend instead: 4 processes,
# 2 on each host, started with torchrun's variables by hand (RANK,
# WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=h0, MASTER_PORT);
# rank 0 serves the store on h0 and every rank listens on its host's address:
#   1. the conformance suite (test_conformance_gloo), 4 ranks
#   2. `mpu demo gpt --backend gloo`: its checks pass, losses equal to thread
#      ranks'
#
# Usage: multihost.sh MPU_TOOL TEST_CONFORMANCE_MPI TEST_STATE_MPI MULTIHOST_FAULTS
#        multihost.sh --gloo MPU_TOOL TEST_CONFORMANCE_GLOO
# Exit 0: passed; 77: skipped (one line says why: not root, no ip/tc/unshare/
# mpirun, or namespaces cannot be made here); 1: failed. Namespaces, files
# and processes are cleaned up on every exit.

# ---- the rsh agent: `multihost.sh --agent [options] HOST COMMAND...` --------------
if [ "${1:-}" = "--agent" ]; then
  shift
  while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done # ssh-style options
  host=$1
  shift
  # as ssh does: the remote shell runs the words as one command line
  exec ip netns exec "${MPU_MULTIHOST_PREFIX:?}$host" unshare --uts \
    sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
fi

set -uo pipefail
gloo=0
[ "${1:-}" = "--gloo" ] && gloo=1 && shift
if [ $# -ne $((gloo ? 2 : 4)) ]; then
  echo "usage: multihost.sh MPU_TOOL TEST_CONFORMANCE_MPI TEST_STATE_MPI MULTIHOST_FAULTS" >&2
  echo "       multihost.sh --gloo MPU_TOOL TEST_CONFORMANCE_GLOO" >&2
  exit 2
fi
mpu=$(realpath "$1") conformance=$(realpath "$2")
[ $gloo -eq 0 ] && state=$(realpath "$3") faults=$(realpath "$4")
self=$(realpath "$0")

skip() {
  echo "multihost: skipped: $*"
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "making network namespaces needs root"
tools="ip tc unshare mpirun timeout"
[ $gloo -eq 1 ] && tools="ip unshare timeout"
for tool in $tools; do
  command -v "$tool" >/dev/null || skip "no '$tool' on this machine"
done

# what a run killed outright (SIGKILL: no trap) left behind: namespaces of
# runs whose process is gone
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^mpu[0-9]+(h[0-9]|sw)$'); do
  pid=${ns#mpu}
  pid=${pid%h?}
  pid=${pid%sw}
  kill -0 "$pid" 2>/dev/null && continue
  pids=$(ip netns pids "$ns" 2>/dev/null)
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  rm -rf "/etc/netns/$ns"
done

# every step's limit is cut to what is left of the whole run's budget, so the
# run ends (and cleans up) before the test harness would kill it
deadline=$((SECONDS + ${MPU_MULTIHOST_BUDGET:-780}))
budget() { # the smaller of $1 and the seconds left (at least 1)
  local left=$((deadline - SECONDS))
  [ $left -lt 1 ] && left=1
  [ "$1" -lt $left ] && echo "$1" || echo $left
}

P=mpu$$ # namespace and /etc/netns prefix of this run
NET=10.$((200 + $$ % 50)).$((($$ / 50) % 250))
export MPU_MULTIHOST_PREFIX=$P
tmp=$(mktemp -d /tmp/mpu-multihost.XXXXXX)
HOSTS=(h0 h1 h2)
[ $gloo -eq 1 ] && HOSTS=(h0 h1)
fails=0 passes=0
ok() {
  passes=$((passes + 1))
  echo "ok: $*"
}
bad() {
  fails=$((fails + 1))
  echo "FAIL: $*"
}

# every process left in our namespaces, then the namespaces and their files
cleanup() {
  local ns pids
  for ns in "${HOSTS[@]/#/$P}" "${P}sw"; do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  done
  for ns in "${HOSTS[@]/#/$P}" "${P}sw"; do
    ip netns del "$ns" 2>/dev/null
    rm -rf "/etc/netns/$ns"
  done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# ---- the hosts -------------------------------------------------------------------------------
ip netns add "${P}sw" 2>"$tmp/err" || skip "cannot make a network namespace ($(head -n1 "$tmp/err"))"
ip -n "${P}sw" link add br0 type bridge && ip -n "${P}sw" link set br0 up &&
  ip -n "${P}sw" link set lo up || skip "cannot make a bridge in a namespace"
for i in "${!HOSTS[@]}"; do
  ns=$P${HOSTS[$i]}
  {
    ip netns add "$ns" &&
      ip link add name eth0 netns "$ns" type veth peer name "port$i" netns "${P}sw" &&
      ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0 &&
      ip -n "$ns" link set eth0 up && ip -n "$ns" link set lo up &&
      ip -n "${P}sw" link set "port$i" master br0 && ip -n "${P}sw" link set "port$i" up
  } 2>"$tmp/err" || skip "cannot wire host ${HOSTS[$i]} ($(head -n1 "$tmp/err"))"
  # a dead peer noticed in seconds, not TCP's default quarter of an hour
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=4 2>/dev/null
  mkdir -p "/etc/netns/$ns"
  {
    echo "127.0.0.1 localhost"
    for j in "${!HOSTS[@]}"; do echo "$NET.$((j + 1)) ${HOSTS[$j]}"; done
  } >"/etc/netns/$ns/hosts"
done
printf 'h0 slots=3\nh1 slots=3\nh2 slots=2\n' >"$tmp/hostfile"
# the bridge's ports need a moment before they forward
for _ in $(seq 50); do
  ip netns exec "${P}h0" bash -c "exec 3<>/dev/tcp/$NET.${#HOSTS[@]}/9" 2>&1 | grep >/dev/null refused && break
  sleep 0.1
done

MPIRUN=(mpirun --allow-run-as-root --oversubscribe --hostfile "$tmp/hostfile" --map-by slot
  --mca plm_rsh_agent "$self --agent" --mca plm_rsh_no_tree_spawn 1
  --mca btl tcp,self --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24"
  --mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3
  -x MPU_TIMEOUT -x MPU_CHECK_CALLS)
export MPU_TIMEOUT=${MPU_TIMEOUT:-60} MPU_CHECK_CALLS=1

# mpirun on h0 (its own hostname too), killed after LIMIT seconds: run_mpi LIMIT NP ARGS...
run_mpi() {
  local limit=$1 np=$2
  shift 2
  # in the background and waited for: a signal to this script is handled at
  # once (bash runs traps only between foreground commands)
  timeout -k 5 "$(budget "$limit")" ip netns exec "${P}h0" unshare --uts \
    sh -c 'hostname h0 && exec "$@"' sh "${MPIRUN[@]}" -n "$np" "$@" &
  wait $!
}

# seconds until no process is left on any host (at most $1), or 1
wait_empty() {
  local t
  for t in $(seq $(($1 * 10))); do
    local left=0 ns
    for ns in "${HOSTS[@]/#/$P}"; do [ -n "$(ip netns pids "$ns")" ] && left=1; done
    [ $left -eq 0 ] && return 0
    sleep 0.1
  done
  return 1
}
# the step lines of two mpu demo gpt outputs (step, loss, ...) are the same
same_losses() { cmp -s <(grep -E '^ +[0-9]+ ' "$1") <(grep -E '^ +[0-9]+ ' "$2"); }

left_over() {
  local ns
  for ns in "${HOSTS[@]/#/$P}"; do
    local pids
    pids=$(ip netns pids "$ns")
    [ -n "$pids" ] && echo "${ns#$P}: $(ps -o comm= -p $(echo $pids) | sort | uniq -c | tr -s ' \n' ' ')"
  done
}

# ---- gloo: 4 processes on 2 hosts ------------------------------------------------------------
if [ $gloo -eq 1 ]; then
  echo "multihost: gloo, hosts h0 h1 on $NET.0/24, 4 ranks (2+2) with torchrun's variables"
  port=$((29500 + $$ % 2000))
  # run_gloo LIMIT OUT PROGRAM ARGS...: ranks 0-1 on h0, 2-3 on h1, each one's
  # output in OUT.<rank>; the status of the first rank that failed
  run_gloo() {
    local limit out r st s=0 pids=()
    limit=$(budget "$1") out=$2
    shift 2
    for r in 0 1 2 3; do
      RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) LOCAL_WORLD_SIZE=2 MASTER_ADDR=h0 \
        MASTER_PORT=$port timeout -k 5 "$limit" ip netns exec "$P${HOSTS[$((r / 2))]}" \
        unshare --uts sh -c 'hostname "$0" && exec "$@"' "${HOSTS[$((r / 2))]}" "$@" \
        >"$out.$r" 2>&1 &
      pids+=($!)
    done
    for r in 0 1 2 3; do
      wait "${pids[$r]}"
      st=$?
      [ $st -ne 0 ] && [ $s -eq 0 ] && s=$st
    done
    port=$((port + 1))
    return $s
  }
  t0=$SECONDS
  if run_gloo 400 "$tmp/conf" "$conformance"; then
    ok "conformance suite on gloo, 4 ranks on 2 hosts ($((SECONDS - t0)) s)"
  else
    bad "conformance suite on gloo across hosts:"
    tail -n 5 "$tmp"/conf.*
  fi
  layout=(--tp 2 --pp 2 --dp 1 --steps 4)
  t0=$SECONDS
  run_gloo 300 "$tmp/gpt" "$mpu" demo gpt --backend gloo "${layout[@]}"
  "$mpu" demo gpt "${layout[@]}" >"$tmp/gpt_threads.txt" 2>&1
  cat "$tmp"/gpt.? >"$tmp/gpt_gloo.txt"
  checks=$(grep -c 'check: .*PASS' "$tmp/gpt_threads.txt")
  if [ "$checks" -ge 1 ] && [ "$(grep -c 'check: .*PASS' "$tmp/gpt_gloo.txt")" -eq "$checks" ] &&
    ! grep -q FAIL "$tmp/gpt_gloo.txt" &&
    same_losses "$tmp/gpt_gloo.txt" "$tmp/gpt_threads.txt"; then
    ok "demo gpt --backend gloo across hosts: its checks pass, losses equal thread ranks' ($((SECONDS - t0)) s)"
  else
    bad "demo gpt --backend gloo across hosts:"
    tail -n 20 "$tmp/gpt_gloo.txt"
  fi
  wait_empty 10 || bad "processes left after the gloo runs: $(left_over)"
  echo "multihost: $passes passed, $fails failed"
  [ $fails -eq 0 ]
  exit
fi

echo "multihost: hosts h0 h1 h2 on $NET.0/24, 8 ranks (3+3+2), $(mpirun --version | head -n1)"

# ---- 1-3: the suite, the state, the demos ----------------------------------------------------
t0=$SECONDS
if run_mpi 400 8 "$conformance" >"$tmp/conf.txt" 2>&1; then
  ok "conformance suite, 8 ranks on 3 hosts ($((SECONDS - t0)) s)"
else
  bad "conformance suite across hosts:"
  tail -n 20 "$tmp/conf.txt"
fi
if run_mpi 120 8 "$state" >"$tmp/state.txt" 2>&1; then
  ok "parallel state and mesh, tp 2 x pp 2 x dp 2 across hosts"
else
  bad "state across hosts:"
  tail -n 20 "$tmp/state.txt"
fi
run_mpi 120 8 "$mpu" demo mappings --backend mpi --tp 2 --pp 2 --format json >"$tmp/map_mpi.json" 2>"$tmp/map.err"
"$mpu" demo mappings --tp 2 --pp 2 --format json >"$tmp/map_threads.json" 2>>"$tmp/map.err"
if [ -s "$tmp/map_mpi.json" ] && cmp -s "$tmp/map_mpi.json" "$tmp/map_threads.json"; then
  ok "demo mappings across hosts equals thread ranks' byte for byte"
else
  bad "demo mappings across hosts differs from thread ranks': $(head -c 300 "$tmp/map.err")"
fi
t0=$SECONDS
run_mpi 300 8 "$mpu" demo gpt --backend mpi --steps 6 >"$tmp/gpt_mpi.txt" 2>&1
"$mpu" demo gpt --steps 6 >"$tmp/gpt_threads.txt" 2>&1
if [ "$(grep -c PASS "$tmp/gpt_mpi.txt")" -eq 2 ] &&
  same_losses "$tmp/gpt_mpi.txt" "$tmp/gpt_threads.txt"; then
  ok "demo gpt --backend mpi across hosts: both checks pass, losses equal thread ranks' ($((SECONDS - t0)) s)"
else
  bad "demo gpt across hosts:"
  tail -n 20 "$tmp/gpt_mpi.txt"
fi
wait_empty 10 || bad "processes left after the healthy runs: $(left_over)"

# ---- faults ----------------------------------------------------------------------------------
# fault_run NAME LIMIT ITERATIONS COUNT [KILL_AT]: the fault program in the background;
# sets $out (its directory) and $mpipid
fault_start() {
  out=$tmp/$1
  mkdir -p "$out"
  run_mpi "$2" 8 "$faults" "$out" "${@:3}" >"$out/mpirun.txt" 2>&1 &
  mpipid=$!
}
# wait until every rank finished its first call (at most 60 s)
wait_ready() {
  local _
  for _ in $(seq 600); do
    [ "$(ls "$out" | grep -c '^ready\.')" -eq 8 ] && return 0
    kill -0 $mpipid 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
# wait at most $1 s for mpirun to end; then $rc is its exit status
wait_job() {
  local _
  rc=
  for _ in $(seq $(($(budget "$1") * 10))); do
    if ! kill -0 $mpipid 2>/dev/null; then
      wait $mpipid
      rc=$?
      return 0
    fi
    sleep 0.1
  done
  return 1
}
calc() { awk "BEGIN { print ($*) }"; }
field() { awk -v f="$2" '{print $f}' "$out/rank.$1" 2>/dev/null; }

# 4. a link set down in the middle of the calls
T=3
export MPU_TIMEOUT=$T
fault_start link_down 120 100000000 65536
if wait_ready; then
  sleep 0.5
  fault=$(date +%s.%N)
  ip -n "${P}h2" link set eth0 down
  if wait_job $((T + 60)); then
    end=$(date +%s.%N)
    [ "$rc" -ne 0 ] && ok "h2's link down: the job ended $(calc "$end - $fault") s after the fault (mpirun exit $rc)" ||
      bad "h2's link down: mpirun exited 0"
  else
    bad "h2's link down: mpirun still runs $((T + 60)) s after the fault"
  fi
  for r in 0 1 2 3 4 5 6 7; do
    res=$(field $r 3) at=$(field $r 5)
    if [ "$res" = MPU_ERR_TIMEOUT ] && [ -n "$at" ] && [ "$(calc "$at - $fault <= $T + 1")" = 1 ]; then
      ok "h2's link down: rank $r ($(field $r 2)) returned $res $(calc "$at - $fault") s after the fault"
    else
      bad "h2's link down: rank $r: ${res:-no report} at ${at:-?} (fault at $fault, timeout $T s): $(cat "$out/rank.$r" 2>/dev/null)"
    fi
  done
  wait_empty 20 && ok "h2's link down: no process left on any host" ||
    bad "h2's link down: processes left 20 s after the job: $(left_over)"
else
  bad "h2's link down: the ranks never started: $(tail -n 5 "$out/mpirun.txt")"
fi
ip -n "${P}h2" link set eth0 up
wait_empty 30 || { ip netns pids "${P}h0" "${P}h1" "${P}h2" | xargs -r kill -9; sleep 1; }

# 5. a link throttled to 10 Mbit/s, both ways
for dev in "${P}h2 eth0" "${P}sw port2"; do
  set -- $dev
  ip -n "$1" link set "$2" up
  tc -n "$1" qdisc add dev "$2" root tbf rate 10mbit burst 32kbit latency 400ms ||
    bad "tc tbf on $2 failed"
done
export MPU_TIMEOUT=60
t0=$(date +%s.%N)
fault_start throttled 300 4 262144
wait_job 300
took=$(calc "$(date +%s.%N) - $t0")
exact=0
for r in 0 1 2 3 4 5 6 7; do [ "$(field $r 3)" = MPU_SUCCESS ] && [ "$(field $r 4)" = 4 ] && exact=$((exact + 1)); done
[ $exact -eq 8 ] && [ "$rc" = 0 ] && ok "10 Mbit/s link: 4 all_reduce calls of 1 MiB exact on every rank (${took} s, MPU_TIMEOUT=60)" ||
  bad "10 Mbit/s link: $exact of 8 ranks exact: $(cat "$out"/rank.* 2>/dev/null | head -n 8)"
export MPU_TIMEOUT=0.3
fault_start throttled_short 120 4 262144
wait_job 60 || bad "10 Mbit/s link, MPU_TIMEOUT=0.3: mpirun still runs after 60 s"
timeouts=0 wrong=0
for r in 0 1 2 3 4 5 6 7; do
  case "$(field $r 3)" in MPU_ERR_TIMEOUT) timeouts=$((timeouts + 1)) ;; WRONG) wrong=$((wrong + 1)) ;; esac
done
[ $timeouts -eq 8 ] && [ $wrong -eq 0 ] && ok "10 Mbit/s link, MPU_TIMEOUT=0.3: every rank returned MPU_ERR_TIMEOUT, none a wrong result" ||
  bad "10 Mbit/s link, MPU_TIMEOUT=0.3: $timeouts timeouts, $wrong wrong of 8: $(cat "$out"/rank.* 2>/dev/null | head -n 8)"
wait_empty 20 || bad "throttled runs: processes left: $(left_over)"
for dev in "${P}h2 eth0" "${P}sw port2"; do
  set -- $dev
  tc -n "$1" qdisc del dev "$2" root 2>/dev/null
done

# 6. a rank on the far host killed in the middle of the calls
export MPU_TIMEOUT=$T
fault_start killed 120 100000000 65536 50
if wait_ready && wait_job $((T + 10 + 30)); then
  end=$(date +%s.%N) killed=$(cat "$out/killed.7" 2>/dev/null)
  [ -n "$killed" ] && [ ! -e "$out/rank.7" ] && [ "$rc" -ne 0 ] && grep -q "signal 9" "$out/mpirun.txt" &&
    [ "$(calc "$end - $killed <= $T + 10")" = 1 ] &&
    ok "rank 7 on h2 killed: mpirun saw it (signal 9), the job ended $(calc "$end - $killed") s later (exit $rc)" ||
    bad "rank 7 on h2 killed: exit $rc, rank 7's report: $(cat "$out/rank.7" 2>/dev/null); mpirun: $(tail -n 5 "$out/mpirun.txt")"
  wrong=$(cat "$out"/rank.* 2>/dev/null | awk '$3 == "WRONG" || $3 == "MPU_SUCCESS"' | wc -l)
  [ "$wrong" -eq 0 ] && ok "rank 7 killed: no surviving rank reported success or a wrong result" ||
    bad "rank 7 killed: $(cat "$out"/rank.*)"
else
  bad "rank 7 killed: mpirun still runs"
fi
wait_empty 20 && ok "rank 7 killed: no process left on any host" || bad "rank 7 killed: processes left: $(left_over)"

echo "multihost: $passes passed, $fails failed"
[ $fails -eq 0 ]
