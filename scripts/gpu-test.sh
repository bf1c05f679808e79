#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, from the folder scripts/gpu-prepare.sh
# built on a CPU machine (gpu-kit/, carried with the repository): no
# compiler, network or package registry needed, at most 8 minutes. NCCL is
# the machine's: a system libnccl.so.2, else the one in PyTorch's wheel
# (python3 -c 'import nvidia.nccl'). Runs, on every visible GPU:
#   1. gpu_checks: NCCL runtime vs header; pointer kinds and mpu's refusals;
#      stream ordering behind a 100 ms host function on the legacy, blocking,
#      non-blocking and mpu_comm_set_stream paths; a non-blocking split's
#      *newcomm; shared against unshared resources (order and abort); graph
#      capture of an mpu call
#   1b. the creation deadline: rank 0 of 2 under torchrun's variables while
#      the other joins the store and never calls NCCL
#   1c. gpu_device_paths: NCCL's one-rank pre-multiplying sum in mpu's pieces
#      (redistribute's device scaling), mpu_redistribute on cudaMalloc buffers,
#      mpu_pipeline_run_tensors with bfloat16/int8/float64 boundaries
#   2. the conformance suite on the NCCL backend (thread ranks, managed memory)
#   3. the region walkthrough on device tensors (tp = the GPUs)
#   4. docs/gpu.md's tp x dp program (thread ranks; under mpirun if the kit
#      and the machine have MPI)
#   5. mpu bench --backend nccl beside nccl-tests' all_reduce_perf
#   6. mpu's TCPStore against PyTorch's TCPStore and torchrun
# and writes OUT/gpu-test.log (everything) and OUT/gpu-summary.md (for
# docs/gpu.md); OUT is $OUT, else gpu-test-out/. KIT names another kit
# folder, NCCL_LIB_DIR the folder of the libnccl.so.2 to use. Exit 0 if every step
# passed, 1 if one failed or the kit cannot run here (one line says why),
# 2 if there is no GPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=scripts/gpu-common.sh
. scripts/gpu-common.sh
gpu_require gpu-test
kit=$(cd "${KIT:-gpu-kit}" 2>/dev/null && pwd || echo "${KIT:-gpu-kit}")
out=${OUT:-gpu-test-out}
budget=${BUDGET_S:-480} # the whole run
start=$SECONDS
[ -f "$kit/KIT" ] || { echo "gpu-test: no $kit (run scripts/gpu-prepare.sh on a CPU machine and bring the folder)" >&2; exit 1; }
mkdir -p "$out"
log=$out/gpu-test.log summary=$out/gpu-summary.md
: >"$log"
kit_line() { sed -n "s/^$1 //p" "$kit/KIT"; }

# ---- can the kit run here: C library, CUDA driver, an NCCL --------------------------
glibc_here=$(ldd --version 2>/dev/null | head -1 | grep -o '[0-9]\+\.[0-9]\+$')
glibc_needed=$(kit_line glibc_needed)
if [ -n "$glibc_needed" ] && [ "$(printf '%s\n%s\n' "$glibc_needed" "$glibc_here" | sort -V | head -1)" != "$glibc_needed" ]; then
  echo "gpu-test: the kit needs glibc $glibc_needed, this machine has $glibc_here (build it on an older system)" >&2
  exit 1
fi
driver_cuda=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)
if [ -n "$driver_cuda" ] && [ "${driver_cuda%%.*}" -lt "$(kit_line cuda_major)" ]; then
  echo "gpu-test: the kit's CUDA runtime is $(kit_line cuda_major).x, the driver supports CUDA $driver_cuda (build the kit against an older toolkit: CUDA_HOME)" >&2
  exit 1
fi
nccl_dir=""
system_nccl=$({ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | sed -n 's/.*libnccl\.so\.2 .*=> //p' | head -1)
if [ -n "${NCCL_LIB_DIR:-}" ]; then
  nccl_dir=$NCCL_LIB_DIR
  nccl_from="NCCL_LIB_DIR ($nccl_dir/libnccl.so.2)"
elif [ -n "$system_nccl" ]; then
  nccl_from="system ($system_nccl)"
else
  nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  if [ -z "$nccl_dir" ] || [ ! -e "$nccl_dir/libnccl.so.2" ]; then
    echo "gpu-test: no libnccl.so.2 (neither the system's nor PyTorch's nvidia.nccl wheel)" >&2
    exit 1
  fi
  nccl_from="PyTorch's wheel ($nccl_dir/libnccl.so.2)"
fi
# a group of one through NCCL too: on one GPU every call then runs NCCL's kernels (docs/gpu.md)
export MPU_NCCL_ONE_RANK=1
export LD_LIBRARY_PATH=$kit/lib${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)

# ---- the steps: each under what is left of the budget ---------------------------------
declare -a names results times
step() { # name, limit_s, command...
  local name=$1 limit=$2 left rc t0=$SECONDS
  shift 2
  left=$((budget - (SECONDS - start) - 10))
  ((limit > left)) && limit=$left
  if ((limit < 5)); then
    names+=("$name") results+=("SKIP (no time left)") times+=(0)
    return
  fi
  echo "==> $name (limit ${limit}s): $*" >>"$log"
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  case $rc in
  0) results+=("PASS") ;;
  77) results+=("SKIP") ;;
  124 | 137) results+=("FAIL (timed out after ${limit}s)") ;;
  *) results+=("FAIL (exit $rc)") ;;
  esac
  names+=("$name") times+=($((SECONDS - t0)))
  echo "<== $name: ${results[-1]}" >>"$log"
}
skip() { names+=("$1") results+=("SKIP: $2") times+=(0); echo "<== $1: SKIP: $2" >>"$log"; }

tp=1
while ((tp * 2 <= gpus)); do tp=$((tp * 2)); done
step "gpu_checks (runtime, pointers, order, split, share, graph)" 60 "$kit/bin/gpu_checks" --unordered
# the same order check with 32 hardware queues instead of CUDA's 8: two streams
# on one queue serialise whatever NCCL does (the raw NCCL baseline shows it)
step "gpu_checks share, CUDA_DEVICE_MAX_CONNECTIONS=32" 30 env CUDA_DEVICE_MAX_CONNECTIONS=32 "$kit/bin/gpu_checks" share
port=$((20000 + $$ % 20000))
# shellcheck disable=SC2016 # the inner shell expands them
step "creation deadline, a silent second rank" 40 bash -c \
  'export MASTER_ADDR=127.0.0.1 MASTER_PORT=$1 WORLD_SIZE=2
   RANK=1 LOCAL_RANK=1 "$0/store_peer" silent 15 & RANK=0 LOCAL_RANK=0 "$0/gpu_checks" deadline; rc=$?; wait; exit $rc' \
  "$kit/bin" "$port"
step "device paths (scale, dtensor, pipeline)" 60 "$kit/bin/gpu_device_paths"
step "conformance on NCCL ($gpus GPU(s))" 150 "$kit/bin/test_conformance_gpu"
step "regions on device tensors (tp $tp)" 60 "$kit/bin/gpu_regions" "$tp"
step "tp x dp program, $gpus thread rank(s)" 60 "$kit/bin/example_gpu_tp_dp" --tp "$tp" --threads "$gpus"
if ! command -v mpirun >/dev/null; then
  skip "tp x dp program under mpirun" "no mpirun on this machine"
elif [ ! -e "$kit/lib/libmpu_mpi.so.0" ]; then
  skip "tp x dp program under mpirun" "the kit has no MPI backend"
else
  step "tp x dp program, mpirun -n $gpus" 60 mpirun --allow-run-as-root --oversubscribe -n "$gpus" \
    "$kit/bin/example_gpu_tp_dp" --tp "$tp" --mpi
fi
bench=$out/bench
mkdir -p "$bench"
flags=(-b 8 -e 64M -f 4 -n 20 -w 5 -d float -o sum -c 1)
# shellcheck disable=SC2016 # the inner shell expands them (timeout runs a program, not a function)
step "mpu bench --backend nccl -t $gpus (all_reduce)" 90 \
  bash -o pipefail -c '"$0" bench --backend nccl -t "$1" -g 1 --columns nccl-tests "${@:3}" | tee "$2/mpu.0.txt"' \
  "$kit/bin/mpu" "$gpus" "$bench" "${flags[@]}"
if [ -x "$kit/bin/all_reduce_perf" ]; then
  # shellcheck disable=SC2016
  step "nccl-tests all_reduce_perf -g $gpus" 90 \
    bash -o pipefail -c '"$0" -g "$1" "${@:3}" | tee "$2/nccl.0.txt"' "$kit/bin/all_reduce_perf" "$gpus" "$bench" "${flags[@]}"
else
  skip "nccl-tests all_reduce_perf" "the kit has none ($(kit_line nccl_tests))"
fi
step "store: mpu's TCPStore against PyTorch's" 90 python3 "$kit/share/test_store_torch.py" "$kit/bin/store_peer"

# ---- the summary ----------------------------------------------------------------------
failed=0
{
  echo "### One-GPU run, $(date -u +%Y-%m-%d)"
  echo
  echo "- GPU: $gpus x $gpu_name, driver $driver (CUDA $driver_cuda)"
  echo "- NCCL: $nccl_from; $(grep -m1 '^PASS runtime\|^FAIL runtime' "$log" | sed 's/^[A-Z]* runtime: //')"
  echo "- kit: $(kit_line built)"
  echo "- $(grep 'NCCL backend on' "$kit/KIT")"
  echo "- took $((SECONDS - start)) s"
  echo
  echo '| step | result | s |'
  echo '|---|---|---|'
  for i in "${!names[@]}"; do
    echo "| ${names[$i]} | ${results[$i]} | ${times[$i]} |"
    case ${results[$i]} in FAIL*) failed=1 ;; esac
  done
  echo
  echo '```'
  grep -E '^(PASS|FAIL|INFO) ' "$log" | cut -c1-200
  echo
  echo "all_reduce float sum, $gpus GPU(s), one round, out-of-place time:"
  gpu_bench_table "$bench"
  echo '```'
} >"$summary"
cat "$summary"
echo "gpu-test: the whole log is $log"
exit $failed
