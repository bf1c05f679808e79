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
  gpt_config cfg = {16, 8, 2, 2, SEQ, 0.1f, 3, GPT_RECOMPUTE_FULL, 0};
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

/* Three micro-batches in flight (all forwards, then the backwards in
 * reverse, as a pipeline's warm-up and cool-down run them) under each
 * recompute mode: the losses and every gradient equal the whole-chunk
 * recompute's bit for bit, since a forward run again computes the same. */
static void run_modes(int recompute, int layers, double *losses, float *grads, size_t *numel) {
  enum { MB = 3, LAYERS = 3 };
  mpu_comm *alone;
  assert_int_equal(mpu_comm_fake_create(0, 1, &alone), MPU_SUCCESS);
  gpt_config cfg = {16, 8, 2, LAYERS, SEQ, 0.2f, 5, recompute, layers};
  gpt_ctx ctx;
  assert_int_equal(gpt_ctx_init(&ctx, &cfg, alone, 0), MPU_SUCCESS);
  ctx.key = 0x5678;
  gpt_chunk c;
  assert_int_equal(gpt_chunk_create(&ctx, &c, 0, 1), MPU_SUCCESS);
  assert_int_equal(gpt_chunk_frames(&ctx, &c, MB), MPU_SUCCESS);
  int whole = gpt_chunk_whole_recompute(&ctx, &c);
  assert_int_equal(whole, recompute == GPT_RECOMPUTE_FULL && (layers == 0 || layers >= LAYERS));
  assert_true(whole ? c.nframes == 0 : c.nframes == MB);
  for (size_t i = 0; i < c.params.numel; i++) c.params.data[i] += 0.1f * sinf(0.37f * (float)i);
  int64_t ids[MB][SEQ], targets[MB][SEQ];
  for (int m = 0; m < MB; m++)
    for (int t = 0; t < SEQ; t++) ids[m][t] = (m * 5 + t * 3) % 16, targets[m][t] = (m + t * 7) % 16;
  mpu_param_buffer_zero_grad(&c.params);
  for (int m = 0; m < MB; m++) {
    gpt_chunk_use_frame(&c, m);
    losses[m] = 0;
    assert_int_equal(gpt_chunk_forward(&ctx, &c, m, ids[m], targets[m], NULL, NULL, &losses[m]),
                     MPU_SUCCESS);
  }
  for (int m = MB - 1; m >= 0; m--) {
    gpt_chunk_use_frame(&c, m);
    double again = 0; /* the demo's whole-chunk recompute: the forward once more */
    if (whole) assert_int_equal(gpt_chunk_forward(&ctx, &c, m, ids[m], targets[m], NULL, NULL, &again), MPU_SUCCESS);
    assert_int_equal(gpt_chunk_backward(&ctx, &c, NULL, NULL, 1.0f / SEQ), MPU_SUCCESS);
  }
  *numel = c.params.numel;
  memcpy(grads, c.params.grad, c.params.numel * sizeof(float));
  /* what each keeps: none > selective > full of some blocks > the whole chunk's input */
  size_t keep[4] = {gpt_saved_floats(&ctx, LAYERS, 1, 1, GPT_RECOMPUTE_NONE, 0),
                    gpt_saved_floats(&ctx, LAYERS, 1, 1, GPT_RECOMPUTE_SELECTIVE, 0),
                    gpt_saved_floats(&ctx, LAYERS, 1, 1, GPT_RECOMPUTE_FULL, 2),
                    gpt_saved_floats(&ctx, LAYERS, 1, 1, GPT_RECOMPUTE_FULL, 0)};
  assert_true(keep[0] > keep[1] && keep[1] > keep[2] && keep[2] > keep[3]);
  assert_int_equal(keep[3], (size_t)SEQ * 8);
  gpt_chunk_free(&c);
  mpu_comm_destroy(alone);
}

static void test_recompute_modes_agree(void **state) {
  (void)state;
  enum { MAXP = 1 << 14 };
  static float ref[MAXP], got[MAXP];
  double ref_loss[3], loss[3];
  size_t n_ref, n;
  run_modes(GPT_RECOMPUTE_FULL, 0, ref_loss, ref, &n_ref);
  assert_true(n_ref <= MAXP);
  int modes[4][2] = {{GPT_RECOMPUTE_NONE, 0}, {GPT_RECOMPUTE_SELECTIVE, 0}, {GPT_RECOMPUTE_FULL, 1},
                     {GPT_RECOMPUTE_FULL, 2}};
  for (int k = 0; k < 4; k++) {
    run_modes(modes[k][0], modes[k][1], loss, got, &n);
    assert_int_equal(n, n_ref);
    for (int m = 0; m < 3; m++)
      if (loss[m] != ref_loss[m]) fail_msg("mode %d/%d: micro-batch %d loss %.9g vs %.9g", modes[k][0], modes[k][1], m, loss[m], ref_loss[m]);
    for (size_t i = 0; i < n; i++)
      if (got[i] != ref[i]) fail_msg("mode %d/%d: gradient %zu %.9g vs %.9g", modes[k][0], modes[k][1], i, got[i], ref[i]);
  }
  assert_int_equal(gpt_recompute_parse("selective"), GPT_RECOMPUTE_SELECTIVE);
  assert_int_equal(gpt_recompute_parse("some"), -1);
}

/* Micro-batches run in turn (F0 B0 F1 B1 ..., the demo without pipelining)
 * on `frames` sets of activations, micro-batch m on set m % frames: the
 * losses and gradients. */
static void run_in_turn(int recompute, int frames, double *losses, float *grads, size_t cap,
                        size_t *numel) {
  enum { MB = 3 };
  mpu_comm *alone;
  assert_int_equal(mpu_comm_fake_create(0, 1, &alone), MPU_SUCCESS);
  gpt_config cfg = {16, 8, 2, 2, SEQ, 0.2f, 7, recompute, recompute == GPT_RECOMPUTE_FULL ? 1 : 0};
  gpt_ctx ctx;
  assert_int_equal(gpt_ctx_init(&ctx, &cfg, alone, 0), MPU_SUCCESS);
  ctx.key = 0x9abc;
  gpt_chunk c;
  assert_int_equal(gpt_chunk_create(&ctx, &c, 0, 1), MPU_SUCCESS);
  assert_int_equal(gpt_chunk_frames(&ctx, &c, frames), MPU_SUCCESS);
  assert_int_equal(c.nframes, frames);
  for (size_t i = 0; i < c.params.numel; i++) c.params.data[i] += 0.1f * sinf(0.41f * (float)i);
  mpu_param_buffer_zero_grad(&c.params);
  for (int m = 0; m < MB; m++) {
    int64_t ids[SEQ], targets[SEQ];
    for (int t = 0; t < SEQ; t++) ids[t] = (m * 3 + t * 5) % 16, targets[t] = (m + t * 11) % 16;
    gpt_chunk_use_frame(&c, m % frames);
    losses[m] = 0;
    assert_int_equal(gpt_chunk_forward(&ctx, &c, m, ids, targets, NULL, NULL, &losses[m]), MPU_SUCCESS);
    gpt_chunk_use_frame(&c, m % frames);
    assert_int_equal(gpt_chunk_backward(&ctx, &c, NULL, NULL, 1.0f / SEQ), MPU_SUCCESS);
  }
  *numel = c.params.numel;
  assert_true(c.params.numel <= cap);
  memcpy(grads, c.params.grad, c.params.numel * sizeof(float));
  gpt_chunk_free(&c);
  mpu_comm_destroy(alone);
}

/* What the demo without pipelining relies on: one set of activations for
 * every micro-batch gives what one set per micro-batch gives, bit for bit,
 * under every recompute mode that keeps activations. */
static void test_one_frame_in_turn(void **state) {
  (void)state;
  enum { MAXP = 1 << 14 };
  static float ref[MAXP], got[MAXP];
  double ref_loss[3], loss[3];
  int modes[3] = {GPT_RECOMPUTE_NONE, GPT_RECOMPUTE_SELECTIVE, GPT_RECOMPUTE_FULL};
  for (int k = 0; k < 3; k++) {
    size_t n_ref, n;
    run_in_turn(modes[k], 3, ref_loss, ref, MAXP, &n_ref);
    run_in_turn(modes[k], 1, loss, got, MAXP, &n);
    assert_int_equal(n, n_ref);
    for (int m = 0; m < 3; m++)
      if (loss[m] != ref_loss[m]) fail_msg("mode %d: micro-batch %d loss %.9g vs %.9g", modes[k], m, loss[m], ref_loss[m]);
    for (size_t i = 0; i < n; i++)
      if (got[i] != ref[i]) fail_msg("mode %d: gradient %zu %.9g vs %.9g", modes[k], i, got[i], ref[i]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_gradient_against_differences),
                                     cmocka_unit_test(test_recompute_modes_agree),
                                     cmocka_unit_test(test_one_frame_in_turn)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
