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

# a program that includes mpu/comm_mpi.h builds with pkg-config mpu-mpi alone,
# and with find_package(mpu COMPONENTS mpi)
if [ -f "$libdir/pkgconfig/mpu-mpi.pc" ]; then
  printf '#include "mpu/comm_mpi.h"\nint main(void) { mpu_comm *c; return MPI_Init(0, 0) || mpu_comm_from_mpi(MPI_COMM_WORLD, &c); }\n' >"$prefix/m.c"
  cc -std=c11 "$prefix/m.c" $(pkg-config --cflags --libs mpu-mpi) -o "$prefix/with_mpu_mpi"
  cmake -S "$src/tests/install" -B "$prefix/consumer_mpi" -DCMAKE_PREFIX_PATH="$prefix" \
    -DEXAMPLE_SOURCE="$src/examples/allreduce.c" -DMPI_PROGRAM="$prefix/m.c" >/dev/null
  cmake --build "$prefix/consumer_mpi" >/dev/null
  test -x "$prefix/consumer_mpi/consumer_mpi"
fi
# and a C program using the CUDA runtime next to mpu with mpu-nccl
if [ -f "$libdir/pkgconfig/mpu-nccl.pc" ]; then
  printf '#include <cuda_runtime.h>\n#include <nccl.h>\n#include "mpu.h"\nint main(void) { int n = 0; cudaGetDeviceCount(&n); return mpu_nccl_available() ? 0 : 1; }\n' >"$prefix/g.c"
  cc -std=c11 "$prefix/g.c" $(pkg-config --cflags --libs mpu-nccl) -o "$prefix/with_mpu_nccl"
fi
echo "1 passed, 0 failed"
