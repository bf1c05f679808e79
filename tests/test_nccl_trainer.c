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
      cmocka_unit_test(fsdp_refuses_nccl),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
