#!/usr/bin/env bash
# On a machine with NVIDIA GPUs: mpu bench --backend nccl next to nccl-tests'
# all_reduce_perf, the same sizes and flags, one thread rank per GPU for mpu
# and one process driving every GPU for all_reduce_perf, run interleaved
# (ROUNDS rounds, each starting with the other tool) and compared by the
# median over rounds of each size's out-of-place time.
#
# all_reduce_perf comes from NCCL_TESTS_DIR (a checkout of
# github.com/NVIDIA/nccl-tests, built here when build/all_reduce_perf is
# missing), else from a shallow clone into build-gpu/nccl-tests when the
# network allows; without either mpu's rows are printed alone, with one line
# saying so.
#
#   scripts/gpu-bench.sh                      float sum, 8 B .. 256 MiB, x2
#   MINBYTES=1M MAXBYTES=1G STEP=4 ROUNDS=5 DTYPE=bfloat16 scripts/gpu-bench.sh
#
# Exit 2 if there is no GPU, 1 if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/gpu-common.sh
. scripts/gpu-common.sh
gpu_require gpu-bench
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
minbytes=${MINBYTES:-8} maxbytes=${MAXBYTES:-256M} step=${STEP:-2} rounds=${ROUNDS:-3}
dtype=${DTYPE:-float} op=${OP:-sum} iters=${ITERS:-20} warmup=${WARMUP:-5}
cuda_home=${CUDA_HOME:-/usr/local/cuda}

dir=build-gpu
gpu_build gpu-bench "$dir" mpu_tool
mpu=$dir/bin/mpu

# nccl-tests' all_reduce_perf: given, cloned, or none
perf=""
tests_dir=${NCCL_TESTS_DIR:-}
if [ -z "$tests_dir" ] && command -v git >/dev/null; then
  if [ -d "$dir/nccl-tests/.git" ] ||
    timeout 120 git clone -q --depth 1 https://github.com/NVIDIA/nccl-tests "$dir/nccl-tests" 2>/dev/null; then
    tests_dir=$dir/nccl-tests
  fi
fi
if [ -n "$tests_dir" ]; then
  if [ ! -x "$tests_dir/build/all_reduce_perf" ]; then
    # NCCL_HOME: the prefix whose include/ holds the nccl.h mpu was configured with
    nccl_inc=$(sed -n 's/^NCCL_INCLUDE_DIR:PATH=//p' "$dir/CMakeCache.txt")
    make -C "$tests_dir" -j"$(nproc)" CUDA_HOME="$cuda_home" NCCL_HOME="$(dirname "$nccl_inc")" \
      >"$dir.nccl-tests.log" 2>&1 || echo "gpu-bench: building nccl-tests failed (see $dir.nccl-tests.log)" >&2
  fi
  [ -x "$tests_dir/build/all_reduce_perf" ] && perf=$tests_dir/build/all_reduce_perf
fi
[ -n "$perf" ] || echo "gpu-bench: no all_reduce_perf (set NCCL_TESTS_DIR to a nccl-tests checkout; cloning needs the network): mpu's rows alone" >&2

flags=(-b "$minbytes" -e "$maxbytes" -f "$step" -n "$iters" -w "$warmup" -d "$dtype" -o "$op" -c 1)
out=$dir/gpu-bench
mkdir -p "$out"
rm -f "$out"/*.txt
failed=0
for ((r = 0; r < rounds; r++)); do # interleaved: the first tool alternates
  order=(mpu nccl)
  ((r % 2)) && order=(nccl mpu)
  for tool in "${order[@]}"; do
    if [ "$tool" = mpu ]; then
      "$mpu" bench --backend nccl -t "$gpus" -g 1 --columns nccl-tests "${flags[@]}" \
        >"$out/mpu.$r.txt" 2>&1 || { echo "gpu-bench: mpu bench failed:" >&2; cat "$out/mpu.$r.txt" >&2; failed=1; }
    elif [ -n "$perf" ]; then
      "$perf" -g "$gpus" "${flags[@]}" >"$out/nccl.$r.txt" 2>&1 ||
        { echo "gpu-bench: all_reduce_perf failed:" >&2; cat "$out/nccl.$r.txt" >&2; failed=1; }
    fi
  done
done

echo
echo "gpu-bench: all_reduce $dtype $op, $gpus x $gpu_name, $rounds interleaved round(s), median out-of-place time"
echo "  ${nccl_line#-- }"
[ -n "$perf" ] && echo "  nccl-tests: $perf"
gpu_bench_table "$out" || failed=1
exit $failed
