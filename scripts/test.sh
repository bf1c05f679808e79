#!/usr/bin/env bash
# Set up what is missing, build, and run the whole test suite through ctest:
# once plain (Release), once under AddressSanitizer+UBSan, once under
# ThreadSanitizer, and the libFuzzer smoke run (clang, ASan+UBSan). Valgrind
# and install checks run in the plain build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh --test
jobs=$(nproc)

run() { # name, cmake args...
  local dir="build${1:+-$1}"
  shift
  echo "==> ${dir}: configure and build" >&2
  cmake -S . -B "$dir" "$@" >/dev/null
  cmake --build "$dir" -j"$jobs" >/dev/null
  echo "==> ${dir}: ctest" >&2
  (cd "$dir" && ctest --output-on-failure -j"$jobs")
}

# tests, tools and examples on: scripts/run.sh configures build/ with the tool alone
all=(-DMPU_BUILD_TESTS=ON -DMPU_BUILD_TOOLS=ON -DMPU_BUILD_EXAMPLES=ON)
run "" -DCMAKE_BUILD_TYPE=Release "${all[@]}"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  run asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMPU_SANITIZE=address,undefined -DMPU_SANITIZE_ONLY=ON "${all[@]}"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  run tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMPU_SANITIZE=thread -DMPU_SANITIZE_ONLY=ON "${all[@]}"
CC=clang run fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMPU_FUZZ=ON -DMPU_SANITIZE=address,undefined \
  -DMPU_BUILD_TESTS=OFF -DMPU_BUILD_TOOLS=OFF -DMPU_BUILD_EXAMPLES=OFF
echo "mpu: all test builds passed" >&2
