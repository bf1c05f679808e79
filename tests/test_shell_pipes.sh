#!/usr/bin/env bash
# Under `set -o pipefail`, `producer | grep -q PATTERN` fails at random: grep
# -q exits at its first match, and a producer still writing then dies of
# SIGPIPE, which pipefail makes the pipeline's status (more often on a busy
# machine). The project's shell scripts that set pipefail let grep read all
# (`grep >/dev/null ...`) or read a here-string (`grep -q ... <<<"$out"`).
# usage: test_shell_pipes.sh SOURCE_DIR
set -euo pipefail
cd "$1"
bad=0
for f in $(grep -l pipefail tests/*.sh scripts/*.sh .ci/run 2>/dev/null); do
  if grep -nE '^[^#]*\|[[:space:]]*grep[[:space:]]+-[a-zA-Z]*q' "$f"; then
    echo "$f: a pipe into grep -q under pipefail (lines above)" >&2
    bad=1
  fi
done
exit $bad
