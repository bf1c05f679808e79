#!/usr/bin/env bash
# Install mpu into a temporary prefix and build programs against it, with
# pkg-config and with CMake's find_package: threads-only, with the layers, and
# (when built) with MPI and with CUDA/NCCL. Every program runs without
# LD_LIBRARY_PATH: the tool and pkg-config/CMake programs carry a run path.
# Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
unset LD_LIBRARY_PATH
cmake --install "$build" --prefix "$prefix" >/dev/null
test -x "$prefix/bin/mpu"
"$prefix/bin/mpu" --help >/dev/null # the tool finds libmpu by itself
test -f "$prefix/include/mpu.h"
libdir=$(dirname "$(find "$prefix" -name mpu.pc)")/..
export PKG_CONFIG_PATH=$libdir/pkgconfig

# one version, reported the same way by the library, the tool and pkg-config
version=$(sed -n 's/^#define MPU_VERSION_STRING "\(.*\)"/\1/p' "$src/include/mpu/version.h")
test "$("$prefix/bin/mpu" --version)" = "mpu $version (libmpu $version)"
test "$(pkg-config --modversion mpu)" = "$version"
test "$(pkg-config --modversion mpu-layers)" = "$version"

# threads only: needs neither MPI nor BLAS at build or load time
cc -std=c11 "$src/examples/allreduce.c" $(pkg-config --cflags --libs mpu) -o "$prefix/with_pkgconfig"
"$prefix/with_pkgconfig" | grep -q "rank 3 of 4: sum = \[6, 4, 14\]"
if ldd "$prefix/with_pkgconfig" | grep -q openblas; then
  echo "a program without layers loads BLAS" >&2
  exit 1
fi
cc -std=c11 "$src/tests/install/layers.c" $(pkg-config --cflags --libs mpu-layers) -o "$prefix/with_layers"
"$prefix/with_layers" | grep -q "layers ok"

cmake -S "$src/tests/install" -B "$prefix/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
  -DEXAMPLE_SOURCE="$src/examples/allreduce.c" -DLAYERS_PROGRAM="$src/tests/install/layers.c" >/dev/null
cmake --build "$prefix/consumer" >/dev/null
"$prefix/consumer/consumer" | grep -q "rank 0 of 4: sum = \[6, 4, 14\]"
"$prefix/consumer/consumer_layers" | grep -q "layers ok"

# a program that includes mpu/comm_mpi.h builds with pkg-config mpu-mpi alone,
# and with find_package(mpu COMPONENTS mpi); run as a singleton MPI process
if [ -f "$libdir/pkgconfig/mpu-mpi.pc" ]; then
  cat >"$prefix/m.c" <<'C'
#include <stdio.h>
#include "mpu/comm_mpi.h"
int main(void) {
  mpu_comm *c;
  int size = 0;
  if (MPI_Init(0, 0) || mpu_comm_from_mpi(MPI_COMM_WORLD, &c) || mpu_comm_size(c, &size)) return 1;
  printf("mpi size %d\n", size);
  mpu_comm_destroy(c);
  return MPI_Finalize();
}
C
  cc -std=c11 "$prefix/m.c" $(pkg-config --cflags --libs mpu-mpi) -o "$prefix/with_mpu_mpi"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$prefix/with_mpu_mpi" | grep -q "mpi size 1"
  cmake -S "$src/tests/install" -B "$prefix/consumer_mpi" -DCMAKE_PREFIX_PATH="$prefix" \
    -DEXAMPLE_SOURCE="$src/examples/allreduce.c" -DMPI_PROGRAM="$prefix/m.c" >/dev/null
  cmake --build "$prefix/consumer_mpi" >/dev/null
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$prefix/consumer_mpi/consumer_mpi" | grep -q "mpi size 1"
fi
# and a C program using the CUDA runtime next to mpu with mpu-nccl (built and
# linked here; there is no GPU to run it on)
if [ -f "$libdir/pkgconfig/mpu-nccl.pc" ]; then
  printf '#include <cuda_runtime.h>\n#include <nccl.h>\n#include "mpu.h"\nint main(void) { int n = 0; cudaGetDeviceCount(&n); return mpu_nccl_available() ? 0 : 1; }\n' >"$prefix/g.c"
  cc -std=c11 "$prefix/g.c" $(pkg-config --cflags --libs mpu-nccl) -o "$prefix/with_mpu_nccl"
fi
# man pages, when help2man built them
if [ -d "$build/man" ]; then
  test -f "$prefix/share/man/man1/mpu.1"
  test -f "$prefix/share/man/man1/mpu-plan.1"
  test -f "$prefix/share/man/man1/mpu-demo-gpt.1"
fi
echo "1 passed, 0 failed"
