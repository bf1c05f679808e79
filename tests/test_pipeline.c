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
 * Then boundaries of any dtype and odd shape (bf16, fp16, int8/32/64, ...,
 * one per boundary or one for all): every stage receives, bit for bit and
 * in its own view, what the stage before sent.
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

/* ---- any dtype and shape: each boundary's bytes arrive as they were sent ---------------- */

enum { MAXB = 8, MAXBYTES = 4096 };

/* boundary b's dtypes and odd shapes (by b, wrapping) */
static const mpu_dtype bkinds[MAXB] = {MPU_BFLOAT16, MPU_FLOAT16, MPU_INT32, MPU_INT8,
                                       MPU_FLOAT64,  MPU_UINT8,   MPU_INT64, MPU_FLOAT32};
static const int bndims[MAXB] = {3, 2, 1, 3, 2, 1, 3, 2};
static const int64_t bshapes[MAXB][3] = {{3, 5, 7}, {13, 1}, {9}, {5, 1, 3},
                                         {11, 3},   {17},    {2, 2, 5}, {7, 3}};

typedef struct tmodel {
  mpu_comm *dev; /* NCCL: the buffers are device memory, reached by copies */
  int pp, rank, V, uniform, calls;
  char why[256];
} tmodel;

/* the bytes of boundary b for micro-batch mb, activations (g 0) or gradients (g 1) */
static void pattern(int mb, int b, int g, unsigned char *out, size_t n) {
  for (size_t j = 0; j < n; j++) out[j] = (unsigned char)(mb * 31 + b * 17 + (int)j * 7 + g * 101);
}

static int view_is(const tmodel *m, const mpu_tensor *t, int b) {
  int k = m->uniform ? 0 : b % MAXB;
  if (!t || t->dtype != bkinds[k] || t->ndim != bndims[k] || !t->data) return 0;
  for (int d = 0; d < t->ndim; d++)
    if (t->shape[d] != bshapes[k][d]) return 0;
  return 1;
}

#define TFAIL(...) (snprintf(m->why, sizeof m->why, __VA_ARGS__), MPU_ERR_INTERNAL)

static mpu_result_t t_copy(const tmodel *m, void *dst, const void *src, size_t n) {
  if (!m->dev) return memcpy(dst, src, n), MPU_SUCCESS;
  return mpu_comm_copy2d(m->dev, dst, n, src, n, n, 1);
}

/* the received boundary b holds the pattern (g) of micro-batch mb */
static mpu_result_t t_check(tmodel *m, const mpu_tensor *t, int mb, int b, int g) {
  unsigned char got[MAXBYTES], want[MAXBYTES];
  size_t n = mpu_tensor_nbytes(t);
  if (!view_is(m, t, b) || n > MAXBYTES) return TFAIL("boundary %d: a view of another shape", b);
  MPU_CHECK_R(t_copy(m, got, t->data, n));
  pattern(mb, b, g, want, n);
  if (memcmp(got, want, n)) return TFAIL("boundary %d, micro-batch %d: other bytes arrived", b, mb);
  return MPU_SUCCESS;
}

static mpu_result_t t_fill(tmodel *m, const mpu_tensor *t, int mb, int b, int g) {
  unsigned char bytes[MAXBYTES];
  size_t n = mpu_tensor_nbytes(t);
  if (!view_is(m, t, b) || n > MAXBYTES) return TFAIL("boundary %d: a view of another shape", b);
  pattern(mb, b, g, bytes, n);
  return t_copy(m, t->data, bytes, n);
}

static mpu_result_t t_fwd(void *user, int mb, int chunk, const mpu_tensor *in, const mpu_tensor *out) {
  tmodel *m = user;
  int v = chunk * m->pp + m->rank;
  m->calls++;
  if ((v == 0) != !in || (v == m->V - 1) != !out) return TFAIL("stage %d: NULL views misplaced", v);
  if (in) MPU_CHECK_R(t_check(m, in, mb, v - 1, 0));
  return out ? t_fill(m, out, mb, v, 0) : MPU_SUCCESS;
}

static mpu_result_t t_bwd(void *user, int mb, int chunk, const mpu_tensor *gout, const mpu_tensor *gin) {
  tmodel *m = user;
  int v = chunk * m->pp + m->rank;
  m->calls++;
  if ((v == 0) != !gin || (v == m->V - 1) != !gout) return TFAIL("stage %d: NULL views misplaced", v);
  if (gout) MPU_CHECK_R(t_check(m, gout, mb, v, 1));
  return gin ? t_fill(m, gin, mb, v - 1, 1) : MPU_SUCCESS;
}

typedef struct trun {
  mpu_schedule_config cfg;
  int uniform; /* one shape for every boundary (bkinds[0], bshapes[0]) */
  char why[8][320];
} trun;

static mpu_result_t tensor_rank(mpu_comm *world, void *arg) {
  trun *a = arg;
  tmodel mm, *m = &mm;
  memset(m, 0, sizeof *m);
  mpu_comm_rank(world, &m->rank);
  m->pp = a->cfg.pp, m->V = a->cfg.pp * a->cfg.vp, m->uniform = a->uniform;
  mpu_comm *group = world;
#ifdef MPU_TEST_NCCL
  MPU_CHECK_R(mpu_comm_nccl_create(world, NULL, &m->dev));
  group = m->dev;
#endif
  mpu_tensor b[MAXV];
  memset(b, 0, sizeof b);
  mpu_pipeline_config pc = MPU_PIPELINE_CONFIG_INIT;
  if (a->uniform) {
    pc.dtype = bkinds[0], pc.ndim = bndims[0];
    memcpy(pc.shape, bshapes[0], sizeof bshapes[0]);
  } else {
    for (int k = 0; k < m->V - 1; k++) {
      b[k].dtype = bkinds[k % MAXB], b[k].ndim = bndims[k % MAXB];
      memcpy(b[k].shape, bshapes[k % MAXB], sizeof bshapes[0]);
    }
    pc.nboundaries = m->V - 1, pc.boundaries = b;
  }
  mpu_pipeline *p = NULL;
  mpu_pipeline_tensor_callbacks cb = {t_fwd, t_bwd, m};
  mpu_result_t r = mpu_pipeline_create_ex(group, &pc, &p);
  if (!r) r = mpu_pipeline_run_tensors(p, &a->cfg, &cb, NULL);
  if (!r && m->calls != 2 * a->cfg.microbatches * a->cfg.vp)
    r = TFAIL("%d callbacks ran", m->calls);
  if (r && m->why[0]) snprintf(a->why[m->rank], sizeof a->why[m->rank], "rank %d: %s", m->rank, m->why);
  mpu_pipeline_free(p);
  mpu_comm_destroy(m->dev);
  return r;
}

static void check_tensors(mpu_schedule_kind kind, int pp, int vp, int M, int uniform) {
  trun a;
  memset(&a, 0, sizeof a);
  mpu_schedule_config c = MPU_SCHEDULE_CONFIG_INIT;
  c.kind = kind, c.pp = pp, c.vp = vp, c.microbatches = M;
  a.cfg = c, a.uniform = uniform;
  mpu_result_t r = mpu_launch(pp, tensor_rank, &a, NULL, NULL);
  for (int k = 0; k < pp; k++)
    if (a.why[k][0]) print_error("%s\n", a.why[k]);
  if (r) fail_msg("%s pp %d vp %d m %d: %s", mpu_schedule_name(kind), pp, vp, M, mpu_last_error());
}

/* bf16, fp16, int8/32/64, uint8, float64 and float32 boundaries of odd shapes,
 * one per boundary or one for all, under 1F1B and the interleaved schedule */
static void test_tensor_boundaries(void **state) {
  (void)state;
  check_tensors(MPU_SCHEDULE_1F1B, 4, 1, 5, 0);
  check_tensors(MPU_SCHEDULE_1F1B, 2, 1, 3, 1);
  check_tensors(MPU_SCHEDULE_INTERLEAVED, 2, 4, 4, 0);
  check_tensors(MPU_SCHEDULE_INTERLEAVED, 4, 2, 8, 0);
  check_tensors(MPU_SCHEDULE_NO_PIPELINING, 1, 1, 3, 1);
}

static mpu_result_t tensor_bad_rank(mpu_comm *world, void *arg) {
  (void)arg;
  mpu_comm *group = world, *dev = NULL;
#ifdef MPU_TEST_NCCL
  MPU_CHECK_R(mpu_comm_nccl_create(world, NULL, &dev));
  group = dev;
#endif
  mpu_result_t r = MPU_SUCCESS;
  mpu_pipeline *p = NULL;
  mpu_pipeline_config pc = MPU_PIPELINE_CONFIG_INIT;
  mpu_tensor b[3];
  memset(b, 0, sizeof b);
  const char *what = NULL;
  /* no shape, a dim of 0, a dim past 2^34, a struct of another size, boundaries at NULL */
  if (mpu_pipeline_create_ex(group, &pc, &p) != MPU_ERR_INVALID_ARGUMENT) what = "no dims";
  pc.ndim = 2, pc.shape[0] = 3, pc.shape[1] = 0;
  if (!what && mpu_pipeline_create_ex(group, &pc, &p) != MPU_ERR_INVALID_ARGUMENT) what = "a dim of 0";
  pc.shape[1] = (int64_t)1 << 40;
  if (!what && mpu_pipeline_create_ex(group, &pc, &p) != MPU_ERR_INVALID_ARGUMENT) what = "2^42 elements";
  pc.shape[1] = 4, pc.size = 8;
  if (!what && mpu_pipeline_create_ex(group, &pc, &p) != MPU_ERR_INVALID_ARGUMENT) what = "size 8";
  pc.size = sizeof pc, pc.nboundaries = 3;
  if (!what && mpu_pipeline_create_ex(group, &pc, &p) != MPU_ERR_INVALID_ARGUMENT) what = "NULL boundaries";
  pc.boundaries = b; /* b[0..2] of no dims */
  if (!what && mpu_pipeline_create_ex(group, &pc, &p) != MPU_ERR_INVALID_ARGUMENT) what = "empty boundaries";
  if (what) r = mpu_fail(MPU_ERR_INTERNAL, "mpu_pipeline_create_ex took %s", what);
  /* three bf16 boundaries: not for the float callbacks, nor for a schedule of one boundary */
  for (int k = 0; k < 3; k++) b[k].dtype = MPU_BFLOAT16, b[k].ndim = 1, b[k].shape[0] = 5 + k;
  if (!r) r = mpu_pipeline_create_ex(group, &pc, &p);
  mpu_schedule_config c = MPU_SCHEDULE_CONFIG_INIT;
  c.pp = 2;
  model fm;
  memset(&fm, 0, sizeof fm);
  mpu_pipeline_callbacks fcb = {fwd, bwd, &fm};
  tmodel tm;
  memset(&tm, 0, sizeof tm);
  mpu_pipeline_tensor_callbacks tcb = {t_fwd, t_bwd, &tm};
  if (!r && (mpu_pipeline_run(p, &c, &fcb, NULL) != MPU_ERR_INVALID_ARGUMENT ||
             !strstr(mpu_last_error(), "boundary 0 carries bfloat16")))
    r = mpu_fail(MPU_ERR_INTERNAL, "float callbacks ran bfloat16 boundaries (%s)", mpu_last_error());
  if (!r && (mpu_pipeline_run_tensors(p, &c, &tcb, NULL) != MPU_ERR_INVALID_ARGUMENT ||
             !strstr(mpu_last_error(), "describes 3 boundaries, the schedule has 1")))
    r = mpu_fail(MPU_ERR_INTERNAL, "3 boundaries ran a schedule of 1 (%s)", mpu_last_error());
  mpu_pipeline_tensor_callbacks none = {NULL, NULL, NULL};
  if (!r && mpu_pipeline_run_tensors(p, &c, &none, NULL) != MPU_ERR_INVALID_ARGUMENT)
    r = mpu_fail(MPU_ERR_INTERNAL, "no tensor callbacks taken");
  if (!r && (fm.forwards || tm.calls)) r = mpu_fail(MPU_ERR_INTERNAL, "a refused run called back");
  mpu_pipeline_free(p);
  mpu_comm_destroy(dev);
  return r;
}

static void test_tensor_bad_input(void **state) {
  (void)state;
  if (mpu_launch(2, tensor_bad_rank, NULL, NULL, NULL)) fail_msg("%s", mpu_last_error());
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
      cmocka_unit_test(test_tensor_boundaries),
      cmocka_unit_test(test_tensor_bad_input),
      cmocka_unit_test(test_comm_clock),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
