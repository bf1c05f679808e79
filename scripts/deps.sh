#!/usr/bin/env bash
# Install what building and testing mpu needs on Debian 12, only what is missing.
# Sourced or run by scripts/run.sh and scripts/test.sh; safe to run again.
set -euo pipefail

packages=(build-essential cmake pkg-config libcmocka-dev libopenblas-dev valgrind python3 clang libclang-rt-14-dev libopenmpi-dev openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "mpu: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
