/*
 * test_layers_fused.c - what a training step fuses gives the bits of what it
 * replaces: Megatron's bias_gelu after a column layer made with skip_bias_add
 * against the layer's own bias and the plain GeLU (outputs, tanh, input and
 * parameter gradients, the bias's sums), and a linear's forward from its own
 * saved-input buffer against the copying forward; the buffer's refusals;
 * the attention's input buffer and the LayerNorm's backward that adds a
 * residual's gradient against the copying forward and an add apart;
 * the input gradient's kernel, whose panels of the weight are packed from
 * 64 rows of dy on, and the forward's, on the weight's panels transposed, against
 * the chain of fused multiply-adds they promise, and past 256 inputs, in
 * OpenBLAS's blocks, against cblas_sgemm itself.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cblas.h>
#include <cmocka.h>

#include "mpu.h"

static mpu_comm *alone(void) {
  mpu_comm *c = NULL;
  assert_int_equal(mpu_comm_fake_create(0, 1, &c), 0);
  return c;
}

static void fill(float *x, size_t n, int salt) {
  for (size_t i = 0; i < n; i++) x[i] = sinf(0.37f * (float)i + (float)salt) * 1.7f;
}

static float *floats(size_t n) {
  float *p = calloc(n, sizeof(float));
  assert_non_null(p);
  return p;
}

/* column(x) + b then gelu, against column(x) without its bias then bias_gelu:
 * the same bits everywhere, over two micro-batches of accumulated gradients;
 * 100 columns end in a partial vector */
static void test_bias_gelu_is_the_layers_bias(void **state) {
  (void)state;
  enum { N = 48, IN = 256, OUT = 100 };
  mpu_comm *c = alone();
  mpu_column_linear plain, skip;
  mpu_linear_options o = MPU_LINEAR_OPTIONS_INIT;
  o.gather_output = 0, o.seed = 7;
  assert_int_equal(mpu_column_linear_create(&plain, c, IN, OUT, &o), 0);
  o.skip_bias_add = 1;
  assert_int_equal(mpu_column_linear_create(&skip, c, IN, OUT, &o), 0);
  assert_memory_equal(plain.weight, skip.weight, sizeof(float) * IN * OUT);
  fill(plain.bias, OUT, 11);
  memcpy(skip.bias, plain.bias, sizeof(float) * OUT);
  float *x = floats(N * IN), *dg = floats(N * OUT), *h[2], *g[2], *t[2], *dh[2], *dx[2];
  float *h_before = floats(N * OUT);
  for (int k = 0; k < 2; k++)
    h[k] = floats(N * OUT), g[k] = floats(N * OUT), t[k] = floats(N * OUT),
    dh[k] = floats(N * OUT), dx[k] = floats(N * IN);
  for (int mb = 0; mb < 2; mb++) {
    fill(x, N * IN, 3 + mb);
    fill(dg, N * OUT, 5 + mb);
    assert_int_equal(mpu_column_linear_forward(&plain, x, N, h[0]), 0);
    mpu_gelu_forward_keep(h[0], g[0], t[0], N * OUT);
    assert_int_equal(mpu_column_linear_forward(&skip, x, N, h[1]), 0);
    memcpy(h_before, h[1], sizeof(float) * N * OUT);
    mpu_bias_gelu_forward_keep(h[1], skip.bias, N, OUT, g[1], t[1]);
    mpu_gelu_backward_kept(h[0], t[0], dg, dh[0], N * OUT);
    assert_int_equal(mpu_column_linear_backward(&plain, dh[0], dx[0]), 0);
    mpu_bias_gelu_backward_kept(h[1], skip.bias, t[1], dg, dh[1], N, OUT, skip.dbias);
    assert_int_equal(mpu_column_linear_backward(&skip, dh[1], dx[1]), 0);
    /* x only read (the backward adds the bias again), and x + b is the layer's x b^T + b */
    assert_memory_equal(h[1], h_before, sizeof(float) * N * OUT);
    for (size_t i = 0; i < (size_t)N * OUT; i++) h_before[i] += skip.bias[i % OUT];
    assert_memory_equal(h[0], h_before, sizeof(float) * N * OUT);
    assert_memory_equal(g[0], g[1], sizeof(float) * N * OUT);
    assert_memory_equal(t[0], t[1], sizeof(float) * N * OUT);
    assert_memory_equal(dh[0], dh[1], sizeof(float) * N * OUT);
    assert_memory_equal(dx[0], dx[1], sizeof(float) * N * IN);
    assert_memory_equal(plain.dweight, skip.dweight, sizeof(float) * IN * OUT);
    assert_memory_equal(plain.dbias, skip.dbias, sizeof(float) * OUT);
  }
  int moved = 0; /* the bias's gradient is there, not zero */
  for (int j = 0; j < OUT; j++) moved += skip.dbias[j] != 0.0f;
  assert_true(moved > OUT / 2);
  /* without a bias: the plain GeLU's bits, x left as it was */
  memcpy(h[1], h[0], sizeof(float) * N * OUT);
  mpu_bias_gelu_forward_keep(h[1], NULL, N, OUT, g[1], t[1]);
  mpu_gelu_forward_keep(h[0], g[0], t[0], N * OUT);
  assert_memory_equal(h[0], h[1], sizeof(float) * N * OUT);
  assert_memory_equal(g[0], g[1], sizeof(float) * N * OUT);
  /* and no bias gradient to sum into (NULL): the plain GeLU's dx */
  mpu_bias_gelu_backward_kept(h[1], NULL, t[1], dg, dh[1], N, OUT, NULL);
  mpu_gelu_backward_kept(h[0], t[0], dg, dh[0], N * OUT);
  assert_memory_equal(dh[0], dh[1], sizeof(float) * N * OUT);
  /* a bias and no gradient for it: gelu'(x + b) dy, as the plain GeLU gives on x + b */
  memcpy(h_before, h[0], sizeof(float) * N * OUT);
  for (size_t i = 0; i < (size_t)N * OUT; i++) h_before[i] += skip.bias[i % OUT];
  mpu_bias_gelu_forward_keep(h[0], skip.bias, N, OUT, g[1], t[1]);
  mpu_bias_gelu_backward_kept(h[0], skip.bias, t[1], dg, dh[1], N, OUT, NULL);
  mpu_gelu_forward_keep(h_before, g[0], t[0], N * OUT);
  mpu_gelu_backward_kept(h_before, t[0], dg, dh[0], N * OUT);
  assert_memory_equal(g[0], g[1], sizeof(float) * N * OUT);
  assert_memory_equal(dh[0], dh[1], sizeof(float) * N * OUT);
  for (int k = 0; k < 2; k++) free(h[k]), free(g[k]), free(t[k]), free(dh[k]), free(dx[k]);
  free(x), free(dg), free(h_before);
  mpu_column_linear_free(&plain), mpu_column_linear_free(&skip);
  mpu_comm_destroy(c);
}

/* a forward from the layer's own input buffer gives what the copying forward
 * gives, and so does the backward that reads what it saved */
static void test_forward_from_the_saved_input(void **state) {
  (void)state;
  enum { N = 24, IN = 40, OUT = 56 };
  mpu_comm *c = alone();
  float x[N * IN], y[2][N * OUT], dy[N * OUT], dx[2][N * IN], dw[IN * OUT];
  fill(x, N * IN, 1), fill(dy, N * OUT, 2);
  for (int kind = 0; kind < 2; kind++) {
    mpu_column_linear col;
    mpu_row_linear row;
    if (kind == 0) assert_int_equal(mpu_column_linear_init(&col, c, IN, OUT, 1, 0, 0, 5, 0.3f), 0);
    else assert_int_equal(mpu_row_linear_init(&row, c, IN, OUT, 1, 1, 0, 6, 0.3f), 0);
    for (int pass = 0; pass < 2; pass++) {
      const float *in = x;
      if (pass) { /* the caller writes the input where the layer keeps it */
        float *buf = NULL;
        if (kind == 0) assert_int_equal(mpu_column_linear_input(&col, N, &buf), 0);
        else assert_int_equal(mpu_row_linear_input(&row, N, &buf), 0);
        assert_non_null(buf);
        memcpy(buf, x, sizeof x);
        in = buf;
      }
      if (kind == 0) {
        mpu_column_linear_zero_grad(&col);
        assert_int_equal(mpu_column_linear_forward(&col, in, N, y[pass]), 0);
        assert_ptr_equal(pass ? in : col.x_total, col.x_total);
        assert_int_equal(mpu_column_linear_backward(&col, dy, dx[pass]), 0);
        if (!pass) memcpy(dw, col.dweight, sizeof dw);
        else assert_memory_equal(dw, col.dweight, sizeof dw);
      } else {
        mpu_row_linear_zero_grad(&row);
        assert_int_equal(mpu_row_linear_forward(&row, in, N, y[pass]), 0);
        assert_ptr_equal(pass ? in : row.x_local, row.x_local);
        assert_int_equal(mpu_row_linear_backward(&row, dy, dx[pass]), 0);
        if (!pass) memcpy(dw, row.dweight, sizeof dw);
        else assert_memory_equal(dw, row.dweight, sizeof dw);
      }
    }
    assert_memory_equal(y[0], y[1], sizeof y[0]);
    assert_memory_equal(dx[0], dx[1], sizeof dx[0]);
    if (kind == 0) mpu_column_linear_free(&col);
    else mpu_row_linear_free(&row);
  }
  mpu_comm_destroy(c);
}

/* the buffer is refused where the saved input is not what the caller passes
 * (gathered with sequence parallelism, split without input_is_parallel), and
 * a forward from it with another row count is an error, not a read past it */
static void test_saved_input_refusals(void **state) {
  (void)state;
  enum { N = 8, IN = 16, OUT = 16 };
  mpu_comm *c = alone();
  float y[2 * N * OUT], *buf = NULL;
  mpu_column_linear sp, col;
  mpu_row_linear split, row;
  assert_int_equal(mpu_column_linear_init(&sp, c, IN, OUT, 1, 0, 1, 5, 0.3f), 0);
  assert_int_equal(mpu_column_linear_input(&sp, N, &buf), MPU_ERR_INVALID_ARGUMENT);
  assert_null(buf);
  assert_non_null(strstr(mpu_last_error(), "sequence parallelism"));
  assert_int_equal(mpu_row_linear_init(&split, c, IN, OUT, 1, 0, 0, 6, 0.3f), 0);
  assert_int_equal(mpu_row_linear_input(&split, N, &buf), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "input_is_parallel"));
  assert_int_equal(mpu_column_linear_init(&col, c, IN, OUT, 1, 0, 0, 5, 0.3f), 0);
  assert_int_equal(mpu_row_linear_init(&row, c, IN, OUT, 1, 1, 0, 6, 0.3f), 0);
  assert_int_equal(mpu_column_linear_input(&col, 0, &buf), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_column_linear_input(&col, N, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_column_linear_input(NULL, N, &buf), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_row_linear_input(NULL, N, &buf), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_column_linear_input(&col, N, &buf), 0);
  fill(buf, N * IN, 1);
  assert_int_equal(mpu_column_linear_forward(&col, buf, 2 * N, y), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "input buffer"));
  assert_int_equal(mpu_column_linear_forward(&col, buf, N, y), 0);
  assert_int_equal(mpu_row_linear_input(&row, N, &buf), 0);
  fill(buf, N * IN, 2);
  assert_int_equal(mpu_row_linear_forward(&row, buf, 2 * N, y), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_row_linear_forward(&row, buf, N, y), 0);
  mpu_column_linear_free(&sp), mpu_column_linear_free(&col);
  mpu_row_linear_free(&split), mpu_row_linear_free(&row);
  mpu_comm_destroy(c);
}

/* dx = dy W: on a CPU with AVX-512 each element is fmaf over the weight's
 * rows in order, from 0 (src/layers/gemm.c), whatever the shapes: here with
 * the weight's panels packed (64 rows and more), in blocks of 256 of its rows
 * (300 and 520: a second, shorter block), and panels of 18 and 8 columns at
 * the edge. Elsewhere (valgrind hides AVX-512) BLAS's sums, to 1e-5 of the terms' magnitudes. */
static void test_input_gradient_bits(void **state) {
  (void)state;
  static const int shapes[][3] = {{72, 50, 300}, {64, 1024, 256}, {128, 40, 520}, {63, 33, 17}};
  __builtin_cpu_init();
  int exact = __builtin_cpu_supports("avx512f") != 0;
  mpu_comm *c = alone();
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
    float *x = floats((size_t)n * in), *dx = floats((size_t)n * in);
    float *y = floats((size_t)n * out), *dy = floats((size_t)n * out);
    fill(x, (size_t)n * in, 7);
    fill(dy, (size_t)n * out, 8);
    mpu_column_linear col;
    assert_int_equal(mpu_column_linear_init(&col, c, in, out, 0, 0, 0, 11, 0.5f), 0);
    assert_int_equal(mpu_column_linear_forward(&col, x, n, y), 0);
    assert_int_equal(mpu_column_linear_backward(&col, dy, dx), 0);
    for (int i = 0; i < n; i++)
      for (int l = 0; l < in; l++) {
        float want = 0.0f, size = 0.0f; /* size: the sum of the terms' magnitudes */
        for (int j = 0; j < out; j++) {
          float d = dy[(size_t)i * out + j], w = col.weight[(size_t)j * in + l];
          want = fmaf(d, w, want);
          size += fabsf(d * w);
        }
        float got = dx[(size_t)i * in + l];
        if (exact ? memcmp(&got, &want, sizeof got) != 0 : fabsf(got - want) > 1e-5f * (1.0f + size))
          fail_msg("%d x %d x %d: dx[%d][%d] = %.9g, want %.9g", n, in, out, i, l, got, want);
      }
    mpu_column_linear_free(&col);
    free(x), free(dx), free(y), free(dy);
  }
  mpu_comm_destroy(c);
}

/* y = x W^T (+ b): on a CPU with AVX-512, from 64 rows of x on and for up
 * to 256 inputs, each element is fmaf over the inputs in order from 0, then
 * the bias added (OpenBLAS's sums there, the same bits): panels of the
 * weight transposed 16 x 16 at a time, with edges of 8 and 4 columns and 8
 * and 13 inputs. Elsewhere, and for longer rows (OpenBLAS's blocks, checked
 * against cblas_sgemm below), 1e-5. */
static void test_forward_bits(void **state) {
  (void)state;
  static const int shapes[][3] = {{72, 40, 100}, {128, 256, 256}, {64, 29, 36}, {63, 33, 17}, {64, 300, 8}};
  __builtin_cpu_init();
  int avx512 = __builtin_cpu_supports("avx512f") != 0;
  mpu_comm *c = alone();
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
    int exact = avx512 && n >= 64 && in <= 256;
    float *x = floats((size_t)n * in), *y = floats((size_t)n * out);
    fill(x, (size_t)n * in, 9);
    for (int kind = 0; kind < 2; kind++) {
      mpu_column_linear col;
      mpu_row_linear row;
      const float *w, *b;
      if (kind == 0) {
        assert_int_equal(mpu_column_linear_init(&col, c, in, out, 1, 0, 0, 13, 0.5f), 0);
        fill(col.bias, (size_t)out, 4);
        assert_int_equal(mpu_column_linear_forward(&col, x, n, y), 0);
        w = col.weight, b = col.bias;
      } else {
        assert_int_equal(mpu_row_linear_init(&row, c, in, out, 0, 1, 0, 14, 0.5f), 0);
        assert_int_equal(mpu_row_linear_forward(&row, x, n, y), 0);
        w = row.weight, b = NULL;
      }
      for (int i = 0; i < n; i++)
        for (int j = 0; j < out; j++) {
          float want = 0.0f, size = b ? fabsf(b[j]) : 0.0f;
          for (int l = 0; l < in; l++) {
            float p = x[(size_t)i * in + l], q = w[(size_t)j * in + l];
            want = fmaf(p, q, want);
            size += fabsf(p * q);
          }
          if (b) want = b[j] + want;
          float got = y[(size_t)i * out + j];
          if (exact ? memcmp(&got, &want, sizeof got) != 0 : fabsf(got - want) > 1e-5f * (1.0f + size))
            fail_msg("%s %d x %d x %d: y[%d][%d] = %.9g, want %.9g", kind ? "row" : "column", n, in,
                     out, i, j, got, want);
        }
      if (kind == 0) mpu_column_linear_free(&col);
      else mpu_row_linear_free(&row);
    }
    free(x), free(y);
  }
  mpu_comm_destroy(c);
}

/* mpu_attention_input: q, k, v written into the attention's own buffer give the bits of a
 * forward and backward that copy them; that buffer with another shape is refused */
static void test_attention_input_buffer(void **state) {
  (void)state;
  enum { T = 40, HEADS = 2, D = 8, W = 3 * HEADS * D };
  float qkv[T * W], out[2][T * HEADS * D], g[T * HEADS * D], dq[2][T * W];
  fill(qkv, T * W, 21), fill(g, T * HEADS * D, 22);
  mpu_attention a[2];
  memset(a, 0, sizeof a);
  assert_int_equal(mpu_attention_forward(&a[0], qkv, T, HEADS, D, NULL, out[0]), MPU_SUCCESS);
  float *in = NULL;
  assert_int_equal(mpu_attention_input(&a[1], T, HEADS, D, &in), MPU_SUCCESS);
  assert_non_null(in);
  memcpy(in, qkv, sizeof qkv);
  assert_int_equal(mpu_attention_forward(&a[1], in, T, HEADS, D, NULL, out[1]), MPU_SUCCESS);
  assert_ptr_equal(a[1].qkv, in); /* no copy made */
  for (int k = 0; k < 2; k++) assert_int_equal(mpu_attention_backward(&a[k], g, dq[k]), MPU_SUCCESS);
  assert_memory_equal(out[0], out[1], sizeof out[0]);
  assert_memory_equal(dq[0], dq[1], sizeof dq[0]);
  assert_int_equal(mpu_attention_forward(&a[1], in, T / 2, HEADS, D, NULL, out[1]),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_ptr_equal(a[1].qkv, in); /* and the buffer is kept */
  assert_int_equal(mpu_attention_input(&a[1], 0, HEADS, D, &in), MPU_ERR_INVALID_ARGUMENT);
  assert_null(in);
  in = qkv; /* no attention: still NULL on the error */
  assert_int_equal(mpu_attention_input(NULL, T, HEADS, D, &in), MPU_ERR_INVALID_ARGUMENT);
  assert_null(in);
  for (int k = 0; k < 2; k++) mpu_attention_free(&a[k]);
}

/* mpu_layer_norm_backward_add: the residual's gradient plus the LayerNorm's, the bits of the
 * backward and a separate add, the weight's and bias's gradients the same */
static void test_layer_norm_backward_add(void **state) {
  (void)state;
  enum { ROWS = 5, H = 37 };
  mpu_layer_norm ln[2];
  float x[ROWS * H], dy[ROWS * H], y[ROWS * H], d[ROWS * H], res[ROWS * H], got[ROWS * H];
  fill(x, ROWS * H, 3), fill(dy, ROWS * H, 4), fill(res, ROWS * H, 5);
  for (int k = 0; k < 2; k++) {
    assert_int_equal(mpu_layer_norm_init(&ln[k], H, 1e-5f, NULL, NULL, NULL, NULL), MPU_SUCCESS);
    for (int j = 0; j < H; j++) ln[k].weight[j] = 1.0f + 0.01f * (float)j, ln[k].bias[j] = 0.1f;
    assert_int_equal(mpu_layer_norm_forward(&ln[k], x, ROWS, y), MPU_SUCCESS);
  }
  assert_int_equal(mpu_layer_norm_backward(&ln[0], dy, d), MPU_SUCCESS);
  memcpy(got, res, sizeof got);
  assert_int_equal(mpu_layer_norm_backward_add(&ln[1], dy, got), MPU_SUCCESS);
  for (int i = 0; i < ROWS * H; i++) {
    float want = res[i] + d[i];
    assert_memory_equal(&got[i], &want, sizeof want);
  }
  assert_memory_equal(ln[0].dweight, ln[1].dweight, sizeof(float) * H);
  assert_memory_equal(ln[0].dbias, ln[1].dbias, sizeof(float) * H);
  assert_int_equal(mpu_layer_norm_backward_add(NULL, dy, got), MPU_ERR_INVALID_ARGUMENT);
  /* overlapping dy and dx (the kernel's restrict) are refused, dx and the gradients untouched */
  memcpy(got, res, sizeof got);
  assert_int_equal(mpu_layer_norm_backward_add(&ln[1], got + H, got), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_layer_norm_backward_add(&ln[1], got, got), MPU_ERR_INVALID_ARGUMENT);
  assert_memory_equal(got, res, sizeof got);
  assert_memory_equal(ln[0].dweight, ln[1].dweight, sizeof(float) * H);
  for (int k = 0; k < 2; k++) mpu_layer_norm_free(&ln[k]);
}

/* Whether this OpenBLAS runs the SkylakeX kernel whose sums mpu's forward
 * reproduces (OpenBLAS 0.3.21's level-3 driver, GEMM_Q 448). */
static int openblas_skylakex(void) {
  const char *core = openblas_get_corename(), *config = openblas_get_config();
  __builtin_cpu_init();
  /* GEMM_Q and the driver's split are 0.3.21's: another release may cut k otherwise */
  return core && strcasecmp(core, "skylakex") == 0 && config &&
         strstr(config, "OpenBLAS 0.3.21") && __builtin_cpu_supports("avx512f");
}

/* y = x W^T (+ b) past 256 inputs (fc2's 1024 at tp 1, 512 at tp 2) is
 * OpenBLAS's own sum: blocks of 448 while 896 inputs are left, then half the
 * rest rounded up to 16, each block a chain from 0 added to y (to 0 on the
 * first without a bias, so a row of products that underflow gives +0, not
 * the chain's -0). Against cblas_sgemm itself, bit for bit where it runs the
 * SkylakeX kernel on one thread, as a rank of the demo runs it (its
 * threaded driver halves the rest without rounding it), at shapes of more
 * than 100^3 multiply-adds (smaller ones OpenBLAS gives its small-matrix
 * kernel, which sums otherwise): 256
 * inputs (one panel), the edges of the blocks (448, 449, 895, 896, 897),
 * blocks longer than the kernel's 256-row panels, 24, 33 and 40 columns, 130
 * and 136 rows (past the 128 rows whose chains wait between pieces of a
 * block), and 200 rows of a single block (one pass over them). */
static void test_forward_blocks_bits(void **state) {
  (void)state;
  static const int shapes[][3] = {{128, 1024, 256}, {128, 512, 256}, {128, 256, 256}, {128, 257, 40}, {64, 448, 40},
                                  {64, 449, 40}, {130, 895, 40}, {64, 896, 24}, {136, 897, 40},
                                  {64, 1400, 33}, {200, 200, 40}};
  int exact = openblas_skylakex();
  int threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  mpu_comm *c = alone();
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int n = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
    float *x = floats((size_t)n * in), *y = floats((size_t)n * out), *want = floats((size_t)n * out);
    fill(x, (size_t)n * in, 5);
    for (int l = 0; l < in; l++) x[l] = -0x1p-149f; /* row 0: each product underflows to -0 */
    for (int kind = 0; kind < 2; kind++) {
      mpu_column_linear col;
      mpu_row_linear row;
      float *w;
      if (kind == 0) {
        assert_int_equal(mpu_column_linear_init(&col, c, in, out, 1, 0, 0, 15, 0.5f), 0);
        fill(col.bias, (size_t)out, 6);
        w = col.weight;
      } else {
        assert_int_equal(mpu_row_linear_init(&row, c, in, out, 0, 1, 0, 16, 0.5f), 0);
        w = row.weight;
      }
      for (size_t i = 0; i < (size_t)out * in; i++) w[i] = fminf(fabsf(w[i]), 0.49f);
      if (kind == 0) {
        assert_int_equal(mpu_column_linear_forward(&col, x, n, y), 0);
        for (int i = 0; i < n; i++) memcpy(want + (size_t)i * out, col.bias, (size_t)out * sizeof(float));
      } else {
        assert_int_equal(mpu_row_linear_forward(&row, x, n, y), 0);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in,
                  kind == 0 ? 1.0f : 0.0f, want, out);
      for (size_t i = 0; i < (size_t)n * out; i++) {
        size_t r = i / (size_t)out;
        float size = 0.0f; /* the sum of the terms' magnitudes */
        for (int l = 0; l < in && !exact; l++) size += fabsf(x[r * in + l] * w[(i % out) * in + l]);
        if (exact ? memcmp(&y[i], &want[i], sizeof y[i]) != 0
                  : fabsf(y[i] - want[i]) > 1e-5f * (1.0f + size))
          fail_msg("%s %d x %d x %d: y[%zu][%zu] = %.9g, cblas_sgemm %.9g", kind ? "row" : "column",
                   n, in, out, r, i % out, y[i], want[i]);
      }
      if (kind == 0) mpu_column_linear_free(&col);
      else mpu_row_linear_free(&row);
    }
    free(x), free(y), free(want);
  }
  openblas_set_num_threads(threads);
  mpu_comm_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bias_gelu_is_the_layers_bias),
      cmocka_unit_test(test_forward_from_the_saved_input),
      cmocka_unit_test(test_saved_input_refusals),
      cmocka_unit_test(test_input_gradient_bits),
      cmocka_unit_test(test_forward_bits),
      cmocka_unit_test(test_attention_input_buffer),
      cmocka_unit_test(test_layer_norm_backward_add),
      cmocka_unit_test(test_forward_blocks_bits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
