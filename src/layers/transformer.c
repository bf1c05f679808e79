/*
 * transformer.c - the pieces of a transformer block that are not
 * tensor-parallel layers themselves: LayerNorm (a duplicate on every rank)
 * and the softmax attention over the heads a rank holds.
 */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/span.h"
#include "layers/gemm.h"
#include "layers/kernels.h"
#include "layers/layers_internal.h"

/* A row's sums in one vector of 16 lanes folded as a tree (GCC's
 * vector extensions, lowered to each clone's widest registers): an omp simd
 * reduction adds its lanes one by one through memory at the end, which for
 * a softmax row of tens of scores cost a tenth of the attention's forward
 * and for a LayerNorm row of 256 a fifth of its forward. */
typedef float lanes_f __attribute__((vector_size(64)));
enum { LANES = 16 };

#define LANES_HALF(v, w)                                                                        \
  __builtin_shufflevector(v, v, (0 ^ (w)), (1 ^ (w)), (2 ^ (w)), (3 ^ (w)), (4 ^ (w)),           \
                          (5 ^ (w)), (6 ^ (w)), (7 ^ (w)), (8 ^ (w)), (9 ^ (w)), (10 ^ (w)),     \
                          (11 ^ (w)), (12 ^ (w)), (13 ^ (w)), (14 ^ (w)), (15 ^ (w)))

/* the sum of acc's lanes (acc is changed) */
#define LANES_FOLD(acc)                                                                   \
  ((acc) += LANES_HALF(acc, 8), (acc) += LANES_HALF(acc, 4), (acc) += LANES_HALF(acc, 2), \
   (acc) += LANES_HALF(acc, 1), (acc)[0])

/* the sum of p's first span floats: 16 lanes at a time, then the tail in
 * order (the softmax rows sum theirs the same way inside their passes) */
static inline __attribute__((always_inline)) float row_sum(const float *p, int span) {
  lanes_f acc = {0}, x;
  int j = 0;
  for (; j + LANES <= span; j += LANES) {
    memcpy(&x, p + j, sizeof x);
    acc += x;
  }
  float s = LANES_FOLD(acc);
  for (; j < span; j++) s += p[j];
  return s;
}

/* ---- LayerNorm ---------------------------------------------------------------------------- */

mpu_result_t mpu_layer_norm_init(mpu_layer_norm *ln, int hidden, float eps, float *weight,
                                 float *bias, float *dweight, float *dbias) {
  static const char fn[] = "mpu_layer_norm_init";
  if (!ln) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL", fn);
  memset(ln, 0, sizeof *ln);
  int views = (weight != NULL) + (bias != NULL) + (dweight != NULL) + (dbias != NULL);
  if (hidden < 1 || !(eps > 0) || (views != 0 && views != 4))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: hidden %d, eps %g, views all four or none (%d given)", fn, hidden, eps,
                      views);
  ln->hidden = hidden, ln->eps = eps, ln->owns_params = views == 0;
  size_t h = (size_t)hidden;
  ln->weight = weight ? weight : malloc(h * sizeof(float));
  ln->bias = bias ? bias : malloc(h * sizeof(float));
  ln->dweight = dweight ? dweight : calloc(h, sizeof(float));
  ln->dbias = dbias ? dbias : calloc(h, sizeof(float));
  if (!ln->weight || !ln->bias || !ln->dweight || !ln->dbias) {
    mpu_layer_norm_free(ln);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  }
  for (size_t i = 0; i < h; i++) ln->weight[i] = 1.0f, ln->bias[i] = 0.0f;
  return MPU_SUCCESS;
}

void mpu_layer_norm_free(mpu_layer_norm *ln) {
  if (!ln) return;
  if (ln->owns_params) free(ln->weight), free(ln->bias), free(ln->dweight), free(ln->dbias);
  free(ln->xhat), free(ln->rstd);
  memset(ln, 0, sizeof *ln);
}

/* one row: xhat and y; returns 1/sqrt(var + eps) (two passes: the mean, then
 * the variance about it, so large offsets lose nothing) */
MPU_SIMD_CLONES static float norm_row(const float *restrict x, const float *restrict w,
                                      const float *restrict b, size_t h, float eps,
                                      float *restrict xhat, float *restrict y) {
  float mean = row_sum(x, (int)h) / (float)h; /* h: a layer's hidden, an int */
  lanes_f dev = {0}, v;
  size_t j;
  for (j = 0; j + LANES <= h; j += LANES) {
    memcpy(&v, x + j, sizeof v);
    v -= mean;
    dev += v * v;
  }
  float var = LANES_FOLD(dev);
  for (; j < h; j++) var += (x[j] - mean) * (x[j] - mean);
  float rs = 1.0f / sqrtf(var / (float)h + eps);
  for (j = 0; j < h; j++) {
    float xh = (x[j] - mean) * rs;
    xhat[j] = xh;
    y[j] = xh * w[j] + b[j];
  }
  return rs;
}

mpu_result_t mpu_layer_norm_forward(mpu_layer_norm *ln, const float *x, int n, float *y) {
  static const char fn[] = "mpu_layer_norm_forward";
  if (!ln || !ln->weight || !x || !y || n < 1)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument or %d rows", fn, n);
  size_t h = (size_t)ln->hidden;
  if ((size_t)n > SIZE_MAX / sizeof(float) / h)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d rows of %zu overflow", fn, n, h);
  float *xhat = realloc(ln->xhat, (size_t)n * h * sizeof(float));
  if (xhat) ln->xhat = xhat;
  float *rstd = realloc(ln->rstd, (size_t)n * sizeof(float));
  if (rstd) ln->rstd = rstd;
  if (!xhat || !rstd) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d rows", fn, n);
  ln->n = n;
  for (size_t i = 0; i < (size_t)n; i++)
    ln->rstd[i] = norm_row(x + i * h, ln->weight, ln->bias, h, ln->eps, ln->xhat + i * h, y + i * h);
  return MPU_SUCCESS;
}

/* one row of the backward, fused: the weight and bias gradients and both
 * sums in one pass over the row, dx in a second (added to dx's own values
 * with add: a residual's gradient, dx + d, as a separate add would make it) */
MPU_SIMD_CLONES static void norm_row_backward(const float *restrict g, const float *restrict xh,
                                              const float *restrict w, size_t h, float rs,
                                              float *restrict dw, float *restrict db,
                                              float *restrict dx, int add) {
  float sum_g = 0, sum_gx = 0; /* of dxhat = dy * weight */
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (size_t j = 0; j < h; j++) {
    float d = g[j] * w[j];
    sum_g += d, sum_gx += d * xh[j];
    dw[j] += g[j] * xh[j];
    db[j] += g[j];
  }
  float mg = sum_g / (float)h, mgx = sum_gx / (float)h;
  if (add) /* (not 0 + d when not adding: -0.0 stays -0.0) */
    for (size_t j = 0; j < h; j++) dx[j] = dx[j] + rs * (g[j] * w[j] - mg - xh[j] * mgx);
  else
    for (size_t j = 0; j < h; j++) dx[j] = rs * (g[j] * w[j] - mg - xh[j] * mgx);
}

static mpu_result_t norm_backward(const char *fn, mpu_layer_norm *ln, const float *dy, float *dx,
                                  int add) {
  if (!ln || !ln->xhat || !dy || !dx)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: no forward yet", fn);
  size_t h = (size_t)ln->hidden, bytes = (size_t)ln->n * h * sizeof(float);
  /* the row kernel reads dy and dx through restrict pointers: overlap is undefined */
  if (add && mpu__spans_overlap(dy, bytes, dx, bytes))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: dy and dx overlap", fn);
  for (size_t i = 0; i < (size_t)ln->n; i++)
    norm_row_backward(dy + i * h, ln->xhat + i * h, ln->weight, h, ln->rstd[i], ln->dweight,
                      ln->dbias, dx + i * h, add);
  return MPU_SUCCESS;
}

mpu_result_t mpu_layer_norm_backward(mpu_layer_norm *ln, const float *dy, float *dx) {
  return norm_backward("mpu_layer_norm_backward", ln, dy, dx, 0);
}

mpu_result_t mpu_layer_norm_backward_add(mpu_layer_norm *ln, const float *dy, float *dx) {
  return norm_backward("mpu_layer_norm_backward_add", ln, dy, dx, 1);
}

/* ---- attention ----------------------------------------------------------------------------- */

/*
 * Per head, the products work on the heads' columns of qkv (leading
 * dimension 3 heads d): S = q k^T, out = P v, and in the
 * backward dD = dout v^T, dv = D^T dout, dq = dS k, dk = dS^T q. The causal
 * mask is used in blocks of rows: rows i0..i1-1 see keys 0..i1-1 only, so
 * the products skip most of the masked triangle (10/16 of the full square at
 * 4 blocks), and the softmax runs on each row's visible part. The products
 * whose right operand is a head's k^T, v^T or its own v, k (S, out, dD, dq)
 * run on the kernel of gemm.h, k^T and v^T transposed once per head (d x T,
 * in L1 for the head's blocks) and the forward's v copied (rows d apart, see
 * gather_rows): at these shapes (32 rows, d 32) BLAS spends more of each
 * call on its set-up and packing than on the product. dv and dk,
 * whose left operand is transposed, stay with cblas_sgemm (transposing a
 * block's D or dS for the kernel cost more than it gained).
 */
enum { ROWS = 32 }; /* rows per block: a block's keys stay in cache */

void mpu_attention_free(mpu_attention *a) {
  if (!a) return;
  free(a->qkv), free(a->probs), free(a->dropped);
  memset(a, 0, sizeof *a);
}

/* row i's dropout: D = P * mask, from the mask or as P itself */
MPU_SIMD_CLONES static void drop_row(const float *restrict p, const float *restrict mask,
                                     float *restrict d, int n) {
  for (int j = 0; j < n; j++) d[j] = p[j] * mask[j];
}

/* The columns a row's passes run over: n rounded up to 16 (whole vectors,
 * no scalar tail), within the m columns the block's product computed. */
static int row_span(int n, int m) {
  int r = (n + 15) & ~15;
  return r < m ? r : m;
}

/* softmax of the first n of a row's m computed scores (scaled by scale
 * first), in place; columns n..span-1 become 0. The max is subtracted so exp
 * never overflows, and clamped below at -87. Every pass runs over whole
 * vectors of 16 (the columns past n masked: the max is the same whatever the
 * order, and the sum's lanes are row_sum's, added in the exp's pass), and
 * only a row cut short at m has a scalar tail: a row is tens of columns, and
 * loops over n or span left the compiler's scalar epilogues most of the
 * work. Static: GCC exports a target_clones function's resolver whatever its
 * visibility. */
MPU_SIMD_CLONES static void softmax_row(float *p, int n, int m, float scale) {
  int span = row_span(n, m), whole = span & ~(LANES - 1), j;
  float first = p[0] * scale, lmax[LANES];
  for (int k = 0; k < LANES; k++) lmax[k] = first;
  for (j = 0; j < whole; j += LANES)
#pragma omp simd
    for (int k = 0; k < LANES; k++) {
      float s = j + k < n ? p[j + k] * scale : first;
      lmax[k] = s > lmax[k] ? s : lmax[k];
    }
  /* the lanes folded as a tree (a max is the same in any order) */
#define MAX_HALF(w) \
  for (int k = 0; k < (w); k++) lmax[k] = lmax[k + (w)] > lmax[k] ? lmax[k + (w)] : lmax[k]
  MAX_HALF(8);
  MAX_HALF(4);
  MAX_HALF(2);
  MAX_HALF(1);
#undef MAX_HALF
  float mx = lmax[0];
  for (; j < n; j++) mx = p[j] * scale > mx ? p[j] * scale : mx;
  lanes_f acc = {0}, x;
  for (j = 0; j < whole; j += LANES) {
    float e[LANES];
#pragma omp simd
    for (int k = 0; k < LANES; k++) {
      float s = j + k < n ? p[j + k] * scale - mx : -87.0f;
      s = s > -87.0f ? s : -87.0f;
      float v = mpu__expf(s);
      e[k] = j + k < n ? v : 0.0f;
      p[j + k] = e[k];
    }
    memcpy(&x, e, sizeof x);
    acc += x;
  }
  float sum = LANES_FOLD(acc);
  for (; j < span; j++) { /* a row cut short at m: span is m, not a multiple of 16 */
    float s = p[j] * scale - mx;
    p[j] = j < n ? mpu__expf(s > -87.0f ? s : -87.0f) : 0.0f;
    sum += p[j];
  }
  float inv = 1.0f / sum;
  for (j = 0; j < whole; j += LANES)
#pragma omp simd
    for (int k = 0; k < LANES; k++) p[j + k] *= inv;
  for (; j < span; j++) p[j] *= inv;
}

/* x (rows, cols; leading dimension ld) into y (rows, cols), rows cols apart:
 * a head's v as the right operand of out = D v, whose rows in qkv are 3
 * heads d apart (3 KiB at 8 heads of 32) and fall in a few sets of L1, so
 * each tile of D's rows read them from L2 */
static void gather_rows(const float *x, size_t ld, int rows, int cols, float *y) {
  for (int i = 0; i < rows; i++)
    memcpy(y + (size_t)i * cols, x + (size_t)i * ld, (size_t)cols * sizeof(float));
}

/* x (rows, cols; leading dimension ld) transposed into t (cols, rows) */
static void transpose(const float *x, size_t ld, int rows, int cols, float *t) {
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < cols; j++) t[(size_t)j * rows + i] = x[(size_t)i * ld + j];
}

/* the saved input and probabilities sized for (T, heads, head_dim): kept when they are */
static mpu_result_t attention_buffers(const char *fn, mpu_attention *a, int T, int heads,
                                      int head_dim) {
  if (T < 1 || heads < 1 || head_dim < 1 || T > 65536 || heads > 65536 || head_dim > 65536)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: T %d, %d heads of %d", fn, T, heads,
                      head_dim);
  if (a->T == T && a->heads == heads && a->head_dim == head_dim && a->qkv) return MPU_SUCCESS;
  size_t W = 3 * (size_t)heads * head_dim, tt = (size_t)T * T;
  mpu_attention_free(a);
  a->qkv = malloc((size_t)T * W * sizeof(float));
  a->probs = malloc((size_t)heads * tt * sizeof(float));
  if (!a->qkv || !a->probs) {
    mpu_attention_free(a);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: T %d, %d heads", fn, T, heads);
  }
  a->T = T, a->heads = heads, a->head_dim = head_dim;
  return MPU_SUCCESS;
}

mpu_result_t mpu_attention_input(mpu_attention *a, int T, int heads, int head_dim, float **qkv) {
  static const char fn[] = "mpu_attention_input";
  if (qkv) *qkv = NULL;
  if (!a || !qkv) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  MPU_CHECK(attention_buffers(fn, a, T, heads, head_dim));
  *qkv = a->qkv;
  return MPU_SUCCESS;
}

mpu_result_t mpu_attention_forward(mpu_attention *a, const float *qkv, int T, int heads,
                                   int head_dim, const float *dropout_mask, float *out) {
  static const char fn[] = "mpu_attention_forward";
  if (!a || !qkv || !out)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (qkv == a->qkv && (a->T != T || a->heads != heads || a->head_dim != head_dim))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: qkv is the attention's input buffer, for T %d, %d heads of %d; T %d, "
                      "%d heads of %d given", fn, a->T, a->heads, a->head_dim, T, heads, head_dim);
  MPU_CHECK(attention_buffers(fn, a, T, heads, head_dim));
  size_t Hl = (size_t)heads * head_dim, W = 3 * Hl, tt = (size_t)T * T;
  if (dropout_mask && !a->dropped) { /* the dropped probabilities: only with a mask */
    a->dropped = malloc((size_t)heads * tt * sizeof(float));
    if (!a->dropped) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: T %d, %d heads", fn, T, heads);
  }
  a->has_mask = dropout_mask != NULL;
  if (a->qkv != qkv) memcpy(a->qkv, qkv, (size_t)T * W * sizeof(float));
  float scale = 1.0f / sqrtf((float)head_dim);
  int d = head_dim;
  /* a head's k^T and its v, rows d apart */
  float *kt = malloc(2 * (size_t)d * T * sizeof(float));
  if (!kt) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: T %d, head_dim %d", fn, T, d);
  float *vh = kt + (size_t)d * T;
  for (int h = 0; h < heads; h++) {
    const float *q = qkv + (size_t)h * d, *k = q + Hl, *v = q + 2 * Hl;
    float *P = a->probs + (size_t)h * tt;
    float *D = dropout_mask ? a->dropped + (size_t)h * tt : P;
    transpose(k, W, T, d, kt);
    gather_rows(v, W, T, d, vh);
    for (int i0 = 0; i0 < T; i0 += ROWS) {
      int nb = T - i0 < ROWS ? T - i0 : ROWS, i1 = i0 + nb;
      float *S = P + (size_t)i0 * T;
      mpu__gemm_nn(nb, i1, d, q + (size_t)i0 * W, (int)W, kt, T, S, T);
      for (int i = i0; i < i1; i++) { /* causal: token i sees 0..i */
        float *row = P + (size_t)i * T;
        softmax_row(row, i + 1, i1, scale);
        int span = row_span(i + 1, i1);
        memset(row + span, 0, (size_t)(T - span) * sizeof(float));
        if (dropout_mask)
          drop_row(row, dropout_mask + (size_t)h * tt + (size_t)i * T, D + (size_t)i * T, T);
      }
      mpu__gemm_nn(nb, d, i1, D + (size_t)i0 * T, T, vh, d, out + (size_t)i0 * Hl + (size_t)h * d,
                   (int)Hl);
    }
  }
  free(kt);
  return MPU_SUCCESS;
}

/* the gradient reaching a row's column c of the softmax: 0 past its n visible
 * columns, and through the dropout where there is one (p 0: not kept) */
static inline __attribute__((always_inline)) float grad_in(const float *restrict g,
                                                            const float *restrict p,
                                                            const float *restrict dropped, int c,
                                                            int n) {
  if (dropped) return c < n && p[c] > 0 ? g[c] * (dropped[c] / p[c]) : 0.0f;
  return c < n ? g[c] : 0.0f;
}

/* row i of dS from dD (in place), over the first n of the row's m computed
 * columns (n..span-1 become 0): dP = dD * keep, keep = D / P (the mask's
 * 1/(1-p) or 0); dS = P (dP - sum_j P dP) scale */
MPU_SIMD_CLONES static void softmax_row_backward(float *restrict g, const float *restrict p,
                                                 const float *restrict dropped, int n, int m,
                                                 float scale) {
  /* whole vectors of 16 as the forward's row, the dot's lanes (as row_sum's) summed in the mask's
   * pass; a scalar tail only for a row cut short at m */
  int span = row_span(n, m), whole = span & ~(LANES - 1), j;
  lanes_f acc = {0}, x;
  for (j = 0; j < whole; j += LANES) {
    float e[LANES];
    if (dropped) { /* a loop per case: each branch-free */
#pragma omp simd
      for (int k = 0; k < LANES; k++) {
        float v = grad_in(g, p, dropped, j + k, n);
        g[j + k] = v;
        e[k] = p[j + k] * v;
      }
    } else {
#pragma omp simd
      for (int k = 0; k < LANES; k++) {
        float v = grad_in(g, p, NULL, j + k, n);
        g[j + k] = v;
        e[k] = p[j + k] * v;
      }
    }
    memcpy(&x, e, sizeof x);
    acc += x;
  }
  float dot = LANES_FOLD(acc);
  for (; j < span; j++) {
    g[j] = grad_in(g, p, dropped, j, n);
    dot += p[j] * g[j];
  }
  for (j = 0; j < whole; j += LANES)
#pragma omp simd
    for (int k = 0; k < LANES; k++) g[j + k] = p[j + k] * (g[j + k] - dot) * scale;
  for (; j < span; j++) g[j] = p[j] * (g[j] - dot) * scale;
}

mpu_result_t mpu_attention_backward(mpu_attention *a, const float *dout, float *dqkv) {
  if (!a || !a->qkv || !dout || !dqkv)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_attention_backward: no forward yet");
  int T = a->T, d = a->head_dim;
  size_t Hl = (size_t)a->heads * d, W = 3 * Hl, tt = (size_t)T * T;
  float scale = 1.0f / sqrtf((float)d);
  memset(dqkv, 0, (size_t)T * W * sizeof(float));
  /* a block's dD, then dS (ROWS x T), and a head's v^T (d x T) */
  float *G = malloc(((size_t)ROWS + (size_t)d) * T * sizeof(float)), *vt = G + (size_t)ROWS * T;
  if (!G) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_attention_backward");
  for (int h = 0; h < a->heads; h++) {
    const float *q = a->qkv + (size_t)h * d, *k = q + Hl, *v = q + 2 * Hl;
    float *dq = dqkv + (size_t)h * d, *dk = dq + Hl, *dv = dq + 2 * Hl;
    const float *P = a->probs + (size_t)h * tt;
    const float *D = a->has_mask ? a->dropped + (size_t)h * tt : P;
    transpose(v, W, T, d, vt);
    for (int i0 = 0; i0 < T; i0 += ROWS) {
      int nb = T - i0 < ROWS ? T - i0 : ROWS, i1 = i0 + nb;
      const float *go = dout + (size_t)i0 * Hl + (size_t)h * d;
      /* out = D v: dv += D^T dout, dD = dout v^T */
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, d, nb, 1.0f, D + (size_t)i0 * T, T,
                  go, (int)Hl, 1.0f, dv, (int)W);
      mpu__gemm_nn(nb, i1, d, go, (int)Hl, vt, T, G, T);
      for (int i = i0; i < i1; i++) { /* row i's dS past i is 0: the mask */
        float *g = G + (size_t)(i - i0) * T;
        softmax_row_backward(g, P + (size_t)i * T, a->has_mask ? D + (size_t)i * T : NULL, i + 1,
                             i1, scale);
        int span = row_span(i + 1, i1);
        memset(g + span, 0, (size_t)(i1 - span) * sizeof(float));
      }
      /* s = q k^T: dq = dS k, dk += dS^T q */
      mpu__gemm_nn(nb, d, i1, G, T, k, (int)W, dq + (size_t)i0 * W, (int)W);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, i1, d, nb, 1.0f, G, T,
                  q + (size_t)i0 * W, (int)W, 1.0f, dk, (int)W);
    }
  }
  free(G);
  return MPU_SUCCESS;
}
