/*
 * test_layers.c - the parallel layers: each single-rank layer against finite
 * differences, and each layer with tp = 2 and 4 (with and without sequence
 * parallelism) against the single-rank layer of the same seed, outputs and
 * gradients to 1e-5; broadcast_data; bad shapes and ids.
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

#define N 8      /* tokens */
#define IN 8
#define OUT 12
#define VOCAB 16

#define TEST_RANK rank
#include "test_helpers.h"

static int close_to(float a, float b) { return fabsf(a - b) <= 1e-5f * (1.0f + fabsf(b)); }

static void fill(float *x, int n, int salt) {
  for (int i = 0; i < n; i++) x[i] = sinf(0.37f * (float)i + (float)salt) * 0.8f;
}

/* ---- single rank vs finite differences ------------------------------------------------- */

static mpu_comm *alone(void) {
  mpu_comm *c = NULL;
  mpu_comm_fake_create(0, 1, &c);
  return c;
}

/* loss = sum(w * y) for a fixed w; d loss / d x by the layer vs central differences */
static void test_column_row_finite_differences(void **state) {
  (void)state;
  mpu_comm *c = alone();
  mpu_column_linear col;
  mpu_row_linear row;
  assert_int_equal(mpu_column_linear_init(&col, c, IN, OUT, 1, 0, 0, 7, 0.3f), MPU_SUCCESS);
  assert_int_equal(mpu_row_linear_init(&row, c, OUT, IN, 1, 0, 0, 8, 0.3f), MPU_SUCCESS);
  for (int j = 0; j < OUT; j++) col.bias[j] = 0.01f * (float)j;
  float x[N * IN], h[N * OUT], g[N * OUT], y[N * IN], w[N * IN], dy[N * IN], dg[N * OUT],
      dh[N * OUT], dx[N * IN];
  fill(x, N * IN, 1);
  fill(w, N * IN, 2);
  /* y = row(gelu(col(x))), loss = sum(w * y) */
  #define LOSS(out)                                                          \
    do {                                                                     \
      assert_int_equal(mpu_column_linear_forward(&col, x, N, h), 0);         \
      mpu_gelu_forward(h, g, N * OUT);                                       \
      assert_int_equal(mpu_row_linear_forward(&row, g, N, y), 0);            \
      double s_ = 0;                                                         \
      for (int i_ = 0; i_ < N * IN; i_++) s_ += (double)w[i_] * y[i_];       \
      out = s_;                                                              \
    } while (0)
  double base;
  LOSS(base);
  assert_true(isfinite(base));
  memcpy(dy, w, sizeof dy);
  assert_int_equal(mpu_row_linear_backward(&row, dy, dg), 0);
  mpu_gelu_backward(h, dg, dh, N * OUT);
  assert_int_equal(mpu_column_linear_backward(&col, dh, dx), 0);
  const float eps = 1e-2f;
  for (int i = 0; i < N * IN; i += 5) { /* input gradient */
    float keep = x[i];
    double up, down;
    x[i] = keep + eps;
    LOSS(up);
    x[i] = keep - eps;
    LOSS(down);
    x[i] = keep;
    double fd = (up - down) / (2 * eps);
    if (fabs(fd - dx[i]) > 2e-3 * (1 + fabs(fd))) fail_msg("dx[%d]: %g, finite difference %g", i, dx[i], fd);
  }
  for (int i = 0; i < OUT * IN; i += 7) { /* a weight gradient */
    float keep = col.weight[i];
    double up, down;
    col.weight[i] = keep + eps;
    LOSS(up);
    col.weight[i] = keep - eps;
    LOSS(down);
    col.weight[i] = keep;
    double fd = (up - down) / (2 * eps);
    if (fabs(fd - col.dweight[i]) > 2e-3 * (1 + fabs(fd)))
      fail_msg("dA[%d]: %g, finite difference %g", i, col.dweight[i], fd);
  }
  for (int j = 0; j < IN; j++) { /* the row bias gradient: sum of w over rows */
    float want = 0;
    for (int i = 0; i < N; i++) want += w[i * IN + j];
    assert_true(close_to(row.dbias[j], want));
  }
  mpu_column_linear_free(&col);
  mpu_row_linear_free(&row);
  mpu_comm_destroy(c);
}

static void test_cross_entropy_finite_differences(void **state) {
  (void)state;
  mpu_comm *c = alone();
  float logits[N * VOCAB], loss[N], dl[N], g[N * VOCAB];
  int64_t t[N];
  fill(logits, N * VOCAB, 3);
  for (int i = 0; i < N; i++) t[i] = (i * 5) % VOCAB, dl[i] = 1;
  for (int ls = 0; ls < 2; ls++) {
    float smoothing = ls ? 0.1f : 0.0f;
    mpu_vocab_cross_entropy ce = {0};
    assert_int_equal(mpu_vocab_cross_entropy_forward(&ce, c, logits, t, N, VOCAB, smoothing, loss), 0);
    /* plain cross entropy by hand for row 0 */
    if (!ls) {
      double m = -1e30, s = 0;
      for (int j = 0; j < VOCAB; j++) m = fmax(m, logits[j]);
      for (int j = 0; j < VOCAB; j++) s += exp(logits[j] - m);
      assert_true(fabs(loss[0] - (log(s) + m - logits[t[0]])) < 1e-5);
    }
    assert_int_equal(mpu_vocab_cross_entropy_backward(&ce, dl, g), 0);
    const float eps = 1e-2f;
    for (int i = 0; i < N * VOCAB; i += 3) {
      float keep = logits[i], up[N], down[N];
      mpu_vocab_cross_entropy tmp = {0};
      logits[i] = keep + eps;
      mpu_vocab_cross_entropy_forward(&tmp, c, logits, t, N, VOCAB, smoothing, up);
      logits[i] = keep - eps;
      mpu_vocab_cross_entropy_forward(&tmp, c, logits, t, N, VOCAB, smoothing, down);
      logits[i] = keep;
      mpu_vocab_cross_entropy_free(&tmp);
      double fd = (up[i / VOCAB] - down[i / VOCAB]) / (2 * eps);
      if (fabs(fd - g[i]) > 2e-3) fail_msg("smoothing %g: dlogits[%d] %g vs %g", smoothing, i, g[i], fd);
    }
    mpu_vocab_cross_entropy_free(&ce);
  }
  mpu_comm_destroy(c);
}

/* ---- tp = 2, 4 against tp = 1 ---------------------------------------------------------- */

static mpu_result_t parallel_vs_single(mpu_comm *tp, void *arg) {
  (void)arg;
  int rank, T;
  mpu_comm_rank(tp, &rank);
  mpu_comm_size(tp, &T);
  mpu_comm *one;
  int self = rank;
  ROK(mpu_comm_create_group(tp, &self, 1, &one));
  float x[N * IN], w[N * IN], ref_h[N * OUT], ref_y[N * IN], ref_dx[N * IN], ref_dh[N * OUT];
  float h[N * OUT], y[N * IN], dx[N * IN], dh[N * OUT], dy[N * IN];
  fill(x, N * IN, 4);
  fill(w, N * IN, 5);
  for (int sp = 0; sp < 2; sp++) {
    /* the single-rank reference: col (gather) -> row (input not parallel) */
    mpu_column_linear c1, cT;
    mpu_row_linear r1, rT;
    ROK(mpu_column_linear_init(&c1, one, IN, OUT, 1, 1, 0, 11, 0.2f));
    ROK(mpu_row_linear_init(&r1, one, OUT, IN, 1, 0, 0, 12, 0.2f));
    for (int j = 0; j < OUT; j++) c1.bias[j] = 0.1f * (float)j;
    for (int j = 0; j < IN; j++) r1.bias[j] = -0.05f * (float)j;
    ROK(mpu_column_linear_forward(&c1, x, N, ref_h));
    ROK(mpu_row_linear_forward(&r1, ref_h, N, ref_y));
    ROK(mpu_row_linear_backward(&r1, w, ref_dh));
    ROK(mpu_column_linear_backward(&c1, ref_dh, ref_dx));
    /* tensor parallel: col (no gather) -> row (input parallel); sequence parallel
     * splits the tokens at the column's input and the row's output */
    ROK(mpu_column_linear_init(&cT, tp, IN, OUT, 1, 0, sp, 11, 0.2f));
    ROK(mpu_row_linear_init(&rT, tp, OUT, IN, 1, 1, sp, 12, 0.2f));
    int ol = OUT / T, rows = sp ? N / T : N, r0 = sp ? rank * rows : 0;
    for (int j = 0; j < ol; j++) cT.bias[j] = 0.1f * (float)(rank * ol + j);
    for (int j = 0; j < IN; j++) rT.bias[j] = -0.05f * (float)j;
    for (int k = 0; k < ol * IN; k++) /* weights are exact slices of the master */
      RCHECK(cT.weight[k] == c1.weight[rank * ol * IN + k], "column weight slice [%d]", k);
    ROK(mpu_column_linear_forward(&cT, x + r0 * IN, rows, h));
    for (int i = 0; i < N; i++)
      for (int j = 0; j < ol; j++)
        RCHECK(close_to(h[i * ol + j], ref_h[i * OUT + rank * ol + j]), "sp %d: column output", sp);
    ROK(mpu_row_linear_forward(&rT, h, N, y));
    for (int i = 0; i < rows * IN; i++)
      RCHECK(close_to(y[i], ref_y[r0 * IN + i]), "sp %d: row output [%d] %g vs %g", sp, i, y[i],
             ref_y[r0 * IN + i]);
    memcpy(dy, w + r0 * IN, (size_t)rows * IN * sizeof(float));
    ROK(mpu_row_linear_backward(&rT, dy, dh));
    for (int i = 0; i < N; i++)
      for (int j = 0; j < ol; j++)
        RCHECK(close_to(dh[i * ol + j], ref_dh[i * OUT + rank * ol + j]), "sp %d: dh", sp);
    ROK(mpu_column_linear_backward(&cT, dh, dx));
    for (int i = 0; i < rows * IN; i++)
      RCHECK(close_to(dx[i], ref_dx[r0 * IN + i]), "sp %d: dx [%d] %g vs %g", sp, i, dx[i],
             ref_dx[r0 * IN + i]);
    for (int k = 0; k < ol * IN; k++)
      RCHECK(close_to(cT.dweight[k], c1.dweight[rank * ol * IN + k]), "sp %d: column dA", sp);
    for (int j = 0; j < ol; j++)
      RCHECK(close_to(cT.dbias[j], c1.dbias[rank * ol + j]), "sp %d: column db", sp);
    for (int o = 0; o < IN; o++) {
      for (int k = 0; k < ol; k++)
        RCHECK(close_to(rT.dweight[o * ol + k], r1.dweight[o * OUT + rank * ol + k]), "row dA");
      RCHECK(close_to(rT.dbias[o], r1.dbias[o]), "sp %d: row db %g vs %g", sp, rT.dbias[o], r1.dbias[o]);
    }
    mpu_column_linear_free(&c1), mpu_column_linear_free(&cT);
    mpu_row_linear_free(&r1), mpu_row_linear_free(&rT);
  }

  /* embedding: masked rows, all-reduced; gradients land on the owner */
  mpu_vocab_embedding e1, eT;
  ROK(mpu_vocab_embedding_init(&e1, one, VOCAB, IN, 21, 1.0f));
  ROK(mpu_vocab_embedding_init(&eT, tp, VOCAB, IN, 21, 1.0f));
  int64_t ids[N];
  for (int i = 0; i < N; i++) ids[i] = (i * 7 + 3) % VOCAB;
  float o1[N * IN], oT[N * IN];
  ROK(mpu_vocab_embedding_forward(&e1, ids, N, o1));
  ROK(mpu_vocab_embedding_forward(&eT, ids, N, oT));
  for (int i = 0; i < N * IN; i++) RCHECK(oT[i] == o1[i], "embedding output");
  ROK(mpu_vocab_embedding_backward(&e1, w));
  ROK(mpu_vocab_embedding_backward(&eT, w));
  int per = VOCAB / T;
  for (int k = 0; k < per * IN; k++)
    RCHECK(close_to(eT.dweight[k], e1.dweight[rank * per * IN + k]), "embedding grad");
  int64_t badid = VOCAB;
  RCHECK(mpu_vocab_embedding_forward(&eT, &badid, 1, oT) == MPU_ERR_INVALID_ARGUMENT,
         "an id outside the vocabulary");
  mpu_vocab_embedding_free(&e1), mpu_vocab_embedding_free(&eT);

  /* cross entropy over a split vocabulary */
  float logits[N * VOCAB], l1[N], lT[N], g1[N * VOCAB], gT[N * VOCAB], dl[N];
  int64_t t[N];
  fill(logits, N * VOCAB, 6);
  for (int i = 0; i < N; i++) t[i] = (i * 3 + 1) % VOCAB, dl[i] = 0.5f;
  mpu_vocab_cross_entropy ce1 = {0}, ceT = {0};
  ROK(mpu_vocab_cross_entropy_forward(&ce1, one, logits, t, N, VOCAB, 0, l1));
  float mine[N * VOCAB];
  for (int i = 0; i < N; i++)
    memcpy(mine + i * per, logits + i * VOCAB + rank * per, (size_t)per * sizeof(float));
  ROK(mpu_vocab_cross_entropy_forward(&ceT, tp, mine, t, N, per, 0, lT));
  for (int i = 0; i < N; i++) RCHECK(close_to(lT[i], l1[i]), "cross entropy loss [%d]", i);
  ROK(mpu_vocab_cross_entropy_backward(&ce1, dl, g1));
  ROK(mpu_vocab_cross_entropy_backward(&ceT, dl, gT));
  for (int i = 0; i < N; i++)
    for (int j = 0; j < per; j++)
      RCHECK(close_to(gT[i * per + j], g1[i * VOCAB + rank * per + j]), "cross entropy grad");
  mpu_vocab_cross_entropy_free(&ce1), mpu_vocab_cross_entropy_free(&ceT);

  /* broadcast_data from the group's rank 0 */
  int64_t tokens[6] = {1, 2, 3, 4, 5, 6}, labels[2] = {7, 8};
  mpu_tensor data[2];
  const char *keys[2] = {"tokens", "labels"};
  if (rank == 0) {
    int64_t s1[2] = {2, 3}, s2[1] = {2};
    mpu_tensor_init(&data[0], tokens, MPU_INT64, 2, s1);
    mpu_tensor_init(&data[1], labels, MPU_INT64, 1, s2);
  }
  ROK(mpu_broadcast_data(tp, 2, keys, data));
  RCHECK(data[0].ndim == 2 && data[0].shape[1] == 3 && ((int64_t *)data[0].data)[5] == 6,
         "broadcast tokens");
  RCHECK(data[1].shape[0] == 2 && ((int64_t *)data[1].data)[1] == 8, "broadcast labels");
  if (rank != 0) mpu_tensor_free(&data[0]), mpu_tensor_free(&data[1]);
  mpu_comm_destroy(one);
  return MPU_SUCCESS;
}

static void test_parallel_matches_single(void **state) {
  (void)state;
  for (int T = 1; T <= 4; T *= 2) {
    memset(messages, 0, sizeof messages);
    mpu_result_t r = mpu_launch(T, parallel_vs_single, NULL, NULL, NULL);
    if (r) {
      for (int k = 0; k < T; k++)
        if (messages[k][0]) print_error("tp %d rank %d: %s\n", T, k, messages[k]);
      fail_msg("tp %d: %s", T, mpu_last_error());
    }
  }
}

/* dx may be dy's own buffer (square layers): the backward then reads dy before
 * it writes dx, and gives what it gives into a separate buffer, bit for bit */
static void test_backward_in_place(void **state) {
  (void)state;
  mpu_comm *c = alone();
  for (int kind = 0; kind < 2; kind++) {
    mpu_column_linear col;
    mpu_row_linear row;
    float x[N * IN], y[N * IN], dy[N * IN], dx[N * IN], both[N * IN], dw[IN * IN], db[IN];
    if (kind == 0) assert_int_equal(mpu_column_linear_init(&col, c, IN, IN, 1, 0, 0, 5, 0.3f), 0);
    else assert_int_equal(mpu_row_linear_init(&row, c, IN, IN, 1, 1, 0, 6, 0.3f), 0);
    fill(x, N * IN, 3);
    fill(dy, N * IN, 4);
    for (int pass = 0; pass < 2; pass++) {
      float *to = pass ? both : dx;
      if (pass) memcpy(both, dy, sizeof dy);
      if (kind == 0) {
        mpu_column_linear_zero_grad(&col);
        assert_int_equal(mpu_column_linear_forward(&col, x, N, y), 0);
        assert_int_equal(mpu_column_linear_backward(&col, pass ? both : dy, to), 0);
        if (!pass) memcpy(dw, col.dweight, sizeof dw), memcpy(db, col.dbias, sizeof db);
        else assert_memory_equal(dw, col.dweight, sizeof dw), assert_memory_equal(db, col.dbias, sizeof db);
      } else {
        mpu_row_linear_zero_grad(&row);
        assert_int_equal(mpu_row_linear_forward(&row, x, N, y), 0);
        assert_int_equal(mpu_row_linear_backward(&row, pass ? both : dy, to), 0);
        if (!pass) memcpy(dw, row.dweight, sizeof dw), memcpy(db, row.dbias, sizeof db);
        else assert_memory_equal(dw, row.dweight, sizeof dw), assert_memory_equal(db, row.dbias, sizeof db);
      }
    }
    assert_memory_equal(dx, both, sizeof dx);
    if (kind == 0) mpu_column_linear_free(&col);
    else mpu_row_linear_free(&row);
  }
  mpu_comm_destroy(c);
}

/* dx = dy W of both linears against the sum written out, at shapes whose
 * rows and columns are not whole tiles of the product's kernel (8 rows by
 * 32 columns: src/layers/gemm.c; 50 columns end in a panel of 18) and at
 * whole tiles */
static void test_input_gradient_against_the_definition(void **state) {
  (void)state;
  static const int shapes[][3] = {{13, 37, 19}, {24, 70, 40}, {8, 32, 8},
                                  {1, 1, 1},    {17, 96, 33}, {5, 50, 9}};
  mpu_comm *c = alone();
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
    float *x = malloc((size_t)n * in * sizeof(float)), *dx = malloc((size_t)n * in * sizeof(float));
    float *y = malloc((size_t)n * out * sizeof(float)), *dy = malloc((size_t)n * out * sizeof(float));
    assert_non_null(x), assert_non_null(dx), assert_non_null(y), assert_non_null(dy);
    fill(x, n * in, 7);
    fill(dy, n * out, 8);
    for (int kind = 0; kind < 2; kind++) {
      mpu_column_linear col;
      mpu_row_linear row;
      const float *w; /* (out, in) */
      if (kind == 0) {
        assert_int_equal(mpu_column_linear_init(&col, c, in, out, 0, 0, 0, 11, 0.5f), 0);
        assert_int_equal(mpu_column_linear_forward(&col, x, n, y), 0);
        assert_int_equal(mpu_column_linear_backward(&col, dy, dx), 0);
        w = col.weight;
      } else {
        assert_int_equal(mpu_row_linear_init(&row, c, in, out, 0, 1, 0, 12, 0.5f), 0);
        assert_int_equal(mpu_row_linear_forward(&row, x, n, y), 0);
        assert_int_equal(mpu_row_linear_backward(&row, dy, dx), 0);
        w = row.weight;
      }
      for (int i = 0; i < n; i++)
        for (int l = 0; l < in; l++) {
          double want = 0;
          for (int j = 0; j < out; j++) want += (double)dy[(size_t)i * out + j] * w[(size_t)j * in + l];
          if (!close_to(dx[(size_t)i * in + l], (float)want))
            fail_msg("%s %d x %d x %d: dx[%d][%d] = %g, want %g", kind ? "row" : "column", n, in,
                     out, i, l, dx[(size_t)i * in + l], want);
        }
      if (kind == 0) mpu_column_linear_free(&col);
      else mpu_row_linear_free(&row);
    }
    free(x), free(dx), free(y), free(dy);
  }
  mpu_comm_destroy(c);
}

static void test_bad_input(void **state) {
  (void)state;
  mpu_comm *c = NULL;
  assert_int_equal(mpu_comm_fake_create(0, 4, &c), MPU_SUCCESS);
  mpu_column_linear col;
  assert_int_equal(mpu_column_linear_init(&col, c, 8, 6, 1, 0, 0, 1, 0.1f), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "out must divide"));
  mpu_row_linear row;
  assert_int_equal(mpu_row_linear_init(&row, c, 6, 8, 1, 1, 0, 1, 0.1f), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_row_linear_init(&row, c, 8, 8, 1, 0, 1, 1, 0.1f), MPU_ERR_INVALID_ARGUMENT);
  mpu_vocab_embedding e;
  assert_int_equal(mpu_vocab_embedding_init(&e, c, 10, 4, 1, 1.0f), MPU_ERR_INVALID_ARGUMENT);
  float x[4] = {0}, y[4];
  assert_int_equal(mpu_column_linear_forward(NULL, x, 1, y), MPU_ERR_INVALID_ARGUMENT);
  mpu_vocab_cross_entropy ce = {0};
  int64_t t[1] = {99};
  float loss[1];
  assert_int_equal(mpu_vocab_cross_entropy_forward(&ce, c, x, t, 1, 4, 0, loss),
                   MPU_ERR_INVALID_ARGUMENT);
  t[0] = 1;
  assert_int_equal(mpu_vocab_cross_entropy_forward(&ce, c, x, t, 1, 4, 1.5f, loss),
                   MPU_ERR_INVALID_ARGUMENT);
  mpu_comm_destroy(c);
}

/* ---- mpu/layers.py's full signatures: stride, skip_bias_add, init_method, master, views ---- */

#define H3 12 /* the strided layers' hidden size: tp 2 x stride 3 x 2 */

static void constant_init(float *w, int rows, int cols, mpu_rng *rng, void *arg) {
  (void)rng;
  for (int i = 0; i < rows * cols; i++) w[i] = *(const float *)arg + (float)i;
}

/* A strided column (a fused weight, stride 3) feeding a strided row layer
 * (input_is_parallel) on tp 2 computes the single-rank chain; the column's
 * local rows are the master's pieces rank, rank + 2, rank + 4; its gradients
 * are the single-rank gradients of those rows. */
static mpu_result_t strided_chain(mpu_comm *tp, void *arg) {
  (void)arg;
  int rank, T;
  mpu_comm_rank(tp, &rank);
  mpu_comm_size(tp, &T);
  mpu_comm *one = alone();
  mpu_linear_options o = MPU_LINEAR_OPTIONS_INIT;
  o.stride = 3, o.gather_output = 0, o.seed = 11, o.keep_master_weight_for_test = 1;
  mpu_column_linear col, col1;
  mpu_row_linear row, row1;
  ROK(mpu_column_linear_create(&col, tp, IN, H3, &o));
  ROK(mpu_column_linear_create(&col1, one, IN, H3, &o));
  mpu_linear_options ro = MPU_LINEAR_OPTIONS_INIT;
  ro.stride = 3, ro.input_is_parallel = 1, ro.seed = 12;
  ROK(mpu_row_linear_create(&row, tp, H3, OUT, &ro));
  ROK(mpu_row_linear_create(&row1, one, H3, OUT, &ro));
  int piece = H3 / T / 3;
  /* the kept master is the single-rank weight; the local rows are its pieces */
  RCHECK(!memcmp(col.master_weight, col1.weight, sizeof(float) * H3 * IN), "master weight");
  for (int k = 0; k < 3; k++)
    RCHECK(!memcmp(col.weight + k * piece * IN, col1.weight + (rank + k * T) * piece * IN,
                   sizeof(float) * piece * IN), "stride piece %d", k);
  float x[N * IN], h[N * H3], h1[N * H3], y[N * OUT], y1[N * OUT], dy[N * OUT];
  float dh[N * H3], dh1[N * H3], dx[N * IN], dx1[N * IN];
  fill(x, N * IN, 1);
  fill(dy, N * OUT, 2);
  ROK(mpu_column_linear_forward(&col, x, N, h));
  ROK(mpu_row_linear_forward(&row, h, N, y));
  ROK(mpu_column_linear_forward(&col1, x, N, h1));
  ROK(mpu_row_linear_forward(&row1, h1, N, y1));
  for (int i = 0; i < N * OUT; i++) RCHECK(close_to(y[i], y1[i]), "y[%d] %g vs %g", i, y[i], y1[i]);
  ROK(mpu_row_linear_backward(&row, dy, dh));
  ROK(mpu_column_linear_backward(&col, dh, dx));
  ROK(mpu_row_linear_backward(&row1, dy, dh1));
  ROK(mpu_column_linear_backward(&col1, dh1, dx1));
  for (int i = 0; i < N * IN; i++) RCHECK(close_to(dx[i], dx1[i]), "dx[%d]", i);
  for (int k = 0; k < 3; k++)
    for (int j = 0; j < piece * IN; j++)
      RCHECK(close_to(col.dweight[k * piece * IN + j], col1.dweight[(rank + k * T) * piece * IN + j]),
             "column dweight piece %d", k);
  mpu_column_linear_free(&col), mpu_column_linear_free(&col1);
  mpu_row_linear_free(&row), mpu_row_linear_free(&row1);
  mpu_comm_destroy(one);
  return MPU_SUCCESS;
}

static void test_strided_layers(void **state) {
  (void)state;
  memset(messages, 0, sizeof messages);
  if (mpu_launch(2, strided_chain, NULL, NULL, NULL))
    fail_msg("%s / %s", messages[0][0] ? messages[0] : messages[1], mpu_last_error());
}

static void test_options(void **state) {
  (void)state;
  mpu_comm *c = alone();
  /* xavier normal by default: std sqrt(2 / (fan_in + fan_out)) */
  mpu_column_linear big;
  assert_int_equal(mpu_column_linear_create(&big, c, 96, 64, NULL), MPU_SUCCESS);
  double sq = 0;
  for (int i = 0; i < 96 * 64; i++) sq += (double)big.weight[i] * big.weight[i];
  double std = sqrt(sq / (96 * 64)), want = sqrt(2.0 / (96 + 64));
  assert_true(fabs(std - want) < 0.05 * want);
  assert_true(big.gather_output && big.has_bias && big.stride == 1); /* mpu/layers.py's defaults */
  mpu_column_linear_free(&big);
  /* a caller's init_method */
  float base = 0.5f;
  mpu_linear_options o = MPU_LINEAR_OPTIONS_INIT;
  o.init_method = constant_init, o.init_arg = &base;
  mpu_row_linear r;
  assert_int_equal(mpu_row_linear_create(&r, c, IN, OUT, &o), MPU_SUCCESS);
  assert_true(r.weight[0] == 0.5f && r.weight[IN * OUT - 1] == 0.5f + (float)(IN * OUT - 1));
  mpu_row_linear_free(&r);
  /* skip_bias_add: the output leaves the bias out and backward leaves its gradient */
  mpu_column_linear with, skip;
  mpu_linear_options so = MPU_LINEAR_OPTIONS_INIT;
  so.seed = 5;
  assert_int_equal(mpu_column_linear_create(&with, c, IN, OUT, &so), MPU_SUCCESS);
  so.skip_bias_add = 1;
  assert_int_equal(mpu_column_linear_create(&skip, c, IN, OUT, &so), MPU_SUCCESS);
  for (int j = 0; j < OUT; j++) with.bias[j] = skip.bias[j] = 0.25f * (float)j;
  float x[N * IN], y[N * OUT], ys[N * OUT], dy[N * OUT], dx[N * IN];
  fill(x, N * IN, 3);
  fill(dy, N * OUT, 4);
  assert_int_equal(mpu_column_linear_forward(&with, x, N, y), MPU_SUCCESS);
  assert_int_equal(mpu_column_linear_forward(&skip, x, N, ys), MPU_SUCCESS);
  for (int i = 0; i < N * OUT; i++) assert_true(close_to(ys[i] + skip.bias[i % OUT], y[i]));
  assert_int_equal(mpu_column_linear_backward(&skip, dy, dx), MPU_SUCCESS);
  for (int j = 0; j < OUT; j++) assert_true(skip.dbias[j] == 0.0f);
  mpu_column_linear_free(&with), mpu_column_linear_free(&skip);
  /* views into a parameter buffer: the same weight as the layer's own memory */
  mpu_param_buffer b;
  mpu_param_buffer_init(&b, 0);
  int w, bias;
  assert_int_equal(mpu_param_buffer_add(&b, "w", IN * OUT, MPU_PARAM_PARTITIONED(0, 1), &w), 0);
  assert_int_equal(mpu_param_buffer_add(&b, "b", OUT, MPU_PARAM_DUPLICATE, &bias), 0);
  assert_int_equal(mpu_param_buffer_finalize(&b, NULL, NULL), 0);
  mpu_linear_options vo = MPU_LINEAR_OPTIONS_INIT;
  vo.seed = 9;
  mpu_column_linear own, view;
  assert_int_equal(mpu_column_linear_create(&own, c, IN, OUT, &vo), MPU_SUCCESS);
  vo.weight = mpu_param_data(&b, w), vo.weight_grad = mpu_param_grad(&b, w);
  vo.bias_data = mpu_param_data(&b, bias), vo.bias_grad = mpu_param_grad(&b, bias);
  assert_int_equal(mpu_column_linear_create(&view, c, IN, OUT, &vo), MPU_SUCCESS);
  assert_memory_equal(own.weight, mpu_param_data(&b, w), sizeof(float) * IN * OUT);
  assert_int_equal(mpu_column_linear_forward(&view, x, N, y), MPU_SUCCESS);
  assert_int_equal(mpu_column_linear_backward(&view, dy, dx), MPU_SUCCESS);
  assert_true(mpu_param_grad(&b, w)[0] != 0.0f && mpu_param_grad(&b, bias)[0] != 0.0f);
  mpu_column_linear_free(&view); /* frees none of the buffer's memory */
  mpu_column_linear_free(&own);
  mpu_param_buffer_free(&b);
  /* a weight view without its gradient; a stride that does not divide */
  vo = (mpu_linear_options)MPU_LINEAR_OPTIONS_INIT;
  float lone[IN * OUT];
  vo.weight = lone;
  assert_int_equal(mpu_column_linear_create(&view, c, IN, OUT, &vo), MPU_ERR_INVALID_ARGUMENT);
  vo = (mpu_linear_options)MPU_LINEAR_OPTIONS_INIT;
  vo.stride = 5;
  assert_int_equal(mpu_column_linear_create(&view, c, IN, OUT, &vo), MPU_ERR_INVALID_ARGUMENT);
  /* the embedding's init_method and views */
  mpu_embedding_options eo = MPU_EMBEDDING_OPTIONS_INIT;
  eo.init_method = constant_init, eo.init_arg = &base;
  mpu_vocab_embedding e;
  assert_int_equal(mpu_vocab_embedding_create(&e, c, VOCAB, IN, &eo), MPU_SUCCESS);
  assert_true(e.weight[3] == 3.5f);
  mpu_vocab_embedding_free(&e);
  mpu_comm_destroy(c);
}

/* ---- LayerNorm and attention against finite differences -------------------------------- */

static void attention_check(int T, int heads, int d, int with_mask);

/* loss = sum(c * f(x)) for fixed c: the analytic dx against central differences */
static void test_norm_and_attention_finite_differences(void **state) {
  (void)state;
  enum { T = 5, HEADS = 2, D = 3, HL = HEADS * D, W3 = 3 * HL };
  /* LayerNorm on (T, HL) */
  mpu_layer_norm ln;
  assert_int_equal(mpu_layer_norm_init(&ln, HL, 1e-5f, NULL, NULL, NULL, NULL), MPU_SUCCESS);
  for (int j = 0; j < HL; j++) ln.weight[j] = 1.0f + 0.1f * (float)j, ln.bias[j] = 0.05f * (float)j;
  float x[T * HL], y[T * HL], c[T * HL], dx[T * HL];
  fill(x, T * HL, 5);
  fill(c, T * HL, 6);
  assert_int_equal(mpu_layer_norm_forward(&ln, x, T, y), MPU_SUCCESS);
  assert_int_equal(mpu_layer_norm_backward(&ln, c, dx), MPU_SUCCESS);
  for (int i = 0; i < T * HL; i++) {
    float keep = x[i], e = 1e-2f;
    double lp = 0, lm = 0;
    x[i] = keep + e;
    mpu_layer_norm_forward(&ln, x, T, y);
    for (int k = 0; k < T * HL; k++) lp += (double)c[k] * y[k];
    x[i] = keep - e;
    mpu_layer_norm_forward(&ln, x, T, y);
    for (int k = 0; k < T * HL; k++) lm += (double)c[k] * y[k];
    x[i] = keep;
    float num = (float)((lp - lm) / (2 * e));
    if (fabsf(num - dx[i]) > 2e-3f * (1 + fabsf(num))) fail_msg("layernorm dx[%d] %g vs %g", i, dx[i], num);
  }
  /* dweight: the sum over rows of dy * xhat */
  assert_true(fabsf(ln.dweight[0]) > 0 && fabsf(ln.dbias[1]) > 0);
  mpu_layer_norm_free(&ln);
  /* attention on (T, 3 HL), with a dropout mask: against the definition and differences */
  attention_check(T, HEADS, D, 1);
  float qkv[T * W3], out[T * HL];
  fill(qkv, T * W3, 7);
  mpu_attention a;
  memset(&a, 0, sizeof a);
  /* causality: the first token's output is its own value, whatever comes after */
  mpu_attention_forward(&a, qkv, T, HEADS, D, NULL, out);
  for (int cidx = 0; cidx < D; cidx++) assert_true(close_to(out[cidx], qkv[2 * HL + cidx]));
  mpu_attention_free(&a);
}

/* attention over several blocks of rows (the last one partial), with and
 * without dropout: dqkv against central differences of sum(g * out), and the
 * output against the plain triple loop of the definition */
static void attention_check(int T, int heads, int d, int with_mask) {
  int hl = heads * d, w3 = 3 * hl;
  size_t tt = (size_t)T * T;
  float *qkv = malloc((size_t)T * w3 * sizeof(float)), *out = malloc((size_t)T * hl * sizeof(float));
  float *dq = malloc((size_t)T * w3 * sizeof(float)), *g = malloc((size_t)T * hl * sizeof(float));
  float *mask = malloc((size_t)heads * tt * sizeof(float)), *s = malloc((size_t)T * sizeof(float));
  assert_non_null(qkv), assert_non_null(out), assert_non_null(dq), assert_non_null(g);
  assert_non_null(mask), assert_non_null(s);
  fill(qkv, T * w3, 9);
  for (int i = 0; i < T * w3; i++) qkv[i] *= 3.0f; /* peaked softmax rows too */
  fill(g, T * hl, 10);
  for (size_t i = 0; i < (size_t)heads * tt; i++) mask[i] = i % 5 == 2 ? 0.0f : 1.25f;
  const float *m = with_mask ? mask : NULL;
  mpu_attention a;
  memset(&a, 0, sizeof a);
  assert_int_equal(mpu_attention_forward(&a, qkv, T, heads, d, m, out), MPU_SUCCESS);
  for (int h = 0; h < heads; h++) /* the definition, token by token */
    for (int i = 0; i < T; i++) {
      double mx = -INFINITY, sum = 0;
      for (int j = 0; j <= i; j++) {
        double dot = 0;
        for (int c = 0; c < d; c++) dot += (double)qkv[i * w3 + h * d + c] * qkv[j * w3 + hl + h * d + c];
        s[j] = (float)(dot / sqrt((double)d));
        mx = fmax(mx, s[j]);
      }
      for (int j = 0; j <= i; j++) sum += exp(s[j] - mx);
      for (int c = 0; c < d; c++) {
        double o = 0;
        for (int j = 0; j <= i; j++)
          o += exp(s[j] - mx) / sum * (m ? m[(size_t)h * tt + (size_t)i * T + j] : 1.0) *
               qkv[j * w3 + 2 * hl + h * d + c];
        float got = out[i * hl + h * d + c];
        if (fabs(got - o) > 1e-5 * (1 + fabs(o))) fail_msg("attention out[%d][%d] %g vs %g", i, h * d + c, got, o);
      }
    }
  /* dqkv poisoned: every element is the backward's (dq written whole, dk and dv cleared first) */
  for (int i = 0; i < T * w3; i++) dq[i] = NAN;
  assert_int_equal(mpu_attention_backward(&a, g, dq), MPU_SUCCESS);
  for (int i = 0; i < T * w3; i++) {
    float keep = qkv[i], e = 1e-2f;
    double lp = 0, lm = 0;
    qkv[i] = keep + e;
    mpu_attention_forward(&a, qkv, T, heads, d, m, out);
    for (int k = 0; k < T * hl; k++) lp += (double)g[k] * out[k];
    qkv[i] = keep - e;
    mpu_attention_forward(&a, qkv, T, heads, d, m, out);
    for (int k = 0; k < T * hl; k++) lm += (double)g[k] * out[k];
    qkv[i] = keep;
    float num = (float)((lp - lm) / (2 * e));
    if (fabsf(num - dq[i]) > 5e-3f * (1 + fabsf(num)))
      fail_msg("attention T %d dqkv[%d] %g vs %g", T, i, dq[i], num);
  }
  mpu_attention_free(&a);
  free(qkv), free(out), free(dq), free(g), free(mask), free(s);
}

static void test_attention_blocks(void **state) {
  (void)state;
  attention_check(70, 2, 4, 1);
  attention_check(70, 2, 4, 0);
  attention_check(33, 1, 2, 0);
}

/* LayerNorm rows of whole vectors and a tail (37 = 2 x 16 + 5) and of the
 * model's 256, on an offset of 10 (the two passes: the mean, then the
 * deviations about it): against the definition in double */
static void test_layer_norm_rows(void **state) {
  (void)state;
  const int hs[] = {37, 256};
  for (int k = 0; k < 2; k++) {
    const int rows = 3;
    int h = hs[k];
    mpu_layer_norm ln;
    assert_int_equal(mpu_layer_norm_init(&ln, h, 1e-5f, NULL, NULL, NULL, NULL), MPU_SUCCESS);
    for (int j = 0; j < h; j++) ln.weight[j] = 1.0f + 0.01f * (float)j, ln.bias[j] = 0.1f;
    float *x = malloc((size_t)rows * h * sizeof(float)), *y = malloc((size_t)rows * h * sizeof(float));
    assert_non_null(x), assert_non_null(y);
    fill(x, rows * h, 7);
    for (int i = 0; i < rows * h; i++) x[i] += 10.0f;
    assert_int_equal(mpu_layer_norm_forward(&ln, x, rows, y), MPU_SUCCESS);
    for (int r = 0; r < rows; r++) {
      double mean = 0, var = 0;
      for (int j = 0; j < h; j++) mean += x[r * h + j];
      mean /= h;
      for (int j = 0; j < h; j++) var += (x[r * h + j] - mean) * (x[r * h + j] - mean);
      double rs = 1 / sqrt(var / h + 1e-5);
      for (int j = 0; j < h; j++) {
        double want = (x[r * h + j] - mean) * rs * ln.weight[j] + ln.bias[j];
        if (fabs(y[r * h + j] - want) > 1e-4 * (1 + fabs(want)))
          fail_msg("layernorm h %d y[%d][%d] %g vs %g", h, r, j, y[r * h + j], want);
      }
    }
    free(x), free(y);
    mpu_layer_norm_free(&ln);
  }
}

static double ulps(float got, double want) {
  float w = (float)want, a = fabsf(w);
  return fabs((double)got - want) / ((double)nextafterf(a, INFINITY) - a);
}

/* mpu_tanh against the exact value (libm's tanh in double) over the floats
 * of interest: every 97th float from 0 to 10.5 (where tanh rounds to 1) and
 * every float of [0.6, 0.65] (where it changes formula), each with its
 * negative; and what is not a finite number. */
static void test_tanh_against_libm(void **state) {
  (void)state;
  enum { BATCH = 1 << 16 };
  float *x = malloc(BATCH * sizeof(float)), *y = malloc(BATCH * sizeof(float));
  assert_non_null(x), assert_non_null(y);
  double worst = 0, worst_libm = 0;
  float worst_at = 0;
  for (int pass = 0; pass < 2; pass++) {
    float lo = pass ? 0.6f : 0.0f, hi = pass ? 0.65f : 10.5f;
    uint32_t step = pass ? 1 : 97, bits;
    memcpy(&bits, &lo, sizeof bits);
    for (int done = 0; !done;) {
      int n = 0;
      for (; n < BATCH; n += 2, bits += step) {
        float v;
        memcpy(&v, &bits, sizeof v);
        if (v > hi) {
          done = 1;
          break;
        }
        x[n] = v, x[n + 1] = -v;
      }
      mpu_tanh(x, y, (size_t)n);
      for (int i = 0; i < n; i++) {
        double want = tanh((double)x[i]), e = ulps(y[i], want);
        if (e > worst) worst = e, worst_at = x[i];
        if (i % 64 == 0) worst_libm = fmax(worst_libm, ulps(tanhf(x[i]), want));
      }
    }
  }
  if (worst > 1.5) fail_msg("mpu_tanh is %.2f ulp off at %.9g (libm's tanhf: %.2f)", worst, worst_at, worst_libm);
  float odd[6] = {INFINITY, -INFINITY, NAN, 40.0f, -1e-30f, 0.0f}, t[6];
  mpu_tanh(odd, t, 6);
  assert_true(t[0] == 1.0f && t[1] == -1.0f && isnan(t[2]) && t[3] == 1.0f && t[4] == -1e-30f);
  assert_true(t[5] == 0.0f && !signbit(t[5]));
  free(x), free(y);
}

/* the GeLU that keeps its tanh computes what the one that does not computes,
 * and both are the tanh formula of Megatron's bias_gelu */
static void test_gelu_kept(void **state) {
  (void)state;
  enum { M = 1000 };
  float x[M], y[M], y2[M], t[M], dy[M], dx[M], dx2[M];
  for (int i = 0; i < M; i++) x[i] = -8.0f + 16.0f * (float)i / M, dy[i] = 0.5f + (float)(i % 7);
  mpu_gelu_forward(x, y, M);
  mpu_gelu_forward_keep(x, y2, t, M);
  mpu_gelu_backward(x, dy, dx, M);
  mpu_gelu_backward_kept(x, t, dy, dx2, M);
  for (int i = 0; i < M; i++) {
    double v = x[i], th = tanh(0.7978845608 * v * (1 + 0.044715 * v * v));
    assert_true(y[i] == y2[i] && dx[i] == dx2[i]);
    if (fabs(y[i] - 0.5 * v * (1 + th)) > 1e-6 * (1 + fabs(v))) fail_msg("gelu(%g) = %g", v, y[i]);
    double slope = 0.5 * (1 + th) + 0.5 * v * (1 - th * th) * 0.7978845608 * (1 + 3 * 0.044715 * v * v);
    if (fabs(dx[i] - slope * dy[i]) > 1e-5 * (1 + fabs(slope * dy[i])))
      fail_msg("gelu'(%g) dy = %g, want %g", v, dx[i], slope * dy[i]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_attention_blocks),
      cmocka_unit_test(test_tanh_against_libm),
      cmocka_unit_test(test_gelu_kept),
      cmocka_unit_test(test_column_row_finite_differences),
      cmocka_unit_test(test_cross_entropy_finite_differences),
      cmocka_unit_test(test_parallel_matches_single),
      cmocka_unit_test(test_backward_in_place),
      cmocka_unit_test(test_input_gradient_against_the_definition),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_strided_layers),
      cmocka_unit_test(test_options),
      cmocka_unit_test(test_norm_and_attention_finite_differences),
      cmocka_unit_test(test_layer_norm_rows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
