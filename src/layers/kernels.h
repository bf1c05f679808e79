/*
 * kernels.h - the element-wise arithmetic the layers share, written so the
 * compiler vectorises it (branch-free: selects instead of ifs, no libm calls)
 * inside functions marked MPU_SIMD_CLONES (core/simd.h).
 */
#ifndef MPU_LAYERS_KERNELS_H
#define MPU_LAYERS_KERNELS_H

#include <stdint.h>
#include <string.h>

#include "core/simd.h"

/* e^x for x in [-87, 88] (the caller clamps): Cody-Waite reduction by ln 2
 * in two parts, a degree-7 polynomial on [-ln2/2, ln2/2] (Cephes' expf),
 * and 2^n put in the exponent bits. Within 1 ulp. */
static inline float mpu__expf(float x) {
  const float round = 12582912.0f; /* 1.5 x 2^23: adding it rounds to an integer */
  float n = (x * 1.44269504088896341f + round) - round;
  float r = x - n * 0.693359375f; /* ln 2's first 9 bits: n * c is exact */
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = (p * r) * r + r + 1.0f;
  int32_t bits = ((int32_t)n + 127) * (1 << 23);
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/* tanh x, branch-free: an odd polynomial below |x| 0.625 (Cephes' tanhf),
 * 1 - 2 / (e^2|x| + 1) above, |x| clamped at 10 (where tanh rounds to 1).
 * Within 1.5 ulp of the exact value over every float (libm's tanhf: 2.2).
 * In two parts, e = mpu__tanhf_exp(x) and mpu__tanhf_end(x, e), so a loop
 * can run the long chain of the exp over a block before the rest: each
 * part's chain is then short enough for the core to overlap many elements
 * (the same operations, the same bits). */
static inline float mpu__tanhf_clamped(float x) {
  float a = x < 0 ? -x : x;
  return a < 10.0f ? a : 10.0f; /* a NaN becomes 10 here, and is given back at the end */
}

static inline float mpu__tanhf_exp(float x) { return mpu__expf(2.0f * mpu__tanhf_clamped(x)); }

static inline float mpu__tanhf_end(float x, float e) {
  float a = mpu__tanhf_clamped(x);
  float z = x * x;
  float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                  1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
  float big = 1.0f - 2.0f / (e + 1.0f);
  big = x < 0 ? -big : big;
  float t = a < 0.625f ? small : big;
  return x == x ? t : x;
}

static inline float mpu__tanhf(float x) { return mpu__tanhf_end(x, mpu__tanhf_exp(x)); }

#endif
