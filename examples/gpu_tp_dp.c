/*
 * gpu_tp_dp.c - what a C/CUDA training program (llm.c style) does with mpu on
 * GPUs: one process (or thread) per GPU, Megatron's parallel state with tp x
 * dp, NCCL communicators for its groups, device buffers.
 *
 * One step of a column + row parallel MLP's communication, with the GEMMs
 * left to the program's own kernels: the row-parallel output is all-reduced
 * over tp (reduce_from_tensor_model_parallel_region), the gradients are
 * averaged over dp, asynchronously, while the program would go on with the
 * next layer's backward. The host twins of the groups do CPU-side work (here:
 * agree on the loss).
 *
 *   mpirun -n 4 ./gpu_tp_dp --tp 2 --mpi          one GPU per process
 *   RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
 *     ./gpu_tp_dp --tp 2 --env &                  torchrun-style, per rank
 *   ./gpu_tp_dp --tp 2 --threads 4                one thread per GPU
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpu.h"

#define CHECK(call)                                                                    \
  do {                                                                                 \
    mpu_result_t r_ = (call);                                                          \
    if (r_) {                                                                          \
      fprintf(stderr, "%s: %s: %s\n", #call, mpu_result_name(r_), mpu_last_error());   \
      return r_;                                                                       \
    }                                                                                  \
  } while (0)

enum { HIDDEN = 1024 };

/* sum of one double over comm: straight from host memory on a host
 * communicator (the twin), through device memory on an NCCL one without a
 * twin (a world from torchrun's variables): NCCL takes no host pointers. */
static mpu_result_t host_sum(mpu_comm *comm, double *value) {
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  CHECK(mpu_comm_capabilities(comm, &caps));
  if (caps.memory == MPU_MEMORY_HOST)
    return mpu_comm_all_reduce(comm, value, value, 1, MPU_FLOAT64, MPU_SUM);
  double *dev = NULL;
  CHECK(mpu_comm_mem_alloc(comm, sizeof *dev, (void **)&dev));
  mpu_result_t r = mpu_comm_copy2d(comm, dev, sizeof *dev, value, sizeof *dev, sizeof *dev, 1);
  if (!r) r = mpu_comm_all_reduce(comm, dev, dev, 1, MPU_FLOAT64, MPU_SUM);
  if (!r) r = mpu_comm_copy2d(comm, value, sizeof *dev, dev, sizeof *dev, sizeof *dev, 1);
  mpu_comm_mem_free(comm, dev);
  return r;
}

/* One rank's step, on a parallel state whose groups are NCCL communicators. */
static mpu_result_t step(mpu_state *s) {
  int rank, tp, dp;
  mpu_comm *tp_comm, *dp_comm, *dp_host;
  CHECK(mpu_comm_rank(mpu_state_world(s), &rank));
  CHECK(mpu_state_comm(s, MPU_GROUP_TP, &tp_comm));
  CHECK(mpu_state_comm(s, MPU_GROUP_DP, &dp_comm));
  CHECK(mpu_state_tp_size(s, &tp));
  CHECK(mpu_state_dp_size(s, &dp));
  float host[HIDDEN];
  void *partial = NULL, *grad = NULL;
  CHECK(mpu_comm_mem_alloc(tp_comm, sizeof host, &partial)); /* device memory */
  CHECK(mpu_comm_mem_alloc(dp_comm, sizeof host, &grad));
  /* the program's kernels would write these; here the host fills them */
  for (int i = 0; i < HIDDEN; i++) host[i] = (float)(rank + 1);
  CHECK(mpu_comm_copy2d(tp_comm, partial, sizeof host, host, sizeof host, sizeof host, 1));
  CHECK(mpu_comm_copy2d(dp_comm, grad, sizeof host, host, sizeof host, sizeof host, 1));

  /* forward: the row-parallel layer's partial sums, reduced over tp */
  mpu_tensor x, y;
  int64_t shape[1] = {HIDDEN};
  CHECK(mpu_tensor_init(&x, partial, MPU_FLOAT32, 1, shape));
  CHECK(mpu_tensor_init(&y, partial, MPU_FLOAT32, 1, shape));
  CHECK(mpu_region_forward(MPU_REDUCE_FROM_TP, tp_comm, &x, &y));

  /* backward: gradients averaged over dp without waiting (the program's next
   * kernels would run here, on other streams) */
  mpu_request *req;
  CHECK(mpu_comm_iall_reduce(dp_comm, grad, grad, HIDDEN, MPU_FLOAT32, MPU_AVG, &req));
  CHECK(mpu_request_wait(req));

  /* CPU-side work on the host twin: every rank agrees on a loss */
  CHECK(mpu_state_host_comm(s, MPU_GROUP_DP, &dp_host));
  double total = rank;
  CHECK(host_sum(dp_host, &total));

  CHECK(mpu_comm_copy2d(tp_comm, host, sizeof host, partial, sizeof host, sizeof host, 1));
  float got = host[0];
  CHECK(mpu_comm_mem_free(tp_comm, partial));
  CHECK(mpu_comm_mem_free(dp_comm, grad));
  int tp_rank;
  CHECK(mpu_state_tp_rank(s, &tp_rank));
  float want = 0; /* the tp group is rank - tp_rank .. + tp - 1 (Megatron's layout) */
  for (int k = 0; k < tp; k++) want += (float)(rank - tp_rank + k + 1);
  if (got != want) {
    fprintf(stderr, "rank %d: tp all-reduce gave %g, want %g\n", rank, got, want);
    return MPU_ERR_INTERNAL;
  }
  if (rank == 0) printf("gpu_tp_dp: tp %d x dp %d on NCCL: step done\n", tp, dp);
  return MPU_SUCCESS;
}

static int tp_size = 1;

static mpu_result_t on_world(mpu_comm *world, void *arg) {
  (void)arg;
  mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
  cfg.world_size = 0; /* from the communicator */
  cfg.tp = tp_size;
  mpu_state *s = NULL;
  CHECK(mpu_state_init(world, &cfg, &s));
  mpu_result_t r = mpu_state_enable_nccl(s, NULL); /* NCCL groups, host twins kept */
  if (!r) r = step(s);
  mpu_state_destroy(s);
  return r;
}

int main(int argc, char **argv) {
  const char *mode = "--threads";
  int threads = 2;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--tp") && i + 1 < argc) tp_size = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) mode = argv[i], threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--mpi") || !strcmp(argv[i], "--env")) mode = argv[i];
    else {
      fprintf(stderr, "usage: gpu_tp_dp [--tp N] [--threads N | --mpi | --env]\n");
      return 2;
    }
  }
  if (!mpu_nccl_available()) {
    fprintf(stderr, "gpu_tp_dp: this build of mpu has no NCCL backend\n");
    return 1;
  }
  mpu_result_t r;
  if (!strcmp(mode, "--mpi")) { /* one GPU per process; the MPI world is the host twin */
    mpu_comm *world = NULL;
    r = mpu_comm_mpi_world(&argc, &argv, &world);
    if (!r) r = on_world(world, NULL);
    mpu_comm_destroy(world);
    mpu_mpi_finalize();
  } else if (!strcmp(mode, "--env")) { /* no MPI: torchrun's variables */
    mpu_comm *world = NULL;
    mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
    cfg.world_size = 0;
    cfg.tp = tp_size;
    mpu_state *s = NULL;
    r = mpu_comm_nccl_from_env(NULL, &world);
    if (!r) r = mpu_state_init(world, &cfg, &s); /* groups by ncclCommSplit */
    if (!r) r = step(s);
    mpu_state_destroy(s);
    mpu_comm_destroy(world);
  } else {
    r = mpu_launch(threads, on_world, NULL, NULL, NULL);
  }
  if (r) fprintf(stderr, "gpu_tp_dp: %s: %s\n", mpu_result_name(r), mpu_last_error());
  return r ? 1 : 0;
}
