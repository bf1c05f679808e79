#!/usr/bin/env python3
"""mpu's DTensor pieces against torch's own: for placement pairs on meshes
(4), (2, 2), (2, 4) and (2, 2, 2) with uneven shapes (5, 3), (7, 9), (1, 4)
and (2, 7, 3), torch's redistribute_local_tensor (the path DTensor's
redistribute, full_tensor and from_local's checks take) runs in
LocalTensorMode (torch's single-process simulation of every rank, as its own
DTensor tests use) on the same per-rank source pieces that dtensor_peer fills
through mpu_redistribute; every rank's source and destination shape and
offset (torch's compute_local_shape_and_global_offset) and every bit of its
destination piece must agree. Shard dims are given negative to mpu in some
cases (torch normalizes them as DTensor's API does). Pairs torch refuses
(Shard -> Partial other than sum, a Partial to another reduction; mixed
reductions in one spec, which mpu refuses too) and integer Replicate ->
Partial(sum) (torch's division makes a float tensor) are counted, not
compared.

A sample of the pairs runs by default (LocalTensorMode costs ~0.03 s of CPU
a pair); MPU_DTENSOR_TORCH_SCALE=N runs N times as many (other pairs too).
Exits 77 (skipped) when this Python cannot import torch.

--write-table FILE writes torch's answers as the C tables of
test_dtensor_torch.c (tests/dtensor_torch_table.h), which checks mpu against
them where no torch is installed: every rank's shape and offset for every
spec of Replicate and Shard placements of the configurations below, and a
hash of the ranks' lines for every pair torch carries out (on (2, 2, 2), 300
sampled pairs per shape).

usage: test_dtensor_torch.py DTENSOR_PEER [--write-table FILE]
"""
import itertools
import logging
import os
import subprocess
import sys

try:
    import torch
    import torch.distributed as dist
    from torch.distributed._local_tensor import (LocalTensor, LocalTensorMode,
                                                 maybe_disable_local_tensor_mode)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._redistribute import redistribute_local_tensor
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
except ImportError as e:
    print("SKIP: this Python cannot import torch's DTensor (%s); scripts/pyenv.sh installs it "
          "where it can" % e)
    sys.exit(77)

logging.disable(logging.WARNING)  # torch's notes on flattening the mesh

PLACES = {"R": Replicate(), "Psum": Partial("sum"), "Pavg": Partial("avg"),
          "Pmax": Partial("max"), "Pmin": Partial("min")}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "int32": torch.int32}
BITS = {torch.float32: (torch.int32, 8), torch.float64: (torch.int64, 16),
        torch.bfloat16: (torch.int16, 4)}
CONFIGS = [  # mesh, shape, placements per mesh dim, pairs run by default, pairs in the table
    ((4,), (5, 3), ["R", "S0", "S1", "Psum", "Pavg", "Pmax", "Pmin"], 49, None),
    ((4,), (7, 9), ["R", "S0", "S1", "Psum", "Pavg", "Pmax", "Pmin"], 49, None),
    ((4,), (1, 4), ["R", "S0", "S1", "Psum", "Pavg", "Pmax", "Pmin"], 49, None),
    ((4,), (2, 7, 3), ["R", "S0", "S1", "S2", "Psum", "Pmax"], 36, None),
    ((2, 2), (5, 3), ["R", "S0", "S1", "Psum", "Pavg", "Pmax"], 150, None),
    ((2, 2), (7, 9), ["R", "S0", "S1", "Psum", "Pmin"], 60, None),
    ((2, 2), (1, 4), ["R", "S0", "S1", "Psum", "Pmax"], 60, None),
    ((2, 2), (2, 7, 3), ["R", "S0", "S1", "S2", "Psum"], 80, None),
    ((2, 4), (5, 3), ["R", "S0", "S1", "Psum", "Pavg"], 80, None),
    ((2, 4), (7, 9), ["R", "S0", "S1", "Psum", "Pmax"], 50, None),
    ((2, 4), (1, 4), ["R", "S0", "S1", "Psum"], 40, None),
    ((2, 2, 2), (5, 3), ["R", "S0", "S1", "Psum", "Pavg", "Pmax"], 60, 300),
    ((2, 2, 2), (2, 7, 3), ["R", "S0", "S1", "S2", "Psum"], 60, 300),
]


def torch_place(t):
    return Shard(int(t[1:])) if t[0] == "S" else PLACES[t]


def value(cid, g, pc):
    base = (g * 7 + pc * 5 + cid * 3) % 17 - 8
    return -0.0 if base == 0 and g % 2 else base / 4.0


def coords_of(rank, mesh):
    out = []
    for m in reversed(mesh):
        out.append(rank % m)
        rank //= m
    return out[::-1]


def bits(t):
    t = t.contiguous().reshape(-1)
    if t.dtype in BITS:
        view, width = BITS[t.dtype]
        mask = (1 << (4 * width)) - 1
        return ["%0*x" % (width, int(v) & mask) for v in t.view(view).tolist()]
    return [str(int(v)) for v in t.tolist()]


def dims(v):
    return ",".join(str(int(x)) for x in v)


def torch_case(mesh, dm, cid, shape, dtype, src, dst):
    """torch's lines for the case, or the reason it has none."""
    world = 1
    for m in mesh:
        world *= m
    sp, dp = [torch_place(t) for t in src], [torch_place(t) for t in dst]
    meta = TensorMeta(torch.Size(shape), torch.empty(shape).stride(), DTYPES[dtype])
    pieces, heads = {}, {}
    for r in range(world):
        c = coords_of(r, mesh)
        ls, lo = _compute_local_shape_and_global_offset(shape, mesh, c, sp)
        ds, do = _compute_local_shape_and_global_offset(shape, mesh, c, dp)
        pc = sum(c[i] * (2 * i + 1) for i in range(len(mesh)) if src[i].startswith("P"))
        flat = []
        for idx in itertools.product(*[range(lo[d], lo[d] + ls[d]) for d in range(len(shape))]):
            g = 0
            for d in range(len(shape)):
                g = g * shape[d] + idx[d]
            flat.append(value(cid, g, pc))
        t = torch.tensor(flat, dtype=torch.float64)
        t = (t * 4).to(torch.int32) if dtype == "int32" else t.to(DTYPES[dtype])
        pieces[r] = t.reshape(ls)
        heads[r] = (ls, lo, ds, do)
    try:
        out = redistribute_local_tensor(LocalTensor(pieces), DTensorSpec(dm, tuple(sp), tensor_meta=meta),
                                        DTensorSpec(dm, tuple(dp), tensor_meta=meta))
    except ValueError as e:
        if "Mixed Partial" in str(e):
            return "mixed", None
        return "refused", None
    except (RuntimeError, AssertionError) as e:
        if "not supported yet" in str(e) or "one partial type" in str(e):
            return "refused", None
        return "torch failed (%s)" % str(e).split(".")[0][:50], None
    lines = []
    for r in range(world):
        o = out._local_tensors[r] if isinstance(out, LocalTensor) else out
        ls, lo, ds, do = heads[r]
        if o.dtype != DTYPES[dtype]:
            return "dtype", None
        if tuple(o.shape) != tuple(ds):
            return "torch's piece is not its own local shape", None
        lines.append(" ".join([str(cid), str(r), dims(ls), dims(lo), dims(ds), dims(do)] + bits(o)))
    return "ok", lines


def fnv1a(text):
    h = 0xcbf29ce484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return h


def write_table(path, cases, want_lines):
    out = ["/* torch %s's DTensor answers, written by tests/test_dtensor_torch.py --write-table:"
           % torch.__version__.split("+")[0],
           " * every rank's local shape and offset (compute_local_shape_and_global_offset) for",
           " * every Replicate/Shard spec of the configurations, and the FNV-1a hash of the ranks'",
           " * lines (dtensor_cases.h, joined by newlines) after redistribute_local_tensor for",
           " * every pair torch carries out (on (2, 2, 2) a sample). Do not edit; write it again. */",
           "static const struct torch_offsets {", "  const char *spec, *want;",
           "} torch_offsets[] = {"]
    for mesh, shape, places, _, _ in CONFIGS:
        shards = [t for t in places if t == "R" or t[0] == "S"]
        for spec in itertools.product(shards, repeat=len(mesh)):
            world, ranks = 1, []
            for m in mesh:
                world *= m
            for r in range(world):
                ls, lo = _compute_local_shape_and_global_offset(
                    shape, mesh, coords_of(r, mesh), [torch_place(t) for t in spec])
                ranks.append(" " + dims(ls) + " " + dims(lo))
            out.append('    {"%s", "%s"},' % (" ".join(
                ["0", str(len(mesh))] + [str(m) for m in mesh] + [str(len(shape))] +
                [str(d) for d in shape] + ["float32"] + list(spec) * 2), "|".join(ranks)))
    out += ["};", "", "static const struct torch_pieces {", "  const char *line;",
            "  uint64_t hash;", "} torch_pieces[] = {"]
    for line in cases:
        how, lines, _ = want_lines[int(line.split()[0])]
        if how != "ok":
            continue
        out.append('    {"%s", 0x%016xu},' % (line, fnv1a("\n".join(lines))))
    out.append("};")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def mpu_spec(t, ndim, negative):
    if negative and t[0] == "S":
        return "S%d" % (int(t[1:]) - ndim)
    return t


def main():
    peer = sys.argv[1]
    scale = int(os.environ.get("MPU_DTENSOR_TORCH_SCALE", "1"))
    table = sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--write-table" else None
    dist.init_process_group("fake", rank=0, world_size=8)
    cases, cid = [], 0
    for mesh, shape, places, want, in_table in CONFIGS:
        specs = list(itertools.product(places, repeat=len(mesh)))
        pairs = list(itertools.product(specs, specs))
        if table:
            want, scale = in_table or len(pairs), 1
        step = max(1, len(pairs) // (want * scale))
        for k in range(0, len(pairs), step):
            cid += 1
            dtype = ["float32", "float32", "float64", "bfloat16", "int32"][cid % 5]
            cases.append((mesh, shape, cid, dtype) + pairs[(k + cid) % len(pairs)])
    want_lines, mpu_input, counts = {}, [], {}
    meshes = {}
    for mesh, shape, cid, dtype, src, dst in cases:
        world = 1
        for m in mesh:
            world *= m
        if mesh not in meshes:
            mode = LocalTensorMode(frozenset(range(world)))
            with mode:
                with maybe_disable_local_tensor_mode():
                    meshes[mesh] = (mode, init_device_mesh("cpu", mesh))
        mode, dm = meshes[mesh]
        with mode:
            how, lines = torch_case(mesh, dm, cid, shape, dtype, src, dst)
        counts[how] = counts.get(how, 0) + 1
        if how.startswith("torch failed"):
            print("torch cannot carry out case %d %s: %s" % (cid, (mesh, shape, dtype, src, dst), how))
        neg = cid % 3 == 0
        mpu_input.append(" ".join([str(cid), str(len(mesh))] + [str(m) for m in mesh] +
                                  [str(len(shape))] + [str(s) for s in shape] + [dtype] +
                                  [mpu_spec(t, len(shape), neg) for t in src + dst]))
        want_lines[cid] = (how, lines, (mesh, shape, dtype, src, dst))
    if table:
        write_table(table, mpu_input, want_lines)
    done = subprocess.run([peer], input="\n".join(mpu_input) + "\n", capture_output=True,
                          text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit("FAIL: dtensor_peer exited %d: %s" % (done.returncode, done.stderr))
    got = {}
    for line in done.stdout.splitlines():
        cid = int(line.split()[0])
        got.setdefault(cid, []).append(line)
    bad = 0
    for cid, (how, lines, what) in sorted(want_lines.items()):
        mine = got.get(cid, [])
        if how == "mixed":
            ok = mine and all(l.split()[2] == "error" for l in mine)
        elif how == "ok":
            ok = mine == lines
        else:
            ok = mine and all(l.split()[2] != "error" for l in mine)
        if not ok:
            bad += 1
            if bad <= 10:
                print("DIFFER case %d %s (torch: %s)" % (cid, what, how))
                for a, b in itertools.zip_longest(lines or [], mine):
                    if a != b:
                        print("  torch: %s\n  mpu:   %s" % (a, b))
    print("%d cases: %s; %d differ" % (len(cases), ", ".join(
        "%s %d" % kv for kv in sorted(counts.items())), bad))
    if bad:
        raise SystemExit("FAIL: %d cases differ from torch" % bad)
    print("OK")


if __name__ == "__main__":
    main()
