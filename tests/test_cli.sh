#!/usr/bin/env bash
# The mpu tool's contract: --help everywhere, exit 2 with one line on stderr
# (and nothing on stdout) for bad arguments, data formats that parse.
# Usage: test_cli.sh PATH_TO_MPU
set -uo pipefail
mpu=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

expect_usage_error() { # args...
  "$mpu" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [ $rc -eq 2 ] || { bad "mpu $* exited $rc, want 2"; return; }
  [ ! -s "$tmp/out" ] || { bad "mpu $* printed on stdout"; return; }
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || { bad "mpu $* printed $(wc -l <"$tmp/err") lines on stderr"; return; }
  ok
}

"$mpu" --help | grep -q "bench" && ok || bad "mpu --help lists no bench"
"$mpu" bench --help | grep -q -- "--maxbytes" && ok || bad "mpu bench --help"
expect_usage_error
expect_usage_error frobnicate
expect_usage_error bench --bogus
expect_usage_error bench -n 0
expect_usage_error bench -n 2,x
expect_usage_error bench --workers 0
expect_usage_error bench -b 1Q
expect_usage_error bench -b 64M -e 8
expect_usage_error bench -c all_sum
expect_usage_error bench -d float8
expect_usage_error bench --format xml
expect_usage_error bench --backend nccl
expect_usage_error bench -i
expect_usage_error bench stray

"$mpu" bench -n 3 -c all -b 8 -e 64K -f 8 -i 3 --csv "$tmp/b.csv" >"$tmp/text" || bad "bench run failed"
grep -q "reference: memcpy" "$tmp/text" && ok || bad "text output has no memcpy reference"
[ "$(grep -c '^  all_to_all' "$tmp/text")" -eq 5 ] && ok || bad "want 5 all_to_all rows (8 B..32 KiB by 8)"
[ "$(head -1 "$tmp/b.csv")" = "collective,backend,ranks,dtype,bytes,time_us,algbw_gbps,busbw_gbps" ] && ok || bad "csv header"
grep -q '^memcpy,threads,1,float32,' "$tmp/b.csv" && ok || bad "csv memcpy row"
[ "$(grep -c '^all_reduce,threads,3,float32,' "$tmp/b.csv")" -eq 5 ] && ok || bad "csv all_reduce rows"

"$mpu" bench -n 2 -b 1K -e 4K -i 3 -d bf16 --format json >"$tmp/json" || bad "json run failed"
if command -v python3 >/dev/null; then
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["dtype"] == "bfloat16" and d["ranks"] == [2], d
assert [r["bytes"] for r in d["rows"]] == [1024, 2048, 4096], d["rows"]
assert all(r["busbw_gbps"] > 0 for r in d["rows"])
' "$tmp/json" && ok || bad "json output"
else
  grep -q '"rows"' "$tmp/json" && ok || bad "json output"
fi
echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
