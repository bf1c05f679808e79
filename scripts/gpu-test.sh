#!/usr/bin/env bash
# On a machine with NVIDIA GPUs: build mpu with the real CUDA runtime and NCCL,
# then run on every visible GPU (NCCL allows one rank per GPU, so one GPU means
# one rank, and it must still pass):
#   1. the conformance suite on the NCCL backend (thread ranks, managed memory)
#   2. the region walkthrough on device tensors (tp = the GPUs)
#   3. docs/gpu.md's tp x dp program (thread ranks; and under mpirun if present)
#   4. mpu bench --backend nccl, nccl-tests' columns
# and print a summary. Exit 1 if any step failed, 2 if there is no GPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/gpu-common.sh
. scripts/gpu-common.sh
gpu_require gpu-test
dir=build-gpu
gpu_build gpu-test "$dir"

declare -a names results
run() { # name, command...
  local name=$1; shift
  echo "==> $name" >&2
  if "$@"; then results+=("PASS"); else results+=("FAIL"); fi
  names+=("$name")
}
tp=1
while ((tp * 2 <= gpus)); do tp=$((tp * 2)); done
run "conformance on NCCL ($gpus GPU(s))" "$dir/bin/test_conformance_gpu"
run "regions on device tensors (tp $tp)" "$dir/bin/gpu_regions" "$tp"
run "tp x dp program, $gpus thread rank(s)" "$dir/bin/example_gpu_tp_dp" --tp "$tp" --threads "$gpus"
if command -v mpirun >/dev/null; then
  run "tp x dp program, mpirun -n $gpus" mpirun --allow-run-as-root --oversubscribe -n "$gpus" \
    "$dir/bin/example_gpu_tp_dp" --tp "$tp" --mpi
fi
run "mpu bench --backend nccl -t $gpus" "$dir/bin/mpu" bench --backend nccl -t "$gpus" -g 1 \
  --collective all_reduce,all_gather,reduce_scatter,broadcast,all_to_all -b 8 -e 256M -f 4

echo
echo "gpu-test summary ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $gpus GPU(s)):"
failed=0
for i in "${!names[@]}"; do
  printf '  %-4s %s\n' "${results[$i]}" "${names[$i]}"
  [ "${results[$i]}" = PASS ] || failed=1
done
exit $failed
