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

# Rows of nccl-tests' table: size count type redop root time algbw busbw #wrong (out of
# place) then the same for in place. Per tool and size: the median over rounds of the
# out-of-place time and its busbw, and the largest #wrong.
summarize() { # tool -> "size time busbw wrong" per size
  cat "$out/$1".*.txt 2>/dev/null | awk '
    $1 ~ /^[0-9]+$/ && NF >= 13 { n[$1]++; t[$1, n[$1]] = $6; b[$1, n[$1]] = $8
                                  if (!($1 in w) || $9 + 0 > w[$1] + 0) w[$1] = $9 }
    END {
      for (s in n) {
        m = n[s]
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++)
          if (t[s, j] < t[s, i]) { x = t[s, i]; t[s, i] = t[s, j]; t[s, j] = x; y = b[s, i]; b[s, i] = b[s, j]; b[s, j] = y }
        k = int((m + 1) / 2)
        print s, t[s, k], b[s, k], w[s]
      }
    }' | sort -k1,1 # join wants its key sorted as text
}
summarize mpu >"$out/mpu.sum"
summarize nccl >"$out/nccl.sum"

echo
echo "gpu-bench: all_reduce $dtype $op, $gpus x $gpu_name, $rounds interleaved round(s), median out-of-place time"
echo "  ${nccl_line#-- }"
[ -n "$perf" ] && echo "  nccl-tests: $perf"
printf '%12s  %12s %10s %7s  %12s %10s %7s  %8s\n' size "mpu us" "busbw" wrong "nccl us" "busbw" wrong "mpu/nccl"
join -a 1 -e - -o 0,1.2,1.3,1.4,2.2,2.3,2.4 "$out/mpu.sum" "$out/nccl.sum" 2>/dev/null |
  awk '{ ratio = ($5 == "-" || $5 + 0 == 0) ? "-" : sprintf("%.2f", $2 / $5)
         printf "%12s  %12s %10s %7s  %12s %10s %7s  %8s\n", $1, $2, $3, $4, $5, $6, $7, ratio }' | sort -n
[ -s "$out/mpu.sum" ] || failed=1
exit $failed
