/*
 * reduce.c - the reduction rules of mpu, for every backend.
 *
 * This file is the one place where "op over ranks" is defined; every backend
 * reduces through it (threads in shared memory, MPI after moving the bytes),
 * so equal inputs give equal bits everywhere. The rules (docs/api.md has
 * them as a table):
 *
 *   order     the sources are combined left to right, rank 0 first:
 *             ((x0 op x1) op x2) ... - never a tree, so float sums do not
 *             depend on the backend's algorithm.
 *   float32   accumulated in float32; float64 in float64.
 *   16-bit    float16 and bfloat16 are widened to float32 (exact), combined
 *             in float32, and rounded once, to nearest even.
 *   avg       floats: the float sum divided by the size in the accumulator
 *             type. Integers: the exact sum (int64 for int8/int32/uint8/
 *             uint32, 128 bits for int64/uint64) divided by the size,
 *             truncated toward zero - so the average of {200, 200} in uint8
 *             is 200.
 *   sum/prod  integers wrap modulo 2^bits (two's complement), never
 *             undefined; floats follow IEEE 754 (inf - inf is NaN).
 *   min/max   a NaN in any source makes the result NaN (as torch's); the
 *             NaN kept is the last one in rank order. Integers compare
 *             exactly (uint64 as unsigned); equal values keep the earlier
 *             rank's (-0 vs +0).
 *   one rank  a communicator of one gives its input back bit for bit,
 *             whatever the op (no NaN is quieted, nothing is rounded).
 *
 * Work goes in blocks small enough for L1: each block of every source is
 * loaded (converted to the accumulator type where needed), combined into an
 * accumulator, then stored once. So each source is read once and dst written
 * once, whatever n is, and 16-bit floats are rounded a single time.
 */
#include "comm/base/reduce.h"

#include "comm/base/copy.h"

#include <stdint.h>
#include <string.h>

#define BLOCK 2048

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

/* Where a finished block goes: every destination, at element offset b. */
typedef struct sink {
  void *const *dsts;
  int ndst;
  int stream;
} sink;

static void emit(const sink *k, size_t offset_bytes, const void *block, size_t bytes) {
  for (int d = 0; d < k->ndst; d++)
    if ((char *)k->dsts[d] + offset_bytes != block) /* in place with one source */
      mpu__copy((char *)k->dsts[d] + offset_bytes, block, bytes, k->stream);
}

/* Convert a float block to dt's bytes and emit it. */
static void store_f32(mpu_dtype dt, const float *acc, size_t m, const sink *k, size_t offset) {
  uint16_t narrow[BLOCK];
  if (dt == MPU_FLOAT16) {
    for (size_t i = 0; i < m; i++) narrow[i] = mpu_float_to_half(acc[i]);
  } else if (dt == MPU_BFLOAT16) {
    for (size_t i = 0; i < m; i++) narrow[i] = mpu_float_to_bfloat16(acc[i]);
  } else {
    emit(k, offset, acc, m * sizeof(float));
    return;
  }
  emit(k, offset, narrow, m * sizeof(uint16_t));
}

/* Ask for every source's next block while this one is combined: past the
 * cache the reduction waits on memory, and the hardware prefetchers stop at
 * page boundaries. */
static void prefetch_next(const void *const *srcs, int n, size_t next, size_t count, size_t es) {
  if (next >= count) return;
  size_t bytes = (count - next < BLOCK ? count - next : BLOCK) * es;
  for (int j = 0; j < n; j++)
    for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch((const char *)srcs[j] + next * es + off);
}

#if defined(__x86_64__)
#include <emmintrin.h>

/* float32 sum, avg and prod in one pass: each group of 16 elements is loaded
 * from every source, combined left to right in registers and stored to every
 * destination (streaming where asked and aligned), with no staging block in
 * between. Lanes are elements, so the order per element - and so every bit
 * of the result - is the generic path's. No software prefetch here: with
 * plain sequential loads the hardware prefetchers keep up, and in A/B runs
 * prefetching made this loop slower (64 MiB reduce_scatter, 2 ranks:
 * 4.6-5.8 ms with it, 3.8-4.5 ms without). */
static void fused_f32(const sink *k, const void *const *srcs, int n, size_t count, mpu_op op,
                      int divisor) {
  const float *const *s = (const float *const *)srcs;
  const __m128 div = _mm_set1_ps((float)divisor);
  const int prod = op == MPU_PROD, avg = op == MPU_AVG;
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    __m128 a0 = _mm_loadu_ps(s[0] + i), a1 = _mm_loadu_ps(s[0] + i + 4);
    __m128 a2 = _mm_loadu_ps(s[0] + i + 8), a3 = _mm_loadu_ps(s[0] + i + 12);
    for (int j = 1; j < n; j++) {
      __m128 b0 = _mm_loadu_ps(s[j] + i), b1 = _mm_loadu_ps(s[j] + i + 4);
      __m128 b2 = _mm_loadu_ps(s[j] + i + 8), b3 = _mm_loadu_ps(s[j] + i + 12);
      if (prod) {
        a0 = _mm_mul_ps(a0, b0), a1 = _mm_mul_ps(a1, b1), a2 = _mm_mul_ps(a2, b2), a3 = _mm_mul_ps(a3, b3);
      } else {
        a0 = _mm_add_ps(a0, b0), a1 = _mm_add_ps(a1, b1), a2 = _mm_add_ps(a2, b2), a3 = _mm_add_ps(a3, b3);
      }
    }
    if (avg) a0 = _mm_div_ps(a0, div), a1 = _mm_div_ps(a1, div), a2 = _mm_div_ps(a2, div), a3 = _mm_div_ps(a3, div);
    for (int d = 0; d < k->ndst; d++) {
      float *p = (float *)k->dsts[d] + i;
      if (k->stream && ((uintptr_t)p & 15) == 0) {
        _mm_stream_ps(p, a0), _mm_stream_ps(p + 4, a1), _mm_stream_ps(p + 8, a2), _mm_stream_ps(p + 12, a3);
      } else {
        _mm_storeu_ps(p, a0), _mm_storeu_ps(p + 4, a1), _mm_storeu_ps(p + 8, a2), _mm_storeu_ps(p + 12, a3);
      }
    }
  }
  for (; i < count; i++) { /* the tail, the same operations one element at a time */
    float a = s[0][i];
    for (int j = 1; j < n; j++) a = prod ? a * s[j][i] : a + s[j][i];
    if (avg) a /= (float)divisor;
    for (int d = 0; d < k->ndst; d++) ((float *)k->dsts[d])[i] = a;
  }
}
#define HAVE_FUSED_F32 1
#endif

static void reduce_f32(const sink *k, const void *const *srcs, int n, size_t count, mpu_dtype dt,
                       mpu_op op, int divisor) {
#ifdef HAVE_FUSED_F32
  if (dt == MPU_FLOAT32 && (op == MPU_SUM || op == MPU_AVG || op == MPU_PROD)) {
    fused_f32(k, srcs, n, count, op, divisor);
    return;
  }
#endif
  float acc[BLOCK], tmp[BLOCK];
  size_t es = mpu_dtype_size(dt);
  for (size_t b = 0; b < count; b += BLOCK) {
    size_t m = count - b < BLOCK ? count - b : BLOCK;
    prefetch_next(srcs, n, b + BLOCK, count, es);
    load_f32(dt, (const char *)srcs[0] + b * es, m, acc);
    for (int j = 1; j < n; j++) {
      const void *src = (const char *)srcs[j] + b * es;
      const float *t = tmp;
      if (dt == MPU_FLOAT32)
        t = src; /* no conversion: combine straight from the source */
      else
        load_f32(dt, src, m, tmp);
      COMBINE_FLOAT(acc, t, m, op);
    }
    if (op == MPU_AVG)
      for (size_t i = 0; i < m; i++) acc[i] /= (float)divisor;
    store_f32(dt, acc, m, k, b * es);
  }
}

static void reduce_f64(const sink *k, const void *const *srcs, int n, size_t count, mpu_op op,
                       int divisor) {
  double acc[BLOCK];
  for (size_t b = 0; b < count; b += BLOCK) {
    size_t m = count - b < BLOCK ? count - b : BLOCK;
    memcpy(acc, (const double *)srcs[0] + b, m * sizeof(double));
    for (int j = 1; j < n; j++) {
      const double *t = (const double *)srcs[j] + b;
      COMBINE_FLOAT(acc, t, m, op);
    }
    if (op == MPU_AVG)
      for (size_t i = 0; i < m; i++) acc[i] /= (double)divisor;
    emit(k, b * sizeof(double), acc, m * sizeof(double));
  }
}

/* Widen to int64, exactly for every integer dtype but uint64 (whose bits are
 * kept: sums and products wrap alike, min and max compare them unsigned). */
static void load_i64(mpu_dtype dt, const void *src, size_t m, int64_t *out) {
  if (dt == MPU_INT32) {
    const int32_t *s = src;
    for (size_t i = 0; i < m; i++) out[i] = s[i];
  } else if (dt == MPU_UINT8) {
    const uint8_t *s = src;
    for (size_t i = 0; i < m; i++) out[i] = s[i];
  } else if (dt == MPU_INT8) {
    const int8_t *s = src;
    for (size_t i = 0; i < m; i++) out[i] = s[i];
  } else if (dt == MPU_UINT32) {
    const uint32_t *s = src;
    for (size_t i = 0; i < m; i++) out[i] = s[i];
  } else {
    memcpy(out, src, m * sizeof(int64_t));
  }
}

/* Narrow to dt keeping the low bits (wrapping) and emit. */
static void store_i64(mpu_dtype dt, const int64_t *acc, size_t m, const sink *k, size_t offset) {
  union {
    uint32_t u32[BLOCK];
    uint8_t u8[BLOCK];
  } narrow;
  if (dt == MPU_INT32 || dt == MPU_UINT32) { /* the low 32 bits: two's complement either way */
    for (size_t i = 0; i < m; i++) narrow.u32[i] = (uint32_t)(uint64_t)acc[i];
  } else if (dt == MPU_UINT8 || dt == MPU_INT8) {
    for (size_t i = 0; i < m; i++) narrow.u8[i] = (uint8_t)(uint64_t)acc[i];
  } else {
    emit(k, offset, acc, m * sizeof(int64_t));
    return;
  }
  emit(k, offset, &narrow, m * mpu_dtype_size(dt));
}

static void reduce_int(const sink *k, const void *const *srcs, int n, size_t count, mpu_dtype dt,
                       mpu_op op, int divisor) {
  int64_t acc[BLOCK], t[BLOCK];
  size_t es = mpu_dtype_size(dt);
  for (size_t b = 0; b < count; b += BLOCK) {
    size_t m = count - b < BLOCK ? count - b : BLOCK;
    load_i64(dt, (const char *)srcs[0] + b * es, m, acc);
    for (int j = 1; j < n; j++) {
      load_i64(dt, (const char *)srcs[j] + b * es, m, t);
      switch (op) {
      case MPU_SUM:
      case MPU_AVG:
        for (size_t i = 0; i < m; i++) acc[i] = (int64_t)((uint64_t)acc[i] + (uint64_t)t[i]);
        break;
      case MPU_PROD:
        for (size_t i = 0; i < m; i++) acc[i] = (int64_t)((uint64_t)acc[i] * (uint64_t)t[i]);
        break;
      case MPU_MIN:
        if (dt == MPU_UINT64)
          for (size_t i = 0; i < m; i++) acc[i] = (uint64_t)t[i] < (uint64_t)acc[i] ? t[i] : acc[i];
        else
          for (size_t i = 0; i < m; i++) acc[i] = t[i] < acc[i] ? t[i] : acc[i];
        break;
      default:
        if (dt == MPU_UINT64)
          for (size_t i = 0; i < m; i++) acc[i] = (uint64_t)t[i] > (uint64_t)acc[i] ? t[i] : acc[i];
        else
          for (size_t i = 0; i < m; i++) acc[i] = t[i] > acc[i] ? t[i] : acc[i];
        break;
      }
    }
    if (op == MPU_AVG)
      for (size_t i = 0; i < m; i++) acc[i] /= divisor;
    store_i64(dt, acc, m, k, b * es);
  }
}

/* The average of int64 or uint64 values: the exact sum in 128 bits, then the
 * division; the quotient lies between the smallest and largest input, so it
 * fits. (A sum of n < 2^31 64-bit values needs at most 95 bits.) */
static void avg_64(const sink *k, const void *const *srcs, int n, size_t count, int divisor,
                   int is_unsigned) {
  uint64_t out[BLOCK];
  for (size_t b = 0; b < count; b += BLOCK) {
    size_t m = count - b < BLOCK ? count - b : BLOCK;
    for (size_t i = 0; i < m; i++) {
      if (is_unsigned) {
        unsigned __int128 acc = 0;
        for (int j = 0; j < n; j++) acc += ((const uint64_t *)srcs[j])[b + i];
        out[i] = (uint64_t)(acc / (unsigned)divisor);
      } else {
        __int128 acc = 0;
        for (int j = 0; j < n; j++) acc += ((const int64_t *)srcs[j])[b + i];
        out[i] = (uint64_t)(int64_t)(acc / divisor);
      }
    }
    emit(k, b * sizeof(uint64_t), out, m * sizeof(uint64_t));
  }
}

void mpu__reduce_to(void *const *dsts, int ndst, const void *const *srcs, int n, size_t count,
                    mpu_dtype dtype, mpu_op op, int divisor, int stream) {
  if (count == 0 || n <= 0 || ndst <= 0) return;
  sink k = {dsts, ndst, stream};
  if (n == 1 && divisor == 1) { /* one rank: its input, bit for bit (a signalling NaN too) */
    emit(&k, 0, srcs[0], count * mpu_dtype_size(dtype));
    if (stream) mpu__copy_fence();
    return;
  }
  switch (dtype) {
  case MPU_FLOAT32:
  case MPU_FLOAT16:
  case MPU_BFLOAT16:
    reduce_f32(&k, srcs, n, count, dtype, op, divisor);
    break;
  case MPU_FLOAT64:
    reduce_f64(&k, srcs, n, count, op, divisor);
    break;
  case MPU_INT64:
  case MPU_UINT64:
    if (op == MPU_AVG) avg_64(&k, srcs, n, count, divisor, dtype == MPU_UINT64);
    else reduce_int(&k, srcs, n, count, dtype, op, divisor);
    break;
  default:
    reduce_int(&k, srcs, n, count, dtype, op, divisor);
    break;
  }
  if (stream) mpu__copy_fence();
}

void mpu__reduce(void *dst, const void *const *srcs, int n, size_t count, mpu_dtype dtype,
                 mpu_op op, int divisor) {
  void *const dsts[1] = {dst};
  mpu__reduce_to(dsts, 1, srcs, n, count, dtype, op, divisor, 0);
}
