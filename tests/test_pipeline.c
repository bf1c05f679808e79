/*
 * test_pipeline.c - running Megatron's schedules over a pipeline of thread
 * ranks gives the gradients of no pipelining.
 *
 * A chain of V = pp x vp layers y = tanh(W x + b) (hidden 8) with a squared
 * error loss; chunk c of rank r is layer c x pp + r. For 1F1B (pp 2, 3, 4)
 * and interleaved 1F1B (pp 2 and 4, vp 2 and 3, several micro-batch counts
 * and group sizes), every layer's accumulated gradients must equal those of
 * the same chain run on one rank micro-batch after micro-batch
 * (forward_backward_no_pipelining). Tolerance: none — each layer sees the
 * same inputs and accumulates its micro-batches in the same order, so the
 * floats are bitwise equal.
 *
 * Built with MPU_TEST_NCCL the pipeline runs over NCCL communicators on the
 * test double: the callbacks get device buffers and copy them to and from
 * the host with mpu_comm_copy2d, as a CUDA trainer's kernels would read them.
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

enum { H = 8, MAXV = 12, MAXM = 16 };

#define MPU_CHECK_R(call)      \
  do {                         \
    mpu_result_t r_ = (call);  \
    if (r_) return r_;         \
  } while (0)

typedef struct layer {
  float w[H * H], b[H], dw[H * H], db[H];
} layer;

static void layer_init(layer *l, int v) {
  memset(l, 0, sizeof *l);
  for (int i = 0; i < H * H; i++) l->w[i] = 0.3f * sinf(0.7f * (float)(i + 1) + (float)v);
  for (int i = 0; i < H; i++) l->b[i] = 0.05f * (float)(i - v);
}

static void input_of(int mb, float *x) {
  for (int i = 0; i < H; i++) x[i] = cosf(0.5f * (float)(i + 1) * (float)(mb + 1));
}

static void target_of(int mb, float *t) {
  for (int i = 0; i < H; i++) t[i] = 0.1f * (float)((i + mb) % 5) - 0.2f;
}

static void layer_forward(const layer *l, const float *x, float *y) {
  for (int o = 0; o < H; o++) {
    float s = l->b[o];
    for (int i = 0; i < H; i++) s += l->w[o * H + i] * x[i];
    y[o] = tanhf(s);
  }
}

/* dy: gradient of y; adds to dw, db; dx (may be NULL) */
static void layer_backward(layer *l, const float *x, const float *y, const float *dy, float *dx) {
  float ds[H];
  for (int o = 0; o < H; o++) ds[o] = dy[o] * (1 - y[o] * y[o]);
  for (int o = 0; o < H; o++) {
    l->db[o] += ds[o];
    for (int i = 0; i < H; i++) l->dw[o * H + i] += ds[o] * x[i];
  }
  if (dx)
    for (int i = 0; i < H; i++) {
      float s = 0;
      for (int o = 0; o < H; o++) s += l->w[o * H + i] * ds[o];
      dx[i] = s;
    }
}

/* one rank's model: its chunks' layers and what backward needs */
typedef struct model {
  mpu_comm *dev; /* the pipeline's NCCL communicator: its buffers are device memory */
  int pp, vp, rank, V, forwards, backwards;
  layer layers[MAXV];               /* by chunk */
  float x[MAXM][MAXV][H], y[MAXM][MAXV][H];
} model;

/* H floats between the pipeline's buffers and the host */
static mpu_result_t xfer(const model *m, void *dst, const void *src) {
  if (!m->dev) return memcpy(dst, src, H * sizeof(float)), MPU_SUCCESS;
  return mpu_comm_copy2d(m->dev, dst, H * sizeof(float), src, H * sizeof(float), H * sizeof(float), 1);
}

static mpu_result_t fwd(void *user, int mb, int chunk, const float *input, float *output) {
  model *m = user;
  int v = chunk * m->pp + m->rank;
  if (input) MPU_CHECK_R(xfer(m, m->x[mb][chunk], input));
  else input_of(mb, m->x[mb][chunk]);
  layer_forward(&m->layers[chunk], m->x[mb][chunk], m->y[mb][chunk]);
  if (v < m->V - 1) MPU_CHECK_R(xfer(m, output, m->y[mb][chunk]));
  m->forwards++;
  return MPU_SUCCESS;
}

static mpu_result_t bwd(void *user, int mb, int chunk, const float *grad_output, float *grad_input) {
  model *m = user;
  float dy[H], t[H], dx[H];
  if (grad_output) {
    MPU_CHECK_R(xfer(m, dy, grad_output));
  } else { /* the last layer: the loss 0.5 |y - t|^2 */
    target_of(mb, t);
    for (int i = 0; i < H; i++) dy[i] = m->y[mb][chunk][i] - t[i];
  }
  layer_backward(&m->layers[chunk], m->x[mb][chunk], m->y[mb][chunk], dy, grad_input ? dx : NULL);
  if (grad_input) MPU_CHECK_R(xfer(m, grad_input, dx));
  m->backwards++;
  return MPU_SUCCESS;
}

/* forward_backward_no_pipelining of the whole chain on one rank */
static void reference(int V, int M, layer *layers) {
  for (int v = 0; v < V; v++) layer_init(&layers[v], v);
  for (int mb = 0; mb < M; mb++) {
    float x[MAXV + 1][H], dy[H], dx[H], t[H];
    input_of(mb, x[0]);
    for (int v = 0; v < V; v++) layer_forward(&layers[v], x[v], x[v + 1]);
    target_of(mb, t);
    for (int i = 0; i < H; i++) dy[i] = x[V][i] - t[i];
    for (int v = V - 1; v >= 0; v--) {
      layer_backward(&layers[v], x[v], x[v + 1], dy, v ? dx : NULL);
      memcpy(dy, dx, sizeof dy);
    }
  }
}

typedef struct run {
  mpu_schedule_config cfg;
  layer got[MAXV];  /* every layer after the run, by virtual stage */
  char trace_first[64];
  int trace_lines[8];
} run;

static mpu_result_t rank_fn(mpu_comm *world, void *arg) {
  run *a = arg;
  int rank;
  mpu_comm_rank(world, &rank);
  model *m = calloc(1, sizeof *m);
  if (!m) return MPU_ERR_OUT_OF_MEMORY;
  m->pp = a->cfg.pp, m->vp = a->cfg.vp, m->rank = rank, m->V = m->pp * m->vp;
  for (int c = 0; c < m->vp; c++) layer_init(&m->layers[c], c * m->pp + rank);
  mpu_pipeline *p = NULL;
  char *text = NULL;
  size_t len = 0;
  FILE *trace = open_memstream(&text, &len);
  mpu_pipeline_callbacks cb = {fwd, bwd, m};
  mpu_comm *group = world;
#ifdef MPU_TEST_NCCL
  mpu_result_t made = mpu_comm_nccl_create(world, NULL, &m->dev);
  if (made) {
    free(m);
    return made;
  }
  group = m->dev;
#endif
  mpu_result_t r = mpu_pipeline_create(group, H, &p);
  if (!r) r = mpu_pipeline_run(p, &a->cfg, &cb, trace);
  fclose(trace);
  int lines = 0;
  for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
  a->trace_lines[rank] = lines;
  if (rank == 0 && text) snprintf(a->trace_first, sizeof a->trace_first, "%.*s", 40, text);
  free(text);
  if (!r && (m->forwards != a->cfg.microbatches * m->vp || m->backwards != m->forwards))
    r = mpu_fail(MPU_ERR_INTERNAL, "rank %d ran %d forwards and %d backwards", rank, m->forwards,
                 m->backwards);
  for (int c = 0; c < m->vp; c++) a->got[c * m->pp + rank] = m->layers[c];
  mpu_pipeline_free(p);
  mpu_comm_destroy(m->dev);
  free(m);
  return r;
}

static void check(mpu_schedule_kind kind, int pp, int vp, int M, int group) {
  run *a = calloc(1, sizeof *a);
  mpu_schedule_config c = MPU_SCHEDULE_CONFIG_INIT;
  c.kind = kind, c.pp = pp, c.vp = vp, c.microbatches = M, c.group_size = group;
  a->cfg = c;
  mpu_result_t r = mpu_launch(pp, rank_fn, a, NULL, NULL);
#ifdef MPU_TEST_NCCL
  if (kind == MPU_SCHEDULE_INTERLEAVED && group > pp) { /* refused: NCCL's sends would deadlock */
    if (r != MPU_ERR_UNSUPPORTED || !strstr(mpu_last_error(), "at most pp"))
      fail_msg("pp %d group %d on NCCL: %s (%s)", pp, group, mpu_result_name(r), mpu_last_error());
    free(a);
    return;
  }
#endif
  if (r) fail_msg("%s pp %d vp %d m %d: %s", mpu_schedule_name(kind), pp, vp, M, mpu_last_error());
  layer want[MAXV];
  reference(pp * vp, M, want);
  for (int v = 0; v < pp * vp; v++)
    if (memcmp(want[v].dw, a->got[v].dw, sizeof want[v].dw) ||
        memcmp(want[v].db, a->got[v].db, sizeof want[v].db))
      fail_msg("%s pp %d vp %d m %d: layer %d's gradients differ from no pipelining "
               "(dw[0] %.9g vs %.9g)",
               mpu_schedule_name(kind), pp, vp, M, v, a->got[v].dw[0], want[v].dw[0]);
  for (int rank = 0; rank < pp; rank++) assert_int_equal(a->trace_lines[rank], 2 * M * vp);
  assert_memory_equal(a->trace_first, "stage 0: F 0.0", 14);
  free(a);
}

static void test_1f1b(void **state) {
  (void)state;
  for (int pp = 2; pp <= 4; pp++)
    for (int M = 1; M <= 8; M++) check(MPU_SCHEDULE_1F1B, pp, 1, M, 0);
}

static void test_interleaved(void **state) {
  (void)state;
  static const int cases[][4] = {{2, 2, 2, 0},  {2, 2, 4, 0}, {2, 2, 5, 3}, {2, 2, 8, 0},
                                 {2, 3, 6, 0},  {2, 2, 7, 5}, {4, 2, 4, 0}, {4, 2, 8, 0},
                                 {4, 2, 9, 5},  {4, 3, 12, 0}, {4, 2, 16, 8}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    check(MPU_SCHEDULE_INTERLEAVED, cases[i][0], cases[i][1], cases[i][2], cases[i][3]);
}

static void test_no_pipelining(void **state) {
  (void)state;
  check(MPU_SCHEDULE_NO_PIPELINING, 1, 1, 5, 0);
}

static mpu_result_t bad_rank(mpu_comm *world, void *arg) {
  (void)arg;
  mpu_pipeline *p = NULL;
  if (mpu_pipeline_create(world, 0, &p) != MPU_ERR_INVALID_ARGUMENT)
    return mpu_fail(MPU_ERR_INTERNAL, "a 0-element activation was taken");
  mpu_result_t r = mpu_pipeline_create(world, H, &p);
  if (r) return r;
  mpu_schedule_config c = MPU_SCHEDULE_CONFIG_INIT;
  c.pp = 3; /* the group has 2 */
  model m;
  memset(&m, 0, sizeof m);
  mpu_pipeline_callbacks cb = {fwd, bwd, &m};
  if (mpu_pipeline_run(p, &c, &cb, NULL) != MPU_ERR_INVALID_ARGUMENT)
    r = mpu_fail(MPU_ERR_INTERNAL, "a schedule of 3 stages ran on 2");
  mpu_pipeline_callbacks none = {NULL, NULL, NULL};
  c.pp = 2;
  if (!r && mpu_pipeline_run(p, &c, &none, NULL) != MPU_ERR_INVALID_ARGUMENT)
    r = mpu_fail(MPU_ERR_INTERNAL, "no callbacks taken");
  mpu_pipeline_free(p);
  return r;
}

static void test_bad_input(void **state) {
  (void)state;
  assert_int_equal(mpu_launch(2, bad_rank, NULL, NULL, NULL), MPU_SUCCESS);
}

/* the communication clock counts each communicating call once, per thread */
static mpu_result_t clocked(mpu_comm *world, void *arg) {
  (void)arg;
  int rank;
  mpu_comm_rank(world, &rank);
  mpu_comm_clock_reset();
  float x = 1, y[2];
  for (int i = 0; i < 3; i++) MPU_CHECK_R(mpu_comm_all_reduce(world, &x, &x, 1, MPU_FLOAT32, MPU_SUM));
  MPU_CHECK_R(mpu_comm_sendrecv(world, &x, 1, 1 - rank, y, 1, 1 - rank, MPU_FLOAT32));
  mpu_request *req;
  MPU_CHECK_R(mpu_comm_iall_gather(world, &x, y, 1, MPU_FLOAT32, &req));
  MPU_CHECK_R(mpu_request_wait(req));
  double s;
  uint64_t calls;
  mpu_comm_clock(&s, &calls);
  if (calls != 5 || !(s > 0)) return mpu_fail(MPU_ERR_INTERNAL, "rank %d: %llu calls in %g s", rank,
                                              (unsigned long long)calls, s);
  mpu_comm_clock_reset();
  mpu_comm_clock(&s, &calls);
  return calls == 0 && s == 0 ? MPU_SUCCESS : mpu_fail(MPU_ERR_INTERNAL, "reset");
}

static void test_comm_clock(void **state) {
  (void)state;
  assert_int_equal(mpu_launch(2, clocked, NULL, NULL, NULL), MPU_SUCCESS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_pipelining),
      cmocka_unit_test(test_1f1b),
      cmocka_unit_test(test_interleaved),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_comm_clock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
