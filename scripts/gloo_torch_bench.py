"""torch's ProcessGroupGloo timed the way mpu bench times a collective, for
scripts/bench-vs-gloo.sh: every process of a torchrun-style job (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by the caller) runs WARMUP then
ITERS all_reduce calls of BYTES bytes of float32 (sum, out of place as a
copy would cost: in place, as torch's all_reduce is), and rank 0 prints one
JSON line: the slowest rank's mean time per call and the median of the
per-call times. Exits 77 with one line when torch is not installed.

Usage: python gloo_torch_bench.py BYTES ITERS [WARMUP]
"""
import json
import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("gloo_torch_bench.py: torch is not installed: skipped")
    sys.exit(77)

nbytes, iters = int(sys.argv[1]), int(sys.argv[2])
warmup = int(sys.argv[3]) if len(sys.argv) > 3 else max(iters // 10, 2)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.ones(max(nbytes // 4, 1), dtype=torch.float32)
for _ in range(warmup):
    dist.all_reduce(x)
dist.barrier()
times = []
start = time.perf_counter()
for _ in range(iters):
    t = time.perf_counter()
    dist.all_reduce(x)
    times.append(time.perf_counter() - t)
total = time.perf_counter() - start
slowest = torch.tensor([total / iters * 1e6, sorted(times)[len(times) // 2] * 1e6])
dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
if rank == 0:
    print(json.dumps({"bytes": nbytes, "ranks": world, "mean_us": slowest[0].item(),
                      "median_us": slowest[1].item(), "torch": torch.__version__}))
dist.destroy_process_group()
