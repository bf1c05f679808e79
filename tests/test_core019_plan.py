#!/usr/bin/env python3
"""mpu plan --flavor core-0.19 against a brute-force model of core_v0.19.0.

For every config of a sweep (a fixed list of corner cases and a seeded
random sample of W = 1..64 with every argument: tp, pp, vp, cp, hcp, ep, etp,
order, distributed-optimizer instances, gloo, rank offset, local world size),
both refuse it or neither does; when neither does, every kind's groups and
every rank's getters (--per-rank JSON) must be equal, nulls included.
The model (tests/core019_reference.py) enumerates groups the way the original
does; mpu computes them as mesh slices, so they share no arithmetic.

usage: test_core019_plan.py path/to/mpu [count]
"""
import itertools
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import core019_reference as ref  # noqa: E402

ORDERS = ["tp-cp-ep-dp-pp", "tp-dp-pp", "tp-pp-dp", "tp-cp-dp-pp", "tp-ep-dp-pp", "tp-dp-ep-pp",
          "tp-cp-ep-pp-dp", "pp-tp-dp", "tp-ep-pp-dp", "cp-tp-dp-pp", "dp-tp-pp", "tp-pp-dp-ep",
          "tp-dp-cp-pp", "ep-tp-dp-pp", "TP-CP-EP-DP-PP", "dp-pp", "tp-xx-pp", "tp-dp-pp-cp"]


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def hcp_splits(cp):
    out = [None]
    for a in divisors(cp):
        if 1 < a < cp:
            out.append([a, cp // a])
    if cp > 1:
        out.append([cp])
        out.append([cp, 1])
    return out


def sample(rng, count):
    fixed = [
        dict(world_size=8, tp=2, pp=2),
        dict(world_size=16, tp=2, pp=2, cp=2, ep=2, etp=1),
        dict(world_size=16, tp=2, pp=2, cp=2, ep=4, etp=1, dist_opt=2),
        dict(world_size=32, tp=2, pp=2, cp=4, hcp=[2, 2], ep=2, dist_opt=2, vp=2),
        dict(world_size=16, tp=1, pp=2, order="tp-pp-dp", ep=2),
        dict(world_size=16, tp=2, pp=2, order="tp-pp-dp", ep=2),
        dict(world_size=24, tp=2, pp=3, local_world_size=12, rank_offset=12),
        dict(world_size=24, tp=2, pp=3, local_world_size=12, rank_offset=13),
        dict(world_size=24, tp=2, pp=3, local_world_size=12, rank_offset=-5),
        dict(world_size=8, tp=2, pp=1, vp=2),
        dict(world_size=8, tp=2, cp=2, hcp=[3]),
        dict(world_size=8, tp=2, order="dp-pp"),
        dict(world_size=8, tp=1, order="dp-pp"),
        dict(world_size=8, ep=2, order="tp-dp-pp"),
        dict(world_size=8, tp=2, order="tp-xx-pp"),
        dict(world_size=12, tp=2, ep=4, etp=1),
        dict(world_size=8, tp=2, dist_opt=3),
        dict(world_size=16, tp=2, ep=2, etp=4, dist_opt=2),
        dict(world_size=16, pp=2, ep=2, order="TP-CP-EP-DP-PP"),
        dict(world_size=1),
        dict(world_size=64, tp=2, pp=4, cp=2, ep=4, etp=2, vp=3, dist_opt=2, gloo=False),
    ]
    for cfg in fixed:
        yield cfg
    for _ in range(count):
        W = rng.randint(1, 64)
        cfg = dict(world_size=W)
        local = W
        if rng.random() < 0.15:
            local = rng.choice(divisors(W) + [W // 2 or 1])
            cfg["local_world_size"] = local
            cfg["rank_offset"] = rng.choice([0, W - local, max(W - local - 1, 0), W - local + 1])
        cfg["tp"] = rng.choice(divisors(local) if rng.random() < 0.9 else [3])
        cfg["pp"] = rng.choice(divisors(local // cfg["tp"]) if local % cfg["tp"] == 0 else [1, 2])
        rest = local // (cfg["tp"] * cfg["pp"]) if local % (cfg["tp"] * cfg["pp"]) == 0 else 1
        cfg["cp"] = rng.choice(divisors(rest)) if rng.random() < 0.5 else 1
        if cfg["cp"] > 1 and rng.random() < 0.5:
            cfg["hcp"] = rng.choice(hcp_splits(cfg["cp"]))
        if rng.random() < 0.6:
            cfg["ep"] = rng.choice(divisors(local))
        if rng.random() < 0.5:
            cfg["etp"] = rng.choice(divisors(local))
        if cfg["pp"] > 1 and rng.random() < 0.3:
            cfg["vp"] = rng.randint(1, 3)
        if rng.random() < 0.4:
            cfg["order"] = rng.choice(ORDERS)
        if rng.random() < 0.35:
            cfg["dist_opt"] = rng.choice([1, 2, 3, 4])
        if rng.random() < 0.2:
            cfg["gloo"] = False
        yield {k: v for k, v in cfg.items() if v is not None}


def mpu_args(cfg):
    a = ["plan", "--flavor", "core-0.19", "--world-size", str(cfg["world_size"])]
    names = {"tp": "--tp", "pp": "--pp", "vp": "--vp", "cp": "--cp", "ep": "--ep", "etp": "--etp",
             "order": "--order", "dist_opt": "--dist-opt-instances",
             "rank_offset": "--rank-offset", "local_world_size": "--local-world-size"}
    for k, flag in names.items():
        if k in cfg:
            a += [flag, str(cfg[k])]
    if "hcp" in cfg:
        a += ["--hcp", ",".join(map(str, cfg["hcp"]))]
    if cfg.get("gloo") is False:
        a.append("--no-gloo")
    return a + ["--format", "json", "--per-rank"]


def main():
    mpu = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1500
    rng = random.Random(20261123)
    checked = refused = 0
    for cfg in sample(rng, count):
        args = mpu_args(cfg)
        try:
            made, sizes = ref.initialize(**cfg)
            want_refusal = None
        except ref.Refused as e:
            want_refusal = e
        p = subprocess.run([mpu] + args, capture_output=True, text=True)
        cmd = "mpu " + " ".join(args)
        if want_refusal is not None:
            if p.returncode != 2 or p.stderr.count("\n") != 1:
                sys.exit(f"FAIL {cmd}: the original raises {want_refusal}, mpu exits "
                         f"{p.returncode}: {p.stderr.strip()}")
            if want_refusal.kind not in p.stderr:
                sys.exit(f"FAIL {cmd}: the original raises {want_refusal.kind}, mpu says "
                         f"{p.stderr.strip()}")
            refused += 1
            continue
        if p.returncode != 0:
            sys.exit(f"FAIL {cmd}: the original accepts it, mpu exits {p.returncode}: "
                     f"{p.stderr.strip()}")
        got = json.loads(p.stdout)
        want_groups = ref.groups_by_kind(made)
        got_groups = {k: set(map(tuple, v)) for k, v in got["groups"].items()}
        if want_groups != got_groups:
            for k in sorted(set(want_groups) | set(got_groups)):
                if want_groups.get(k) != got_groups.get(k):
                    sys.exit(f"FAIL {cmd}: kind {k}: want {sorted(want_groups.get(k, []))}, "
                             f"got {sorted(got_groups.get(k, []))}")
        want_ranks = ref.per_rank(cfg["world_size"], made, cfg.get("vp"))
        for w, g in zip(want_ranks, got["per_rank"]):
            if w != g:
                diff = {k: (w.get(k), g.get(k)) for k in set(w) | set(g) if w.get(k) != g.get(k)}
                sys.exit(f"FAIL {cmd}: rank {w['rank']}: (want, got) {diff}")
        if len(want_ranks) != len(got["per_rank"]):
            sys.exit(f"FAIL {cmd}: {len(got['per_rank'])} ranks, want {len(want_ranks)}")
        checked += 1
    print(f"core-0.19: {checked} layouts equal to the model, group by group and rank by rank; "
          f"{refused} refused by both")


if __name__ == "__main__":
    main()
