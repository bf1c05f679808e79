/*
 * transformer.c - the pieces of a transformer block that are not
 * tensor-parallel layers themselves: LayerNorm (a duplicate on every rank)
 * and the softmax attention over the heads a rank holds.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "layers/layers_internal.h"

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

mpu_result_t mpu_layer_norm_forward(mpu_layer_norm *ln, const float *x, int n, float *y) {
  static const char fn[] = "mpu_layer_norm_forward";
  if (!ln || !ln->weight || !x || !y || n < 1)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument or %d rows", fn, n);
  size_t h = (size_t)ln->hidden;
  float *xhat = realloc(ln->xhat, (size_t)n * h * sizeof(float));
  if (xhat) ln->xhat = xhat;
  float *rstd = realloc(ln->rstd, (size_t)n * sizeof(float));
  if (rstd) ln->rstd = rstd;
  if (!xhat || !rstd) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d rows", fn, n);
  ln->n = n;
  for (int i = 0; i < n; i++) {
    const float *row = x + (size_t)i * h;
    double mean = 0, var = 0;
    for (size_t j = 0; j < h; j++) mean += row[j];
    mean /= (double)h;
    for (size_t j = 0; j < h; j++) var += (row[j] - mean) * (row[j] - mean);
    var /= (double)h;
    float rs = (float)(1.0 / sqrt(var + ln->eps));
    ln->rstd[i] = rs;
    for (size_t j = 0; j < h; j++) {
      float xh = (float)(row[j] - mean) * rs;
      ln->xhat[(size_t)i * h + j] = xh;
      y[(size_t)i * h + j] = xh * ln->weight[j] + ln->bias[j];
    }
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_layer_norm_backward(mpu_layer_norm *ln, const float *dy, float *dx) {
  if (!ln || !ln->xhat || !dy || !dx)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_layer_norm_backward: no forward yet");
  size_t h = (size_t)ln->hidden;
  for (int i = 0; i < ln->n; i++) {
    const float *g = dy + (size_t)i * h, *xh = ln->xhat + (size_t)i * h;
    double sum_g = 0, sum_gx = 0; /* of dxhat = dy * weight */
    for (size_t j = 0; j < h; j++) {
      float d = g[j] * ln->weight[j];
      sum_g += d, sum_gx += d * xh[j];
      ln->dweight[j] += g[j] * xh[j];
      ln->dbias[j] += g[j];
    }
    float mg = (float)(sum_g / (double)h), mgx = (float)(sum_gx / (double)h);
    for (size_t j = 0; j < h; j++)
      dx[(size_t)i * h + j] = ln->rstd[i] * (g[j] * ln->weight[j] - mg - xh[j] * mgx);
  }
  return MPU_SUCCESS;
}

/* ---- attention ----------------------------------------------------------------------------- */

void mpu_attention_free(mpu_attention *a) {
  if (!a) return;
  free(a->qkv), free(a->probs), free(a->dropped);
  memset(a, 0, sizeof *a);
}

mpu_result_t mpu_attention_forward(mpu_attention *a, const float *qkv, int T, int heads,
                                   int head_dim, const float *dropout_mask, float *out) {
  static const char fn[] = "mpu_attention_forward";
  if (!a || !qkv || !out || T < 1 || heads < 1 || head_dim < 1 || T > 65536)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument or T %d, %d heads of %d", fn, T,
                      heads, head_dim);
  size_t Hl = (size_t)heads * head_dim, W = 3 * Hl, tt = (size_t)T * T;
  if (a->T != T || a->heads != heads || a->head_dim != head_dim || !a->qkv) {
    mpu_attention_free(a);
    a->qkv = malloc((size_t)T * W * sizeof(float));
    a->probs = malloc((size_t)heads * tt * sizeof(float));
    a->dropped = malloc((size_t)heads * tt * sizeof(float));
    if (!a->qkv || !a->probs || !a->dropped) {
      mpu_attention_free(a);
      return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: T %d, %d heads", fn, T, heads);
    }
    a->T = T, a->heads = heads, a->head_dim = head_dim;
  }
  memcpy(a->qkv, qkv, (size_t)T * W * sizeof(float));
  float scale = 1.0f / sqrtf((float)head_dim);
  for (int h = 0; h < heads; h++) {
    const float *q = qkv + (size_t)h * head_dim, *k = q + Hl, *v = q + 2 * Hl;
    float *P = a->probs + (size_t)h * tt, *D = a->dropped + (size_t)h * tt;
    for (int i = 0; i < T; i++) {
      float mx = -INFINITY;
      for (int j = 0; j <= i; j++) { /* causal: token i sees 0..i */
        float s = 0;
        for (int c = 0; c < head_dim; c++) s += q[(size_t)i * W + c] * k[(size_t)j * W + c];
        P[(size_t)i * T + j] = s * scale;
        mx = fmaxf(mx, s * scale);
      }
      double sum = 0;
      for (int j = 0; j <= i; j++) sum += P[(size_t)i * T + j] = expf(P[(size_t)i * T + j] - mx);
      for (int j = 0; j < T; j++) {
        float p = j <= i ? (float)(P[(size_t)i * T + j] / sum) : 0.0f;
        P[(size_t)i * T + j] = p;
        D[(size_t)i * T + j] = dropout_mask ? p * dropout_mask[(size_t)h * tt + (size_t)i * T + j] : p;
      }
      float *o = out + (size_t)i * Hl + (size_t)h * head_dim;
      for (int c = 0; c < head_dim; c++) {
        float acc = 0;
        for (int j = 0; j <= i; j++) acc += D[(size_t)i * T + j] * v[(size_t)j * W + c];
        o[c] = acc;
      }
    }
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_attention_backward(mpu_attention *a, const float *dout, float *dqkv) {
  if (!a || !a->qkv || !dout || !dqkv)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_attention_backward: no forward yet");
  int T = a->T, d = a->head_dim;
  size_t Hl = (size_t)a->heads * d, W = 3 * Hl, tt = (size_t)T * T;
  float scale = 1.0f / sqrtf((float)d);
  memset(dqkv, 0, (size_t)T * W * sizeof(float));
  float *dp = malloc((size_t)T * sizeof(float));
  if (!dp) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_attention_backward");
  for (int h = 0; h < a->heads; h++) {
    const float *q = a->qkv + (size_t)h * d, *k = q + Hl, *v = q + 2 * Hl;
    float *dq = dqkv + (size_t)h * d, *dk = dq + Hl, *dv = dq + 2 * Hl;
    const float *P = a->probs + (size_t)h * tt, *D = a->dropped + (size_t)h * tt;
    for (int i = 0; i < T; i++) {
      const float *go = dout + (size_t)i * Hl + (size_t)h * d;
      /* out_i = sum_j D_ij v_j: dv_j += D_ij go; dD_ij = go . v_j; dP = dD * (D / P) */
      double dot = 0;
      for (int j = 0; j <= i; j++) {
        float dd = 0;
        for (int c = 0; c < d; c++) {
          dv[(size_t)j * W + c] += D[(size_t)i * T + j] * go[c];
          dd += go[c] * v[(size_t)j * W + c];
        }
        float p = P[(size_t)i * T + j], keep = p > 0 ? D[(size_t)i * T + j] / p : 0.0f;
        dp[j] = dd * keep;
        dot += (double)dp[j] * p;
      }
      /* softmax: ds_ij = P_ij (dP_ij - sum_k P_ik dP_ik); s = q.k scale */
      for (int j = 0; j <= i; j++) {
        float ds = P[(size_t)i * T + j] * (dp[j] - (float)dot) * scale;
        for (int c = 0; c < d; c++) {
          dq[(size_t)i * W + c] += ds * k[(size_t)j * W + c];
          dk[(size_t)j * W + c] += ds * q[(size_t)i * W + c];
        }
      }
    }
  }
  free(dp);
  return MPU_SUCCESS;
}
