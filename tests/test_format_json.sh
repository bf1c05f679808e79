#!/usr/bin/env bash
# --format json wherever a help text offers --format: every command, demo and
# mode below gives one JSON document that parses, and a command or demo whose
# --help offers --format must have a case here.
# Usage: test_format_json.sh PATH_TO_MPU
set -uo pipefail
mpu=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

json_cases=(
  "plan --world-size 8 --tp 2"
  "plan --compare --world-size 8 --tp 2"
  "plan --schedule 1f1b --pp 2 --micro-batches 4"
  "plan --bench"
  "mesh --shape 2,4"
  "mesh --bench --iters 100"
  "bench -t 2 -b 8 -e 64 -n 2"
  "bench --block --hidden 64 --tokens 64 --iters 1"
  "demo gpt --steps 2"
  "demo gpt --bench"
  "demo hsdp"
  "demo mappings"
  "demo train --steps 2"
  "ckpt inspect $tmp/jsonck"
)
"$mpu" demo gpt --steps 2 --save "$tmp/jsonck" >/dev/null 2>&1 || bad "demo gpt --save for ckpt inspect"
for c in $("$mpu" --help | awk '/^commands:/ {on = 1; next} on && NF == 0 {exit} on {print $1}') \
  $("$mpu" demo --help | awk '/^demos:/ {on = 1; next} on && NF == 0 {exit} on {print "demo/" $1}'); do
  help=$("$mpu" ${c/\// } --help)
  grep -q -- "--format" <<<"$help" || continue
  printf '%s\n' "${json_cases[@]}" | grep >/dev/null "^${c/\// }\( \|$\)" && ok || bad "mpu ${c/\// } --help offers --format; no json case tests it"
done
for args in "${json_cases[@]}"; do
  timeout 300 "$mpu" $args --format json >"$tmp/j.json" 2>"$tmp/j.err" &&
    python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$tmp/j.json" && ok ||
    bad "mpu $args --format json: $(head -c 300 "$tmp/j.err") $(head -c 200 "$tmp/j.json")"
done

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
