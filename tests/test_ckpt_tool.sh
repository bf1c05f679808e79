#!/usr/bin/env bash
# What the mpu tool reads and writes by a name the user gives: `mpu ckpt
# inspect --format json` prints valid JSON whatever the checkpoint's file
# names hold (a quote, a backslash, a byte that is not UTF-8); `mpu ckpt
# merge` refuses to write over the checkpoint's own index or files, over a
# FIFO or a directory, and writes a regular file through OUT.tmp; an index
# that is a FIFO is refused at once; `mpu bench --csv` refuses a FIFO before
# the work and writes a regular file. The checkpoint is written here by hand
# (python3: an index and two piece files with their CRC-32s).
# Usage: test_ckpt_tool.sh MPU
set -uo pipefail
mpu=$1
command -v python3 >/dev/null || { echo "python3 not found: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0 passes=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

ck=$tmp/ck
python3 - "$ck" <<'EOF'
import json, os, struct, sys, zlib
ck = sys.argv[1].encode()
os.makedirs(ck)
names = [b'q"u\\ote.bin', "\u00e9.bin".encode()]  # a quote and a backslash; UTF-8
files, pieces = [], []
for k, name in enumerate(names):
    data = struct.pack("<8f", *range(8 * k, 8 * k + 8))
    with open(os.path.join(ck, name), "wb") as f:
        f.write(b"\0" * 8 + data)
    esc = json.dumps(name.decode(), ensure_ascii=False)[1:-1].encode()
    files.append(b'{"name": "%s", "bytes": %d}' % (esc, 8 + len(data)))
    pieces.append(b'{"file": "%s", "offsets": [%d, 0], "lengths": [2, 4], "flat": [0, 8], '
                  b'"bytes": [8, %d], "crc32": "%08x"}' % (esc, 2 * k, 8 + len(data), zlib.crc32(data)))
index = (b'{"format": "mpu-checkpoint", "version": 1, "step": 3, "layout": {"world": 2, "tp": 1, '
         b'"pp": 1, "vp": 0, "dp": 2, "cp": 1, "ep": 1, "zero1": false, "flavor": "core"}, '
         b'"optimizer": null, "metadata": {}, "rng": [], "files": [' + b", ".join(files) +
         b'], "tensors": {"x": {"kind": "param", "dtype": "F32", "shape": [4, 4], "pieces": [' +
         b", ".join(pieces) + b"]}}}\n")
with open(os.path.join(ck, b"index.json"), "wb") as f:
    f.write(index)
EOF

"$mpu" ckpt inspect "$ck" >/dev/null 2>"$tmp/err" && ok || bad "inspect: $(cat "$tmp/err")"
"$mpu" ckpt inspect "$ck" --format json >"$tmp/json" 2>"$tmp/err" || bad "inspect --format json: $(cat "$tmp/err")"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
assert sorted(f["name"] for f in d["files"]) == ["q\"u\\ote.bin", "\u00e9.bin"], d["files"]
assert d["step"] == 3 and d["tensors"][0]["name"] == "x"
' "$tmp/json" && ok || bad "inspect --format json is not JSON with the names escaped: $(cat "$tmp/json")"

# a directory whose name is not UTF-8: U+FFFD in the JSON, which stays UTF-8
cp -r "$ck" "$tmp/ck"$'\xff'
"$mpu" ckpt inspect "$tmp/ck"$'\xff' --format json >"$tmp/json" 2>"$tmp/err" || bad "inspect: $(cat "$tmp/err")"
python3 -c '
import json, sys
assert json.load(open(sys.argv[1], encoding="utf-8"))["dir"].endswith("ck\ufffd")
' "$tmp/json" && ok || bad "inspect --format json of a directory that is not UTF-8: $(cat "$tmp/json")"

# merge: never over the checkpoint's own files, a FIFO or a directory
cp "$ck/index.json" "$tmp/index.before"
for out in "$ck/index.json" "$ck/q\"u\\ote.bin" "$tmp"; do
  "$mpu" ckpt merge "$ck" "$out" >/dev/null 2>"$tmp/err"
  [ $? -eq 1 ] && ok || bad "merge onto $out was not refused"
done
grep -q "reads" <(
  "$mpu" ckpt merge "$ck" "$ck/index.json" 2>&1) && ok || bad "merge onto the index: no reason given"
cmp -s "$ck/index.json" "$tmp/index.before" && "$mpu" ckpt inspect "$ck" >/dev/null 2>&1 && ok ||
  bad "merge destroyed the checkpoint"
mkfifo "$tmp/fifo"
timeout 20 "$mpu" ckpt merge "$ck" "$tmp/fifo" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && [ -p "$tmp/fifo" ] && grep -q "FIFO" "$tmp/err" && ok ||
  bad "merge onto a FIFO: $(cat "$tmp/err")"
"$mpu" ckpt merge "$ck" "$tmp/out.safetensors" >/dev/null 2>"$tmp/err" &&
  "$mpu" ckpt merge "$ck" "$tmp/out.safetensors" >/dev/null 2>>"$tmp/err" && [ -f "$tmp/out.safetensors" ] &&
  [ ! -e "$tmp/out.safetensors.tmp" ] && ok || bad "merge to a new file and over it: $(cat "$tmp/err")"

# an index that is a FIFO: refused, not waited on
mkdir "$tmp/ck2"
cp "$ck"/*.bin "$tmp/ck2/"
mkfifo "$tmp/ck2/index.json"
timeout 20 "$mpu" ckpt inspect "$tmp/ck2" >/dev/null 2>"$tmp/err"
[ $? -eq 1 ] && grep -q "FIFO" "$tmp/err" && ok || bad "inspect of a FIFO index: $(cat "$tmp/err")"

# bench --csv: a FIFO refused before the work (opening it waited for a reader), a file written
timeout 20 "$mpu" bench -t 2 -e 64 -n 2 --csv "$tmp/fifo" >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "FIFO" "$tmp/err" && ok || bad "bench --csv FIFO: $(cat "$tmp/err")"
"$mpu" bench -t 2 -e 64 -n 2 --csv "$tmp/b.csv" >/dev/null 2>"$tmp/err" && [ -f "$tmp/b.csv" ] &&
  head -1 "$tmp/b.csv" | grep >/dev/null '^collective,' && [ ! -e "$tmp/b.csv.tmp" ] && ok ||
  bad "bench --csv: $(cat "$tmp/err")"

echo "$passes passed, $fails failed"
[ $fails -eq 0 ]
