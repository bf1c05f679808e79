/*
 * gpu_regions.c - the mpu/mappings.py walkthrough on GPU buffers: tp = the
 * visible GPUs (one thread rank each), the parallel state's tp group on NCCL,
 * tensors in device memory (mpu_comm_mem_alloc), moved in and out with
 * mpu_comm_copy2d. Checks copy_to, reduce_from, scatter_to and gather_from,
 * forward and backward, against the values derived in test_regions.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpu.h"

#define CHECK(cond, ...)                                 \
  do {                                                   \
    if (!(cond)) {                                       \
      fprintf(stderr, "gpu_regions rank %d: ", r);       \
      fprintf(stderr, __VA_ARGS__);                      \
      fprintf(stderr, " (%s)\n", mpu_last_error());      \
      return MPU_ERR_INTERNAL;                           \
    }                                                    \
  } while (0)

static mpu_tensor vec(void *d, int n) {
  mpu_tensor t;
  int64_t s[1] = {n};
  mpu_tensor_init(&t, d, MPU_FLOAT32, 1, s);
  return t;
}

static mpu_result_t walk(mpu_state *s, void *arg) {
  (void)arg;
  int r, T, tr;
  mpu_comm *tp;
  mpu_comm_rank(mpu_state_world(s), &r);
  CHECK(!mpu_state_enable_nccl(s, NULL), "enable NCCL");
  CHECK(!mpu_state_comm(s, MPU_GROUP_TP, &tp), "tp group");
  mpu_state_tp_size(s, &T);
  mpu_state_tp_rank(s, &tr);
  void *da = NULL, *db = NULL;
  CHECK(!mpu_comm_mem_alloc(tp, 64 * sizeof(float), &da) &&
            !mpu_comm_mem_alloc(tp, 64 * sizeof(float), &db), "device memory");
  float h[64], out[64];
  size_t f = sizeof(float);
  /* copy_to forward is the identity; backward all-reduces: sum of the tp ranks */
  h[0] = (float)r;
  CHECK(!mpu_comm_copy2d(tp, da, f, h, f, f, 1), "copy in");
  mpu_tensor x = vec(da, 1), y = vec(db, 1);
  CHECK(!mpu_region_forward(MPU_COPY_TO_TP, tp, &x, &y), "copy_to forward");
  CHECK(!mpu_comm_copy2d(tp, out, f, db, f, f, 1) && out[0] == (float)r, "copy_to: %g", out[0]);
  CHECK(!mpu_region_backward(MPU_COPY_TO_TP, tp, &x, &y, 0), "copy_to backward");
  CHECK(!mpu_comm_copy2d(tp, out, f, db, f, f, 1), "copy out");
  float group_sum = (float)(T * (r - tr) + T * (T - 1) / 2);
  CHECK(out[0] == group_sum, "copy_to backward: %g, want %g", out[0], group_sum);
  /* reduce_from forward all-reduces */
  CHECK(!mpu_region_forward(MPU_REDUCE_FROM_TP, tp, &x, &y), "reduce_from");
  CHECK(!mpu_comm_copy2d(tp, out, f, db, f, f, 1) && out[0] == group_sum, "reduce_from: %g", out[0]);
  /* scatter_to [1..T] keeps element tr; gather_from brings them back */
  for (int k = 0; k < T; k++) h[k] = (float)(k + 1);
  CHECK(!mpu_comm_copy2d(tp, da, (size_t)T * f, h, (size_t)T * f, (size_t)T * f, 1), "copy in");
  x = vec(da, T), y = vec(db, 1);
  CHECK(!mpu_region_forward(MPU_SCATTER_TO_TP, tp, &x, &y), "scatter_to");
  CHECK(!mpu_comm_copy2d(tp, out, f, db, f, f, 1) && out[0] == (float)(tr + 1), "scatter_to: %g",
        out[0]);
  mpu_tensor part = vec(db, 1), whole = vec(da, T);
  CHECK(!mpu_region_forward(MPU_GATHER_FROM_TP, tp, &part, &whole), "gather_from");
  CHECK(!mpu_comm_copy2d(tp, out, (size_t)T * f, da, (size_t)T * f, (size_t)T * f, 1), "copy out");
  for (int k = 0; k < T; k++) CHECK(out[k] == (float)(k + 1), "gather_from [%d]: %g", k, out[k]);
  mpu_comm_mem_free(tp, da);
  mpu_comm_mem_free(tp, db);
  return MPU_SUCCESS;
}

int main(int argc, char **argv) {
  int gpus = argc > 1 ? atoi(argv[1]) : 1;
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  c.world_size = gpus;
  c.tp = gpus;
  mpu_result_t r = mpu_with_state(gpus, &c, 1, walk, NULL, NULL, NULL);
  if (r) {
    fprintf(stderr, "gpu_regions: %s: %s\n", mpu_result_name(r), mpu_last_error());
    return 1;
  }
  printf("gpu_regions: copy_to, reduce_from, scatter_to, gather_from on %d GPU(s): OK\n", gpus);
  return 0;
}
