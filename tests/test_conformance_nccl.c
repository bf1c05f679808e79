/*
 * test_conformance_nccl.c - the conformance suite on the NCCL backend, linked
 * with the NCCL/CUDA test double (libmpu_nccl_double): 1, 2, 4 and 8 thread
 * ranks, each with its own "GPU", an NCCL communicator made over the threads
 * world (its host twin). Cases that need what NCCL does not have are skipped
 * and say so.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "conformance/conformance.h"

static const int rank_counts[] = {1, 2, 4, 8};

typedef struct nccl_run {
  const conf_case *c;
  conf_suite *suite;
} nccl_run;

static mpu_result_t on_nccl(mpu_comm *world, void *arg) {
  nccl_run *run = arg;
  mpu_comm *nc = NULL;
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.timeout_s = 60;
  mpu_result_t r = mpu_comm_nccl_create(world, &o, &nc);
  if (r) return r;
  r = run->c->fn(nc, run->suite);
  mpu_result_t d = mpu_comm_destroy(nc);
  return r ? r : d;
}

static void run_case(void **state) {
  const conf_case *c = *state;
  static conf_suite suite;
  if (c->needs & (CONF_NEEDS_EXACT | CONF_NEEDS_P2P_MATCH | CONF_NEEDS_EAGER_SEND)) skip();
  for (size_t i = 0; i < sizeof rank_counts / sizeof *rank_counts; i++) {
    int n = rank_counts[i];
    mpu_launch_options opt = MPU_LAUNCH_OPTIONS_INIT;
    opt.timeout_s = 120;
    nccl_run run = {c, &suite};
    memset(&suite, 0, sizeof suite);
    mpu_result_t r = mpu_launch(n, on_nccl, &run, NULL, &opt);
    if (r != MPU_SUCCESS) {
      for (int k = 0; k < n; k++)
        if (suite.message[k][0]) print_error("%s\n", suite.message[k]);
      fail_msg("%s with %d NCCL ranks: %s: %s", c->name, n, mpu_result_name(r), mpu_last_error());
    }
  }
}

int main(void) {
  struct CMUnitTest tests[32];
  int n = 0;
  if (!mpu_nccl_available()) {
    printf("no NCCL backend in this build\n");
    return 0;
  }
  for (const conf_case *c = conf_cases; c->name && n < 32; c++)
    tests[n++] = (struct CMUnitTest){c->name, run_case, NULL, NULL, (void *)c};
  return _cmocka_run_group_tests("conformance_nccl", tests, (size_t)n, NULL, NULL);
}
