#!/usr/bin/env python3
"""`mpu ckpt export` against its readers: a tp 2 x pp 2 (vp 2) x dp 2 ZeRO-1
checkpoint of the demo, exported in shards of at most 64 KiB, gives
model-0000k-of-0000n.safetensors files of whole tensors and
model.safetensors.index.json (metadata.total_size, weight_map) such that:
every tensor equals `mpu ckpt merge`'s bit for bit, read the way transformers
reads an index (transformers.utils.hub.get_checkpoint_shard_files, or the same
steps written out where transformers is not installed), by
transformers' load_sharded_checkpoint and by
torch.distributed.checkpoint.load through python/mpu_dcp.py (where torch is
installed; one line says what was skipped). A name map renames tensors, and
its mistakes are refused.

usage: test_ckpt_export.py MPU SOURCE_DIR
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file

try:
    import torch
except ImportError:
    torch = None
try:
    from transformers.utils.hub import get_checkpoint_shard_files
except ImportError:
    get_checkpoint_shard_files = None


def run(*args, want=0):
    done = subprocess.run(list(args), capture_output=True, text=True)
    if done.returncode != want:
        raise SystemExit("FAIL: %s exited %d (want %d): %s%s" % (" ".join(args), done.returncode, want,
                                                                 done.stdout, done.stderr))
    return done.stdout + done.stderr


def read_index(folder):
    """What transformers does with an index: the shard files of weight_map, each loaded."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if get_checkpoint_shard_files:
        files, meta = get_checkpoint_shard_files(folder, index)
        weight_map = meta["weight_map"]
    else:  # transformers/utils/hub.py get_checkpoint_shard_files, for a local folder
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = [os.path.join(folder, f) for f in sorted(set(weight_map.values()))]
    tensors = {}
    for path in files:
        for name, value in load_file(path).items():
            if weight_map.get(name) != os.path.basename(path):
                raise SystemExit("FAIL: %s holds %s, which the weight_map puts in %s"
                                 % (path, name, weight_map.get(name)))
            tensors[name] = value
    return tensors


def check_layout(folder, merged, failures, max_shard):
    names = sorted(os.listdir(folder))
    shards = [n for n in names if n.endswith(".safetensors")]
    index = json.load(open(os.path.join(folder, "model.safetensors.index.json")))
    total = sum(v.nbytes for v in merged.values())
    if index["metadata"]["total_size"] != total:
        failures.append("total_size %s, the tensors have %d bytes" % (index["metadata"]["total_size"], total))
    n = len(shards)
    want = ["model-%05d-of-%05d.safetensors" % (k + 1, n) for k in range(n)]
    if shards != want or n < 2:
        failures.append("the files are %s" % shards)
    if sorted(set(index["weight_map"].values())) != shards:
        failures.append("the weight_map names files %s" % sorted(set(index["weight_map"].values())))
    for s in shards:
        held = load_file(os.path.join(folder, s))
        size = sum(v.nbytes for v in held.values())
        if size > max_shard and len(held) > 1:
            failures.append("%s holds %d bytes in %d tensors, over %d" % (s, size, len(held), max_shard))


def main():
    mpu, src = sys.argv[1], sys.argv[2]
    failures, skipped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        ck, out = os.path.join(tmp, "ckpt"), os.path.join(tmp, "hf")
        run(mpu, "demo", "gpt", "--steps", "4", "--save", ck)
        run(mpu, "ckpt", "merge", ck, os.path.join(tmp, "merged.safetensors"))
        merged = load_file(os.path.join(tmp, "merged.safetensors"))
        run(mpu, "ckpt", "export", ck, out, "--max-shard-size", "64K")
        check_layout(out, merged, failures, 64 * 1024)
        exported = read_index(out)
        if sorted(exported) != sorted(merged):
            failures.append("the export holds %s, the merge %s" % (sorted(exported), sorted(merged)))
        for name in sorted(set(exported) & set(merged)):
            if exported[name].dtype != np.float32 or not np.array_equal(exported[name], merged[name]):
                failures.append("%s differs from the merged tensor" % name)
        # --all: the moments too, one file at the default shard size
        run(mpu, "ckpt", "export", ck, os.path.join(tmp, "all"), "--all")
        every = read_index(os.path.join(tmp, "all"))
        if not any(n.endswith(".exp_avg") for n in every) or not set(merged) <= set(every):
            failures.append("--all exported %d tensors without the moments" % len(every))
        wrote = sorted(os.listdir(os.path.join(tmp, "all")))
        if wrote != ["model-00001-of-00001.safetensors", "model.safetensors.index.json"]:
            failures.append("--all with the default shard size wrote %s" % wrote)
        # a name map: two tensors renamed, the rest as they were
        first, second = sorted(merged)[:2]
        mapfile = os.path.join(tmp, "names.txt")
        with open(mapfile, "w") as f:
            f.write("# mpu name -> transformers name\n%s model.embed.weight\n\n%s   lm.x  # comment\n"
                    % (first, second))
        run(mpu, "ckpt", "export", ck, os.path.join(tmp, "mapped"), "--name-map", mapfile)
        mapped = read_index(os.path.join(tmp, "mapped"))
        renamed = {first: "model.embed.weight", second: "lm.x"}
        if sorted(mapped) != sorted(renamed.get(n, n) for n in merged):
            failures.append("the name map gave %s" % sorted(mapped))
        for old, new in renamed.items():
            if new not in mapped or not np.array_equal(mapped[new], merged[old]):
                failures.append("%s (was %s) differs from the merged tensor" % (new, old))
        # its mistakes: a name the checkpoint lacks, two tensors given one name, a bad line
        for text, why in (("no.such.tensor x\n", "no tensor 'no.such.tensor'"),
                          ("%s same\n%s same\n" % (first, second), "two tensors would be named 'same'"),
                          ("%s\n" % first, "line 1: want 'MPU_NAME OTHER_NAME'")):
            with open(mapfile, "w") as f:
                f.write(text)
            said = run(mpu, "ckpt", "export", ck, os.path.join(tmp, "bad"), "--name-map", mapfile, want=1)
            if why not in said:
                failures.append("a map of %r: %s" % (text, said.strip()))
            if os.path.exists(os.path.join(tmp, "bad", "model.safetensors.index.json")):
                failures.append("a refused export left an index")
        said = run(mpu, "ckpt", "merge", ck, os.path.join(tmp, "x.safetensors"), "--max-shard-size", "1M", want=2)
        if "export's options" not in said:
            failures.append("merge --max-shard-size: %s" % said.strip())

        if torch is None:
            skipped.append("torch is not installed: transformers' load_sharded_checkpoint and "
                           "torch.distributed.checkpoint.load not run")
        else:
            check_torch(out, merged, src, failures, skipped)
        if get_checkpoint_shard_files is None:
            skipped.append("transformers is not installed: its index reading written out instead")
    for s in skipped:
        print("SKIP " + s)
    for f in failures:
        print("FAIL " + f)
    print("%d tensors compared, %d failures" % (len(merged), len(failures)))
    return 1 if failures else 0


def module_for(names, shapes):
    """An nn.Module whose state_dict has exactly these names and shapes."""
    root = torch.nn.Module()
    for name in names:
        *path, leaf = name.split(".")
        m = root
        for part in path:
            if not hasattr(m, part):
                m.add_module(part, torch.nn.Module())
            m = getattr(m, part)
        m.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shapes[name])))
    return root


def check_torch(out, merged, src, failures, skipped):
    shapes = {n: tuple(v.shape) for n, v in merged.items()}
    try:  # transformers 5 keeps it in trainer_utils, 4 in modeling_utils
        from transformers.trainer_utils import load_sharded_checkpoint
    except ImportError:
        try:
            from transformers.modeling_utils import load_sharded_checkpoint
        except ImportError:
            load_sharded_checkpoint = None
    if load_sharded_checkpoint is None:
        skipped.append("transformers is not installed: load_sharded_checkpoint not run")
    else:
        model = module_for(sorted(merged), shapes)
        load_sharded_checkpoint(model, out, strict=True)
        for name, value in model.state_dict().items():
            if not np.array_equal(value.numpy(), merged[name]):
                failures.append("load_sharded_checkpoint: %s differs from the merged tensor" % name)
    import torch.distributed.checkpoint as dcp
    sys.path.insert(0, os.path.join(src, "python"))
    from mpu_dcp import ExportReader
    state = {n: torch.full(shapes[n], float("nan")) for n in merged}
    dcp.load(state, storage_reader=ExportReader(out))
    for name, value in state.items():
        if not np.array_equal(value.numpy(), merged[name]):
            failures.append("torch.distributed.checkpoint.load: %s differs from the merged tensor" % name)


if __name__ == "__main__":
    sys.exit(main())
