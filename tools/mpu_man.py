#!/usr/bin/env python3
"""The man pages of mpu and its subcommands, made from their --help texts.

The help texts are the one source: each has a `usage:` line, a description,
option lists (`options:`, `mpu's own:`, ...), `exit status:` and `examples:`.
This script turns them into pages with NAME, SYNOPSIS, DESCRIPTION, OPTIONS,
EXIT STATUS, EXAMPLES and SEE ALSO, so the pages cannot say something the
--help does not. The pages are the ones the help texts list: mpu(1), one per
command in `mpu --help` (mpu-plan(1), ...), one per demo in `mpu demo --help`
(mpu-demo-gpt(1), ...).

Usage: mpu_man.py MPU OUTDIR VERSION
"""
import os
import re
import subprocess
import sys

SECTION_ORDER = ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "EXAMPLES", "SEE ALSO"]


def help_text(mpu, args):
    done = subprocess.run([mpu] + args + ["--help"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit("mpu_man.py: mpu %s --help exited %d" % (" ".join(args), done.returncode))
    return done.stdout


def listed(text, heading):
    """(name, summary) under `heading:` in a help text."""
    out, inside = [], False
    for line in text.splitlines():
        if line.strip() == heading + ":":
            inside = True
        elif inside and line.startswith("  ") and line.strip():
            name, _, summary = line.strip().partition(" ")
            out.append((name, summary.strip()))
        elif inside and out:
            break
    return out


def esc(text):
    """roff-safe text: backslashes, hyphens of options, a leading dot or quote."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return re.sub(r"^([.'])", r"\\&\1", text)


def blocks(text):
    """The help text as (heading or None, lines) blocks split at blank lines."""
    out, cur = [], []
    for line in text.rstrip("\n").splitlines():
        if line.strip():
            cur.append(line)
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    result = []
    for b in out:
        if re.match(r"^\S.*:$", b[0]) and len(b[0]) < 48 and not b[0].startswith("usage:"):
            result.append((b[0][:-1], b[1:]))
        else:
            result.append((None, b))
    return result


def items(lines):
    """An indented list ('  -x, --long ARG   what it does' and its continuation lines) as
    (tag, description) pairs."""
    out = []
    for line in lines:
        body = line.strip()
        indent = len(line) - len(body)
        if indent <= 6:  # a new item; its description's lines are indented deeper
            m = re.match(r"(\S.*?)(?:\s{2,}(.*))?$", body)
            out.append([m.group(1), m.group(2) or ""])
        elif out:
            out[-1][1] = (out[-1][1] + " " + body).strip()
        else:
            out.append([body, ""])
    return [(t, d) for t, d in out]


def page(name, summary, text, see_also, version):
    parts = blocks(text)
    usage = parts[0][1]
    if not usage[0].startswith("usage: "):
        sys.exit("mpu_man.py: %s: the help text does not begin with 'usage:'" % name)
    sections = {s: [] for s in SECTION_ORDER}
    sections["NAME"].append("%s \\- %s" % (name, esc(summary)))
    synopsis = " ".join(line.strip() for line in usage)[len("usage: "):]
    sections["SYNOPSIS"].append(".B %s" % esc(synopsis.split(" ")[0]))
    rest = synopsis.split(" ", 1)[1] if " " in synopsis else ""
    if rest:
        sections["SYNOPSIS"][-1] += "\n" + esc(rest)
    for heading, lines in parts[1:]:
        if heading is None:
            sections["DESCRIPTION"].append(".PP\n" + esc(" ".join(l.strip() for l in lines)))
        elif heading == "exit status":
            for tag, desc in items(lines):
                sections["EXIT STATUS"].append(".TP\n.B %s\n%s" % (esc(tag), esc(desc)))
        elif heading == "examples":
            sections["EXAMPLES"].append(".PP\n.nf\n.RS\n%s\n.RE\n.fi" % "\n".join(esc(l.strip()) for l in lines))
        else:
            target = "OPTIONS" if heading.startswith("options") or heading.endswith("own") else "DESCRIPTION"
            if target == "DESCRIPTION" or heading != "options":
                sections[target].append(".SS %s" % esc(heading))
            for tag, desc in items(lines):
                sections[target].append(".TP\n.B %s\n%s" % (esc(tag), esc(desc)))
    sections["SEE ALSO"].append(",\n".join(".BR %s (1)" % p for p in see_also))
    missing = [s for s in SECTION_ORDER if not sections[s]]
    if missing:
        sys.exit("mpu_man.py: %s: the help text has no %s" % (name, ", ".join(missing)))
    out = ['.\\" Made by tools/mpu_man.py from `%s --help`; edit the help text, not this page.'
           % name.replace("-", " "),
           '.TH %s 1 "" "mpu %s" "User Commands"' % (name.upper().replace("-", "\\-"), version)]
    for s in SECTION_ORDER:
        out.append(".SH %s" % s)
        out.extend(sections[s])
    return "\n".join(out) + "\n"


def main():
    mpu, outdir, version = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(outdir, exist_ok=True)
    top = help_text(mpu, [])
    commands = listed(top, "commands")
    demos = listed(help_text(mpu, ["demo"]), "demos")
    pages = [("mpu", [], "model-parallel groups and communicators for C training programs")]
    pages += [("mpu-" + c, [c], s) for c, s in commands]
    pages += [("mpu-demo-" + d, ["demo", d], s) for d, s in demos]
    names = [p[0] for p in pages]
    for name, args, summary in pages:
        if name == "mpu":
            see = names[1:]
        else:
            parent = "mpu-demo" if name.startswith("mpu-demo-") else "mpu"
            see = ["mpu"] + ([parent] if parent != "mpu" else []) + \
                  [n for n in names if n != name and n != "mpu" and n != parent and
                   n.startswith("mpu-demo-") == name.startswith("mpu-demo-")]
        with open(os.path.join(outdir, name + ".1"), "w") as f:
            f.write(page(name, summary, help_text(mpu, args), see, version))
    with open(os.path.join(outdir, "pages.txt"), "w") as f:
        f.write("\n".join(names) + "\n")


if __name__ == "__main__":
    main()
