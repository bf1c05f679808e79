#!/usr/bin/env bash
# The Python of the checkpoint tests: a virtual environment at DIR with numpy
# and safetensors (needed: a failure to install them fails), and transformers
# and torch where they install (the tests that need them skip without them).
# Made once and reused: DIR/mpu-pyenv.done marks a finished environment, so
# the plain and sanitizer builds share one (tests/CMakeLists.txt: MPU_PYENV).
# MPU_PYENV_TORCH=0 leaves torch out (it is a download of gigabytes).
# Usage: pyenv.sh DIR [PYTHON]
set -euo pipefail
dir=$1 python=${2:-python3}
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9 # one maker at a time: ctest runs the fixture once per build tree
if [ -f "$dir/mpu-pyenv.done" ] && "$dir/bin/python" -c 'import numpy, safetensors' 2>/dev/null; then
  exit 0
fi
rm -rf "$dir"
"$python" -m venv "$dir"
pip=("$dir/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" numpy safetensors
# optional: what does not install (or import) is removed, and the tests that need it skip
optional() { # module, pip's names...
  local module=$1
  shift
  if ! timeout 900 "${pip[@]}" "$@" || ! "$dir/bin/python" -c "import $module" >/dev/null 2>&1; then
    echo "mpu pyenv: $module did not install; the tests that need it will skip" >&2
    "$dir/bin/python" -m pip uninstall -q -y "$@" >/dev/null 2>&1 || true
  fi
}
optional transformers transformers
if [ "${MPU_PYENV_TORCH:-1}" != 0 ]; then
  optional torch torch
fi
"$dir/bin/python" - <<'PY'
import importlib.util
have = [m for m in ("numpy", "safetensors", "transformers", "torch") if importlib.util.find_spec(m)]
print("mpu pyenv: " + ", ".join(have))
PY
touch "$dir/mpu-pyenv.done"
