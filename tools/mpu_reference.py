#!/usr/bin/env python3
"""docs/reference.md, the API reference, made from the public headers.

The headers are the one source: for each header that include/mpu.h includes
(and mpu/comm_mpi.h and mpu/version.h), the page gives its opening comment,
then every type (typedef), macro (#define MPU_...) and function (MPU_API) it
declares, each with the comment written above it, in the header's order. So
the page cannot say something the headers do not; ctest `api_reference` fails
when it is out of date.

Usage: mpu_reference.py SOURCE_DIR [--check | --write]
  (neither: print the page)
"""
import os
import re
import sys

TITLE = "# API reference\n"
INTRO = ("Made from the headers by `tools/mpu_reference.py --write`; do not edit (ctest "
         "`api_reference` checks it is up to date). Every call returns an `mpu_result_t` unless "
         "said otherwise, and leaves a message in `mpu_last_error()` when it fails "
         "(docs/api.md has the conventions).\n")


def headers(src):
    umbrella = open(os.path.join(src, "include", "mpu.h")).read()
    names = re.findall(r'#include "(mpu/[a-z_]+\.h)"', umbrella)
    for extra in ("mpu/version.h", "mpu/comm_mpi.h"):
        if extra not in names:
            names.append(extra)
    return names


def comment_text(c):
    """A /* */ or // comment as plain lines."""
    if c.startswith("//"):
        return "\n".join(l.strip()[2:].strip() for l in c.splitlines())
    body = c[2:-2]
    lines = [re.sub(r"^\s*\* ?", "", l) for l in body.splitlines()]
    return "\n".join(lines).strip()


def chunks(text):
    """(kind, text) in order: comment, preproc, decl (up to its ';' at brace depth 0)."""
    i, n, out = 0, len(text), []
    while i < n:
        if text[i].isspace():
            i += 1
        elif text.startswith("/*", i):
            j = text.index("*/", i) + 2
            out.append(("comment", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = i
            while True:  # consecutive // lines are one comment
                k = text.find("\n", j)
                k = n if k < 0 else k
                nxt = text[k + 1:].lstrip(" \t")
                j = k
                if not nxt.startswith("//"):
                    break
                j = k + 1 + (len(text[k + 1:]) - len(nxt))
            out.append(("comment", text[i:j]))
            i = j
        elif text[i] == "#":
            j = i
            while True:  # continued lines
                k = text.find("\n", j)
                k = n if k < 0 else k
                if text[k - 1] != "\\":
                    break
                j = k + 1
            out.append(("preproc", text[i:k]))
            i = k
        else:
            depth, j = 0, i
            while j < n:
                if text.startswith("/*", j):
                    j = text.index("*/", j) + 2
                    continue
                ch = text[j]
                if ch in "({":
                    depth += 1
                elif ch in ")}":
                    depth -= 1
                elif ch == ";" and depth == 0:
                    break
                j += 1
            out.append(("decl", text[i:j + 1]))
            i = j + 1
    return out


def page(src):
    out = [TITLE, "\n", INTRO]
    for name in headers(src):
        text = open(os.path.join(src, "include", name)).read()
        # C++'s guards are not declarations
        text = re.sub(r'#ifdef __cplusplus\s*\n\s*extern "C" \{\s*\n\s*#endif', "", text)
        text = re.sub(r"#ifdef __cplusplus\s*\n\s*\}\s*\n\s*#endif", "", text)
        items = chunks(text)
        out.append("\n## %s\n\n" % name)
        if items and items[0][0] == "comment":
            out.append(comment_text(items[0][1]) + "\n")
            items = items[1:]
        last = None  # the comment just above, while nothing came between
        for kind, t in items:
            if kind == "comment":
                last = t
                continue
            public = (kind == "decl" and (t.lstrip().startswith(("MPU_API", "typedef"))) or
                      kind == "preproc" and re.match(r"#define MPU_(?!.*_H\b)", t))
            if public:
                if last:
                    out.append("\n" + comment_text(last) + "\n")
                out.append("\n```\n%s\n```\n" % t.strip())
            last = None
    return "".join(out)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    src = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    path = os.path.join(src, "docs", "reference.md")
    text = page(src)
    if mode == "--write":
        open(path, "w").write(text)
    elif mode == "--check":
        have = open(path).read() if os.path.exists(path) else ""
        if have != text:
            print("FAIL docs/reference.md is not what the headers make: run "
                  "tools/mpu_reference.py . --write")
            a, b = have.splitlines(), text.splitlines()
            for k, (x, y) in enumerate(zip(a + [""] * len(b), b + [""] * len(a))):
                if x != y:
                    print("first difference at line %d:\n  page:    %s\n  headers: %s" % (k + 1, x, y))
                    break
            print("0 passed, 1 failed")
            return 1
        print("1 passed, 0 failed")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
