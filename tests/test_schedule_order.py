#!/usr/bin/env python3
"""mpu plan --schedule against Megatron's schedule loops, ported literally.

The model below is core_v0.19.0's schedules.py reduced to the order of its
forward_step / backward_step calls: forward_backward_no_pipelining,
forward_backward_pipelining_without_interleaving (warm-up, steady 1F1B,
cool-down) and forward_backward_pipelining_with_interleaving (get_schedule_table,
get_pp_rank_microbatches, get_model_chunk_id, and the FIFO of each chunk's
saved inputs that decides which micro-batch a backward runs). For a table of
(pp, vp, micro-batches, group size) every stage's order must be equal.

usage: test_schedule_order.py path/to/mpu
"""
import json
import subprocess
import sys


def schedule_table(m, vp, n):
    table = []
    for lo in range(0, m, n):
        hi = m if lo + n >= m else lo + n
        table += [(mb, c) for c in range(vp) for mb in range(lo, hi)]
    return table


def order(kind, pp, vp, m, n, rank, forward_only=False):
    out = []
    if kind == "no-pipelining":
        for i in range(m):
            out.append(("F", i, 0))
            if not forward_only:
                out.append(("B", i, 0))
        return out
    if kind == "1f1b":
        warmup = min(pp - rank - 1, m)
        if forward_only:
            warmup = m
        remaining = m - warmup
        for i in range(warmup):
            out.append(("F", i, 0))
        for i in range(remaining):
            out.append(("F", i + warmup, 0))
            if not forward_only:
                out.append(("B", i, 0))
        if not forward_only:
            for i in range(warmup):
                out.append(("B", remaining + i, 0))
        return out
    table = schedule_table(m, vp, n)
    total = m * vp
    if forward_only:
        warmup = total
    else:
        warmup = (pp - rank - 1) * 2 + (vp - 1) * n
    warmup = min(warmup, total)
    remaining = total - warmup
    saved = [[] for _ in range(vp)]  # each chunk's inputs, popped FIFO by the backward

    def fwd(k):
        mb, c = table[k]
        saved[c].append(mb)
        out.append(("F", mb, c))

    def bwd(k):
        c = vp - 1 - table[k % total][1]
        out.append(("B", saved[c].pop(0), c))

    for k in range(warmup):
        fwd(k)
    for k in range(remaining):
        fwd(k + warmup)
        if not forward_only:
            bwd(k)
    if not forward_only:
        for k in range(remaining, total):
            bwd(k)
    return out


def main():
    mpu = sys.argv[1]
    cases = [("no-pipelining", 1, 1, m, 0) for m in (1, 3, 8)]
    cases += [("1f1b", pp, 1, m, 0) for pp in (2, 3, 4) for m in (1, 2, 3, 4, 7, 8, 16)]
    for pp in (2, 3, 4):
        for vp in (2, 3):
            for m in (pp, 2 * pp, 3 * pp + 1, 4 * pp, 10):
                for n in sorted({pp, pp + 1, m}):
                    if n > m or (m % n and m % n < pp):
                        continue
                    cases.append(("interleaved", pp, vp, m, n))
    checked = 0
    for kind, pp, vp, m, n in cases:
        for forward_only in (False, True):
            args = [mpu, "plan", "--schedule", kind, "--pp", str(pp), "--micro-batches", str(m),
                    "--format", "json"]
            if vp > 1:
                args += ["--vp", str(vp)]
            if n:
                args += ["--group-size", str(n)]
            if forward_only:
                args.append("--forward-only")
            p = subprocess.run(args, capture_output=True, text=True)
            if p.returncode:
                sys.exit(f"FAIL {' '.join(args)}: {p.stderr.strip()}")
            got = json.loads(p.stdout)
            for stage in got["stages"]:
                want = order(kind, pp, vp, m, n or pp, stage["stage"], forward_only)
                mine = [(s[0], s[1], s[2]) for s in stage["steps"]]
                if mine != want:
                    sys.exit(f"FAIL {' '.join(args)} stage {stage['stage']}:\n want {want}\n got  {mine}")
                checked += 1
            if not forward_only and m % pp == 0:
                if abs(got["bubble"] - got["analytic_bubble"]) > 1e-9:
                    sys.exit(f"FAIL {' '.join(args)}: bubble {got['bubble']} vs analytic "
                             f"{got['analytic_bubble']}")
    # Megatron's refusals for the interleaved schedule
    for pp, vp, m, n in ((2, 2, 4, 1), (2, 2, 4, 5), (4, 2, 9, 4), (1, 2, 4, 0)):
        args = [mpu, "plan", "--schedule", "interleaved", "--pp", str(pp), "--vp", str(vp),
                "--micro-batches", str(m)] + (["--group-size", str(n)] if n else [])
        p = subprocess.run(args, capture_output=True, text=True)
        if p.returncode != 2 or p.stderr.count("\n") != 1:
            sys.exit(f"FAIL {' '.join(args)}: want exit 2 and one line, got {p.returncode}: {p.stderr}")
    print(f"schedules: {checked} stage orders equal to Megatron's loops, {len(cases)} configs")


if __name__ == "__main__":
    main()
