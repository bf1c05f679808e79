/*
 * kernels.c - the element-wise kernels of the layers (GeLU, tanh, softmax),
 * compiled once per vector width and picked at load time (core/simd.h).
 */
#include "layers/kernels.h"

#include "mpu/layers.h"

/* Megatron's bias_gelu: 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) */
#define GELU_K 0.79788456f
#define GELU_C 0.044715f

/* the argument of the GeLU's tanh, and its tanh */
static inline float gelu_arg(float v) { return GELU_K * v * (1.0f + GELU_C * v * v); }
static inline float gelu_tanh(float v) { return mpu__tanhf(gelu_arg(v)); }

MPU_SIMD_CLONES void mpu_tanh(const float *x, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = mpu__tanhf(x[i]);
}

/* one row of Megatron's bias_gelu with the tanh kept: y = gelu(x + bias) (bias NULL: none); x is
 * only read, as Megatron's bias_gelu reads it, so the forward stores two arrays, not three. By
 * blocks: the tanh's exp over the block, then the rest (mpu__tanhf_exp, _end), two short chains
 * where one long one left the core waiting on its latency (the same bits) */
static inline __attribute__((always_inline)) void bias_gelu_row(const float *restrict x,
                                                                const float *restrict bias,
                                                                float *restrict y,
                                                                float *restrict t, size_t n) {
  enum { BLOCK = 64 }; /* (in L1) */
  float u[BLOCK], e[BLOCK];
  for (size_t i0 = 0; i0 < n; i0 += BLOCK) {
    size_t nb = n - i0 < BLOCK ? n - i0 : BLOCK;
    for (size_t k = 0; k < nb; k++) { /* the tanh's exp first, over the block (kernels.h) */
      float v = bias ? x[i0 + k] + bias[i0 + k] : x[i0 + k];
      u[k] = gelu_arg(v);
      e[k] = mpu__tanhf_exp(u[k]);
    }
    for (size_t k = 0; k < nb; k++) {
      float v = bias ? x[i0 + k] + bias[i0 + k] : x[i0 + k];
      float th = mpu__tanhf_end(u[k], e[k]);
      t[i0 + k] = th;
      y[i0 + k] = 0.5f * v * (1.0f + th);
    }
  }
}

MPU_SIMD_CLONES void mpu_bias_gelu_forward_keep(const float *restrict x, const float *restrict bias,
                                                size_t rows, size_t cols, float *restrict y,
                                                float *restrict t) {
  for (size_t r = 0; r < rows; r++) {
    size_t o = r * cols;
    if (bias) bias_gelu_row(x + o, bias, y + o, t + o, cols);
    else bias_gelu_row(x + o, NULL, y + o, t + o, cols);
  }
}

/* the bias_gelu row without a bias: the same operations, the same bits */
MPU_SIMD_CLONES void mpu_gelu_forward_keep(const float *restrict x, float *restrict y,
                                           float *restrict t, size_t n) {
  bias_gelu_row(x, NULL, y, t, n);
}

MPU_SIMD_CLONES void mpu_gelu_forward(const float *restrict x, float *restrict y, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + gelu_tanh(v));
  }
}

/* d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2) */
static inline float gelu_slope(float v, float th) {
  return 0.5f * v * ((1.0f - th * th) * (GELU_K + 3.0f * GELU_K * GELU_C * v * v)) +
         0.5f * (1.0f + th);
}

/* one row of bias_gelu's backward: x + bias again, as Megatron's bias_gelu_back adds them (the
 * forward's bits), and the bias's gradient summed as the linear layer sums it, row by row (the
 * same order, the same bits); inlined per case so each loop is branch-free */
static inline __attribute__((always_inline)) void bias_gelu_back_row(
    const float *restrict x, const float *restrict bias, const float *restrict t,
    const float *restrict dy, float *restrict dx, size_t n, float *restrict dbias) {
  for (size_t j = 0; j < n; j++) {
    float d = gelu_slope(bias ? x[j] + bias[j] : x[j], t[j]) * dy[j];
    dx[j] = d;
    if (dbias) dbias[j] += d;
  }
}

MPU_SIMD_CLONES void mpu_gelu_backward_kept(const float *restrict x, const float *restrict t,
                                            const float *restrict dy, float *restrict dx,
                                            size_t n) {
  bias_gelu_back_row(x, NULL, t, dy, dx, n, NULL);
}

MPU_SIMD_CLONES void mpu_bias_gelu_backward_kept(const float *restrict x, const float *restrict bias,
                                                 const float *restrict t, const float *restrict dy,
                                                 float *restrict dx, size_t rows, size_t cols,
                                                 float *restrict dbias) {
  for (size_t r = 0; r < rows; r++) {
    size_t o = r * cols;
    if (bias && dbias) bias_gelu_back_row(x + o, bias, t + o, dy + o, dx + o, cols, dbias);
    else if (bias) bias_gelu_back_row(x + o, bias, t + o, dy + o, dx + o, cols, NULL);
    else if (dbias) bias_gelu_back_row(x + o, NULL, t + o, dy + o, dx + o, cols, dbias);
    else bias_gelu_back_row(x + o, NULL, t + o, dy + o, dx + o, cols, NULL);
  }
}

MPU_SIMD_CLONES void mpu_gelu_backward(const float *restrict x, const float *restrict dy,
                                       float *restrict dx, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    dx[i] = gelu_slope(v, gelu_tanh(v)) * dy[i];
  }
}
