#!/usr/bin/env bash
# On a CPU machine with the CUDA toolkit and NCCL (compile and link only, no
# GPU): build everything scripts/gpu-test.sh needs into ONE folder, gpu-kit/
# (ignored by git; under 64 MiB), for a GPU machine that has no network, no
# package registry, no compiler libraries of its own and NCCL perhaps only as
# PyTorch's libnccl.so.2. Carry the folder there with the repository and run
# scripts/gpu-test.sh.
#
#   gpu-kit/bin    mpu, gpu_checks, gpu_device_paths, test_conformance_gpu, gpu_regions,
#                  example_gpu_tp_dp, store_peer; all_reduce_perf from
#                  nccl-tests' source when a copy is here (NCCL_TESTS_SRC: a
#                  checkout, or a bare git dir such as the one the `fetch`
#                  tool brings to /work/.mirror/NVIDIA+nccl-tests/repo)
#   gpu-kit/lib    libmpu, libmpu_layers, libmpu_nccl, the CUDA runtime they
#                  were linked with, OpenBLAS and its Fortran runtime: every
#                  run path is $ORIGIN-relative, so the folder works anywhere
#   gpu-kit/share  test_store_torch.py (mpu's store against PyTorch's TCPStore)
#   gpu-kit/KIT    what it was built with and the newest glibc symbol it needs
#
# libnccl.so.2 is not carried (hundreds of MiB): gpu-test.sh uses the GPU
# machine's. mpu's backend checks its version at load and looks up what is
# newer than its floor, so one build serves any NCCL from the floor up.
#
# Usage: scripts/gpu-prepare.sh        env: CUDA_HOME (/usr/local/cuda),
#        NCCL_ROOT, NCCL_TESTS_SRC, GENCODE (sm_90: H100/H200), JOBS (2)
set -euo pipefail
cd "$(dirname "$0")/.."
kit=gpu-kit build=build-gpukit
cuda=${CUDA_HOME:-/usr/local/cuda}
jobs=${JOBS:-2}
gencode=${GENCODE:--gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90}
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache)

# ---- mpu: the programs and their libraries, run paths relative to the kit --------
mkdir -p "$build" # its logs live there too
# shellcheck disable=SC2016 # $ORIGIN is the loader's, not the shell's
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" -DCUDAToolkit_ROOT="$cuda" \
  -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON '-DCMAKE_BUILD_RPATH=$ORIGIN/../lib;$ORIGIN' \
  ${NCCL_ROOT:+-DNCCL_ROOT="$NCCL_ROOT"} >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
grep -q "NCCL backend on" "$build/configure.log" ||
  { echo "gpu-prepare: CUDA/NCCL not found:"; grep "NCCL backend" "$build/configure.log"; exit 1; }
programs=(mpu_tool gpu_checks gpu_device_paths test_conformance_gpu gpu_regions example_gpu_tp_dp store_peer mpu_nccl)
targets=()
for t in "${programs[@]}"; do targets+=(--target "$t"); done
cmake --build "$build" -j"$jobs" "${targets[@]}" >"$build/build.log" 2>&1 ||
  { tail -30 "$build/build.log"; exit 1; }

rm -rf "$kit"
mkdir -p "$kit/bin" "$kit/lib" "$kit/share"
cp "$build"/bin/{mpu,gpu_checks,gpu_device_paths,test_conformance_gpu,gpu_regions,example_gpu_tp_dp,store_peer} "$kit/bin/"
for l in libmpu.so.0 libmpu_layers.so.0 libmpu_nccl.so.0; do cp -L "$build/lib/$l" "$kit/lib/$l"; done
cp tests/test_store_torch.py "$kit/share/"

# ---- what they need beyond the C library: the CUDA runtime, OpenBLAS, Fortran --------
# (libnccl is the GPU machine's; libc, libm, libgcc_s, the loader and libstdc++, which
# all_reduce_perf alone needs, are on any machine with PyTorch, and a newer libstdc++
# than the machine's glibc would refuse to load)
for f in "$kit"/bin/* "$kit"/lib/*; do
  ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
  case $name in
  libmpu*|libnccl.so*|libc.so*|libm.so*|libgcc_s.so*|libstdc++.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
  *) [ -e "$kit/lib/$name" ] || cp -L "$path" "$kit/lib/$name" ;;
  esac
done
# the copied libraries find each other in the kit (OpenBLAS its Fortran runtime)
test -e "$kit/lib/libcudart.so.13" -o -n "$(ls "$kit"/lib/libcudart.so.* 2>/dev/null)"

# ---- nccl-tests' all_reduce_perf, from its source, for sm_90 only --------------------
src=${NCCL_TESTS_SRC:-/work/.mirror/NVIDIA+nccl-tests/repo}
if [ -e "$src" ]; then
  tests=$build/nccl-tests # a copy outside the repository's tracked files (never committed)
  if [ ! -d "$tests/src" ]; then
    mkdir -p "$tests"
    if [ -d "$src/src" ]; then cp -r "$src"/. "$tests"/; else git --git-dir="$src" archive HEAD | tar -x -C "$tests"; fi
  fi
  nccl_inc=$(sed -n 's/^NCCL_INCLUDE_DIR:PATH=//p' "$build/CMakeCache.txt")
  if make -C "$tests/src" -j"$jobs" CUDA_HOME="$cuda" NCCL_HOME="$(dirname "$nccl_inc")" \
    CUDARTLIB=cudart_static NVCC_GENCODE="$gencode" BUILDDIR="$(pwd)/$tests/build" \
    "$(pwd)/$tests/build/all_reduce_perf" >"$build/nccl-tests.log" 2>&1; then
    cp "$tests/build/all_reduce_perf" "$kit/bin/"
    nccl_tests=$(git --git-dir="$src" log -1 --format='%h %s' 2>/dev/null || echo "from $src")
  else
    echo "gpu-prepare: building nccl-tests failed (see $build/nccl-tests.log); the kit has no all_reduce_perf"
  fi
else
  echo "gpu-prepare: no nccl-tests source (NCCL_TESTS_SRC); the kit has no all_reduce_perf"
fi

strip --strip-unneeded "$kit"/bin/* "$kit"/lib/* 2>/dev/null || true
glibc=$(for f in "$kit"/bin/* "$kit"/lib/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
{
  echo "built $(date -u +%Y-%m-%dT%H:%MZ) from $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with local changes)')"
  grep "NCCL backend on" "$build/configure.log" | sed 's/^-- //'
  echo "cuda_major $(sed -n 's/^#define CUDART_VERSION \([0-9]*\)/\1/p' "$cuda/include/cuda_runtime_api.h" | head -1 | awk '{ print int($1 / 1000) }')"
  echo "glibc_needed $glibc"
  echo "nccl_tests ${nccl_tests:-none}"
} >"$kit/KIT"
size=$(du -sb "$kit" | cut -f1)
echo "gpu-prepare: $kit is $((size / 1048576)) MiB"
cat "$kit/KIT"
if ((size >= 64 * 1048576)); then
  echo "gpu-prepare: $kit is over 64 MiB" >&2
  exit 1
fi
