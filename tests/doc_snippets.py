#!/usr/bin/env python3
"""Every C snippet of README.md and docs/*.md, compiled and run.

Each ```c block must follow a marker comment that says how it runs:

    <!-- test: program -->            a whole program: compile, run
    <!-- test: program mpi N -->      a whole program: run under mpirun -n N
    <!-- test: program gloo N -->     a whole program: N processes with torchrun's
                                      variables (tests/gloo_run.sh), where the
                                      gloo backend was built
    <!-- test: main -->               the block is the body of main()
    <!-- test: rank N -->             the body of a rank function (world, rank,
                                      size in scope), run on N thread ranks
    <!-- test: rank N nccl -->        the same, with the NCCL test double in place
                                      of libmpu_nccl (GPU snippets on a CPU)
    <!-- test: state N TP PP -->      the body of a state function (s, world,
                                      rank), mpu_with_state with tp x pp

A snippet shows everything it uses: the marker is one line (no code hidden in
it), and a rank or state body starts with a comment naming what the function
around it gives (SCOPE below); a helper function makes the snippet a program.
A block with no marker fails the test, so a new snippet cannot go untested.

usage: doc_snippets.py SOURCE_DIR BUILD_DIR [MPIRUN...]
"""
import os
import re
import subprocess
import sys
import tempfile

HEADER = "#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include \"mpu.h\"\n"

RANK = """
static mpu_result_t snippet(mpu_comm *world, void *arg) {{
  (void)arg;
  int rank = 0, size = 0;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &size);
  (void)rank, (void)size;
{body}
  return MPU_SUCCESS;
}}

int main(void) {{
  mpu_result_t r = mpu_launch({n}, snippet, NULL, NULL, NULL);
  if (r) fprintf(stderr, "snippet: %s: %s\\n", mpu_result_name(r), mpu_last_error());
  return r != MPU_SUCCESS;
}}
"""

STATE = """
static mpu_result_t snippet(mpu_state *s, void *arg) {{
  (void)arg;
  mpu_comm *world = mpu_state_world(s);
  int rank = 0;
  mpu_comm_rank(world, &rank);
  (void)rank;
{body}
  return MPU_SUCCESS;
}}

int main(void) {{
  mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
  cfg.tp = {tp};
  cfg.pp = {pp};
  mpu_result_t r = mpu_with_state({n}, &cfg, 1, snippet, NULL, NULL, NULL);
  if (r) fprintf(stderr, "snippet: %s: %s\\n", mpu_result_name(r), mpu_last_error());
  return r != MPU_SUCCESS;
}}
"""

# the first line of a rank or state snippet: the names the function around it gives
SCOPE = {
    "rank": "/* in a rank function (mpu_launch runs it on each rank): mpu_comm *world; int rank, size */",
    "state": "/* in a function mpu_with_state runs on each rank: mpu_state *s; mpu_comm *world; int rank */",
}

MAIN = """
int main(void) {{
{body}
  return 0;
}}
"""


def snippets(path):
    """(line, marker, prelude, code) for each ```c block of a markdown file."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out = []
    for i, line in enumerate(lines):
        if line.strip() != "```c":
            continue
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        code = "\n".join(lines[i + 1 : j])
        # the marker: the comment block ending on the nearest non-empty line above
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker, prelude = None, ""
        if k >= 0 and lines[k].strip().endswith("-->"):
            start = k
            while start >= 0 and "<!-- test:" not in lines[start]:
                start -= 1
            if start >= 0:
                block = lines[start : k + 1]
                first = block[0].split("<!-- test:", 1)[1].replace("-->", "").strip()
                marker = first.split()
                prelude = "\n".join(l for l in block[1:] if l.strip() != "-->")
        out.append((i + 1, marker, prelude, code))
    return out


def main():
    src, build = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    mpirun = sys.argv[3:]
    files = [os.path.join(src, "README.md")] + sorted(
        os.path.join(src, "docs", f) for f in os.listdir(os.path.join(src, "docs")) if f.endswith(".md"))
    failures, runs = 0, 0
    tmp = tempfile.mkdtemp(prefix="mpu-doc-")
    for path in files:
        for line, marker, prelude, code in snippets(path):
            where = "%s:%d" % (os.path.relpath(path, src), line)
            if not marker:
                print("FAIL %s: a C snippet with no <!-- test: ... --> marker" % where)
                failures += 1
                continue
            kind, args = marker[0], marker[1:]
            # what a reader sees is all there is: no code hidden in the marker, and a rank or
            # state body says first what is in scope (the function around it)
            if prelude.strip():
                print("FAIL %s: code hidden in the marker: put it in the block" % where)
                failures += 1
                continue
            if kind in SCOPE and not code.startswith(SCOPE[kind]):
                print("FAIL %s: a %s snippet's first line is not '%s'" % (where, kind, SCOPE[kind]))
                failures += 1
                continue
            body = "\n".join("  " + l for l in code.split("\n"))
            run_with, env_for_run = [], {}
            if kind == "program":
                text = code
                if args[:1] == ["mpi"]:
                    if not mpirun:
                        print("skip %s: no MPI here" % where)
                        continue
                    run_with = mpirun + ["-n", args[1]]
                if args[:1] == ["gloo"]:
                    if not os.path.exists(os.path.join(build, "lib", "libmpu_gloo.so.0")):
                        print("skip %s: no gloo backend in this build" % where)
                        continue
                    run_with = ["sh", os.path.join(src, "tests", "gloo_run.sh"), args[1]]
            elif kind == "main":
                text = HEADER + prelude + MAIN.format(body=body)
            elif kind == "rank":
                text = HEADER + prelude + RANK.format(body=body, n=args[0])
                if args[1:2] == ["nccl"]:
                    double = os.path.join(build, "lib", "libmpu_nccl_double.so")
                    if not os.path.exists(double):
                        print("skip %s: no NCCL test double in this build" % where)
                        continue
                    libdir = os.path.join(tmp, "double")
                    os.makedirs(libdir, exist_ok=True)
                    if not os.path.exists(os.path.join(libdir, "libmpu_nccl.so.0")):
                        os.symlink(double, os.path.join(libdir, "libmpu_nccl.so.0"))
                    env_for_run = {"LD_LIBRARY_PATH": libdir, "MPU_DOUBLE_GPUS": "8"}
            elif kind == "state":
                text = HEADER + prelude + STATE.format(body=body, n=args[0], tp=args[1], pp=args[2])
            else:
                print("FAIL %s: unknown marker kind '%s'" % (where, kind))
                failures += 1
                continue
            if kind == "program" and "#include" not in text:
                text = HEADER + text
            name = re.sub(r"[^a-z0-9]+", "_", where.lower())
            c_file, exe = os.path.join(tmp, name + ".c"), os.path.join(tmp, name)
            open(c_file, "w").write(text)
            cc = [os.environ.get("CC", "cc"), "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror",
                  "-Wno-unused-variable", "-Wno-unused-but-set-variable", "-Wno-unused-function",
                  "-I", os.path.join(src, "include"), c_file, "-o", exe,
                  "-L", os.path.join(build, "lib"), "-lmpu_layers", "-lmpu", "-lm",
                  "-Wl,--enable-new-dtags,-rpath," + os.path.join(build, "lib")]
            cflags = os.environ.get("MPU_DOC_CFLAGS", "").split()
            done = subprocess.run(cc + cflags, capture_output=True, text=True)
            if done.returncode:
                print("FAIL %s: does not compile:\n%s" % (where, done.stderr))
                failures += 1
                continue
            try:
                env = dict(os.environ, **env_for_run)
                done = subprocess.run(run_with + [exe], capture_output=True, text=True, timeout=120,
                                      env=env)
            except subprocess.TimeoutExpired:
                print("FAIL %s: did not finish in 120 s" % where)
                failures += 1
                continue
            runs += 1
            if done.returncode:
                print("FAIL %s: exit %d\n%s%s" % (where, done.returncode, done.stdout, done.stderr))
                failures += 1
            else:
                print("ok   %s (%s)" % (where, " ".join(marker)))
    print("%d snippet(s) run, %d failed" % (runs, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
