/*
 * test_conformance_gpu.c - the conformance suite on real GPUs through NCCL:
 * one thread rank per visible GPU, buffers in CUDA managed memory (the host
 * fills and checks them, NCCL moves them). Cases that need what NCCL does
 * not have are skipped and listed; the argument checks run too (stack
 * buffers refused before any kernel). Built wherever CUDA
 * and NCCL are found; run by scripts/gpu-test.sh on a machine with a GPU.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "conformance/conformance.h"

typedef struct run_arg {
  const conf_case *c;
  conf_suite *suite;
} run_arg;

static mpu_result_t on_gpu(mpu_comm *world, void *arg) {
  run_arg *a = arg;
  mpu_comm *nc = NULL;
  mpu_result_t r = mpu_comm_nccl_create(world, NULL, &nc);
  if (r) return r;
  r = a->c->fn(nc, a->suite);
  mpu_result_t d = mpu_comm_destroy(nc);
  return r ? r : d;
}

int main(void) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    fprintf(stderr, "test_conformance_gpu: no CUDA device\n");
    return 1;
  }
  conf_alloc = conf_managed_alloc;
  conf_free = conf_managed_free;
  static conf_suite suite;
  int passed = 0, failed = 0, skipped = 0;
  unsigned cannot = CONF_NEEDS_EXACT | CONF_NEEDS_P2P_MATCH | CONF_NEEDS_EAGER_SEND;
  for (const conf_case *c = conf_cases; c->name; c++) {
    if (c->needs & cannot) {
      printf("[ SKIPPED  ] %s\n", c->name);
      skipped++;
      continue;
    }
    for (int n = 1; n <= gpus; n *= 2) {
      memset(&suite, 0, sizeof suite);
      run_arg a = {c, &suite};
      mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
      o.timeout_s = 120;
      mpu_result_t r = mpu_launch(n, on_gpu, &a, NULL, &o);
      if (r) {
        printf("[  FAILED  ] %s with %d GPU ranks: %s: %s\n", c->name, n, mpu_result_name(r),
               mpu_last_error());
        for (int k = 0; k < n; k++)
          if (suite.message[k][0]) printf("    %s\n", suite.message[k]);
        failed++;
      } else {
        printf("[       OK ] %s with %d GPU ranks\n", c->name, n);
        passed++;
      }
    }
  }
  printf("conformance on %d GPU(s): %d passed, %d failed, %d skipped\n", gpus, passed, failed,
         skipped);
  return failed ? 1 : 0;
}
