#!/usr/bin/env bash
# Install what building mpu needs on Debian 12 (with --test, also what its
# tests need), only what is missing. Run by scripts/run.sh and scripts/test.sh;
# safe to run again.
set -euo pipefail

packages=(build-essential cmake pkg-config libcmocka-dev libopenblas-dev python3 libopenmpi-dev openmpi-bin)
# the gloo backend (libmpu_gloo; optional at configure, left out without it)
packages+=(libgloo-dev)
if [ "${1:-}" = "--test" ]; then
  # valgrind for the leak checks, clang for the fuzzer, chromium for the HTML picture's browser test
  packages+=(valgrind clang libclang-rt-14-dev chromium)
  # ip, tc and unshare for scripts/multihost.sh's hosts (network namespaces)
  packages+=(iproute2 util-linux)
  # venv for the Python checkpoint tests' environment (scripts/pyenv.sh)
  packages+=(python3-venv)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep >/dev/null "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "mpu: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
