/*
 * test_gpt.c - the small GPT of `mpu demo gpt` (tools/mpu/gpt.c) on one
 * rank: its gradient, parameter by parameter, against central differences of
 * its loss (dropout on: the masks are fixed by the step's key), so that the
 * demo's check against one rank rests on a model whose backward is right.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpt.h"

enum { SEQ = 6 };

static double loss_of(gpt_ctx *ctx, gpt_chunk *c, const int64_t *ids, const int64_t *targets) {
  double sum = 0;
  assert_int_equal(gpt_chunk_forward(ctx, c, 0, ids, targets, NULL, NULL, &sum), MPU_SUCCESS);
  return sum / SEQ;
}

static void test_gradient_against_differences(void **state) {
  (void)state;
  mpu_comm *alone;
  assert_int_equal(mpu_comm_fake_create(0, 1, &alone), MPU_SUCCESS);
  gpt_config cfg = {16, 8, 2, 2, SEQ, 0.1f, 3};
  gpt_ctx ctx;
  assert_int_equal(gpt_ctx_init(&ctx, &cfg, alone, 0), MPU_SUCCESS);
  ctx.key = 0x1234;
  gpt_chunk c;
  assert_int_equal(gpt_chunk_create(&ctx, &c, 0, 1), MPU_SUCCESS);
  /* larger weights than the init's, so every path carries a visible gradient */
  for (size_t i = 0; i < c.params.numel; i++) c.params.data[i] += 0.1f * sinf(0.37f * (float)i);
  int64_t ids[SEQ] = {1, 5, 9, 2, 15, 7}, targets[SEQ] = {5, 9, 2, 15, 7, 3};
  mpu_param_buffer_zero_grad(&c.params);
  loss_of(&ctx, &c, ids, targets);
  assert_int_equal(gpt_chunk_backward(&ctx, &c, NULL, NULL, 1.0f / SEQ), MPU_SUCCESS);
  float *g = malloc(c.params.numel * sizeof(float));
  memcpy(g, c.params.grad, c.params.numel * sizeof(float));
  int checked = 0;
  for (int p = 0; p < c.params.nparams; p++) {
    const mpu_param *mp = &c.params.params[p];
    for (int k = 0; k < 4; k++) { /* four elements of every parameter */
      size_t e = mp->offset + (size_t)((k * 7919 + p * 31) % (int)mp->numel);
      float keep = c.params.data[e], h = 2e-3f;
      c.params.data[e] = keep + h;
      double lp = loss_of(&ctx, &c, ids, targets);
      c.params.data[e] = keep - h;
      double lm = loss_of(&ctx, &c, ids, targets);
      c.params.data[e] = keep;
      double num = (lp - lm) / (2.0 * h), got = g[e];
      if (fabs(num - got) > 1e-3 + 0.05 * fmax(fabs(num), fabs(got)))
        fail_msg("%s[%zu]: backward %.6g, differences %.6g", mp->name, e - mp->offset, got, num);
      checked++;
    }
  }
  assert_true(checked >= 4 * 20);
  free(g);
  gpt_chunk_free(&c);
  mpu_comm_destroy(alone);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_gradient_against_differences)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
