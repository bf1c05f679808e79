/*
 * kernels.c - the element-wise kernels of the layers (GeLU, tanh, softmax),
 * compiled once per vector width and picked at load time (core/simd.h).
 */
#include "layers/kernels.h"

#include "mpu/layers.h"

/* Megatron's bias_gelu: 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))) */
#define GELU_K 0.79788456f
#define GELU_C 0.044715f

MPU_SIMD_CLONES void mpu_tanh(const float *x, float *y, size_t n) {
  for (size_t i = 0; i < n; i++) y[i] = mpu__tanhf(x[i]);
}

MPU_SIMD_CLONES void mpu_gelu_forward_keep(const float *restrict x, float *restrict y,
                                           float *restrict t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = x[i], th = mpu__tanhf(GELU_K * v * (1.0f + GELU_C * v * v));
    t[i] = th;
    y[i] = 0.5f * v * (1.0f + th);
  }
}

MPU_SIMD_CLONES void mpu_gelu_forward(const float *restrict x, float *restrict y, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + mpu__tanhf(GELU_K * v * (1.0f + GELU_C * v * v)));
  }
}

/* d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 c x^2) */
static inline float gelu_slope(float v, float th) {
  return 0.5f * v * ((1.0f - th * th) * (GELU_K + 3.0f * GELU_K * GELU_C * v * v)) +
         0.5f * (1.0f + th);
}

MPU_SIMD_CLONES void mpu_gelu_backward_kept(const float *restrict x, const float *restrict t,
                                            const float *restrict dy, float *restrict dx,
                                            size_t n) {
  for (size_t i = 0; i < n; i++) dx[i] = gelu_slope(x[i], t[i]) * dy[i];
}

MPU_SIMD_CLONES void mpu_gelu_backward(const float *restrict x, const float *restrict dy,
                                       float *restrict dx, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    dx[i] = gelu_slope(v, mpu__tanhf(GELU_K * v * (1.0f + GELU_C * v * v))) * dy[i];
  }
}
