# shellcheck shell=bash
# What scripts/gpu-test.sh and scripts/gpu-bench.sh share (source it; NAME is
# the calling script's name for its messages).

# gpu_require NAME: exit 2 with one line unless nvidia-smi finds a GPU; sets gpus.
gpu_require() {
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "$1: no NVIDIA GPU here (nvidia-smi finds none)" >&2
    exit 2
  fi
  # shellcheck disable=SC2034 # read by the caller
  gpus=$(nvidia-smi -L | wc -l)
}

# gpu_build NAME DIR [TARGET...]: configure DIR (Release) with the real CUDA
# runtime and NCCL, exit 1 with the configure log when they are not found, and
# build the targets (all without any); sets nccl_line to the configure's
# "NCCL backend on" line.
gpu_build() {
  local name=$1 dir=$2
  shift 2
  command -v cmake >/dev/null || bash scripts/deps.sh
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release >"$dir.configure.log" 2>&1 || {
    cat "$dir.configure.log"; exit 1; }
  # shellcheck disable=SC2034 # read by the caller
  nccl_line=$(grep "NCCL backend on" "$dir.configure.log") || {
    echo "$name: CUDA/NCCL not found"; cat "$dir.configure.log"; exit 1; }
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$dir" -j"$(nproc)" "${targets[@]}" >/dev/null || exit 1
}

# gpu_bench_table DIR: mpu's and nccl-tests' tables side by side, from
# DIR/mpu.*.txt and DIR/nccl.*.txt (one file per round, nccl-tests' columns).
# Rows of nccl-tests' table: size count type redop root time algbw busbw #wrong
# (out of place) then the same for in place. Per tool and size: the median over
# rounds of the out-of-place time and its busbw, and the largest #wrong.
# Returns 1 when mpu has no rows.
gpu_bench_table() {
  local dir=$1
  _gpu_summarize() { # tool -> "size time busbw wrong" per size
    cat "$dir/$1".*.txt 2>/dev/null | awk '
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
  _gpu_summarize mpu >"$dir/mpu.sum"
  _gpu_summarize nccl >"$dir/nccl.sum"
  printf '%12s  %12s %10s %7s  %12s %10s %7s  %8s\n' size "mpu us" "busbw" wrong "nccl us" "busbw" wrong "mpu/nccl"
  join -a 1 -e - -o 0,1.2,1.3,1.4,2.2,2.3,2.4 "$dir/mpu.sum" "$dir/nccl.sum" 2>/dev/null |
    awk '{ ratio = ($5 == "-" || $5 + 0 == 0) ? "-" : sprintf("%.2f", $2 / $5)
           printf "%12s  %12s %10s %7s  %12s %10s %7s  %8s\n", $1, $2, $3, $4, $5, $6, $7, ratio }' | sort -n
  [ -s "$dir/mpu.sum" ]
}
