/*
 * toy_model.c - forward and backward of the ToyModel, matrix products by BLAS.
 */
#include "toy_model.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t next(toy_rng *g) {
  uint64_t z = (g->state += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

float toy_uniform(toy_rng *g, float lo, float hi) {
  float u = (float)(next(g) >> 40) * (1.0f / 16777216.0f); /* 24 random bits in [0, 1) */
  return lo + (hi - lo) * u;
}

void toy_init_params(float *p, uint64_t seed) {
  toy_rng g = {seed};
  float k1 = 1.0f / sqrtf((float)TOY_IN), k2 = 1.0f / sqrtf((float)TOY_HIDDEN);
  for (int i = TOY_W1; i < TOY_B1; i++) p[i] = toy_uniform(&g, -k1, k1);
  for (int i = TOY_B1; i < TOY_W2; i++) p[i] = toy_uniform(&g, -k1, k1);
  for (int i = TOY_W2; i < TOY_B2; i++) p[i] = toy_uniform(&g, -k2, k2);
  for (int i = TOY_B2; i < TOY_NPARAMS; i++) p[i] = toy_uniform(&g, -k2, k2);
}

void toy_make_data(float *x, float *y, int n, uint64_t seed) {
  toy_rng g = {seed ^ UINT64_C(0x5eed5eed5eed5eed)};
  float teacher[TOY_OUT * TOY_IN];
  for (int i = 0; i < TOY_OUT * TOY_IN; i++) teacher[i] = toy_uniform(&g, -1.0f, 1.0f);
  for (int s = 0; s < n; s++) {
    for (int i = 0; i < TOY_IN; i++) x[s * TOY_IN + i] = toy_uniform(&g, -1.0f, 1.0f);
    for (int o = 0; o < TOY_OUT; o++) {
      float acc = 0;
      for (int i = 0; i < TOY_IN; i++) acc += teacher[o * TOY_IN + i] * x[s * TOY_IN + i];
      y[s * TOY_OUT + o] = tanhf(acc);
    }
  }
}

int toy_acts_alloc(toy_acts *acts, int n) {
  acts->n = n;
  acts->h = malloc((size_t)n * TOY_HIDDEN * sizeof(float));
  acts->a = malloc((size_t)n * TOY_HIDDEN * sizeof(float));
  acts->out = malloc((size_t)n * TOY_OUT * sizeof(float));
  if (acts->h && acts->a && acts->out) return 0;
  toy_acts_free(acts);
  return -1;
}

void toy_acts_free(toy_acts *acts) {
  free(acts->h);
  free(acts->a);
  free(acts->out);
  acts->h = acts->a = acts->out = NULL;
}

/* out (n, o) = in (n, i) W^T + b, W (o, i) */
static void linear(const float *in, const float *w, const float *b, float *out, int n, int i,
                   int o) {
  for (int s = 0; s < n; s++) memcpy(out + s * o, b, (size_t)o * sizeof(float));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, o, i, 1.0f, in, i, w, i, 1.0f, out, o);
}

float toy_forward(const float *p, const float *x, const float *y, toy_acts *acts) {
  int n = acts->n;
  linear(x, p + TOY_W1, p + TOY_B1, acts->h, n, TOY_IN, TOY_HIDDEN);
  for (int i = 0; i < n * TOY_HIDDEN; i++) acts->a[i] = acts->h[i] > 0 ? acts->h[i] : 0;
  linear(acts->a, p + TOY_W2, p + TOY_B2, acts->out, n, TOY_HIDDEN, TOY_OUT);
  double sum = 0; /* the loss is summed in double: it is compared across layouts */
  for (int i = 0; i < n * TOY_OUT; i++) {
    double d = (double)acts->out[i] - (double)y[i];
    sum += d * d;
  }
  return (float)(sum / (n * TOY_OUT));
}

int toy_backward(const float *p, const float *x, const float *y, const toy_acts *acts,
                 float *g) {
  int n = acts->n;
  float *dout = malloc((size_t)n * TOY_OUT * sizeof(float));
  float *dh = malloc((size_t)n * TOY_HIDDEN * sizeof(float));
  if (!dout || !dh) {
    free(dout);
    free(dh);
    return -1;
  }
  float scale = 2.0f / (float)(n * TOY_OUT); /* d mean((out - y)^2) / d out */
  for (int i = 0; i < n * TOY_OUT; i++) dout[i] = scale * (acts->out[i] - y[i]);
  /* dW2 (OUT, HIDDEN) = dout^T a; db2 = sum over the batch of dout */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, TOY_OUT, TOY_HIDDEN, n, 1.0f, dout,
              TOY_OUT, acts->a, TOY_HIDDEN, 0.0f, g + TOY_W2, TOY_HIDDEN);
  for (int o = 0; o < TOY_OUT; o++) {
    float acc = 0;
    for (int s = 0; s < n; s++) acc += dout[s * TOY_OUT + o];
    g[TOY_B2 + o] = acc;
  }
  /* da (n, HIDDEN) = dout W2, then through the ReLU */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, TOY_HIDDEN, TOY_OUT, 1.0f, dout,
              TOY_OUT, p + TOY_W2, TOY_HIDDEN, 0.0f, dh, TOY_HIDDEN);
  for (int i = 0; i < n * TOY_HIDDEN; i++)
    if (acts->h[i] <= 0) dh[i] = 0;
  /* dW1 (HIDDEN, IN) = dh^T x; db1 = sum of dh */
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, TOY_HIDDEN, TOY_IN, n, 1.0f, dh,
              TOY_HIDDEN, x, TOY_IN, 0.0f, g + TOY_W1, TOY_IN);
  for (int j = 0; j < TOY_HIDDEN; j++) {
    float acc = 0;
    for (int s = 0; s < n; s++) acc += dh[s * TOY_HIDDEN + j];
    g[TOY_B1 + j] = acc;
  }
  free(dout);
  free(dh);
  return 0;
}
