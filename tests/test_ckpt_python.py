#!/usr/bin/env python3
"""Python reads what mpu writes: the merged checkpoint of a tp 2 x pp 2 (vp 2)
x dp 2 ZeRO-1 run loads with safetensors.numpy.load_file and every tensor
equals the one-rank run's (saved at the same step) to the demo's tolerance;
every rank file loads too, and the pieces put where index.json says give the
merged tensors exactly. The docs/checkpoint.md Python snippet runs as shown.
Run by ctest in the environment scripts/pyenv.sh makes; exits 77 (skipped)
when the Python has no safetensors or numpy.

usage: test_ckpt_python.py MPU SOURCE_DIR
"""
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError as e:
    print("SKIP: this python3 has no safetensors/numpy (%s); pip install safetensors numpy" % e)
    sys.exit(77)


def run(*args):
    done = subprocess.run(list(args), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit("FAIL: %s exited %d: %s" % (" ".join(args), done.returncode, done.stderr))
    return done.stdout


def main():
    mpu, src = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        par, one = os.path.join(tmp, "ckpt"), os.path.join(tmp, "one")
        run(mpu, "demo", "gpt", "--steps", "10", "--save", par)
        run(mpu, "demo", "gpt", "--steps", "10", "--tp", "1", "--pp", "1", "--dp", "1",
            "--micro-batches", "8", "--save", one)
        run(mpu, "ckpt", "merge", par, os.path.join(tmp, "model.safetensors"))
        run(mpu, "ckpt", "merge", one, os.path.join(tmp, "one.safetensors"))
        a = load_file(os.path.join(tmp, "model.safetensors"))
        b = load_file(os.path.join(tmp, "one.safetensors"))
        if sorted(a) != sorted(b) or not a:
            failures.append("the merged files hold different tensors")
        for name in sorted(set(a) & set(b)):
            x, y = a[name], b[name]
            if x.shape != y.shape or x.dtype != np.float32:
                failures.append("%s: %s %s vs %s" % (name, x.dtype, x.shape, y.shape))
                continue
            tol = 1e-3 * max(float(np.abs(y).max()), 1.0)  # the demo's parameter check
            if float(np.abs(x - y).max()) > tol:
                failures.append("%s differs from the one-rank model by %g" % (name, float(np.abs(x - y).max())))
        # the rank files are safetensors files too; the pieces rebuild the tensors exactly
        # the root's newest iteration, as latest_checkpointed_iteration.txt names it (Megatron's)
        it = int(open(os.path.join(par, "latest_checkpointed_iteration.txt")).read())
        par = os.path.join(par, "iter_%07d" % it)
        index = json.load(open(os.path.join(par, "index.json")))
        files = {f["name"]: load_file(os.path.join(par, f["name"])) for f in index["files"]}
        for name, t in index["tensors"].items():
            whole = np.full(t["shape"], np.nan, dtype=np.float32)
            for p in t["pieces"]:
                box = tuple(slice(o, o + n) for o, n in zip(p["offsets"], p["lengths"]))
                region = whole[box].reshape(-1)   # a copy: fill it, then put it back
                region[p["flat"][0]:p["flat"][1]] = files[p["file"]][p["key"]].reshape(-1)
                whole[box] = region.reshape([n for n in p["lengths"]])
            if np.isnan(whole).any():
                failures.append("%s: the pieces leave holes" % name)
            elif name in a and not np.array_equal(whole, a[name]):
                failures.append("%s: the pieces differ from the merged tensor" % name)
        # the docs' snippet, run where ckpt/ and model.safetensors are
        doc = open(os.path.join(src, "docs", "checkpoint.md")).read()
        snippets = re.findall(r"<!-- test: python -->\n```python\n(.*?)```", doc, re.S)
        if not snippets:
            failures.append("docs/checkpoint.md has no tested Python snippet")
        for code in snippets:
            env = dict(os.environ)
            done = subprocess.run([sys.executable, "-c", code], cwd=tmp, capture_output=True, text=True,
                                  env=env)
            if done.returncode != 0:
                failures.append("the docs' snippet failed: %s" % done.stderr[-500:])
    for f in failures:
        print("FAIL " + f)
    print("%d tensors compared, %d failures" % (len(a), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
