#!/usr/bin/env bash
# Install mpu into temporary prefixes and build programs against it each way
# a user would: pkg-config (mpu, mpu-layers, mpu-mpi, mpu-nccl) and CMake's
# find_package (mpu::mpu, mpu::layers, COMPONENTS mpi nccl), once with the
# build tree's libdir and once with Debian's multiarch one
# (lib/x86_64-linux-gnu, a library-only tree configured here). The README's
# first program, built with `pkg-config --libs mpu`, runs with Open MPI and
# CUDA hidden from the loader (a private mount namespace where their
# libraries are empty files), where the MPI and NCCL backends say in one line
# what is missing.
# Usage: test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset LD_LIBRARY_PATH PKG_CONFIG_PATH
version=$(sed -n 's/^#define MPU_VERSION_STRING "\(.*\)"/\1/p' "$src/include/mpu/version.h")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# the README's first program, as the docs show it
awk '/^## A first program/ {on = 1} on && /^```c/ {grab = 1; next} grab && /^```/ {exit} grab' \
  "$src/README.md" >"$work/readme.c"
grep -q mpu_launch "$work/readme.c"

# Run a command with Open MPI's and CUDA's libraries hidden from the loader;
# without mount namespaces, run it plainly and check the loader never looked
# for them.
hidden() {
  if unshare -m --propagation private true 2>/dev/null; then
    unshare -m --propagation private bash -c '
      set -e
      for d in /usr/local/cuda /usr/lib/x86_64-linux-gnu/openmpi; do
        [ -d "$d" ] && mount -t tmpfs none "$(readlink -f "$d")"
      done
      for f in /usr/lib/x86_64-linux-gnu/lib{mpi,open-pal,open-rte,cudart,nccl}*.so*; do
        [ -e "$f" ] && mount --bind /dev/null "$(readlink -f "$f")"
      done
      exec "$@"' hidden "$@"
  else
    local out
    out=$(LD_DEBUG=libs "$@" 2>&1)
    if echo "$out" | grep >/dev/null -E 'libmpi|libcudart|libnccl'; then
      echo "the loader looked for MPI or CUDA:" >&2
      echo "$out" | grep -E 'libmpi|libcudart|libnccl' >&2
      return 1
    fi
    "$@"
  fi
}

# check_prefix PREFIX LIBDIR BUILD: install BUILD to PREFIX and build against it
check_prefix() {
  local prefix=$1 libdir=$2 tree=$3 lib
  cmake --install "$tree" --prefix "$prefix" >/dev/null
  lib=$prefix/$libdir
  test -f "$lib/pkgconfig/mpu.pc"
  test -f "$prefix/include/mpu.h"
  export PKG_CONFIG_PATH=$lib/pkgconfig
  test "$(pkg-config --modversion mpu)" = "$version"
  test "$(pkg-config --modversion mpu-layers)" = "$version"
  test "$(pkg-config --variable=prefix mpu)" = "$prefix"
  test "$(pkg-config --variable=libdir mpu)" = "$lib"
  test "$(pkg-config --cflags mpu | xargs)" = "-I$prefix/include"
  if pkg-config --libs mpu mpu-layers mpu-mpi mpu-nccl 2>/dev/null | grep >/dev/null rpath; then
    echo "a .pc file bakes a run path into Libs" >&2
    exit 1
  fi
  # libmpu needs libc, libm and pthreads only
  if ldd "$lib/libmpu.so" | grep >/dev/null -Ei 'mpi|cuda|nccl|blas'; then
    echo "libmpu needs more than libc:" >&2
    ldd "$lib/libmpu.so" >&2
    exit 1
  fi

  # pkg-config: the README program (-lmpu alone), run with MPI and CUDA hidden
  cc -std=c11 "$work/readme.c" $(pkg-config --cflags --libs mpu) -o "$prefix/readme"
  readelf -d "$prefix/readme" | grep NEEDED | grep >/dev/null -Ev 'libmpu\.so|libc\.so|libm\.so|libpthread' && {
    echo "the README program needs more than libmpu:" >&2
    readelf -d "$prefix/readme" >&2
    exit 1
  }
  LD_LIBRARY_PATH=$lib hidden "$prefix/readme" | grep >/dev/null "rank 3: sum 6"
  cc -std=c11 "$src/tests/install/backends.c" $(pkg-config --cflags --libs mpu) -o "$prefix/backends"
  if [ -f "$lib/libmpu_mpi.so.0" ]; then
    LD_LIBRARY_PATH=$lib "$prefix/backends" | grep >/dev/null "^mpi: yes"
    LD_LIBRARY_PATH=$lib hidden "$prefix/backends" | grep >/dev/null "^mpi: no: mpu_mpi_available: the mpi backend is not available: .*libmpi"
  fi
  if [ -f "$lib/libmpu_nccl.so.0" ]; then
    LD_LIBRARY_PATH=$lib hidden "$prefix/backends" | grep >/dev/null "^nccl: no: mpu_nccl_available: the nccl backend is not available: .*lib\(cudart\|nccl\)"
  fi
  cc -std=c11 "$src/tests/install/layers.c" $(pkg-config --cflags --libs mpu-layers) -o "$prefix/with_layers"
  LD_LIBRARY_PATH=$lib "$prefix/with_layers" | grep >/dev/null "layers ok"

  # CMake: every target, the backends as components; the targets carry run paths
  local cm_args=(-DCMAKE_PREFIX_PATH="$prefix" -DEXAMPLE_SOURCE="$work/readme.c"
    -DLAYERS_PROGRAM="$src/tests/install/layers.c")
  if [ -f "$lib/pkgconfig/mpu-mpi.pc" ]; then
    # a program that includes mpu/comm_mpi.h and calls MPI itself: mpu-mpi alone
    # (it names its MPI in Requires, as mpu/comm_mpi.h exposes MPI's types)
    grep -q '^Requires: mpu ompi-c' "$lib/pkgconfig/mpu-mpi.pc"
    if grep -q -- '-I/' "$lib/pkgconfig/mpu-mpi.pc"; then
      echo "mpu-mpi.pc copies MPI's flags instead of requiring it" >&2
      exit 1
    fi
    cat >"$work/m.c" <<'C'
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
    cc -std=c11 "$work/m.c" $(pkg-config --cflags --libs mpu-mpi) -o "$prefix/with_mpu_mpi"
    LD_LIBRARY_PATH=$lib "$prefix/with_mpu_mpi" | grep >/dev/null "mpi size 1"
    cm_args+=(-DMPI_PROGRAM="$work/m.c")
  fi
  if [ -f "$lib/pkgconfig/mpu-nccl.pc" ]; then
    # a C/CUDA program next to mpu (built and linked: there is no GPU to run
    # it on), and one that uses the backend through mpu alone
    printf '#include <cuda_runtime.h>\n#include <nccl.h>\n#include "mpu.h"\nint main(void) { int n = 0; cudaGetDeviceCount(&n); return mpu_nccl_available() ? 0 : 1; }\n' >"$work/g.c"
    cc -std=c11 "$work/g.c" $(pkg-config --cflags --libs mpu-nccl) -o "$prefix/with_mpu_nccl"
    cc -std=c11 "$src/tests/install/nccl.c" $(pkg-config --cflags --libs mpu-nccl) -o "$prefix/nccl_pc"
    LD_LIBRARY_PATH=$lib "$prefix/nccl_pc" | grep >/dev/null "nccl backend ok"
    cm_args+=(-DNCCL_PROGRAM="$src/tests/install/nccl.c")
  fi
  cmake -S "$src/tests/install" -B "$prefix/consumer" "${cm_args[@]}" >/dev/null
  cmake --build "$prefix/consumer" >/dev/null
  "$prefix/consumer/consumer" | grep >/dev/null "rank 0: sum 6"
  "$prefix/consumer/consumer_layers" | grep >/dev/null "layers ok"
  if [ -f "$lib/pkgconfig/mpu-mpi.pc" ]; then
    "$prefix/consumer/consumer_mpi" | grep >/dev/null "mpi size 1"
  fi
  if [ -f "$lib/pkgconfig/mpu-nccl.pc" ]; then
    "$prefix/consumer/consumer_nccl" | grep >/dev/null "nccl backend ok"
  fi
  unset PKG_CONFIG_PATH
}

# 1. the build tree as configured (its CMAKE_INSTALL_LIBDIR), with the tool
libdir=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$build/CMakeCache.txt")
check_prefix "$work/default" "$libdir" "$build"
test -x "$work/default/bin/mpu"
# the installed tool finds its library by itself, and reports one version
test "$("$work/default/bin/mpu" --version)" = "mpu $version (libmpu $version)"
# it loads the backend --backend asks for, and says in one line what is missing
for b in mpi nccl; do
  [ -f "$work/default/$libdir/libmpu_$b.so.0" ] || continue
  if out=$(hidden "$work/default/bin/mpu" bench --backend $b -n 1 2>&1); then
    echo "mpu bench --backend $b ran with its libraries hidden" >&2
    exit 1
  fi
  if [ "$(echo "$out" | wc -l)" != 1 ] || ! grep -q "the $b backend is not available: .*lib" <<<"$out"; then
    echo "mpu bench --backend $b with its libraries hidden said:" >&2
    echo "$out" >&2
    exit 1
  fi
done
# man pages, when the build made them (tools/mpu_man.py)
if [ -d "$build/man" ]; then
  test -f "$work/default/share/man/man1/mpu.1"
  test -f "$work/default/share/man/man1/mpu-plan.1"
  test -f "$work/default/share/man/man1/mpu-demo-gpt.1"
fi

# the DCP reader of mpu ckpt export's folders (docs/checkpoint.md)
test -f "$work/default/share/mpu/python/mpu_dcp.py"

# 2. Debian's multiarch libdir: the libraries alone, configured here
cmake -S "$src" -B "$work/multiarch-build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_LIBDIR=lib/x86_64-linux-gnu -DMPU_BUILD_TESTS=OFF -DMPU_BUILD_TOOLS=OFF \
  -DMPU_BUILD_EXAMPLES=OFF >/dev/null
cmake --build "$work/multiarch-build" -j2 >/dev/null
check_prefix "$work/multiarch" lib/x86_64-linux-gnu "$work/multiarch-build"
echo "1 passed, 0 failed"
