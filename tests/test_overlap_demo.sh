#!/usr/bin/env bash
# `mpu demo gpt --overlap-grad-reduce` (Megatron's overlap_grad_reduce for the
# plain data-parallel optimizer, thread ranks):
#  - the losses and the final parameters' difference are equal to the same
#    run without the flag (every digit the JSON prints), for tp 1 x pp 1 x dp 2 and
#    tp 2 x pp 2 (vp 2) x dp 2 without sequence parallelism;
#  - the report line is well-formed: the blocking time is > 0, the overlapped
#    and the blocking steps are half of --steps each (interleaved), the reduces started are exactly one per block plus
#    one for the head's and one for the embedding's, per rank and step;
#  - something was hidden behind compute: every rank starts all of its
#    reduces before it waits, and a rank that tests a call whose members all
#    started it returns with it complete (it runs the tasks left and waits for
#    those under way on its peers), so in each dp group the rank that
#    reaches the wait last finds its reduces complete. So at least
#    (dp groups) x (reduces per rank) per step are complete before the wait,
#    whatever the load. The time share (1 - exposed / blocking) is only
#    checked to be a number <= 100%: on a loaded 2-core machine a descheduled
#    rank can make the exposed time exceed the blocking steps' time, which
#    says nothing about correctness;
#  - the second line gives both kinds of step's wall time, each > 0;
#  - refusals (exit 2): ZeRO-1, --fsdp, dp 1, the MPI backend, tp > 1 with
#    sequence parallelism, --bench.
#    (MPI refused by the flag, or before it where the MPI backend was not built)
# Usage: test_overlap_demo.sh [--quick] MPU   (--quick: the sanitizer builds, the first layout)
set -uo pipefail
quick=0
if [ "$1" = "--quick" ]; then quick=1; shift; fi
mpu=$1
fails=0
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
steps=4

# the JSON's losses and parameter difference, every digit
numbers() {
  python3 -c 'import json,sys; d=json.load(sys.stdin); print(repr([s["loss"] for s in d["steps"]]), repr(d["param_max_difference"]))'
}

layouts=("--tp 1 --pp 1 --dp 2" "--tp 2 --pp 2 --vp 2 --dp 2 --no-sp --layers 4")
per_rank=("6" "")   # reduces per rank and step: 4 blocks + head + embedding
[ $quick = 1 ] && layouts=("${layouts[0]}")
for i in "${!layouts[@]}"; do
  args="${layouts[$i]} --no-zero --steps $steps"
  # shellcheck disable=SC2086
  plain=$("$mpu" demo gpt $args --format json) || bad "$args: the run without overlap failed"
  # shellcheck disable=SC2086
  over=$("$mpu" demo gpt $args --overlap-grad-reduce --format json) || bad "$args --overlap-grad-reduce failed"
  a=$(numbers <<<"$plain") b=$(numbers <<<"$over")
  if [ -z "$a" ] || [ "$a" != "$b" ]; then
    bad "$args: losses/parameters with overlap differ: '$a' vs '$b'"
  fi
  # shellcheck disable=SC2086
  text=$("$mpu" demo gpt $args --overlap-grad-reduce) || bad "$args --overlap-grad-reduce (text) failed"
  line=$(grep '^overlap: dp ' <<<"$text")
  steps_re='^overlap: a step took ([0-9.]+) ms overlapped, ([0-9.]+) ms blocking \(wall clock, means over ranks and steps\)$'
  if ! [[ $(grep '^overlap: a step' <<<"$text") =~ $steps_re ]] ||
    ! python3 -c "import sys; sys.exit(0 if float('${BASH_REMATCH[1]}') > 0 and float('${BASH_REMATCH[2]}') > 0 else 1)"; then
    bad "$args: no well-formed step-time line in: $text"
  fi
  re='^overlap: dp gradient reduce ([0-9.]+) ms per step blocking \(mean of ([0-9]+) steps\), ([0-9.]+) ms exposed \(mean of ([0-9]+) overlapped steps, interleaved\), hidden behind compute (-?[0-9.]+)%; ([0-9]+) of ([0-9]+) reduces complete before the wait$'
  if ! [[ $line =~ $re ]]; then
    bad "$args: no well-formed overlap line in: $text"
    continue
  fi
  blocking=${BASH_REMATCH[1]} nb=${BASH_REMATCH[2]} n=${BASH_REMATCH[4]} hidden=${BASH_REMATCH[5]}
  complete=${BASH_REMATCH[6]} reduces=${BASH_REMATCH[7]}
  python3 -c "import sys; sys.exit(0 if float('$blocking') > 0 else 1)" || bad "$args: blocking time $blocking"
  python3 -c "import sys; sys.exit(0 if float('$hidden') <= 100 else 1)" || bad "$args: hidden $hidden%"
  # every second step overlapped (the first, third, ...), the others blocking
  [ "$n" = $((steps / 2)) ] && [ "$nb" = $((steps / 2)) ] || bad "$args: $n overlapped and $nb blocking steps, want $((steps / 2)) each"
  if [ -n "${per_rank[$i]}" ]; then # 2 ranks, one dp group
    want=$((2 * per_rank[i] * n)) least=$((per_rank[i] * n))
    [ "$reduces" = $want ] || bad "$args: $reduces reduces, want $want"
    [ "$complete" -ge $least ] || bad "$args: $complete reduces complete before the wait, want >= $least"
  fi
  [ "$complete" -gt 0 ] && [ "$complete" -le "$reduces" ] || bad "$args: $complete of $reduces complete"
  echo "ok: $args: $line"
done

refuse() { # the arguments, and a word the message must hold
  local words=$1
  shift
  out=$("$mpu" demo gpt "$@" 2>&1)
  rc=$?
  [ $rc = 2 ] || bad "$* exits $rc, want 2"
  grep -q -- "$words" <<<"$out" || bad "$*: message '$out' lacks '$words'"
}
refuse "--no-zero" --dp 2 --overlap-grad-reduce
refuse "--no-zero" --dp 2 --fsdp --overlap-grad-reduce
refuse "dp 2 or more" --dp 1 --no-zero --overlap-grad-reduce
refuse "backend threads\|not available" --dp 2 --no-zero --backend mpi --overlap-grad-reduce
refuse "--no-sp" --tp 2 --pp 1 --dp 2 --no-zero --overlap-grad-reduce
refuse "--bench" --bench --overlap-grad-reduce

[ $fails = 0 ] && echo "test_overlap_demo: PASS" || echo "test_overlap_demo: $fails FAIL"
[ $fails = 0 ]
