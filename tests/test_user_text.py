#!/usr/bin/env python3
"""What a user reads: the man pages and the words.

- every man page (build/man, made by tools/mpu_man.py from the --help texts)
  has NAME, SYNOPSIS, DESCRIPTION, OPTIONS, EXIT STATUS, EXAMPLES and SEE ALSO
  in that order, describes every option its --help describes, and mpu(1)
  points to every mpu-* page;
- no help text, man page, doc, README or source comment speaks of this
  project's own history (its seed documents, issues or rounds): they name the
  source (Megatron-DeepSpeed's mpu/mappings.py, Megatron-LM's
  parallel_state.py, PyTorch's DeviceMesh tutorial, BioNeMo's helpers) or the
  mpu feature;
- the configure line of the MPI backend says which MPI it found.
Usage: test_user_text.py MPU SOURCE_DIR MAN_DIR CMAKE
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

SECTIONS = ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "EXAMPLES", "SEE ALSO"]
HISTORY = re.compile(r"\bseeds? ?#?0\d\d\b|\bthe seeds?'s?\b|\bseed's\b|\bissues? ?#?\d+\b|\bround \d+\b",
                     re.I)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def help_text(mpu, args):
    return subprocess.run([mpu] + args + ["--help"], capture_output=True, text=True).stdout


def man_pages(mpu, man):
    names = open(os.path.join(man, "pages.txt")).read().split()
    check("mpu" in names and "mpu-demo-gpt" in names and "mpu-bench" in names,
          "the pages are %s" % names)
    for name in names:
        text = open(os.path.join(man, name + ".1")).read()
        found = re.findall(r"^\.SH (.*)$", text, re.M)
        check(found == SECTIONS, "%s.1 has sections %s, want %s" % (name, found, SECTIONS))
        args = name.split("-")[1:]
        helped = help_text(mpu, args)
        for flag in sorted(set(re.findall(r"(?<![\w-])--[a-z][\w-]*", helped))):
            check(flag.replace("-", "\\-") in text, "%s.1 does not describe %s" % (name, flag))
        see = text[text.index(".SH SEE ALSO"):]
        if name == "mpu":
            for other in names[1:]:
                check(".BR %s (1)" % other in see, "mpu(1) does not point to %s(1)" % other)
        else:
            check(".BR mpu (1)" in see, "%s(1) does not point to mpu(1)" % name)
        check(HISTORY.search(text) is None, "%s.1 speaks of the project's history: %s"
              % (name, HISTORY.search(text).group(0) if HISTORY.search(text) else ""))
    return names


def comments(path):
    """The comments of a C, CMake, shell or Python file (and of a doc: all of it)."""
    text = open(path, errors="replace").read()
    if path.endswith((".c", ".h", ".cu")):
        return "\n".join(re.findall(r"/\*.*?\*/|//[^\n]*", text, re.S))
    if path.endswith((".py", ".sh", ".txt", ".cmake")) or os.path.basename(path) == "CMakeLists.txt":
        return "\n".join(re.findall(r"#[^\n]*|\"\"\".*?\"\"\"", text, re.S))
    return text


def words(mpu, src, pages):
    helps = {"mpu " + " ".join(p.split("-")[1:]): help_text(mpu, p.split("-")[1:]) for p in pages}
    helps["mpu bench --block"] = help_text(mpu, ["bench", "--block"])
    for what, text in helps.items():
        m = HISTORY.search(text)
        check(m is None, "'%s --help' speaks of the project's history: %s" % (what, m and m.group(0)))
    files = [os.path.join(src, "README.md")] + glob.glob(os.path.join(src, "docs", "*.md"))
    for top in ("src", "include", "tools", "tests", "examples", "scripts", "fuzz", "cmake"):
        for root, _, names in os.walk(os.path.join(src, top)):
            files += [os.path.join(root, n) for n in names
                      if n.endswith((".c", ".h", ".cu", ".py", ".sh", ".md", ".cmake")) or n == "CMakeLists.txt"]
    files.append(os.path.join(src, "CMakeLists.txt"))
    me = os.path.abspath(__file__)
    for path in files:
        if os.path.abspath(path) == me:
            continue
        for m in HISTORY.finditer(comments(path)):
            failures.append("%s speaks of the project's history: '%s'" % (os.path.relpath(path, src), m.group(0)))
    check(re.search(r"demo .*\(gpt, ", helps["mpu "]) is not None,
          "mpu --help does not list the gpt demo")


def configure_line(src, cmake):
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([cmake, "-S", src, "-B", tmp, "-DMPU_BUILD_TESTS=OFF", "-DMPU_BUILD_TOOLS=OFF",
                               "-DMPU_BUILD_EXAMPLES=OFF", "-DMPU_WITH_NCCL=OFF"],
                              capture_output=True, text=True)
    line = [l for l in done.stdout.splitlines() if "mpu: MPI backend" in l]
    check(len(line) == 1, "configure says nothing of the MPI backend: %s" % done.stdout[-2000:])
    if line and "backend on" in line[0]:
        check(re.search(r"MPI backend on \(MPI \d+\.\d+, \S.*\)$", line[0]) is not None,
              "the configure line does not say which MPI: %r" % line[0])


def main():
    mpu, src, man, cmake = sys.argv[1:5]
    pages = man_pages(mpu, man)
    words(mpu, src, pages)
    configure_line(src, cmake)
    for f in failures:
        print("FAIL " + f)
    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
