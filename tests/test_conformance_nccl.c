/*
 * test_conformance_nccl.c - the conformance suite on the NCCL backend, linked
 * with the NCCL/CUDA test double (libmpu_nccl_double): 1, 2, 4 and 8 thread
 * ranks, each with its own "GPU", an NCCL communicator made over the threads
 * world (its host twin). The cases' buffers are CUDA managed memory, as on a
 * GPU, with the double's pointer checks on in every case (its device memory
 * faults the host, stack memory faults its kernels); those that need what
 * NCCL does not have are skipped and say so. Then NCCL's own reduction rules, where they
 * differ from mpu's (docs/gpu.md): NaN in min/max, integer avg, float avg.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>

#include "conformance/conformance.h"
#include "nccl_double/switches.h"
#include "test_helpers.h"

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

/* ---- NCCL's reduction rules (src/device/reduce_kernel.h), on the faithful
 * double; with its "reductions" switch, mpu's rules (docs/api.md) ------------ */

typedef struct rules_arg {
  int mpu_rules; /* the double folds by mpu's rules */
  char message[4][256];
} rules_arg;

#define RULE(cond, ...)                                                          \
  do {                                                                           \
    if (!(cond)) {                                                               \
      snprintf(a->message[me], sizeof a->message[me], __VA_ARGS__);              \
      r = MPU_ERR_INTERNAL;                                                      \
      goto out;                                                                  \
    }                                                                            \
  } while (0)

static mpu_result_t rules_rank(mpu_comm *world, void *arg) {
  rules_arg *a = arg;
  mpu_comm *nc = NULL;
  int me = 0, n = 0;
  mpu_result_t r = test_nccl_over(world, NULL, &me, &n, &nc);
  if (r) return r;
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  float *f = NULL;
  int8_t *i8 = NULL;
  uint8_t *u8 = NULL;
  int32_t *i32 = NULL;
  if ((r = mpu_comm_capabilities(nc, &caps))) goto out;
  RULE(!caps.nan_propagates && !caps.exact_int_avg && !caps.exact_reductions,
       "caps: nan_propagates %d, exact_int_avg %d", caps.nan_propagates, caps.exact_int_avg);
  f = conf_managed_alloc(2 * sizeof *f), i8 = conf_managed_alloc(2), u8 = conf_managed_alloc(2),
  i32 = conf_managed_alloc(2 * sizeof *i32);
  RULE(f && i8 && u8 && i32, "managed memory");
  /* min/max with a NaN on rank 0: NCCL's fminf/fmaxf drop it */
  f[0] = me ? 1.0f : NAN, f[1] = me ? 1.0f : NAN;
  if ((r = mpu_comm_all_reduce(nc, f, f, 1, MPU_FLOAT32, MPU_MIN))) goto out;
  if ((r = mpu_comm_all_reduce(nc, f + 1, f + 1, 1, MPU_FLOAT32, MPU_MAX))) goto out;
  if (a->mpu_rules) RULE(isnan(f[0]) && isnan(f[1]), "mpu's min/max: %g %g, want NaN", f[0], f[1]);
  else RULE(f[0] == 1.0f && f[1] == 1.0f, "NCCL's min/max: %g %g, want 1 (fminf)", f[0], f[1]);
  /* integer avg: NCCL sums in the element type (wrapping), then divides */
  i8[0] = 100, u8[0] = 200, i32[0] = me ? -3 : 0;
  if ((r = mpu_comm_all_reduce(nc, i8, i8, 1, MPU_INT8, MPU_AVG))) goto out;
  if ((r = mpu_comm_all_reduce(nc, u8, u8, 1, MPU_UINT8, MPU_AVG))) goto out;
  if ((r = mpu_comm_all_reduce(nc, i32, i32, 1, MPU_INT32, MPU_AVG))) goto out;
  int8_t want8 = a->mpu_rules ? 100 : (int8_t)((int8_t)(100 * n) / n);
  uint8_t wantu8 = a->mpu_rules ? 200 : (uint8_t)((uint8_t)(200 * n) / n);
  int32_t want32 = -3 * (n - 1) / n; /* truncated toward zero under both rules */
  RULE(i8[0] == want8 && u8[0] == wantu8 && i32[0] == want32,
       "int avg over %d: int8 %d (want %d), uint8 %u (want %u), int32 %d (want %d)", n, i8[0],
       want8, u8[0], wantu8, i32[0], want32);
  /* float avg: NCCL multiplies each input by 1/n first, so a sum that would
   * overflow does not */
  f[0] = 3e38f;
  if ((r = mpu_comm_all_reduce(nc, f, f, 1, MPU_FLOAT32, MPU_AVG))) goto out;
  if (a->mpu_rules) RULE(isinf(f[0]), "mpu's avg of 3e38 x %d: %g, want inf", n, f[0]);
  else RULE(fabsf(f[0] - 3e38f) <= 3e38f * 1e-6f, "NCCL's avg of 3e38 x %d: %g", n, f[0]);
out:
  conf_managed_free(f), conf_managed_free(i8), conf_managed_free(u8), conf_managed_free(i32);
  mpu_result_t d = mpu_comm_destroy(nc);
  return r ? r : d;
}

static void nccl_rules(int mpu_rules) {
  for (int n = 2; n <= 4; n += 2) {
    rules_arg a = {mpu_rules, {{0}}};
    assert_int_equal(double_forgive("reductions", mpu_rules), 0);
    mpu_result_t r = mpu_launch(n, rules_rank, &a, NULL, NULL);
    double_forgive("reductions", 0);
    for (int k = 0; k < n; k++)
      if (a.message[k][0]) print_error("rank %d: %s\n", k, a.message[k]);
    if (r) fail_msg("%d ranks: %s: %s", n, mpu_result_name(r), mpu_last_error());
  }
}

static void nccl_reduction_rules(void **state) {
  (void)state;
  nccl_rules(0);
}

/* the switch folds as mpu does: the same checks tell the two apart */
static void mpu_reduction_rules_switch(void **state) {
  (void)state;
  nccl_rules(1);
}

int main(void) {
  struct CMUnitTest tests[32];
  int n = 0;
  if (!mpu_nccl_available()) {
    printf("no NCCL backend in this build\n");
    return 0;
  }
  conf_alloc = conf_managed_alloc;
  conf_free = conf_managed_free;
  for (const conf_case *c = conf_cases; c->name && n < 30; c++)
    tests[n++] = (struct CMUnitTest){c->name, run_case, NULL, NULL, (void *)c};
  tests[n++] = (struct CMUnitTest){"nccl_reduction_rules", nccl_reduction_rules, NULL, NULL, NULL};
  tests[n++] =
      (struct CMUnitTest){"mpu_reduction_rules_switch", mpu_reduction_rules_switch, NULL, NULL, NULL};
  return _cmocka_run_group_tests("conformance_nccl", tests, (size_t)n, NULL, NULL);
}
