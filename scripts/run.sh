#!/usr/bin/env bash
# Set up what is missing, build, and run the main job on the threads backend:
# a short collective benchmark (mpu bench).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
build/bin/mpu bench -n 2 -b 8 -e 16M -f 8 -c all_reduce "$@"
