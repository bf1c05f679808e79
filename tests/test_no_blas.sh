#!/usr/bin/env bash
# libmpu on libc alone: a second build tree configured without OpenBLAS
# (MPU_WITH_BLAS=OFF, and pkg-config finding nothing) says once what it leaves
# out, registers no test that needs the layers or the tool, and builds libmpu
# (and libmpu_gloo, a C++ library, where gloo is found).
# usage: test_no_blas.sh SOURCE_DIR [COMPILER_LAUNCHER]
set -euo pipefail
src=$1
launcher=${2:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(-DCMAKE_BUILD_TYPE=Release)
[ -n "$launcher" ] && args+=(-DCMAKE_C_COMPILER_LAUNCHER="$launcher" -DCMAKE_CXX_COMPILER_LAUNCHER="$launcher")

# OpenBLAS switched off: the tests are configured, those of the layers and the tool are not
out=$(cmake -S "$src" -B "$work/off" "${args[@]}" -DMPU_WITH_BLAS=OFF 2>&1)
echo "$out" | grep "mpu: layers"
test "$(echo "$out" | grep -c 'libmpu_layers, the mpu tool and the tests that use them are not built')" -eq 1
tests=$(cd "$work/off" && ctest -N)
grep -q ' test_train$' <<<"$tests"
if echo "$tests" | grep -E ' (test_layers|test_gpt|test_cli|doc_snippets|docs_match_help|test_install|gloo_demos_hand)$'; then
  echo "tests that need the layers or the tool are registered" >&2
  exit 1
fi
targets=(mpu)
gloo=0
if grep -q 'mpu: gloo backend on' <<<"$out"; then gloo=1 targets+=(mpu_gloo); fi
cmake --build "$work/off" --target "${targets[@]}" -j2 >/dev/null
lib=$(ls "$work"/off/lib/libmpu.so.*.*.*)
if readelf -d "$lib" | grep NEEDED | grep -Ei 'blas'; then exit 1; fi
test ! -e "$work/off/lib/libmpu_layers.so"
if [ $gloo = 1 ]; then
  gloo_lib=$(ls "$work"/off/lib/libmpu_gloo.so.*.*.*)
  if readelf -d "$gloo_lib" | grep NEEDED | grep -Ei 'blas'; then exit 1; fi
  echo "mpu: libmpu_gloo builds without OpenBLAS"
fi

# pkg-config that finds no OpenBLAS (nor anything else: the tests, which need cmocka, off)
out=$(PKG_CONFIG_LIBDIR="$work/empty" PKG_CONFIG_PATH= cmake -S "$src" -B "$work/absent" "${args[@]}" \
      -DMPU_BUILD_TESTS=OFF 2>&1)
echo "$out" | grep "mpu: layers"
grep -q 'mpu: layers off (OpenBLAS not found by pkg-config)' <<<"$out"
echo "mpu: libmpu configures and builds without OpenBLAS"
