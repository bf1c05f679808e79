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
