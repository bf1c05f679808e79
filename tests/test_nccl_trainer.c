/*
 * test_nccl_trainer.c - the trainer's device path on NCCL communicators, on
 * the faithful test double (device memory the host cannot touch, no
 * forgiving switch): the regions on device tensors are ordered on the
 * stream and return without the host waiting for the device; FSDP, which
 * shards host buffers, refuses an NCCL group in one line naming what it
 * lacks.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <cuda_runtime.h>

#include "mpu.h"

#define TEST_RANK me
#include "test_helpers.h"

static void run(int n, mpu_rank_fn fn, void *arg) {
  memset(messages, 0, sizeof messages);
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 120;
  mpu_result_t r = mpu_launch(n, fn, arg, NULL, &o);
  if (r) {
    for (int k = 0; k < n; k++)
      if (messages[k][0]) print_error("rank %d: %s\n", k, messages[k]);
    fail_msg("%s", mpu_last_error());
  }
}

/* ---- regions ordered on the stream ------------------------------------------------ */

static void *open_later(void *p) {
  struct timespec ts = {3, 0};
  nanosleep(&ts, NULL);
  gate_open(p);
  return NULL;
}

/* Each region behind a long kernel on the legacy default stream (where its
 * input would be computed): the call returns before the kernel ends (the
 * host does not wait for the device, as with ProcessGroupNCCL's
 * async_op=False), and a kernel after it (here a cudaMemcpy on the same
 * stream) sees the result. The gather along the last dim goes through the
 * scratch and strided copies, the scatter through copies alone. */
static mpu_result_t regions_rank(mpu_comm *world, void *arg) {
  (void)arg;
  int me, n;
  mpu_comm *nc = NULL;
  ROK(test_nccl_over(world, NULL, &me, &n, &nc));
  mpu_comm_caps caps = {0};
  caps.size = sizeof caps;
  ROK(mpu_comm_capabilities(nc, &caps));
  RCHECK(cudaSetDevice(caps.device) == cudaSuccess, "device");
  static const mpu_region regions[] = {MPU_REDUCE_FROM_TP, MPU_GATHER_FROM_TP, MPU_SCATTER_TO_TP};
  mpu_result_t r = MPU_SUCCESS;
  for (int k = 0; k < 3 && !r; k++) {
    float in[4] = {0}, out[8] = {0};
    for (int i = 0; i < 4; i++) in[i] = (float)(10 * me + i);
    int m_in = regions[k] == MPU_SCATTER_TO_TP ? 2 * n : 4;
    int m_out = regions[k] == MPU_GATHER_FROM_TP ? 4 * n : regions[k] == MPU_SCATTER_TO_TP ? 2 : 4;
    float *x = NULL, *y = NULL;
    ROK(test_dev_in(nc, in, sizeof in, (void **)&x));
    ROK(test_dev_in(nc, NULL, sizeof out, (void **)&y));
    mpu_tensor tx = test_vec(x, m_in), ty = test_vec(y, m_out);
    gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    pthread_t helper;
    RCHECK(cudaLaunchHostFunc(NULL, gate_hold, &g) == cudaSuccess, "host function");
    RCHECK(!pthread_create(&helper, NULL, open_later, &g), "thread");
    r = mpu_region_forward(regions[k], nc, &tx, &ty);
    int waited = gate_ran(&g);
    cudaError_t e = cudaMemcpy(out, y, (size_t)m_out * sizeof(float), cudaMemcpyDeviceToHost);
    pthread_join(helper, NULL);
    test_dev_out(nc, x, NULL, 0);
    test_dev_out(nc, y, NULL, 0);
    RCHECK(!r, "%s: %s", mpu_region_name(regions[k]), mpu_last_error());
    RCHECK(!waited, "%s: the host waited for the device", mpu_region_name(regions[k]));
    RCHECK(e == cudaSuccess, "copy out");
    for (int i = 0; i < m_out; i++) {
      float want = regions[k] == MPU_REDUCE_FROM_TP   ? (float)(10 * n * (n - 1) / 2 + n * i)
                   : regions[k] == MPU_GATHER_FROM_TP ? (float)(10 * (i / 4) + i % 4)
                                                      : (float)(10 * me + 2 * me + i);
      RCHECK(out[i] == want, "%s [%d]: %g, want %g", mpu_region_name(regions[k]), i, out[i], want);
    }
  }
  mpu_comm_destroy(nc);
  return r;
}

static void regions_stream_ordered(void **state) {
  (void)state;
  run(2, regions_rank, NULL);
}

/* ---- FSDP on an NCCL group ------------------------------------------------------ */

static mpu_result_t fsdp_rank(mpu_comm *world, void *arg) {
  (void)arg;
  int me, n;
  mpu_comm *nc = NULL;
  ROK(test_nccl_over(world, NULL, &me, &n, &nc));
  mpu_param_buffer b;
  mpu_param_buffer_init(&b, 0);
  int i;
  mpu_fsdp *f = NULL;
  mpu_result_t r = mpu_param_buffer_add(&b, "w", 64, MPU_PARAM_DUPLICATE, &i);
  if (!r) r = mpu_fsdp_create(&b, nc, NULL, NULL, &f);
  const char *e = mpu_last_error();
  mpu_fsdp_free(f);
  mpu_param_buffer_free(&b);
  mpu_comm_destroy(nc);
  RCHECK(r == MPU_ERR_INVALID_ARGUMENT && !strchr(e, '\n') && strstr(e, "mpu_fsdp_create") &&
             strstr(e, "host"),
         "FSDP on NCCL: %s: %s", mpu_result_name(r), e);
  return MPU_SUCCESS;
}

static void fsdp_refuses_nccl(void **state) {
  (void)state;
  run(2, fsdp_rank, NULL);
}

int main(void) {
  if (!mpu_nccl_available()) {
    printf("no NCCL backend in this build\n");
    return 0;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(regions_stream_ordered),
      cmocka_unit_test(fsdp_refuses_nccl),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
