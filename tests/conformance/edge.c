/*
 * edge.c - the conformance cases at the edges of each dtype: integer
 * overflow and averages of extreme values, NaN and infinities in every op,
 * float16 and bfloat16 rounding ties, subnormals and overflow to infinity.
 *
 * Expected values come from a reference written here, apart from the
 * library: the rule of docs/api.md (left fold in rank order; 16-bit floats
 * through float32, rounded once to nearest even; integer sums wrap, integer
 * averages are exact then truncated, uint64 compares unsigned; a NaN in
 * min/max wins) applied with this
 * file's own 16-bit decoders and a rounding by search over the encodings.
 * Floats are compared bit for bit, except that any NaN matches a NaN.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

/* ---- 16-bit floats, independently of the library ----------------------- */

static double half_value(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
  return h & 0x8000 ? -v : v;
}

static double bf16_value(uint16_t b) {
  int e = (b >> 7) & 0xff, m = b & 0x7f;
  double v = e == 0 ? ldexp(m, -133) : e == 255 ? (m ? NAN : INFINITY) : ldexp(128 + m, e - 134);
  return b & 0x8000 ? -v : v;
}

/* The encoding nearest to v, ties to the even encoding, by binary search over
 * the finite non-negative encodings 0..top (monotonic in value); beyond the
 * largest finite value by at least half a step it is infinity (inf_bits). */
static uint16_t nearest(double v, double (*value)(uint16_t), uint16_t top, uint16_t inf_bits) {
  if (isnan(v)) return (uint16_t)(inf_bits | 1); /* some NaN; NaNs compare as a class */
  uint16_t sign = signbit(v) ? 0x8000 : 0;
  double a = fabs(v);
  double step = value(top) - value((uint16_t)(top - 1));
  if (a >= value(top) + step / 2) return sign | inf_bits;
  uint16_t lo = 0, hi = top;
  while (hi - lo > 1) {
    uint16_t mid = (uint16_t)((lo + hi) / 2);
    if (value(mid) <= a) lo = mid;
    else hi = mid;
  }
  if (value(hi) <= a) lo = hi; /* a is the top value itself */
  if (lo == top) return sign | lo;
  double below = a - value(lo), above = value((uint16_t)(lo + 1)) - a;
  uint16_t pick = below < above ? lo : above < below ? (uint16_t)(lo + 1) : (lo & 1 ? lo + 1 : lo);
  return sign | pick;
}

static uint16_t to_half(double v) { return nearest(v, half_value, 0x7bff, 0x7c00); }
static uint16_t to_bf16(double v) { return nearest(v, bf16_value, 0x7f7f, 0x7f80); }

/* ---- the edge values of each dtype ------------------------------------- */

/* Even elements: every rank holds the same table entry (averages of extremes,
 * n-fold overflow); odd elements: rank r holds the next entry after rank
 * r - 1's (sums that tie, NaN against numbers, inf against -inf). */
static size_t entry(size_t i, int r, size_t len) {
  return i % 2 == 0 ? (i / 2) % len : (i / 2 + (size_t)r) % len;
}

static const double f_table[] = {
    2048, 1, 2050, 1, 256, 1, 258, 1, /* 16-bit ties: 2049 and 257 are halfway */
    65504, 65504, -65504,             /* float16 overflow to infinity */
    5.9604644775390625e-8,            /* 2^-24: the smallest float16 subnormal */
    1.1920928955078125e-7,            /* 2^-23 */
    1e8, -1e8, 3.0e38, 3.0e38, -3.0e38, /* float32 order and overflow */
    INFINITY, -INFINITY, NAN, 0.5, -0.0, 1e-45, 1.5};

static const int64_t i32_table[] = {INT32_MAX, INT32_MIN, -3, -4, 200, 7, 0, INT32_MAX - 1,
                                    INT32_MIN + 1, 1 << 30};
static const int64_t i64_table[] = {INT64_MAX, INT64_MIN, -3, -4, INT64_MAX - 1, 3, 0,
                                    INT64_MIN + 1, (int64_t)1 << 62};
static const int64_t u8_table[] = {200, 255, 0, 1, 128, 3, 254};
static const int64_t i8_table[] = {INT8_MAX, INT8_MIN, -3, -4, 100, 7, 0, INT8_MAX - 1,
                                   INT8_MIN + 1, 64};
static const int64_t u32_table[] = {UINT32_MAX, 0, 3, (int64_t)1 << 31, UINT32_MAX - 1, 1,
                                    4000000000, 65536};
static const uint64_t u64_table[] = {UINT64_MAX, 0, 3, (uint64_t)1 << 63, UINT64_MAX - 1, 1,
                                     ((uint64_t)1 << 63) - 1, (uint64_t)1 << 32};

#define LEN(a) (sizeof(a) / sizeof *(a))

/* The float table encoded in 16 bits, once (the search is slow under valgrind). */
static uint16_t half_table[LEN(f_table)], bf16_table[LEN(f_table)];
static pthread_once_t encoded = PTHREAD_ONCE_INIT;

static void encode_tables(void) {
  for (size_t k = 0; k < LEN(f_table); k++) {
    half_table[k] = to_half(f_table[k]);
    bf16_table[k] = to_bf16(f_table[k]);
  }
}

/* Element i of rank r's input, as dt's bits at p[at]. */
static void put_at(mpu_dtype dt, void *p, size_t at, size_t i, int r) {
  pthread_once(&encoded, encode_tables);
  switch (dt) {
  case MPU_FLOAT32: ((float *)p)[at] = (float)f_table[entry(i, r, LEN(f_table))]; break;
  case MPU_FLOAT64: ((double *)p)[at] = f_table[entry(i, r, LEN(f_table))]; break;
  case MPU_FLOAT16: ((uint16_t *)p)[at] = half_table[entry(i, r, LEN(f_table))]; break;
  case MPU_BFLOAT16: ((uint16_t *)p)[at] = bf16_table[entry(i, r, LEN(f_table))]; break;
  case MPU_INT32: ((int32_t *)p)[at] = (int32_t)i32_table[entry(i, r, LEN(i32_table))]; break;
  case MPU_INT64: ((int64_t *)p)[at] = i64_table[entry(i, r, LEN(i64_table))]; break;
  case MPU_INT8: ((int8_t *)p)[at] = (int8_t)i8_table[entry(i, r, LEN(i8_table))]; break;
  case MPU_UINT32: ((uint32_t *)p)[at] = (uint32_t)u32_table[entry(i, r, LEN(u32_table))]; break;
  case MPU_UINT64: ((uint64_t *)p)[at] = u64_table[entry(i, r, LEN(u64_table))]; break;
  default: ((uint8_t *)p)[at] = (uint8_t)u8_table[entry(i, r, LEN(u8_table))]; break;
  }
}

/* ---- the reference ------------------------------------------------------ */

static double float_of(mpu_dtype dt, const void *p) {
  switch (dt) {
  case MPU_FLOAT32: return *(const float *)p;
  case MPU_FLOAT64: return *(const double *)p;
  case MPU_FLOAT16: return half_value(*(const uint16_t *)p);
  default: return bf16_value(*(const uint16_t *)p);
  }
}

static int64_t int_of(mpu_dtype dt, const void *p) {
  switch (dt) {
  case MPU_INT32: return *(const int32_t *)p;
  case MPU_INT64: return *(const int64_t *)p;
  case MPU_INT8: return *(const int8_t *)p;
  case MPU_UINT32: return *(const uint32_t *)p;
  default: return *(const uint8_t *)p;
  }
}

/* min/max: a NaN on either side wins (the later one if both); equal values
 * keep the earlier rank's. */
#define FOLD(acc, x, op)                                                         \
  ((op) == MPU_SUM || (op) == MPU_AVG ? (acc) + (x)                              \
   : (op) == MPU_PROD                 ? (acc) * (x)                              \
   : isnan(x)                         ? (x)                                      \
   : isnan(acc)                       ? (acc)                                    \
   : ((op) == MPU_MIN ? (x) < (acc) : (x) > (acc)) ? (x) : (acc))

/* The expected element i over n ranks, as dt's bits at out[i]. */
static void reference(mpu_dtype dt, mpu_op op, int n, size_t i, void *out) {
  char x[8];
  if (dt == MPU_FLOAT64) {
    put_at(dt, x, 0, i, 0);
    double acc = float_of(dt, x);
    for (int r = 1; r < n; r++) put_at(dt, x, 0, i, r), acc = FOLD(acc, float_of(dt, x), op);
    if (op == MPU_AVG) acc /= n;
    ((double *)out)[i] = acc;
  } else if (mpu_dtype_is_float(dt)) { /* float32 arithmetic, 16-bit rounded once */
    put_at(dt, x, 0, i, 0);
    float acc = (float)float_of(dt, x);
    for (int r = 1; r < n; r++) put_at(dt, x, 0, i, r), acc = FOLD(acc, (float)float_of(dt, x), op);
    if (op == MPU_AVG) acc /= (float)n;
    if (dt == MPU_FLOAT32) ((float *)out)[i] = acc;
    else ((uint16_t *)out)[i] = dt == MPU_FLOAT16 ? to_half(acc) : to_bf16(acc);
  } else if (dt == MPU_UINT64) { /* unsigned: compared, summed exactly and divided as such */
    put_at(dt, x, 0, i, 0);
    uint64_t best, wrap;
    memcpy(&best, x, 8);
    wrap = best;
    unsigned __int128 exact = best;
    for (int r = 1; r < n; r++) {
      uint64_t v;
      put_at(dt, x, 0, i, r);
      memcpy(&v, x, 8);
      wrap = op == MPU_PROD ? wrap * v : wrap + v;
      exact += v;
      if (op == MPU_MIN ? v < best : v > best) best = v;
    }
    ((uint64_t *)out)[i] = op == MPU_AVG                      ? (uint64_t)(exact / (unsigned)n)
                           : op == MPU_MIN || op == MPU_MAX ? best
                                                            : wrap;
  } else { /* integers: sums and products wrap, averages are exact, then truncated */
    put_at(dt, x, 0, i, 0);
    int64_t best = int_of(dt, x);
    uint64_t wrap = (uint64_t)best;
    __int128 exact = best;
    for (int r = 1; r < n; r++) {
      put_at(dt, x, 0, i, r);
      int64_t v = int_of(dt, x);
      wrap = op == MPU_PROD ? wrap * (uint64_t)v : wrap + (uint64_t)v;
      exact += v;
      if (op == MPU_MIN ? v < best : v > best) best = v;
    }
    uint64_t bits = op == MPU_AVG                      ? (uint64_t)(int64_t)(exact / n)
                    : op == MPU_MIN || op == MPU_MAX ? (uint64_t)best
                                                     : wrap;
    if (dt == MPU_INT32 || dt == MPU_UINT32) ((uint32_t *)out)[i] = (uint32_t)bits;
    else if (dt == MPU_INT64) ((int64_t *)out)[i] = (int64_t)bits;
    else ((uint8_t *)out)[i] = (uint8_t)bits; /* uint8, int8 */
  }
}

/* Bit-equal, or both NaN. */
static int same(mpu_dtype dt, const void *got, const void *want, size_t i) {
  size_t es = mpu_dtype_size(dt);
  const char *g = (const char *)got + i * es, *w = (const char *)want + i * es;
  if (!memcmp(g, w, es)) return 1;
  return mpu_dtype_is_float(dt) && isnan(float_of(dt, g)) && isnan(float_of(dt, w));
}

static void hex(mpu_dtype dt, const void *p, size_t i, char *buf, size_t len) {
  size_t es = mpu_dtype_size(dt);
  const unsigned char *b = (const unsigned char *)p + i * es;
  size_t used = 0;
  for (size_t k = es; k-- > 0 && used + 3 <= len;) used += (size_t)snprintf(buf + used, len - used, "%02x", b[k]);
}

/* ---- the case --------------------------------------------------------------- */

/* Small counts go through every backend's small path, the large one through
 * the zero-copy / chunked path; 4099 elements of float64 x 8 ranks is past
 * every staging threshold. */
static const size_t edge_counts[] = {1, 2, 61, 4099};
#define MAX_EDGE 4099

/* The uneven collectives on the same edge values, every odd rank's count 0:
 * reduce_scatter_v against the reference (rank r's block starts at the sum
 * of the counts before it), all_gather_v moving the inputs bit for bit. */
static mpu_result_t uneven_edges(mpu_comm *world, void *suite, mpu_dtype dt, mpu_op op,
                                 size_t count, char *send, char *recv, char *want,
                                 size_t *counts) {
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  size_t es = mpu_dtype_size(dt), total = 0, before = 0;
  char g[24], w[24];
  for (int k = 0; k < n; k++) {
    counts[k] = k % 2 ? 0 : count;
    if (k < rank) before += counts[k];
    total += counts[k];
  }
  for (size_t i = 0; i < total; i++) put_at(dt, send, i, i, rank);
  memset(recv, 0x5a, count * es);
  mpu_result_t r = mpu_comm_reduce_scatter_v(world, send, recv, counts, dt, op);
  if (r)
    return conf_failf(suite, world, __FILE__, __LINE__, "reduce_scatter_v %s %s count %zu: %s: %s",
                      mpu_dtype_name(dt), mpu_op_name(op), count, mpu_result_name(r),
                      mpu_last_error());
  for (size_t i = 0; i < counts[rank]; i++) {
    reference(dt, op, n, before + i, want); /* want[before + i] */
    if (!same(dt, recv + i * es, want + (before + i) * es, 0)) {
      hex(dt, recv, i, g, sizeof g);
      hex(dt, want, before + i, w, sizeof w);
      return conf_failf(suite, world, __FILE__, __LINE__,
                        "reduce_scatter_v %s %s count %zu on %d ranks: [%zu] = 0x%s, want 0x%s",
                        mpu_dtype_name(dt), mpu_op_name(op), count, n, i, g, w);
    }
  }
  /* all_gather_v: rank k's inputs, bit for bit (a NaN's payload included) */
  for (size_t i = 0; i < counts[rank]; i++) put_at(dt, send, i, i, rank);
  memset(recv, 0x5a, total * es);
  r = mpu_comm_all_gather_v(world, send, recv, counts, NULL, dt);
  if (r)
    return conf_failf(suite, world, __FILE__, __LINE__, "all_gather_v %s count %zu: %s: %s",
                      mpu_dtype_name(dt), count, mpu_result_name(r), mpu_last_error());
  size_t at = 0;
  for (int k = 0; k < n; k++)
    for (size_t i = 0; i < counts[k]; i++, at++) {
      put_at(dt, want, 0, i, k);
      if (memcmp(recv + at * es, want, es)) {
        hex(dt, recv, at, g, sizeof g);
        hex(dt, want, 0, w, sizeof w);
        return conf_failf(suite, world, __FILE__, __LINE__,
                          "all_gather_v %s count %zu on %d ranks: block %d [%zu] = 0x%s, want 0x%s",
                          mpu_dtype_name(dt), count, n, k, i, g, w);
      }
    }
  return MPU_SUCCESS;
}

mpu_result_t conf_case_edge_values(mpu_comm *world, void *suite) {
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  size_t cap = (size_t)MAX_EDGE * 8 * (size_t)n;
  char *send = calloc(cap, 1), *recv = calloc(cap, 1), *want = calloc(cap, 1);
  size_t *uneven = calloc((size_t)n, sizeof *uneven);
  mpu_result_t res = MPU_SUCCESS;
  char g[24], w[24];
  if (!send || !recv || !want || !uneven) {
    res = conf_failf(suite, world, __FILE__, __LINE__, "out of memory");
    goto out;
  }
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    for (int op = 0; op < MPU_OP_COUNT; op++)
      for (size_t c = 0; c < LEN(edge_counts); c++) {
        size_t count = edge_counts[c], es = mpu_dtype_size((mpu_dtype)dt);
        const char *what = "";
        for (size_t i = 0; i < count; i++) reference((mpu_dtype)dt, (mpu_op)op, n, i, want);
        for (int form = 0; form < 4; form++) {
          mpu_result_t r;
          char *out = recv;
          memset(recv, 0x5a, count * es);
          if (form == 0 || form == 1) { /* all_reduce, out of place and in place */
            what = form ? "all_reduce in place" : "all_reduce";
            for (size_t i = 0; i < count; i++) put_at((mpu_dtype)dt, send, i, i, rank);
            out = form ? send : recv;
            r = mpu_comm_all_reduce(world, send, out, count, (mpu_dtype)dt, (mpu_op)op);
          } else if (form == 2) { /* reduce at the last rank */
            what = "reduce";
            for (size_t i = 0; i < count; i++) put_at((mpu_dtype)dt, send, i, i, rank);
            r = mpu_comm_reduce(world, send, recv, count, (mpu_dtype)dt, (mpu_op)op, n - 1);
            if (rank != n - 1) out = NULL;
          } else { /* reduce_scatter: block k of rank r holds elements [k count, (k+1) count) */
            what = "reduce_scatter";
            for (size_t i = 0; i < count * (size_t)n; i++) put_at((mpu_dtype)dt, send, i, i, rank);
            for (size_t i = 0; i < count; i++)
              reference((mpu_dtype)dt, (mpu_op)op, n, (size_t)rank * count + i, want);
            r = mpu_comm_reduce_scatter(world, send, recv, count, (mpu_dtype)dt, (mpu_op)op);
            /* want[rank * count + i] holds the reference for recv[i] */
            memmove(want, want + (size_t)rank * count * es, count * es);
          }
          if (r) {
            res = conf_failf(suite, world, __FILE__, __LINE__, "%s %s %s count %zu: %s: %s", what,
                             mpu_dtype_name((mpu_dtype)dt), mpu_op_name((mpu_op)op), count,
                             mpu_result_name(r), mpu_last_error());
            goto out;
          }
          for (size_t i = 0; out && i < count; i++)
            if (!same((mpu_dtype)dt, out, want, i)) {
              hex((mpu_dtype)dt, out, i, g, sizeof g);
              hex((mpu_dtype)dt, want, i, w, sizeof w);
              res = conf_failf(suite, world, __FILE__, __LINE__,
                               "%s %s %s count %zu on %d ranks: [%zu] = 0x%s, want 0x%s", what,
                               mpu_dtype_name((mpu_dtype)dt), mpu_op_name((mpu_op)op), count, n,
                               i, g, w);
              goto out;
            }
          if (form == 3) /* restore the reference for the next form */
            for (size_t i = 0; i < count; i++) reference((mpu_dtype)dt, (mpu_op)op, n, i, want);
        }
        res = uneven_edges(world, suite, (mpu_dtype)dt, (mpu_op)op, count, send, recv, want,
                           uneven);
        if (res) goto out;
      }
out:
  free(uneven);
  free(send);
  free(recv);
  free(want);
  return res;
}

/* Every rank's outputs of the edge cases, as bytes (test_edge_bytes compares
 * them across backends). Writes at most cap bytes into buf; *used gets the
 * length. */
mpu_result_t conf_edge_outputs(mpu_comm *world, char *buf, size_t cap, size_t *used) {
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  *used = 0;
  size_t big = (size_t)MAX_EDGE * 8 * (size_t)n;
  char *send = calloc(big, 1), *recv = calloc(big, 1);
  mpu_result_t r = send && recv ? MPU_SUCCESS : MPU_ERR_OUT_OF_MEMORY;
  for (int dt = 0; dt < MPU_DTYPE_COUNT && !r; dt++)
    for (int op = 0; op < MPU_OP_COUNT && !r; op++)
      for (size_t c = 0; c < LEN(edge_counts) && !r; c++) {
        size_t count = edge_counts[c], bytes = count * mpu_dtype_size((mpu_dtype)dt);
        for (size_t i = 0; i < count * (size_t)n; i++) put_at((mpu_dtype)dt, send, i, i, rank);
        for (int form = 0; form < 3 && !r; form++) {
          memset(recv, 0, bytes);
          if (form == 0) r = mpu_comm_all_reduce(world, send, recv, count, (mpu_dtype)dt, (mpu_op)op);
          else if (form == 1) r = mpu_comm_reduce(world, send, recv, count, (mpu_dtype)dt, (mpu_op)op, 0);
          else r = mpu_comm_reduce_scatter(world, send, recv, count, (mpu_dtype)dt, (mpu_op)op);
          if (!r && *used + bytes <= cap) {
            memcpy(buf + *used, recv, bytes);
            *used += bytes;
          }
        }
      }
  free(send);
  free(recv);
  return r;
}
