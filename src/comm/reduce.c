/*
 * reduce.c - element-wise reduction kernels.
 *
 * Work goes in blocks small enough for L1: each block of every source is
 * loaded (converted to the accumulator type where needed), combined into an
 * accumulator, then stored once. So each source is read once and dst written
 * once, whatever n is, and 16-bit floats are rounded a single time.
 *
 * Accumulators: float for float32/float16/bfloat16, double for float64,
 * int64 for the integers (sums and products computed in uint64 so overflow
 * wraps instead of being undefined).
 */
#include "comm/reduce.h"

#include <stdint.h>
#include <string.h>

#define BLOCK 512

/* Comparisons that let a NaN through, as torch's min/max do. */
#define MIN_OF(a, b) (((b) < (a) || (b) != (b)) ? (b) : (a))
#define MAX_OF(a, b) (((b) > (a) || (b) != (b)) ? (b) : (a))

#define COMBINE_FLOAT(acc, t, m, op)                                    \
  switch (op) {                                                         \
  case MPU_SUM:                                                         \
  case MPU_AVG:                                                         \
    for (size_t i = 0; i < (m); i++) (acc)[i] += (t)[i];                \
    break;                                                              \
  case MPU_PROD:                                                        \
    for (size_t i = 0; i < (m); i++) (acc)[i] *= (t)[i];                \
    break;                                                              \
  case MPU_MIN:                                                         \
    for (size_t i = 0; i < (m); i++) (acc)[i] = MIN_OF((acc)[i], (t)[i]); \
    break;                                                              \
  default:                                                              \
    for (size_t i = 0; i < (m); i++) (acc)[i] = MAX_OF((acc)[i], (t)[i]); \
    break;                                                              \
  }

static void load_f32(mpu_dtype dt, const void *src, size_t m, float *out) {
  if (dt == MPU_FLOAT16) {
    const uint16_t *s = src;
    for (size_t i = 0; i < m; i++) out[i] = mpu_half_to_float(s[i]);
  } else if (dt == MPU_BFLOAT16) {
    const uint16_t *s = src;
    for (size_t i = 0; i < m; i++) out[i] = mpu_bfloat16_to_float(s[i]);
  } else {
    memcpy(out, src, m * sizeof(float));
  }
}

static void store_f32(mpu_dtype dt, const float *acc, size_t m, void *dst) {
  if (dt == MPU_FLOAT16) {
    uint16_t *d = dst;
    for (size_t i = 0; i < m; i++) d[i] = mpu_float_to_half(acc[i]);
  } else if (dt == MPU_BFLOAT16) {
    uint16_t *d = dst;
    for (size_t i = 0; i < m; i++) d[i] = mpu_float_to_bfloat16(acc[i]);
  } else {
    memcpy(dst, acc, m * sizeof(float));
  }
}

static void reduce_f32(void *dst, const void *const *srcs, int n, size_t count, mpu_dtype dt,
                       mpu_op op, int divisor) {
  float acc[BLOCK], tmp[BLOCK];
  size_t es = mpu_dtype_size(dt);
  for (size_t b = 0; b < count; b += BLOCK) {
    size_t m = count - b < BLOCK ? count - b : BLOCK;
    load_f32(dt, (const char *)srcs[0] + b * es, m, acc);
    for (int k = 1; k < n; k++) {
      const void *src = (const char *)srcs[k] + b * es;
      const float *t = tmp;
      if (dt == MPU_FLOAT32)
        t = src; /* no conversion: combine straight from the source */
      else
        load_f32(dt, src, m, tmp);
      COMBINE_FLOAT(acc, t, m, op);
    }
    if (op == MPU_AVG)
      for (size_t i = 0; i < m; i++) acc[i] /= (float)divisor;
    store_f32(dt, acc, m, (char *)dst + b * es);
  }
}

static void reduce_f64(double *dst, const void *const *srcs, int n, size_t count, mpu_op op,
                       int divisor) {
  double acc[BLOCK];
  for (size_t b = 0; b < count; b += BLOCK) {
    size_t m = count - b < BLOCK ? count - b : BLOCK;
    memcpy(acc, (const double *)srcs[0] + b, m * sizeof(double));
    for (int k = 1; k < n; k++) {
      const double *t = (const double *)srcs[k] + b;
      COMBINE_FLOAT(acc, t, m, op);
    }
    if (op == MPU_AVG)
      for (size_t i = 0; i < m; i++) acc[i] /= (double)divisor;
    memcpy(dst + b, acc, m * sizeof(double));
  }
}

static void load_i64(mpu_dtype dt, const void *src, size_t m, int64_t *out) {
  if (dt == MPU_INT32) {
    const int32_t *s = src;
    for (size_t i = 0; i < m; i++) out[i] = s[i];
  } else if (dt == MPU_UINT8) {
    const uint8_t *s = src;
    for (size_t i = 0; i < m; i++) out[i] = s[i];
  } else {
    memcpy(out, src, m * sizeof(int64_t));
  }
}

/* Narrowing keeps the low bits (wrapping), as the GNU C conversion defines. */
static void store_i64(mpu_dtype dt, const int64_t *acc, size_t m, void *dst) {
  if (dt == MPU_INT32) {
    int32_t *d = dst;
    for (size_t i = 0; i < m; i++) d[i] = (int32_t)(uint32_t)(uint64_t)acc[i];
  } else if (dt == MPU_UINT8) {
    uint8_t *d = dst;
    for (size_t i = 0; i < m; i++) d[i] = (uint8_t)(uint64_t)acc[i];
  } else {
    memcpy(dst, acc, m * sizeof(int64_t));
  }
}

static void reduce_int(void *dst, const void *const *srcs, int n, size_t count, mpu_dtype dt,
                       mpu_op op, int divisor) {
  int64_t acc[BLOCK], t[BLOCK];
  size_t es = mpu_dtype_size(dt);
  for (size_t b = 0; b < count; b += BLOCK) {
    size_t m = count - b < BLOCK ? count - b : BLOCK;
    load_i64(dt, (const char *)srcs[0] + b * es, m, acc);
    for (int k = 1; k < n; k++) {
      load_i64(dt, (const char *)srcs[k] + b * es, m, t);
      switch (op) {
      case MPU_SUM:
      case MPU_AVG:
        for (size_t i = 0; i < m; i++) acc[i] = (int64_t)((uint64_t)acc[i] + (uint64_t)t[i]);
        break;
      case MPU_PROD:
        for (size_t i = 0; i < m; i++) acc[i] = (int64_t)((uint64_t)acc[i] * (uint64_t)t[i]);
        break;
      case MPU_MIN:
        for (size_t i = 0; i < m; i++) acc[i] = t[i] < acc[i] ? t[i] : acc[i];
        break;
      default:
        for (size_t i = 0; i < m; i++) acc[i] = t[i] > acc[i] ? t[i] : acc[i];
        break;
      }
    }
    if (op == MPU_AVG)
      for (size_t i = 0; i < m; i++) acc[i] /= divisor;
    store_i64(dt, acc, m, (char *)dst + b * es);
  }
}

void mpu__reduce(void *dst, const void *const *srcs, int n, size_t count, mpu_dtype dtype,
                 mpu_op op, int divisor) {
  if (count == 0 || n <= 0) return;
  switch (dtype) {
  case MPU_FLOAT32:
  case MPU_FLOAT16:
  case MPU_BFLOAT16:
    reduce_f32(dst, srcs, n, count, dtype, op, divisor);
    break;
  case MPU_FLOAT64:
    reduce_f64(dst, srcs, n, count, op, divisor);
    break;
  default:
    reduce_int(dst, srcs, n, count, dtype, op, divisor);
    break;
  }
}
