#!/usr/bin/env python3
"""`mpu bench --columns nccl-tests` prints nccl-tests' table exactly: its header
lines (src/util.cu's printf formats), 13 whitespace-separated fields per row in
its order (size, count, type, redop, root, then time, algbw, busbw, #wrong out
of place and in place), its type names, and the summary lines scripts read
with awk '{print $NF}'; -d all and -o all run nccl-tests' types and ops in its
order; the default table keeps mpu's extra columns; nccl-tests' times no roof,
so its CSV leaves roofline_us empty.
Usage: test_bench_columns.py MPU
"""
import csv
import os
import subprocess
import sys
import tempfile

NCCL_TYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16"]
SIZE = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2, "float": 4,
        "double": 8, "bfloat16": 2}
# nccl-tests' header (src/util.cu, without per-iteration timing or timestamps)
HEADER = [
    "#",
    "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          " % ("", "", "", "", ""),
    "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
    % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
       "#wrong", 0, ""),
    "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
    % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", 0, ""),
]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def run(mpu, *args):
    done = subprocess.run([mpu, "bench"] + list(args), capture_output=True, text=True)
    check(done.returncode == 0, "mpu bench %s exited %d: %s" % (" ".join(args), done.returncode, done.stderr))
    return done.stdout.splitlines()


def rows(lines):
    return [line for line in lines if line and not line.startswith("#")]


def main():
    mpu = sys.argv[1]
    out = run(mpu, "-t", "3", "-b", "8", "-e", "256", "-n", "2", "-w", "0", "-d", "all", "-o", "all",
              "--collective", "all_reduce,all_gather,broadcast", "--columns", "nccl-tests")
    for h in range(len(out)):
        if out[h].startswith("#   ") or out[h].startswith("#       size"):
            break
    check(out[h - 1:h + 3] == HEADER, "the header is not nccl-tests': %r" % out[h - 1:h + 3])
    data = rows(out)
    check(len(data) == 6 * 10 * (5 + 1 + 1), "want 6 sizes x 10 types x (5 ops + gather + broadcast) rows, got %d" % len(data))
    types, ops = [], []
    for line in data:
        f = line.split()
        check(len(f) == 13, "a row of %d fields, nccl-tests has 13: %r" % (len(f), line))
        if len(f) != 13:
            continue
        size, count, typ, redop, root = int(f[0]), int(f[1]), f[2], f[3], int(f[4])
        check(typ in NCCL_TYPES, "type %r is not one of nccl-tests' names" % typ)
        check(typ not in SIZE or size % SIZE[typ] == 0, "size %d is not whole %s elements" % (size, typ))
        check(redop in ("sum", "prod", "max", "min", "avg", "none"), "redop %r" % redop)
        check(root in (0, -1), "root %d" % root)
        for base in (5, 9):  # out of place, in place: time, algbw, busbw, #wrong
            t, a, b = float(f[base]), float(f[base + 1]), float(f[base + 2])
            check(t > 0 and a >= 0 and b >= 0 and int(f[base + 3]) == 0, "bad values: %r" % line)
        # nccl-tests' widths: %12li  %12li  %8s  %6s  %6s (52) then 2 x "  %7s  %6s  %6s  %6g" (33)
        check(len(line) == 118 and line[12:14] == "  " and line[26:28] == "  ", "not nccl-tests' widths: %r" % line)
        if not types or types[-1] != typ:
            types.append(typ)
        if redop != "none" and (not ops or ops[-1] != redop):
            ops.append(redop)
    order = [t for t in NCCL_TYPES if t in SIZE]
    check(types[:len(order)] == order, "-d all runs %s, nccl-tests' order is %s" % (types[:len(order)], order))
    check(ops[:5] == ["sum", "prod", "max", "min", "avg"], "-o all runs %s" % ops[:5])
    summary = [line for line in out if line.startswith("# Out of bounds") or line.startswith("# Avg bus")]
    check(len(summary) == 2 and summary[0] == "# %-20s : %d %s" % ("Out of bounds values", 0, "OK"),
          "the summary lines: %r" % summary)
    if len(summary) == 2:
        check(float(summary[1].split()[-1]) > 0, "awk '{print $NF}' of the Avg bus bandwidth line")
    # the default keeps mpu's columns (median, roof) and says float too
    default = run(mpu, "-t", "2", "-e", "64", "-n", "2")
    check(any("median" in line and "roof" in line for line in default), "the default table lost mpu's columns")
    check(all(line.split()[2] == "float" for line in rows(default)), "the default table's type is not 'float'")
    # nccl-tests' table times no roof: the CSV leaves roofline_us empty (a 0
    # would read as a roof of 0 us), where mpu's table gives one
    with tempfile.TemporaryDirectory() as tmp:
        for columns, want_roof in (("nccl-tests", False), ("mpu", True)):
            path = os.path.join(tmp, columns + ".csv")
            run(mpu, "-t", "2", "-e", "64", "-n", "2", "--columns", columns, "--csv", path)
            with open(path) as f:
                table = list(csv.DictReader(f))
            check(len(table) > 0 and all((r["roofline_us"] != "") == want_roof for r in table),
                  "--columns %s --csv: roofline_us %r" % (columns, [r["roofline_us"] for r in table]))
    for f in failures[:20]:
        print("FAIL " + f)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
