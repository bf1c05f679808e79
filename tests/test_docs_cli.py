#!/usr/bin/env python3
"""README.md and docs/ agree with the tool's --help texts.

- the subcommands `mpu --help` lists are the ones README's "The tool" section
  shows, and the demos `mpu demo --help` lists are the ones the docs run;
- every flag of every `mpu ...` command line in README.md and docs/*.md (code
  blocks and inline code) is one that subcommand's --help describes.
Usage: test_docs_cli.py MPU SOURCE_DIR
"""
import glob
import os
import re
import subprocess
import sys

SUBCOMMANDS = ("bench", "ckpt", "demo", "mesh", "plan")


def help_text(mpu, args):
    done = subprocess.run([mpu] + args + ["--help"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit("FAIL: mpu %s --help exited %d" % (" ".join(args), done.returncode))
    return done.stdout


def listed(text, heading):
    """The names in the indented list under `heading:` of a help text."""
    names, inside = [], False
    for line in text.splitlines():
        if line.strip() == heading + ":":
            inside = True
        elif inside and line.startswith("  ") and line.strip():
            names.append(line.split()[0])
        elif inside and not line.strip() and names:
            break
    return names


def documented_commands(src):
    """(file, command line) for every `mpu <sub> ...` the docs show."""
    out = []
    for path in [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md"))):
        text = open(path).read()
        for m in re.finditer(r"(?:build/bin/|\$prefix/bin/|^|[\s`(])mpu ((?:%s)\b[^\n`|;)]*)" % "|".join(SUBCOMMANDS),
                             text, re.M):
            line = " ".join(w.rstrip(",.:") for w in m.group(1).split(" #")[0].split())
            out.append((os.path.relpath(path, src), line))
    return out


def main():
    mpu, src = sys.argv[1], sys.argv[2]
    failures, checked = [], 0
    commands = listed(help_text(mpu, []), "commands")
    if sorted(commands) != sorted(SUBCOMMANDS):
        failures.append("mpu --help lists %s, the docs know %s" % (commands, SUBCOMMANDS))
    readme = open(os.path.join(src, "README.md")).read()
    tool = readme[readme.index("## The tool"):]
    tool = tool[:tool.index("\n## ", 5)]
    shown = sorted(set(re.findall(r"build/bin/mpu (\w+)", tool)) - {"--help"})
    if shown != sorted(commands):
        failures.append("README's tool section shows %s, mpu --help lists %s" % (shown, commands))
    demos = listed(help_text(mpu, ["demo"]), "demos")
    docs = documented_commands(src)
    run_demos = sorted({line.split()[1] for _, line in docs if line.startswith("demo ") and len(line.split()) > 1})
    if run_demos != sorted(demos):
        failures.append("the docs run demos %s, mpu demo --help lists %s" % (run_demos, demos))
    helps = {}
    for where, line in docs:
        words = line.split()
        key = words[:2] if words[0] == "demo" and len(words) > 1 else words[:1]
        if words[0] == "bench" and "--block" in words:
            key = ["bench", "--block"]
        name = " ".join(key)
        if name not in helps:
            helps[name] = help_text(mpu, key)
        for w in words[len(key):]:
            flag = w.split("=")[0]
            if not re.fullmatch(r"--?[A-Za-z][\w-]*", flag):
                continue
            checked += 1
            if not re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(flag), helps[name]):
                failures.append("%s: 'mpu %s' uses %s, which 'mpu %s --help' does not describe"
                                % (where, line, flag, name))
    for f in failures:
        print("FAIL " + f)
    print("%d passed, %d failed (%d documented command lines, %d flags)"
          % (checked + 3 - len(failures), len(failures), len(docs), checked))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
