#!/usr/bin/env python3
"""README.md and docs/ agree with the tool's --help texts.

- the subcommands `mpu --help` lists are the ones README's "The tool" section
  shows, and the demos `mpu demo --help` lists are the ones the docs run;
- every flag of every `mpu ...` command line in README.md and docs/*.md (code
  blocks and inline code) is one that subcommand's --help describes;
- a text block that shows `$ build/bin/mpu ...` and its output shows what the
  tool prints today (a line `...` stands for any lines).
Usage: test_docs_cli.py MPU SOURCE_DIR
"""
import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import mpu_man  # noqa: E402  (tools/mpu_man.py: how a help text's lists are read)

SUBCOMMANDS = ("bench", "ckpt", "demo", "mesh", "plan")


def help_text(mpu, args):
    done = subprocess.run([mpu] + args + ["--help"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit("FAIL: mpu %s --help exited %d" % (" ".join(args), done.returncode))
    return done.stdout


def listed(text, heading):
    """The names in the indented list under `heading:` of a help text (as the man pages read it)."""
    return [name for name, _ in mpu_man.listed(text, heading)]


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


def shown_outputs(src):
    """(file, command, expected lines) for every text block of a command and its output."""
    out = []
    for path in [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md"))):
        for m in re.finditer(r"```text\n\$ (build/bin/mpu [^\n]*)\n(.*?)```", open(path).read(), re.S):
            out.append((os.path.relpath(path, src), m.group(1), m.group(2).splitlines()))
    return out


def matches(want, got):
    """want's lines, in order, are got's; `...` takes any number of lines."""
    if not want:
        return not got
    if want[0] == "...":
        return any(matches(want[1:], got[i:]) for i in range(len(got) + 1))
    return bool(got) and got[0] == want[0] and matches(want[1:], got[1:])


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
    for where, command, want in shown_outputs(src):
        checked += 1
        done = subprocess.run(command.replace("build/bin/mpu", mpu, 1), shell=True,
                              capture_output=True, text=True)
        if not matches(want, done.stdout.splitlines()):
            failures.append("%s: '%s' prints something else than the docs show:\n%s"
                            % (where, command, done.stdout))
    for f in failures:
        print("FAIL " + f)
    print("%d passed, %d failed (%d documented command lines, %d flags)"
          % (checked + 3 - len(failures), len(failures), len(docs), checked))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
