#!/usr/bin/env bash
# Install mpu into a temporary prefix and build a program against it twice:
# with pkg-config and with CMake's find_package. Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
test -x "$prefix/bin/mpu"
env -u LD_LIBRARY_PATH "$prefix/bin/mpu" --version >/dev/null # the tool finds libmpu by itself
test -f "$prefix/include/mpu.h"
libdir=$(dirname "$(find "$prefix" -name mpu.pc)")/..
export PKG_CONFIG_PATH=$libdir/pkgconfig LD_LIBRARY_PATH=$libdir

cc -std=c11 "$src/examples/allreduce.c" $(pkg-config --cflags --libs mpu) -o "$prefix/with_pkgconfig"
"$prefix/with_pkgconfig" | grep -q "rank 3 of 4: sum = \[6, 4, 14\]"

cmake -S "$src/tests/install" -B "$prefix/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DEXAMPLE_SOURCE="$src/examples/allreduce.c" >/dev/null
cmake --build "$prefix/consumer" >/dev/null
"$prefix/consumer/consumer" | grep -q "rank 0 of 4: sum = \[6, 4, 14\]"
"$prefix/bin/mpu" --help >/dev/null
echo "1 passed, 0 failed"
