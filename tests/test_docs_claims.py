#!/usr/bin/env python3
"""What the docs' prose claims, checked against the tool and the docs' own tables.

- docs/bench.md: every datatype it says `mpu bench -d` takes runs, and every
  option it says is refused exits 2;
- docs/bench.md: "The largest loss from one size to the next is N%" is what
  its perf-report sweep table shows (busbw of one row against the next);
- docs/state.md: "`mpu plan ... --format svg` is N KB" is the size the tool
  writes;
- a measured time is given in one place, scripts/perf-report.sh's tables: no
  prose outside them gives an 8-byte all_reduce's time in us;
- "`mpu plan ...` writes N MB" in state.md is what it writes;
- every perf-report block in docs/ holds its command and what it measured (a
  block left empty says nothing while the prose around it cites it).
Usage: test_docs_claims.py MPU SOURCE_DIR
"""
import glob
import os
import re
import subprocess
import sys


def run(mpu, args):
    return subprocess.run([mpu] + args, capture_output=True, text=True, timeout=300)


def outside_reports(text):
    """The text with every perf-report block cut out."""
    return re.sub(r"<!-- perf-report (\S+) -->.*?<!-- /perf-report \1 -->", "", text, flags=re.S)


def main():
    mpu, src = sys.argv[1], sys.argv[2]
    failures, checked = [], 0
    bench = open(os.path.join(src, "docs", "bench.md")).read()

    m = re.search(r"`-d` datatype by nccl-tests' names \(([^)]*)\)", bench)
    types = re.findall(r"`([a-z0-9]+)`", m.group(1)) if m else []
    if len(types) < 10:
        failures.append("bench.md does not list -d's datatypes (%s)" % types)
    for t in types:
        done = run(mpu, ["bench", "-t", "2", "-b", "8", "-e", "8", "-n", "1", "-w", "0", "-d", t])
        checked += 1
        if done.returncode != 0:
            failures.append("bench.md says -d %s runs; it exits %d: %s" % (t, done.returncode, done.stderr.strip()))
    m = re.search(r"What mpu cannot do is refused in\s+one line that says why: (.*?)\. ", bench, re.S)
    refused = re.findall(r"`(-[a-zA-Z] [^`]+)`", m.group(1)) if m else []
    if not refused:
        failures.append("bench.md's list of refused options is not found")
    # `-d a|b|c` claims each of a, b and c
    refused = [opt.split()[0] + " " + alt for opt in refused for alt in opt.split(None, 1)[1].split("|")]
    for opt in refused:
        done = run(mpu, ["bench", "-t", "2", "-b", "8", "-e", "8", "-n", "1"] + opt.split())
        checked += 1
        if done.returncode != 2 or len(done.stderr.strip().splitlines()) != 1:
            failures.append("bench.md says %s is refused in one line; it exits %d: %s"
                            % (opt, done.returncode, done.stderr.strip()))

    sweep = re.search(r"<!-- perf-report sweep -->(.*?)<!-- /perf-report sweep -->", bench, re.S).group(1)
    rows = re.findall(r"^\| (\d+ [KMG]iB) \| [\d.]+ \| [\d.]+ \| ([\d.]+) \|", sweep, re.M)
    losses = [(100 * (1 - float(b2) / float(b1)), s1, s2) for (s1, b1), (s2, b2) in zip(rows, rows[1:])]
    claim = re.search(r"The largest loss from one size to the next is (\d+)% \((\d+ [KMG]iB) to (\d+ [KMG]iB)", bench)
    checked += 1
    if not claim or not losses:
        failures.append("bench.md: no claim of the sweep's largest loss, or no sweep table")
    else:
        worst = max(losses)
        if abs(worst[0] - int(claim.group(1))) > 1 or (claim.group(2), claim.group(3)) != worst[1:]:
            failures.append("bench.md claims the largest loss is %s%% (%s to %s); its table says %.0f%% (%s to %s)"
                            % (claim.group(1), claim.group(2), claim.group(3), worst[0], worst[1], worst[2]))

    state = open(os.path.join(src, "docs", "state.md")).read()
    for cmd, kb in re.findall(r"`mpu (plan [^`]*--format svg)` is (\d+) KB", state):
        done = run(mpu, cmd.split())
        checked += 1
        if done.returncode != 0 or abs(len(done.stdout) / 1024 - int(kb)) > 0.5 * int(kb):
            failures.append("state.md says `mpu %s` is %s KB; it writes %d bytes" % (cmd, kb, len(done.stdout)))
    for cmd, mb in re.findall(r"`mpu (plan [^`]*)` writes ([\d.]+) MB", state):
        done = run(mpu, cmd.split())
        checked += 1
        if done.returncode != 0 or abs(len(done.stdout) / 1e6 - float(mb)) > 0.1 * float(mb):
            failures.append("state.md says `mpu %s` writes %s MB; it writes %d bytes" % (cmd, mb, len(done.stdout)))

    for path in [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "docs", "*.md"))):
        prose = outside_reports(open(path).read())
        for sentence in re.split(r"(?<=\.)\s", prose):
            checked += 1
            if re.search(r"8-byte (all_reduce|call)", sentence) and re.search(r"\d\s*(us|µs)\b", sentence):
                failures.append("%s gives an 8-byte all_reduce's time outside perf-report's tables: %s"
                                % (os.path.basename(path), " ".join(sentence.split())[:160]))

    for path in sorted(glob.glob(os.path.join(src, "docs", "*.md"))):
        for name, body in re.findall(r"<!-- perf-report (\S+) -->(.*?)<!-- /perf-report \1 -->",
                                     open(path).read(), re.S):
            checked += 1
            if "```sh" not in body or not re.search(r"^(\||```text)", body, re.M):
                failures.append("%s's perf-report block %s holds no command and table: run "
                                "scripts/perf-report.sh --only %s --write" % (os.path.basename(path), name, name))

    for f in failures:
        print("FAIL " + f)
    print("%d passed, %d failed" % (checked - len(failures), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
