#!/usr/bin/env bash
# Set up what is missing, build, and run the main job on the threads backend:
# mpu demo gpt (a small GPT with tp 2 x pp 2 (vp 2) x dp 2 on 8 thread ranks,
# checked against one rank), then a short collective benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# the tool alone (its libraries come with it): the tests and examples are scripts/test.sh's
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMPU_BUILD_TESTS=OFF -DMPU_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build -j"$(nproc)" --target mpu_tool
build/bin/mpu demo gpt "$@"
build/bin/mpu bench -t 2 -b 8 -e 16M -f 8 --collective all_reduce
