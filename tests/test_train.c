/*
 * test_train.c - parameter buffers, bucketed gradient reduction, AdamW plain
 * and distributed (ZeRO-1), gradient-norm clipping.
 *
 * On 8 thread ranks (tp 2 x dp 4): every rank's gradients are a known
 * function of its rank, so the expected update is computed here on one rank,
 * element by element, from the definitions (average over dp, norm over the
 * tensor-parallel partitions counting duplicates once, clip, torch's AdamW);
 * the plain and the distributed optimizer must both reach it, with buckets
 * of several sizes, shards of unequal lengths, and the caller's memory.
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

#include "mpu.h"

#define MPU_CHECK_OR(call)             \
  do {                                 \
    mpu_result_t r_ = (call);          \
    if (r_) return r_;                 \
  } while (0)

enum { TP = 2, DP = 4, STEPS = 4 };
static const size_t sizes[3] = {37, 5, 3}; /* w (partitioned), bias and norm (duplicates) */

static void build(mpu_param_buffer *b, int tp_rank, float *data, float *grad) {
  mpu_param_buffer_init(b, tp_rank);
  int i;
  assert_int_equal(mpu_param_buffer_add(b, "w", sizes[0], MPU_PARAM_PARTITIONED(0, 1), &i), 0);
  assert_int_equal(mpu_param_buffer_add(b, "bias", sizes[1], MPU_PARAM_DUPLICATE, &i), 0);
  assert_int_equal(mpu_param_buffer_no_decay(b, i), 0);
  assert_int_equal(mpu_param_buffer_add(b, "norm", sizes[2], MPU_PARAM_DUPLICATE, &i), 0);
  assert_int_equal(mpu_param_buffer_no_decay(b, i), 0);
  assert_int_equal(mpu_param_buffer_finalize(b, data, grad), 0);
}

/* the starting value of element j of parameter p on tensor rank t, and the
 * gradient of data rank d at step s (duplicates: equal on both tensor ranks) */
static float init_value(int p, size_t j, int t) {
  return 0.1f * (float)(p + 1) + 0.01f * (float)j + (p == 0 ? 0.5f * (float)t : 0.0f);
}
static float grad_value(int p, size_t j, int t, int d, int s) {
  return (p == 0 ? (float)(t + 1) : 1.0f) * sinf(0.3f * (float)(j + 1) + (float)d + 0.7f * (float)s) *
         (float)(d + 1);
}

typedef struct run_args {
  int distributed;
  size_t bucket_bytes;
  int caller_memory;
  float result[TP][128]; /* each tensor rank's final parameters, from data rank 0 */
  float norms[STEPS];
  int overlap; /* plain: reduce each parameter's gradients with mpu_grad_all_reduce_start,
                * last parameter first (as a backward finishes them), then grads_reduced */
} run_args;

static mpu_result_t rank_fn(mpu_state *s, void *arg) {
  run_args *a = arg;
  int tp, dp;
  mpu_comm *dpc, *mp, *world = mpu_state_world(s);
  if (mpu_state_tp_rank(s, &tp) || mpu_state_dp_rank(s, &dp) ||
      mpu_state_comm(s, MPU_GROUP_DP, &dpc) || mpu_state_comm(s, MPU_GROUP_MP, &mp))
    return MPU_ERR_INTERNAL;
  float data[128], grad[128];
  mpu_param_buffer b;
  build(&b, tp, a->caller_memory ? data : NULL, a->caller_memory ? grad : NULL);
  if (b.numel > 128) return mpu_fail(MPU_ERR_INTERNAL, "the test's arrays hold 128 elements");
  if (a->caller_memory) memset(grad, 0, sizeof grad), memset(data, 0, sizeof data);
  for (int p = 0; p < 3; p++)
    for (size_t j = 0; j < sizes[p]; j++) mpu_param_data(&b, p)[j] = init_value(p, j, tp);
  mpu_adamw_options o = MPU_ADAMW_OPTIONS_INIT;
  o.lr = 0.05f, o.weight_decay = 0.1f, o.clip_grad = 2.0f, o.sync.bucket_bytes = a->bucket_bytes;
  mpu_optimizer opt;
  mpu_result_t r = mpu_optimizer_init(&opt, &b, dpc, a->distributed, &o);
  for (int step = 0; step < STEPS && !r; step++) {
    mpu_param_buffer_zero_grad(&b);
    for (int p = 0; p < 3; p++)
      for (size_t j = 0; j < sizes[p]; j++) mpu_param_grad(&b, p)[j] = grad_value(p, j, tp, dp, step);
    float norm;
    if (a->overlap && !r) {
      mpu_request *req[3] = {NULL, NULL, NULL};
      size_t end = b.numel;
      for (int p = 2; p >= 0 && !r; p--) {
        r = mpu_grad_all_reduce_start(&b, dpc, &o.sync, b.params[p].offset, end, &req[p]);
        end = b.params[p].offset;
      }
      for (int p = 0; p < 3; p++)
        if (req[p]) {
          mpu_result_t w = mpu_request_wait(req[p]);
          if (!r) r = w;
        }
      if (!r) r = mpu_optimizer_set_grads_reduced(&opt, 1);
    }
    /* the norm spans what each rank holds: the model-parallel group for the
     * plain optimizer, every rank (dp x tp) for the distributed one */
    r = mpu_optimizer_step(&opt, a->distributed ? world : mp, &norm);
    if (!r && dp == 0 && tp == 0) a->norms[step] = norm;
  }
  if (!r && dp == 0) memcpy(a->result[tp], b.data, b.numel * sizeof(float));
  mpu_optimizer_free(&opt);
  mpu_param_buffer_free(&b);
  return r;
}

/* The expected parameters of tensor rank t, on one rank, from the definitions. */
static void expected(float out[TP][128], float norms[STEPS]) {
  mpu_param_buffer b;
  build(&b, 0, NULL, NULL);
  float p[TP][128] = {{0}}, m[TP][128] = {{0}}, v[TP][128] = {{0}};
  for (int t = 0; t < TP; t++)
    for (int q = 0; q < 3; q++)
      for (size_t j = 0; j < sizes[q]; j++) p[t][b.params[q].offset + j] = init_value(q, j, t);
  for (int s = 0; s < STEPS; s++) {
    float g[TP][128] = {{0}};
    double sq = 0;
    for (int t = 0; t < TP; t++)
      for (int q = 0; q < 3; q++)
        for (size_t j = 0; j < sizes[q]; j++) {
          double sum = 0;
          for (int d = 0; d < DP; d++) sum += grad_value(q, j, t, d, s) / (float)DP;
          g[t][b.params[q].offset + j] = (float)sum;
          if (q == 0 || t == 0) sq += sum * sum; /* duplicates once */
        }
    float norm = (float)sqrt(sq), clip = 2.0f / (norm + 1e-6f);
    norms[s] = norm;
    if (clip > 1) clip = 1;
    float bc1 = 1 - powf(0.9f, (float)(s + 1)), bc2 = 1 - powf(0.999f, (float)(s + 1));
    for (int t = 0; t < TP; t++)
      for (int q = 0; q < 3; q++)
        for (size_t j = 0; j < sizes[q]; j++) {
          size_t e = b.params[q].offset + j;
          float gg = g[t][e] * clip, decay = q == 0 ? 1.0f : 0.0f;
          p[t][e] -= 0.05f * 0.1f * decay * p[t][e];
          m[t][e] = 0.9f * m[t][e] + 0.1f * gg;
          v[t][e] = 0.999f * v[t][e] + 0.001f * gg * gg;
          p[t][e] -= 0.05f / bc1 * m[t][e] / (sqrtf(v[t][e]) / sqrtf(bc2) + 1e-8f);
        }
  }
  memcpy(out, p, sizeof p);
  mpu_param_buffer_free(&b);
}

static void run(run_args *a) {
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  c.tp = TP;
  assert_int_equal(mpu_with_state(TP * DP, &c, 1, rank_fn, a, NULL, NULL), MPU_SUCCESS);
}

static void test_plain_and_zero1_match_the_definition(void **state) {
  (void)state;
  float want[TP][128], want_norms[STEPS];
  expected(want, want_norms);
  mpu_param_buffer layout;
  build(&layout, 0, NULL, NULL);
  const size_t buckets[] = {64, 100, 4, 40000000}; /* 16 elements, uneven, one element, one bucket */
  for (int distributed = 0; distributed < 2; distributed++)
    for (size_t k = 0; k < sizeof buckets / sizeof buckets[0]; k++) {
      run_args a = {distributed, buckets[k], k == 1, {{0}}, {0}, 0};
      run(&a);
      for (int s = 0; s < STEPS; s++)
        if (fabsf(a.norms[s] - want_norms[s]) > 1e-5f * want_norms[s])
          fail_msg("%s, bucket %zu: step %d norm %g, want %g", distributed ? "ZeRO-1" : "plain",
                   buckets[k], s, a.norms[s], want_norms[s]);
      for (int t = 0; t < TP; t++)
        for (int q = 0; q < 3; q++)
          for (size_t j = 0; j < sizes[q]; j++) {
            size_t e = layout.params[q].offset + j;
            if (fabsf(a.result[t][e] - want[t][e]) > 1e-5f)
              fail_msg("%s, bucket %zu: tp %d %s[%zu] = %.7g, want %.7g",
                       distributed ? "ZeRO-1" : "plain", buckets[k], t, layout.params[q].name, j,
                       a.result[t][e], want[t][e]);
          }
    }
  mpu_param_buffer_free(&layout);
}

/* Reduces started range by range and waited before the step give the
 * parameters of the optimizer's own reduce, bit for bit: each element is the
 * same sum of the same scaled values. */
static void test_overlapped_reduce_equals_plain(void **state) {
  (void)state;
  run_args plain = {0, 64, 0, {{0}}, {0}, 0}, over = {0, 64, 0, {{0}}, {0}, 1};
  run(&plain);
  run(&over);
  assert_memory_equal(plain.result, over.result, sizeof plain.result);
  assert_memory_equal(plain.norms, over.norms, sizeof plain.norms);
}

static void test_zero1_equals_plain(void **state) {
  (void)state;
  run_args plain = {0, 64, 0, {{0}}, {0}, 0}, zero = {1, 64, 0, {{0}}, {0}, 0};
  run(&plain);
  run(&zero);
  for (int t = 0; t < TP; t++)
    for (int e = 0; e < 128; e++)
      if (fabsf(plain.result[t][e] - zero.result[t][e]) > 1e-6f)
        fail_msg("tp %d element %d: plain %.9g, ZeRO-1 %.9g", t, e, plain.result[t][e],
                 zero.result[t][e]);
}

static void test_bad_input(void **state) {
  (void)state;
  mpu_param_buffer b;
  mpu_param_buffer_init(&b, 0);
  assert_int_equal(mpu_param_buffer_finalize(&b, NULL, NULL), MPU_ERR_INVALID_USAGE); /* empty */
  assert_int_equal(mpu_param_buffer_add(&b, "x", 0, MPU_PARAM_DUPLICATE, NULL),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_param_buffer_add(&b, "x", (size_t)1 << 41, MPU_PARAM_DUPLICATE, NULL),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_param_buffer_add(&b, "x", 4, MPU_PARAM_PARTITIONED(-1, 1), NULL),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_param_buffer_add(&b, "x", 4, MPU_PARAM_DUPLICATE, NULL), 0);
  mpu_comm *fake;
  assert_int_equal(mpu_comm_fake_create(0, 1, &fake), 0);
  assert_int_equal(mpu_grad_all_reduce(&b, fake, NULL), MPU_ERR_INVALID_USAGE); /* not finalized */
  assert_int_equal(mpu_param_buffer_finalize(&b, NULL, NULL), 0);
  assert_int_equal(mpu_param_buffer_add(&b, "y", 4, MPU_PARAM_DUPLICATE, NULL),
                   MPU_ERR_INVALID_USAGE);
  assert_null(mpu_param_data(&b, 1));
  mpu_adamw_options o = MPU_ADAMW_OPTIONS_INIT;
  o.beta1 = 1.0f;
  mpu_optimizer opt;
  assert_int_equal(mpu_optimizer_init(&opt, &b, fake, 1, &o), MPU_ERR_INVALID_ARGUMENT);
  o.beta1 = 0.9f;
  assert_int_equal(mpu_optimizer_init(&opt, &b, fake, 1, &o), 0);
  float before = mpu_param_data(&b, 0)[0] = 1.0f;
  mpu_param_grad(&b, 0)[2] = NAN; /* a non-finite norm: an error, and no update */
  float norm;
  assert_int_equal(mpu_optimizer_step(&opt, NULL, &norm), MPU_ERR_INVALID_ARGUMENT);
  assert_true(mpu_param_data(&b, 0)[0] == before);
  /* a range out of the buffer, an empty one, no request */
  mpu_request *req = (mpu_request *)&b;
  assert_int_equal(mpu_grad_all_reduce_start(&b, fake, NULL, 0, b.numel + 1, &req),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_null(req);
  assert_int_equal(mpu_grad_all_reduce_start(&b, fake, NULL, 2, 2, &req), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_grad_all_reduce_start(&b, fake, NULL, 0, 1, NULL), MPU_ERR_INVALID_ARGUMENT);
  /* the distributed optimizer reduce-scatters itself: it refuses reduced gradients */
  mpu_param_grad(&b, 0)[2] = 0;
  assert_int_equal(mpu_optimizer_set_grads_reduced(&opt, 1), MPU_ERR_INVALID_USAGE);
  assert_non_null(strstr(mpu_last_error(), "grads_reduced"));
  assert_int_equal(opt.grads_reduced, 0);
  assert_int_equal(mpu_optimizer_set_grads_reduced(&opt, 0), MPU_SUCCESS);
  assert_int_equal(mpu_optimizer_step(&opt, NULL, &norm), MPU_SUCCESS);
  mpu_optimizer_free(&opt);
  mpu_param_buffer_free(&b);
  mpu_comm_destroy(fake);
}

/* A step of several optimizers refuses one given twice, two over one buffer
 * and a step count that cannot grow (negative, or INT64_MAX), before any
 * gradient is reduced or any parameter changed. */
static void test_step_all_refusals(void **state) {
  (void)state;
  mpu_comm *fake;
  assert_int_equal(mpu_comm_fake_create(0, 1, &fake), 0);
  mpu_param_buffer a, b;
  mpu_param_buffer_init(&a, 0), mpu_param_buffer_init(&b, 0);
  assert_int_equal(mpu_param_buffer_add(&a, "p", 4, MPU_PARAM_DUPLICATE, NULL), 0);
  assert_int_equal(mpu_param_buffer_add(&b, "q", 4, MPU_PARAM_DUPLICATE, NULL), 0);
  assert_int_equal(mpu_param_buffer_finalize(&a, NULL, NULL), 0);
  assert_int_equal(mpu_param_buffer_finalize(&b, NULL, NULL), 0);
  mpu_optimizer oa, ob, oa2;
  assert_int_equal(mpu_optimizer_init(&oa, &a, fake, 0, NULL), 0);
  assert_int_equal(mpu_optimizer_init(&ob, &b, fake, 0, NULL), 0);
  assert_int_equal(mpu_optimizer_init(&oa2, &a, fake, 1, NULL), 0); /* a again, ZeRO-1 */
  for (int j = 0; j < 4; j++) mpu_param_data(&a, 0)[j] = 1.0f, mpu_param_grad(&a, 0)[j] = 0.5f;
  mpu_optimizer *twice[2] = {&oa, &oa}, *same_buffer[3] = {&ob, &oa, &oa2}, *two[2] = {&oa, &ob};
  assert_int_equal(mpu_optimizer_step_all(twice, 2, NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "optimizers 0 and 1"));
  assert_int_equal(mpu_optimizer_step_all(same_buffer, 3, NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "optimizers 1 and 2"));
  ob.step = INT64_MAX;
  assert_int_equal(mpu_optimizer_step_all(two, 2, NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "optimizer 1"));
  ob.step = -1;
  assert_int_equal(mpu_optimizer_step_all(two, 2, NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
  for (int j = 0; j < 4; j++)
    assert_true(mpu_param_data(&a, 0)[j] == 1.0f && mpu_param_grad(&a, 0)[j] == 0.5f);
  assert_int_equal(oa.step, 0);
  ob.step = INT64_MAX - 1;
  assert_int_equal(mpu_optimizer_step_all(two, 2, NULL, NULL), 0); /* the last step that counts */
  assert_true(ob.step == INT64_MAX && oa.step == 1 && mpu_param_data(&a, 0)[0] != 1.0f);
  mpu_optimizer_free(&oa), mpu_optimizer_free(&ob), mpu_optimizer_free(&oa2);
  mpu_param_buffer_free(&a), mpu_param_buffer_free(&b);
  mpu_comm_destroy(fake);
}

/* ---- activation recompute --------------------------------------------------------------- */

enum { RH = 16 };

typedef struct block {
  mpu_state *s;
  float w[RH * RH], x[RH], pre[RH], mask[RH], y[RH];
  int dropped; /* the activations were thrown away */
} block;

/* y = dropout(tanh(W x)), the mask from the model-parallel stream (p = 0.3) */
static mpu_result_t block_forward(void *user) {
  block *b = user;
  mpu_rng *mp;
  MPU_CHECK_OR(mpu_rng_tracker_fork(mpu_state_rng_tracker(b->s), MPU_MODEL_PARALLEL_RNG, &mp));
  for (int o = 0; o < RH; o++) {
    float acc = 0;
    for (int i = 0; i < RH; i++) acc += b->w[o * RH + i] * b->x[i];
    b->pre[o] = tanhf(acc);
    b->mask[o] = mpu_rng_uniform(mp) < 0.3f ? 0.0f : 1.0f / 0.7f;
    b->y[o] = b->pre[o] * b->mask[o];
  }
  b->dropped = 0;
  return MPU_SUCCESS;
}

/* loss = sum_o (o + 1) y_o: dW */
static void block_backward(const block *b, float *dw) {
  for (int o = 0; o < RH; o++) {
    float ds = (float)(o + 1) * b->mask[o] * (1 - b->pre[o] * b->pre[o]);
    for (int i = 0; i < RH; i++) dw[o * RH + i] += ds * b->x[i];
  }
}

/* one training step of the block, other work drawing from the stream
 * between its forward and backward; *after is the stream's next number */
static void step_block(int recompute, float *dw, uint64_t *after) {
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  c.world_size = 2, c.tp = 2;
  block *b = calloc(1, sizeof *b);
  assert_non_null(b);
  assert_int_equal(mpu_state_mock(1, &c, 1234, &b->s), MPU_SUCCESS);
  for (int i = 0; i < RH * RH; i++) b->w[i] = 0.2f * sinf((float)i);
  for (int i = 0; i < RH; i++) b->x[i] = cosf((float)i);
  mpu_recompute ck;
  if (recompute) {
    assert_int_equal(mpu_recompute_forward(&ck, b->s, block_forward, b), MPU_SUCCESS);
    memset(b->pre, 0, sizeof b->pre), memset(b->mask, 0, sizeof b->mask); /* dropped */
    b->dropped = 1;
  } else {
    assert_int_equal(block_forward(b), MPU_SUCCESS);
  }
  mpu_rng *mp;
  assert_int_equal(mpu_rng_tracker_fork(mpu_state_rng_tracker(b->s), MPU_MODEL_PARALLEL_RNG, &mp), 0);
  for (int i = 0; i < 7; i++) mpu_rng_next(mp); /* another layer's dropout */
  mpu_rng_next(mpu_state_default_rng(b->s));
  if (recompute) assert_int_equal(mpu_recompute_replay(&ck, b->s, block_forward, b), 0);
  assert_false(b->dropped);
  memset(dw, 0, RH * RH * sizeof *dw);
  block_backward(b, dw);
  assert_int_equal(mpu_rng_tracker_fork(mpu_state_rng_tracker(b->s), MPU_MODEL_PARALLEL_RNG, &mp), 0);
  *after = mpu_rng_next(mp) ^ mpu_rng_next(mpu_state_default_rng(b->s));
  mpu_state_destroy(b->s);
  free(b);
}

static void test_recompute_gives_the_same_gradients(void **state) {
  (void)state;
  float plain[RH * RH], again[RH * RH];
  uint64_t after_plain, after_again;
  step_block(0, plain, &after_plain);
  step_block(1, again, &after_again);
  assert_memory_equal(plain, again, sizeof plain); /* the same dropout mask, bit for bit */
  assert_true(after_plain == after_again);         /* and the streams go on as without */
  int zeros = 0;
  for (int i = 0; i < RH * RH; i += RH) zeros += plain[i] == 0.0f;
  assert_true(zeros > 0 && zeros < RH); /* dropout did drop some */
  mpu_recompute ck;
  memset(&ck, 0, sizeof ck);
  assert_int_equal(mpu_recompute_replay(&ck, NULL, block_forward, NULL), MPU_ERR_INVALID_USAGE);
}

/* A parameter the caller writes between steps is the one the next step
 * updates. p = 1, gradient 1, lr 0.1, no decay or clipping: the first step
 * gives 0.9 (m^ = 1, v^ = 1). Set p = 5 and step with a zero gradient:
 * m = 0.09, v = 0.000999, bias corrections 0.19 and 0.001999, so
 * m^ / sqrt(v^) = 0.473684 / 0.706929 = 0.670049 and p = 5 - 0.0670049 =
 * 4.932995 (torch.optim.AdamW gives the same); an optimizer that kept its own
 * copy would give 0.9 - 0.067 = 0.833. */
static void test_step_reads_what_the_caller_wrote(void **state) {
  (void)state;
  for (int distributed = 0; distributed < 2; distributed++) {
    mpu_comm *one;
    assert_int_equal(mpu_comm_fake_create(0, 1, &one), 0);
    mpu_param_buffer b;
    mpu_param_buffer_init(&b, 0);
    int i;
    assert_int_equal(mpu_param_buffer_add(&b, "p", 1, MPU_PARAM_DUPLICATE, &i), 0);
    assert_int_equal(mpu_param_buffer_finalize(&b, NULL, NULL), 0);
    mpu_adamw_options o = MPU_ADAMW_OPTIONS_INIT;
    o.lr = 0.1f, o.weight_decay = 0, o.clip_grad = 0;
    mpu_optimizer opt;
    assert_int_equal(mpu_optimizer_init(&opt, &b, one, distributed, &o), 0);
    *mpu_param_data(&b, i) = 1.0f, *mpu_param_grad(&b, i) = 1.0f;
    assert_int_equal(mpu_optimizer_step(&opt, NULL, NULL), 0);
    assert_float_equal(*mpu_param_data(&b, i), 0.9f, 1e-6);
    *mpu_param_data(&b, i) = 5.0f, *mpu_param_grad(&b, i) = 0.0f;
    assert_int_equal(mpu_optimizer_step(&opt, NULL, NULL), 0);
    assert_float_equal(*mpu_param_data(&b, i), 4.932995f, 1e-5);
    mpu_shard held;
    assert_int_equal(mpu_optimizer_param_shard(&opt, i, &held), 0);
    assert_int_equal(held.nspans, 1);
    assert_true(held.spans[0].lo == 0 && held.spans[0].hi == 1 && held.spans[0].at == 0);
    assert_true(held.ndim == 1 && held.shape[0] == 1 && held.nboxes == 1);
    assert_int_equal(mpu_optimizer_param_shard(&opt, 1, &held), MPU_ERR_INVALID_ARGUMENT);
    mpu_optimizer_free(&opt);
    mpu_param_buffer_free(&b);
    mpu_comm_destroy(one);
  }
}

/* A buffer of 2 MiB or more, and the optimizer's moments of it, start on a
 * 2 MiB boundary (for transparent huge pages: core/memory.h) and zeroed; the
 * step updates every element of it, the last as the first. */
static void test_large_buffers_on_huge_page_boundaries(void **state) {
  (void)state;
  const size_t n = (size_t)1 << 20, huge = (size_t)2 << 20; /* 4 MiB of floats */
  mpu_comm *one;
  assert_int_equal(mpu_comm_fake_create(0, 1, &one), 0);
  mpu_param_buffer b;
  mpu_param_buffer_init(&b, 0);
  int small, big;
  assert_int_equal(mpu_param_buffer_add(&b, "small", 3, MPU_PARAM_DUPLICATE, &small), 0);
  assert_int_equal(mpu_param_buffer_add(&b, "big", n, MPU_PARAM_DUPLICATE, &big), 0);
  assert_int_equal(mpu_param_buffer_finalize(&b, NULL, NULL), 0);
  assert_int_equal((uintptr_t)b.data % huge, 0);
  assert_int_equal((uintptr_t)b.grad % huge, 0);
  for (size_t i = 0; i < b.numel; i++) assert_true(b.data[i] == 0.0f && b.grad[i] == 0.0f);
  mpu_adamw_options o = MPU_ADAMW_OPTIONS_INIT;
  o.lr = 0.1f, o.weight_decay = 0, o.clip_grad = 0;
  mpu_optimizer opt;
  assert_int_equal(mpu_optimizer_init(&opt, &b, one, 0, &o), 0);
  assert_int_equal((uintptr_t)opt.m % huge, 0);
  assert_int_equal((uintptr_t)opt.v % huge, 0);
  float *p = mpu_param_data(&b, big), *g = mpu_param_grad(&b, big);
  for (size_t i = 0; i < n; i++) p[i] = 1.0f, g[i] = 1.0f;
  assert_int_equal(mpu_optimizer_step(&opt, NULL, NULL), 0);
  assert_float_equal(p[0], 0.9f, 1e-6);
  assert_float_equal(p[n - 1], 0.9f, 1e-6);
  assert_true(mpu_param_data(&b, small)[2] == 0.0f); /* no gradient: AdamW moves it nowhere */
  mpu_optimizer_free(&opt);
  mpu_param_buffer_free(&b);
  mpu_comm_destroy(one);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_step_reads_what_the_caller_wrote),
      cmocka_unit_test(test_large_buffers_on_huge_page_boundaries),
      cmocka_unit_test(test_plain_and_zero1_match_the_definition),
      cmocka_unit_test(test_zero1_equals_plain),
      cmocka_unit_test(test_overlapped_reduce_equals_plain),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_step_all_refusals),
      cmocka_unit_test(test_recompute_gives_the_same_gradients),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
