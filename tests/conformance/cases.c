/*
 * cases.c - the conformance cases: every collective x dtype x op, in place
 * and not, zero, small, uneven and large counts; groups from create_group and
 * split; and argument errors that every backend must reject the same way.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

const int conf_rank_counts[] = {1, 2, 3, 4, 8};
const int conf_rank_counts_len = 5;

mpu_result_t conf_failf(void *suite, mpu_comm *world, const char *file, int line,
                              const char *fmt, ...) {
  int rank = 0;
  mpu_comm_rank(world, &rank);
  char *msg = ((conf_suite *)suite)->message[rank];
  int n = snprintf(msg, sizeof ((conf_suite *)suite)->message[0], "rank %d: %s:%d: ", rank, file,
                   line);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg + n, sizeof ((conf_suite *)suite)->message[0] - (size_t)n, fmt, ap);
  va_end(ap);
  return MPU_ERR_INTERNAL;
}

/* ---- values ---------------------------------------------------------------- */

void conf_set(mpu_dtype dt, void *p, size_t i, double v) {
  switch (dt) {
  case MPU_FLOAT32: ((float *)p)[i] = (float)v; break;
  case MPU_FLOAT64: ((double *)p)[i] = v; break;
  case MPU_FLOAT16: ((uint16_t *)p)[i] = mpu_float_to_half((float)v); break;
  case MPU_BFLOAT16: ((uint16_t *)p)[i] = mpu_float_to_bfloat16((float)v); break;
  case MPU_INT32: ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)(int64_t)v; break;
  case MPU_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
  case MPU_UINT32: ((uint32_t *)p)[i] = (uint32_t)(uint64_t)(int64_t)v; break;
  case MPU_UINT64: ((uint64_t *)p)[i] = (uint64_t)(int64_t)v; break;
  default: ((uint8_t *)p)[i] = (uint8_t)(uint64_t)(int64_t)v; break; /* uint8, int8 */
  }
}

double conf_get(mpu_dtype dt, const void *p, size_t i) {
  switch (dt) {
  case MPU_FLOAT32: return ((const float *)p)[i];
  case MPU_FLOAT64: return ((const double *)p)[i];
  case MPU_FLOAT16: return mpu_half_to_float(((const uint16_t *)p)[i]);
  case MPU_BFLOAT16: return mpu_bfloat16_to_float(((const uint16_t *)p)[i]);
  case MPU_INT32: return ((const int32_t *)p)[i];
  case MPU_INT64: return (double)((const int64_t *)p)[i];
  case MPU_INT8: return ((const int8_t *)p)[i];
  case MPU_UINT32: return ((const uint32_t *)p)[i];
  case MPU_UINT64: return (double)((const uint64_t *)p)[i];
  default: return ((const uint8_t *)p)[i];
  }
}

double conf_rounded(mpu_dtype dt, double v) {
  char b[8];
  conf_set(dt, b, 0, v);
  return conf_get(dt, b, 0);
}

/* Element i of rank r's input: small integers, so sums are exact in every dtype. */
double conf_value(mpu_op op, int r, size_t i) {
  if (op == MPU_PROD) return (double)(1 + (r + i) % 2); /* products stay <= 2^8 */
  return (double)(1 + ((size_t)r * 3 + i * 7) % 5);
}

/* What op over ranks 0..n-1 of conf_value(op, k, i) must give in dtype dt. */
double conf_expected(mpu_dtype dt, mpu_op op, int n, size_t i) {
  int64_t acc = (int64_t)conf_value(op, 0, i);
  for (int k = 1; k < n; k++) {
    int64_t v = (int64_t)conf_value(op, k, i);
    switch (op) {
    case MPU_PROD: acc *= v; break;
    case MPU_MIN: acc = v < acc ? v : acc; break;
    case MPU_MAX: acc = v > acc ? v : acc; break;
    default: acc += v; break;
    }
  }
  if (op != MPU_AVG) return conf_rounded(dt, (double)acc);
  if (dt == MPU_FLOAT64) return (double)acc / n;
  if (mpu_dtype_is_float(dt)) return conf_rounded(dt, (double)((float)acc / (float)n));
  return conf_rounded(dt, (double)(acc / n));
}

void conf_fill(mpu_dtype dt, void *p, size_t count, mpu_op op, int r, size_t offset) {
  for (size_t i = 0; i < count; i++) conf_set(dt, p, i, conf_value(op, r, offset + i));
}

static void *host_alloc(size_t bytes) { return calloc(bytes ? bytes : 1, 1); }

/* Buffers passed to collectives come from here: the GPU driver swaps in
 * managed memory, which both the host and NCCL can use. */
void *(*conf_alloc)(size_t bytes) = host_alloc;
void (*conf_free)(void *p) = free;

void *conf_buf(size_t bytes) { return conf_alloc(bytes); }

void conf_poison_fill(void *p, size_t bytes) { memset(p, 0x5a, bytes); }

/* ---- collectives ------------------------------------------------------------ */

static const size_t reduce_counts[] = {0, 1, 7, 1031, 20001};

static mpu_result_t case_all_reduce(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  void *send = conf_buf(20001 * 8), *recv = conf_buf(20001 * 8);
  CHECK(send && recv, "out of memory");
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    for (int op = 0; op < MPU_OP_COUNT; op++)
      for (int inplace = 0; inplace < 2; inplace++)
        for (size_t c = 0; c < sizeof reduce_counts / sizeof *reduce_counts; c++) {
          size_t count = reduce_counts[c], es = mpu_dtype_size((mpu_dtype)dt);
          conf_fill((mpu_dtype)dt, send, count, (mpu_op)op, rank, 0);
          void *out = inplace ? send : recv;
          if (!inplace) conf_poison_fill(recv, count * es);
          CHECK_OK(mpu_comm_all_reduce(world, send, out, count, (mpu_dtype)dt, (mpu_op)op));
          for (size_t i = 0; i < count; i++) {
            double got = conf_get((mpu_dtype)dt, out, i), want = conf_expected((mpu_dtype)dt, (mpu_op)op, n, i);
            CHECK(got == want, "all_reduce %s %s count %zu%s: [%zu] = %g, want %g",
                  mpu_dtype_name((mpu_dtype)dt), mpu_op_name((mpu_op)op), count,
                  inplace ? " in place" : "", i, got, want);
          }
        }
out:
  conf_free(send);
  conf_free(recv);
  return res;
}

/* Past the MPI backend's 1 MiB segments (with a ragged last one) and the
 * threads backend's streaming threshold per rank. */
static mpu_result_t case_all_reduce_large(mpu_comm *world, void *suite) {
  static const struct { mpu_dtype dt; size_t count; } sizes[] = {
      {MPU_FLOAT32, 300001}, {MPU_FLOAT16, 700003}, {MPU_INT64, 140009}};
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  void *send = conf_buf(700003 * 4), *recv = conf_buf(700003 * 4);
  CHECK(send && recv, "out of memory");
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
    for (int op = MPU_SUM; op <= MPU_MAX; op += MPU_MAX - MPU_SUM) {
      mpu_dtype dt = sizes[k].dt;
      size_t count = sizes[k].count;
      conf_fill(dt, send, count, (mpu_op)op, rank, 0);
      conf_poison_fill(recv, count * mpu_dtype_size(dt));
      CHECK_OK(mpu_comm_all_reduce(world, send, recv, count, dt, (mpu_op)op));
      for (size_t i = 0; i < count; i++) {
        double got = conf_get(dt, recv, i), want = conf_expected(dt, (mpu_op)op, n, i);
        CHECK(got == want, "all_reduce %s %s count %zu: [%zu] = %g, want %g", mpu_dtype_name(dt),
              mpu_op_name((mpu_op)op), count, i, got, want);
      }
    }
out:
  conf_free(send);
  conf_free(recv);
  return res;
}

static mpu_result_t case_all_gather(mpu_comm *world, void *suite) {
  static const size_t counts[] = {0, 1, 7, 9001};
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  void *send = conf_buf(9001 * 8), *recv = conf_buf(9001 * 8 * (size_t)n);
  CHECK(send && recv, "out of memory");
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    for (int inplace = 0; inplace < 2; inplace++)
      for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
        size_t count = counts[c], es = mpu_dtype_size((mpu_dtype)dt);
        conf_poison_fill(recv, count * es * (size_t)n);
        void *in = inplace ? (char *)recv + (size_t)rank * count * es : send;
        conf_fill((mpu_dtype)dt, in, count, MPU_SUM, rank, 0);
        CHECK_OK(mpu_comm_all_gather(world, in, recv, count, (mpu_dtype)dt));
        for (int k = 0; k < n; k++)
          for (size_t i = 0; i < count; i++) {
            double got = conf_get((mpu_dtype)dt, recv, (size_t)k * count + i);
            double want = conf_rounded((mpu_dtype)dt, conf_value(MPU_SUM, k, i));
            CHECK(got == want, "all_gather %s count %zu%s: block %d [%zu] = %g, want %g",
                  mpu_dtype_name((mpu_dtype)dt), count, inplace ? " in place" : "", k, i, got,
                  want);
          }
      }
out:
  conf_free(send);
  conf_free(recv);
  return res;
}

static mpu_result_t case_reduce_scatter(mpu_comm *world, void *suite) {
  static const size_t counts[] = {0, 1, 7, 3001};
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  void *send = conf_buf(3001 * 8 * (size_t)n), *recv = conf_buf(3001 * 8);
  CHECK(send && recv, "out of memory");
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    for (int op = 0; op < MPU_OP_COUNT; op++)
      for (int inplace = 0; inplace < 2; inplace++)
        for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
          size_t count = counts[c], es = mpu_dtype_size((mpu_dtype)dt);
          conf_fill((mpu_dtype)dt, send, count * (size_t)n, (mpu_op)op, rank, 0);
          void *out = inplace ? (char *)send + (size_t)rank * count * es : recv;
          if (!inplace) conf_poison_fill(recv, count * es);
          CHECK_OK(mpu_comm_reduce_scatter(world, send, out, count, (mpu_dtype)dt, (mpu_op)op));
          for (size_t i = 0; i < count; i++) {
            double got = conf_get((mpu_dtype)dt, out, i);
            double want = conf_expected((mpu_dtype)dt, (mpu_op)op, n, (size_t)rank * count + i);
            CHECK(got == want, "reduce_scatter %s %s count %zu%s: [%zu] = %g, want %g",
                  mpu_dtype_name((mpu_dtype)dt), mpu_op_name((mpu_op)op), count,
                  inplace ? " in place" : "", i, got, want);
          }
        }
out:
  conf_free(send);
  conf_free(recv);
  return res;
}

static mpu_result_t case_broadcast(mpu_comm *world, void *suite) {
  static const size_t counts[] = {0, 1, 7, 9001};
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  void *buf = conf_buf(9001 * 8);
  CHECK(buf, "out of memory");
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    for (int root = 0; root < n; root++)
      for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
        size_t count = counts[c], es = mpu_dtype_size((mpu_dtype)dt);
        if (rank == root) conf_fill((mpu_dtype)dt, buf, count, MPU_SUM, root, 0);
        else conf_poison_fill(buf, count * es);
        CHECK_OK(mpu_comm_broadcast(world, buf, count, (mpu_dtype)dt, root));
        for (size_t i = 0; i < count; i++) {
          double got = conf_get((mpu_dtype)dt, buf, i);
          double want = conf_rounded((mpu_dtype)dt, conf_value(MPU_SUM, root, i));
          CHECK(got == want, "broadcast %s root %d count %zu: [%zu] = %g, want %g",
                mpu_dtype_name((mpu_dtype)dt), root, count, i, got, want);
        }
      }
out:
  conf_free(buf);
  return res;
}

static mpu_result_t case_reduce(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  void *send = conf_buf(20001 * 8), *recv = conf_buf(20001 * 8);
  CHECK(send && recv, "out of memory");
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    for (int op = 0; op < MPU_OP_COUNT; op++)
      for (int root = 0; root < n; root++)
        for (size_t c = 0; c < sizeof reduce_counts / sizeof *reduce_counts; c++) {
          size_t count = reduce_counts[c], es = mpu_dtype_size((mpu_dtype)dt);
          int inplace = (root + (int)c) % 2; /* both forms, at every root */
          conf_fill((mpu_dtype)dt, send, count, (mpu_op)op, rank, 0);
          conf_poison_fill(recv, count * es);
          void *out = rank != root ? NULL : inplace ? send : recv;
          CHECK_OK(mpu_comm_reduce(world, send, out, count, (mpu_dtype)dt, (mpu_op)op, root));
          if (rank != root) {
            for (size_t i = 0; i < count; i++) /* non-roots' inputs are untouched */
              CHECK(conf_get((mpu_dtype)dt, send, i) == conf_rounded((mpu_dtype)dt, conf_value((mpu_op)op, rank, i)),
                    "reduce changed a non-root's input at [%zu]", i);
            continue;
          }
          for (size_t i = 0; i < count; i++) {
            double got = conf_get((mpu_dtype)dt, out, i), want = conf_expected((mpu_dtype)dt, (mpu_op)op, n, i);
            CHECK(got == want, "reduce %s %s root %d count %zu: [%zu] = %g, want %g",
                  mpu_dtype_name((mpu_dtype)dt), mpu_op_name((mpu_op)op), root, count, i, got,
                  want);
          }
        }
out:
  conf_free(send);
  conf_free(recv);
  return res;
}

/* Element i of the block rank `from` sends to rank `to`. */
static double a2a_value(int from, int to, size_t i) {
  return (double)((from * 31 + to * 7 + (int)(i % 13)) % 97);
}

static mpu_result_t case_all_to_all(mpu_comm *world, void *suite) {
  static const size_t counts[] = {0, 1, 7, 3001};
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  void *send = conf_buf(3001 * 8 * (size_t)n), *recv = conf_buf(3001 * 8 * (size_t)n);
  CHECK(send && recv, "out of memory");
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
      size_t count = counts[c], es = mpu_dtype_size((mpu_dtype)dt);
      for (int to = 0; to < n; to++)
        for (size_t i = 0; i < count; i++)
          conf_set((mpu_dtype)dt, send, (size_t)to * count + i, a2a_value(rank, to, i));
      conf_poison_fill(recv, count * es * (size_t)n);
      CHECK_OK(mpu_comm_all_to_all(world, send, recv, count, (mpu_dtype)dt));
      for (int from = 0; from < n; from++)
        for (size_t i = 0; i < count; i++) {
          double got = conf_get((mpu_dtype)dt, recv, (size_t)from * count + i);
          double want = conf_rounded((mpu_dtype)dt, a2a_value(from, rank, i));
          CHECK(got == want, "all_to_all %s count %zu: block from %d [%zu] = %g, want %g",
                mpu_dtype_name((mpu_dtype)dt), count, from, i, got, want);
        }
    }
out:
  conf_free(send);
  conf_free(recv);
  return res;
}

static mpu_result_t case_barrier(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  for (int i = 0; i < 50; i++) CHECK_OK(mpu_comm_barrier(world));
out:
  return res;
}

/* A ring in both directions, several messages queued before any is received
 * (as pipeline stages do), in every dtype, and a zero-length message. */
static mpu_result_t case_send_recv(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  enum { COUNT = 3000, MSGS = 3 };
  void *buf = conf_buf(COUNT * 8);
  CHECK(buf, "out of memory");
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++) {
    for (int m = 0; m < MSGS; m++) {
      conf_fill((mpu_dtype)dt, buf, COUNT, MPU_SUM, rank * 10 + m, 0);
      CHECK_OK(mpu_comm_send(world, buf, COUNT, (mpu_dtype)dt, next));
      conf_fill((mpu_dtype)dt, buf, COUNT, MPU_SUM, rank * 10 + m + 5, 0);
      CHECK_OK(mpu_comm_send(world, buf, COUNT, (mpu_dtype)dt, prev));
    }
    CHECK_OK(mpu_comm_send(world, NULL, 0, (mpu_dtype)dt, next));
    for (int m = 0; m < MSGS; m++) {
      conf_poison_fill(buf, COUNT * 8);
      CHECK_OK(mpu_comm_recv(world, buf, COUNT, (mpu_dtype)dt, prev));
      for (size_t i = 0; i < COUNT; i++)
        CHECK(conf_get((mpu_dtype)dt, buf, i) == conf_rounded((mpu_dtype)dt, conf_value(MPU_SUM, prev * 10 + m, i)),
              "recv %s message %d from %d: wrong [%zu]", mpu_dtype_name((mpu_dtype)dt), m, prev, i);
      CHECK_OK(mpu_comm_recv(world, buf, COUNT, (mpu_dtype)dt, next));
      for (size_t i = 0; i < COUNT; i++)
        CHECK(conf_get((mpu_dtype)dt, buf, i) ==
                  conf_rounded((mpu_dtype)dt, conf_value(MPU_SUM, next * 10 + m + 5, i)),
              "recv %s message %d from %d: wrong [%zu]", mpu_dtype_name((mpu_dtype)dt), m, next, i);
    }
    CHECK_OK(mpu_comm_recv(world, NULL, 0, (mpu_dtype)dt, prev));
  }
  CHECK_OK(mpu_comm_barrier(world));
out:
  conf_free(buf);
  return res;
}

/* ---- groups ------------------------------------------------------------------ */

/* all_reduce of world ranks over c: must be the sum of exactly its members. */
static mpu_result_t sum_over(mpu_comm *c, int64_t *got, int64_t *want) {
  int size, wr;
  mpu_result_t r = mpu_comm_size(c, &size);
  if (r) return r;
  *want = 0;
  for (int i = 0; i < size; i++) {
    if ((r = mpu_comm_world_rank(c, i, &wr))) return r;
    *want += wr;
  }
  int me;
  if ((r = mpu_comm_rank(c, &me)) || (r = mpu_comm_world_rank(c, me, &wr))) return r;
  int64_t *buf = conf_buf(2 * sizeof *buf); /* the suite's memory: managed on NCCL */
  if (!buf) return MPU_ERR_OUT_OF_MEMORY;
  buf[0] = wr;
  r = mpu_comm_all_reduce(c, buf, buf + 1, 1, MPU_INT64, MPU_SUM);
  *got = buf[1];
  conf_free(buf);
  return r;
}

static mpu_result_t case_split(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  mpu_comm *parity = NULL, *reversed = NULL, *none = NULL, *sub = NULL;
  int rank, n, r, s;
  int64_t got, want;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);

  /* even and odd ranks, ordered by rank */
  CHECK_OK(mpu_comm_split(world, rank % 2, 0, &parity));
  CHECK(parity, "split gave no communicator");
  CHECK_OK(mpu_comm_rank(parity, &r));
  CHECK_OK(mpu_comm_size(parity, &s));
  CHECK(r == rank / 2 && s == (n - rank % 2 + 1) / 2, "parity split: rank %d of %d", r, s);
  CHECK_OK(sum_over(parity, &got, &want));
  CHECK(got == want, "all_reduce on parity group: %lld, want %lld", (long long)got, (long long)want);

  /* one group, keys reverse the order */
  CHECK_OK(mpu_comm_split(world, 7, n - rank, &reversed));
  CHECK_OK(mpu_comm_rank(reversed, &r));
  CHECK(r == n - 1 - rank, "key order: rank %d, want %d", r, n - 1 - rank);
  CHECK_OK(sum_over(reversed, &got, &want));
  CHECK(got == want, "all_reduce on reversed group: %lld, want %lld", (long long)got, (long long)want);

  /* rank 0 opts out; the others form one group */
  CHECK_OK(mpu_comm_split(world, rank == 0 ? MPU_COMM_SPLIT_NOCOLOR : 1, 0, &none));
  CHECK((rank == 0) == (none == NULL), "NOCOLOR: got %p on rank %d", (void *)none, rank);
  if (none) {
    CHECK_OK(mpu_comm_size(none, &s));
    CHECK(s == n - 1, "split without rank 0: size %d, want %d", s, n - 1);
    CHECK_OK(sum_over(none, &got, &want));
    CHECK(got == want, "all_reduce without rank 0: %lld, want %lld", (long long)got, (long long)want);
  }

  /* a split of a split */
  CHECK_OK(mpu_comm_split(parity, 0, 0, &sub));
  CHECK_OK(sum_over(sub, &got, &want));
  CHECK(got == want, "all_reduce on split of split: %lld, want %lld", (long long)got, (long long)want);
out:
  mpu_comm_destroy(parity);
  mpu_comm_destroy(reversed);
  mpu_comm_destroy(none);
  mpu_comm_destroy(sub);
  return res;
}

static mpu_result_t case_create_group(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  mpu_comm *a = NULL, *b = NULL, *pair = NULL, *again = NULL, *rev = NULL;
  int rank, n, r, members[CONF_MAX_RANKS];
  int64_t got, want;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);

  /* overlapping groups used one after the other: A = 0..n-2, B = 1..n-1 */
  int na = n > 1 ? n - 1 : 1;
  for (int i = 0; i < na; i++) members[i] = i;
  if (rank < na) {
    CHECK_OK(mpu_comm_create_group(world, members, na, &a));
    CHECK_OK(sum_over(a, &got, &want));
    CHECK(got == want, "group A: %lld, want %lld", (long long)got, (long long)want);
  }
  for (int i = 0; i < na; i++) members[i] = n - na + i;
  if (rank >= n - na) {
    CHECK_OK(mpu_comm_create_group(world, members, na, &b));
    CHECK_OK(sum_over(b, &got, &want));
    CHECK(got == want, "group B: %lld, want %lld", (long long)got, (long long)want);
  }
  /* then A again and B again: ranks in both use them interleaved */
  if (a) {
    CHECK_OK(sum_over(a, &got, &want));
    CHECK(got == want, "group A again: %lld, want %lld", (long long)got, (long long)want);
  }
  if (b) {
    CHECK_OK(sum_over(b, &got, &want));
    CHECK(got == want, "group B again: %lld, want %lld", (long long)got, (long long)want);
  }

  /* disjoint pairs created at the same time, then the same pairs again */
  int partner = rank ^ 1;
  if (partner < n) {
    int pm[2] = {rank < partner ? rank : partner, rank < partner ? partner : rank};
    CHECK_OK(mpu_comm_create_group(world, pm, 2, &pair));
    CHECK_OK(mpu_comm_create_group(world, pm, 2, &again));
    CHECK_OK(sum_over(again, &got, &want));
    CHECK(got == want, "second pair: %lld, want %lld", (long long)got, (long long)want);
    CHECK_OK(sum_over(pair, &got, &want));
    CHECK(got == want, "first pair: %lld, want %lld", (long long)got, (long long)want);
  }

  /* the member order gives the ranks */
  for (int i = 0; i < n; i++) members[i] = n - 1 - i;
  CHECK_OK(mpu_comm_create_group(world, members, n, &rev));
  CHECK_OK(mpu_comm_rank(rev, &r));
  CHECK(r == n - 1 - rank, "reversed member list: rank %d, want %d", r, n - 1 - rank);
  int wr;
  CHECK_OK(mpu_comm_world_rank(rev, 0, &wr));
  CHECK(wr == n - 1, "member 0 is world rank %d, want %d", wr, n - 1);
  CHECK_OK(sum_over(rev, &got, &want));
  CHECK(got == want, "reversed group: %lld, want %lld", (long long)got, (long long)want);
out:
  mpu_comm_destroy(a);
  mpu_comm_destroy(b);
  mpu_comm_destroy(pair);
  mpu_comm_destroy(again);
  mpu_comm_destroy(rev);
  return res;
}

/* ---- bad input: local checks, identical on every backend ------------------------- */

static mpu_result_t case_bad_input(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  mpu_comm *dead = NULL;
  int rank, n;
  /* the suite's memory (managed on NCCL): the calls below are refused for
   * their arguments, never for where the buffers live */
  float *buf = conf_buf(64 * sizeof *buf), *out = conf_buf(64 * sizeof *out);
  double *aligned = conf_buf(80 * sizeof *aligned);
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  const mpu_result_t BAD = MPU_ERR_INVALID_ARGUMENT;
  CHECK(buf && out && aligned, "out of memory");

  CHECK_ERR(BAD, mpu_comm_all_reduce(NULL, buf, out, 1, MPU_FLOAT32, MPU_SUM));
  CHECK_ERR(BAD, mpu_comm_all_reduce(world, NULL, out, 1, MPU_FLOAT32, MPU_SUM));
  CHECK_ERR(BAD, mpu_comm_all_reduce(world, buf, NULL, 1, MPU_FLOAT32, MPU_SUM));
  CHECK_ERR(BAD, mpu_comm_all_reduce(world, buf, out, SIZE_MAX, MPU_FLOAT32, MPU_SUM));
  CHECK_ERR(BAD, mpu_comm_all_reduce(world, buf, out, SIZE_MAX / 2, MPU_FLOAT32, MPU_SUM));
  CHECK_ERR(BAD, mpu_comm_all_reduce(world, buf, out, 1, (mpu_dtype)99, MPU_SUM));
  CHECK_ERR(BAD, mpu_comm_all_reduce(world, buf, out, 1, MPU_FLOAT32, (mpu_op)99));
  CHECK_ERR(BAD, mpu_comm_all_reduce(world, buf, buf + 1, 4, MPU_FLOAT32, MPU_SUM));
  CHECK_ERR(BAD, mpu_comm_all_gather(world, buf, NULL, 1, MPU_FLOAT32));
  CHECK_ERR(BAD, mpu_comm_all_gather(world, buf, out, SIZE_MAX / 4, MPU_FLOAT32));
  if (n > 1) /* a send inside recv, but not at this rank's block */
    CHECK_ERR(BAD, mpu_comm_all_gather(world, out + (rank == 0 ? 1 : 0), out, 1, MPU_FLOAT32));
  CHECK_ERR(BAD, mpu_comm_reduce_scatter(world, NULL, out, 1, MPU_FLOAT32, MPU_SUM));
  CHECK_ERR(BAD, mpu_comm_reduce_scatter(world, buf, out, SIZE_MAX / 2, MPU_INT64, MPU_SUM));
  CHECK_ERR(BAD, mpu_comm_broadcast(world, buf, 1, MPU_FLOAT32, -1));
  CHECK_ERR(BAD, mpu_comm_broadcast(world, buf, 1, MPU_FLOAT32, n));
  CHECK_ERR(BAD, mpu_comm_broadcast(world, NULL, 1, MPU_FLOAT32, 0));
  CHECK_ERR(BAD, mpu_comm_reduce(world, buf, out, 1, MPU_FLOAT32, MPU_SUM, n));
  if (rank == 0) CHECK_ERR(BAD, mpu_comm_reduce(world, buf, NULL, 1, MPU_FLOAT32, MPU_SUM, 0));
  CHECK_ERR(BAD, mpu_comm_all_to_all(world, buf, buf, 1, MPU_FLOAT32));
  CHECK_ERR(BAD, mpu_comm_all_to_all(world, buf, out, SIZE_MAX / 2, MPU_FLOAT32));
  CHECK_ERR(BAD, mpu_comm_send(world, buf, 1, MPU_FLOAT32, n));
  CHECK_ERR(BAD, mpu_comm_send(world, buf, 1, MPU_FLOAT32, -1));
  CHECK_ERR(BAD, mpu_comm_recv(world, NULL, 1, MPU_FLOAT32, 0));
  CHECK_ERR(BAD, mpu_comm_barrier(NULL));

  int dup[2] = {rank, rank}, outside[2] = {rank, n}, other[1] = {(rank + 1) % n};
  mpu_comm *g = NULL;
  CHECK_ERR(BAD, mpu_comm_create_group(world, dup, 2, &g));
  CHECK_ERR(BAD, mpu_comm_create_group(world, outside, 2, &g));
  CHECK_ERR(BAD, mpu_comm_create_group(world, dup, 0, &g));
  CHECK_ERR(BAD, mpu_comm_create_group(world, dup, 1, NULL));
  if (n > 1) CHECK_ERR(BAD, mpu_comm_create_group(world, other, 1, &g));
  CHECK(g == NULL, "a failed create_group set its output");
  CHECK_ERR(BAD, mpu_comm_split(world, -5, 0, &g));

  /* a short-lived group (destroying twice is checked single-threaded, in
   * test_fake: here another rank could reuse the address at once) */
  int self[1] = {rank};
  CHECK_OK(mpu_comm_create_group(world, self, 1, &dead));
  CHECK_OK(mpu_comm_all_reduce(dead, buf, out, 3, MPU_FLOAT32, MPU_MAX));
  CHECK(out[0] == buf[0] && out[2] == buf[2], "a group of one must copy");
  CHECK_OK(mpu_comm_destroy(dead));
  dead = NULL;
  CHECK_OK(mpu_comm_destroy(NULL));

  /* and after all that the world still works */
  CHECK_OK(mpu_comm_barrier(world));
  /* misaligned buffers are refused, whatever the size (the large paths load whole elements) */
  {
    char *odd = (char *)aligned + 1;
    CHECK_ERR(MPU_ERR_INVALID_ARGUMENT, mpu_comm_all_reduce(world, odd, odd, 16, MPU_FLOAT32, MPU_SUM));
    CHECK_ERR(MPU_ERR_INVALID_ARGUMENT, mpu_comm_broadcast(world, odd, 4, MPU_FLOAT64, 0));
    CHECK_ERR(MPU_ERR_INVALID_ARGUMENT, mpu_comm_all_gather(world, aligned, odd, 1, MPU_INT32));
  }
  /* memory the communicator's calls cannot reach is refused before anything
   * moves, naming the buffer: stack memory on a device backend (a GPU's
   * kernels would fault on it); the world works on afterwards */
  {
    mpu_comm_caps caps = {.size = sizeof caps};
    CHECK_OK(mpu_comm_capabilities(world, &caps));
    if (caps.memory == MPU_MEMORY_DEVICE) {
      float stack[4] = {0};
      char want[64];
      snprintf(want, sizeof want, "send buffer %p", (void *)stack);
      CHECK_ERR(BAD, mpu_comm_all_reduce(world, stack, out, 4, MPU_FLOAT32, MPU_SUM));
      CHECK(strstr(mpu_last_error(), want), "a stack buffer's refusal says: %s", mpu_last_error());
      CHECK_ERR(BAD, mpu_comm_all_reduce(world, buf, stack, 4, MPU_FLOAT32, MPU_SUM));
      CHECK_ERR(BAD, mpu_comm_broadcast(world, stack, 4, MPU_FLOAT32, 0));
      CHECK_OK(mpu_comm_barrier(world));
    }
  }
out:
  conf_free(buf);
  conf_free(out);
  conf_free(aligned);
  return res;
}


/* A ring shift both ways with mpu_comm_sendrecv, every dtype, then a
 * pipeline exchange (first stage only sends, last only receives). */
static mpu_result_t case_sendrecv(mpu_comm *world, void *suite) {
  enum { COUNT = 2500 };
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  void *out = conf_buf(COUNT * 8), *in = conf_buf(COUNT * 8);
  CHECK(out && in, "out of memory");
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    for (int dir = 0; dir < 2; dir++) {
      int to = dir ? prev : next, from = dir ? next : prev;
      conf_fill((mpu_dtype)dt, out, COUNT, MPU_SUM, rank * 7 + dir, 0);
      conf_poison_fill(in, COUNT * 8);
      CHECK_OK(mpu_comm_sendrecv(world, out, COUNT, to, in, COUNT, from, (mpu_dtype)dt));
      for (size_t i = 0; i < COUNT; i++)
        CHECK(conf_get((mpu_dtype)dt, in, i) == conf_rounded((mpu_dtype)dt, conf_value(MPU_SUM, from * 7 + dir, i)),
              "sendrecv %s from %d: wrong [%zu]", mpu_dtype_name((mpu_dtype)dt), from, i);
    }
  /* a pipeline: stage r receives from r - 1, adds its rank, sends to r + 1 */
  int64_t *x = in; /* the suite's memory */
  *x = 0;
  if (rank > 0) CHECK_OK(mpu_comm_recv(world, x, 1, MPU_INT64, rank - 1));
  *x += rank;
  if (rank < n - 1) CHECK_OK(mpu_comm_send(world, x, 1, MPU_INT64, rank + 1));
  CHECK(*x == (int64_t)rank * (rank + 1) / 2, "pipeline value at stage %d: %lld", rank, (long long)*x);
  CHECK_ERR(MPU_ERR_INVALID_ARGUMENT, mpu_comm_sendrecv(world, out, 1, n, in, 1, 0, MPU_FLOAT32));
  CHECK_ERR(MPU_ERR_INVALID_ARGUMENT, mpu_comm_sendrecv(world, out, 2, 0, (char *)out + 4, 2, 0, MPU_FLOAT32));
out:
  conf_free(out);
  conf_free(in);
  return res;
}

/* ---- non-blocking collectives ------------------------------------------------ */

/* Every collective started at once, waited for in reverse order: each
 * result as the blocking call's. Float32 and int64, a small and a large count. */
static mpu_result_t case_nonblocking(mpu_comm *world, void *suite) {
  static const size_t counts[] = {7, 5003};
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  size_t cap = 5003 * 8 * (size_t)n;
  char *in = conf_buf(cap), *ar = conf_buf(cap), *ag = conf_buf(cap), *rsi = conf_buf(cap), *rs = conf_buf(cap),
       *bc = conf_buf(cap), *rd = conf_buf(cap), *a2i = conf_buf(cap), *a2 = conf_buf(cap);
  mpu_request *req[7] = {0};
  CHECK(in && ar && ag && rsi && rs && bc && rd && a2i && a2, "out of memory");
  for (int d = 0; d < 2; d++)
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++) {
      mpu_dtype dt = d ? MPU_INT64 : MPU_FLOAT32;
      size_t count = counts[c];
      int root = n - 1;
      conf_fill(dt, in, count, MPU_SUM, rank, 0);
      conf_fill(dt, rsi, count * (size_t)n, MPU_SUM, rank, 0);
      if (rank == root) conf_fill(dt, bc, count, MPU_SUM, root, 0);
      for (int to = 0; to < n; to++)
        for (size_t i = 0; i < count; i++) conf_set(dt, a2i, (size_t)to * count + i, a2a_value(rank, to, i));
      CHECK_OK(mpu_comm_iall_reduce(world, in, ar, count, dt, MPU_SUM, &req[0]));
      CHECK_OK(mpu_comm_iall_gather(world, in, ag, count, dt, &req[1]));
      CHECK_OK(mpu_comm_ireduce_scatter(world, rsi, rs, count, dt, MPU_SUM, &req[2]));
      CHECK_OK(mpu_comm_ibroadcast(world, bc, count, dt, root, &req[3]));
      CHECK_OK(mpu_comm_ireduce(world, in, rd, count, dt, MPU_MAX, 0, &req[4]));
      CHECK_OK(mpu_comm_iall_to_all(world, a2i, a2, count, dt, &req[5]));
      CHECK_OK(mpu_comm_ibarrier(world, &req[6]));
      for (int k = 6; k >= 0; k--) {
        mpu_request *r = req[k];
        req[k] = NULL;
        CHECK_OK(mpu_request_wait(r));
      }
      for (size_t i = 0; i < count; i++) {
        CHECK(conf_get(dt, ar, i) == conf_expected(dt, MPU_SUM, n, i), "iall_reduce [%zu]", i);
        CHECK(conf_get(dt, bc, i) == conf_rounded(dt, conf_value(MPU_SUM, root, i)), "ibroadcast [%zu]", i);
        if (rank == 0) CHECK(conf_get(dt, rd, i) == conf_expected(dt, MPU_MAX, n, i), "ireduce [%zu]", i);
        for (int k = 0; k < n; k++) {
          CHECK(conf_get(dt, ag, (size_t)k * count + i) == conf_rounded(dt, conf_value(MPU_SUM, k, i)),
                "iall_gather block %d [%zu]", k, i);
          CHECK(conf_get(dt, a2, (size_t)k * count + i) == conf_rounded(dt, a2a_value(k, rank, i)),
                "iall_to_all block %d [%zu]", k, i);
        }
        CHECK(conf_get(dt, rs, i) == conf_expected(dt, MPU_SUM, n, (size_t)rank * count + i),
              "ireduce_scatter [%zu]", i);
      }
    }
out:
  for (int k = 0; k < 7; k++)
    if (req[k]) mpu_request_wait(req[k]);
  conf_free(in), conf_free(ar), conf_free(ag), conf_free(rsi), conf_free(rs), conf_free(bc), conf_free(rd), conf_free(a2i), conf_free(a2);
  return res;
}

/* The order rules: calls happen in issue order whatever the wait order; a
 * blocking call after a non-blocking one sees its result; test completes;
 * point to point after a pending collective does not deadlock; a request
 * cannot be waited for twice; a destroyed communicator fails its requests. */
static mpu_result_t case_nonblocking_order(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  /* the suite's memory (managed on NCCL): a, x, y, z and two int32 messages */
  int64_t *v = conf_buf(5 * sizeof *v), *a = v, *x = v + 1, *y = v + 2, *z = v + 3;
  int32_t *msg = (int32_t *)(v + 4);
  mpu_request *r1 = NULL, *r2 = NULL;
  mpu_comm *dup = NULL;
  CHECK(v, "out of memory");
  *a = rank + 1;
  /* x = sum(rank + 1); then the blocking call reads x: y = n * sum */
  CHECK_OK(mpu_comm_iall_reduce(world, a, x, 1, MPU_INT64, MPU_SUM, &r1));
  CHECK_OK(mpu_comm_all_reduce(world, x, y, 1, MPU_INT64, MPU_SUM));
  int64_t sum = (int64_t)n * (n + 1) / 2;
  CHECK(*y == n * sum, "blocking call after iall_reduce: %lld, want %lld", (long long)*y,
        (long long)(n * sum));
  mpu_request *stale = r1;
  CHECK_OK(mpu_request_wait(r1));
  r1 = NULL;
  CHECK_ERR(MPU_ERR_INVALID_USAGE, mpu_request_wait(stale)); /* compared, never read */
  CHECK_ERR(MPU_ERR_INVALID_ARGUMENT, mpu_request_wait(NULL));
  /* two chained: z = sum of x's after x was recomputed; waited in reverse */
  CHECK_OK(mpu_comm_iall_reduce(world, a, x, 1, MPU_INT64, MPU_SUM, &r1));
  CHECK_OK(mpu_comm_iall_reduce(world, x, z, 1, MPU_INT64, MPU_MAX, &r2));
  CHECK_OK(mpu_request_wait(r2));
  r2 = NULL;
  CHECK(*z == sum, "second call waited first: %lld, want %lld", (long long)*z, (long long)sum);
  int done = 0;
  for (long spins = 0; !done && spins < 100000000; spins++) CHECK_OK(mpu_request_test(r1, &done));
  r1 = NULL;
  CHECK(done, "mpu_request_test never completed");
  /* p2p behind a pending barrier: rank 0 receives, rank 1 waits then sends */
  CHECK_OK(mpu_comm_ibarrier(world, &r1));
  if (n > 1 && rank == 0) {
    msg[0] = 0;
    CHECK_OK(mpu_comm_recv(world, msg, 1, MPU_INT32, 1));
    CHECK(msg[0] == 42, "recv after ibarrier: %d", msg[0]);
    CHECK_OK(mpu_request_wait(r1));
  } else if (n > 1 && rank == 1) {
    msg[1] = 42;
    CHECK_OK(mpu_request_wait(r1));
    CHECK_OK(mpu_comm_send(world, msg + 1, 1, MPU_INT32, 0));
  } else {
    CHECK_OK(mpu_request_wait_timeout(r1, 60));
  }
  r1 = NULL;
  /* a request dies with its communicator; a stale request pointer is refused */
  int *all = malloc((size_t)n * sizeof(int));
  CHECK(all, "out of memory");
  for (int k = 0; k < n; k++) all[k] = k;
  mpu_result_t cr = mpu_comm_create_group(world, all, n, &dup);
  free(all);
  CHECK_OK(cr);
  CHECK_OK(mpu_comm_ibarrier(dup, &r1));
  if (mpu_comm_destroy(dup) == MPU_SUCCESS) dup = NULL;
  if (!dup) {
    mpu_result_t w = mpu_request_wait(r1);
    if (w == MPU_SUCCESS) {
      /* a backend that completes calls on its own may have finished it */
    } else {
      CHECK(w == MPU_ERR_INVALID_USAGE, "wait after destroy: %s", mpu_result_name(w));
    }
    r1 = NULL;
  }
out:
  if (r1) mpu_request_wait(r1);
  if (r2) mpu_request_wait(r2);
  mpu_comm_destroy(dup);
  if (v) conf_free(v);
  return res;
}

/* mpu_request_free: freed calls still run, in order, and a later request's
 * completion says their buffers are the caller's again. */
static mpu_result_t case_request_free(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  int64_t *v = conf_buf(4 * sizeof *v), *a = v, *x = v + 1; /* the suite's memory */
  mpu_request *q = NULL;
  CHECK(v, "out of memory");
  *a = rank + 1;
  for (int i = 0; i < 2; i++) {
    CHECK_OK(mpu_comm_iall_reduce(world, a, &x[i], 1, MPU_INT64, MPU_SUM, &q));
    CHECK_OK(mpu_request_free(q));
    CHECK_ERR(MPU_ERR_INVALID_USAGE, mpu_request_wait(q)); /* compared, never read */
    q = NULL;
  }
  CHECK_OK(mpu_comm_iall_reduce(world, a, &x[2], 1, MPU_INT64, MPU_SUM, &q));
  CHECK_OK(mpu_request_wait(q));
  q = NULL;
  int64_t sum = (int64_t)n * (n + 1) / 2;
  for (int i = 0; i < 3; i++)
    CHECK(x[i] == sum, "call %d: %lld, want %lld", i, (long long)x[i], (long long)sum);
  CHECK_ERR(MPU_ERR_INVALID_ARGUMENT, mpu_request_free(NULL));
  CHECK_OK(mpu_comm_barrier(world));
out:
  if (q) mpu_request_wait(q);
  if (v) conf_free(v);
  (void)suite;
  return res;
}

/* ---- uneven collectives ------------------------------------------------------
 * Counts per rank with zeros for some ranks, one rank holding everything
 * (past every staging threshold), all different; blocks packed in rank order
 * (NULL displacements) or spaced out in reverse rank order with gaps that
 * must stay untouched. */

#define UNEVEN_PATTERNS 4
#define UNEVEN_BIG 3001
#define GAP 3

static size_t uneven_count(int p, int k, int n) {
  switch (p) {
  case 0: return 0;                                /* nobody contributes */
  case 1: return k % 2 ? 0 : (size_t)(1 + 3 * k);  /* every other rank contributes nothing */
  case 2: return k == n - 1 ? UNEVEN_BIG : 0;      /* one rank has it all */
  default: return (size_t)(7 * k + 1);             /* all different */
  }
}

/* Room for any pattern's blocks over n ranks, spaced, in elements. */
static size_t uneven_room(int n) {
  return UNEVEN_BIG + (size_t)n * (size_t)(7 * n + 1) + (size_t)GAP * ((size_t)n + 1);
}

/* Where the blocks go: packed (NULL; *at gets the packed offsets) or spaced
 * in reverse rank order (displs, also in *at). */
static const size_t *uneven_displs(int spaced, const size_t *counts, int n, size_t *displs) {
  size_t off = spaced ? GAP : 0;
  for (int j = 0; j < n; j++) {
    int k = spaced ? n - 1 - j : j;
    displs[k] = off;
    off += counts[k] + (spaced ? GAP : 0);
  }
  return spaced ? displs : NULL;
}

static int poisoned(const void *p, size_t at, size_t es) {
  const unsigned char *b = (const unsigned char *)p + at * es;
  for (size_t i = 0; i < es; i++)
    if (b[i] != 0x5a) return 0;
  return 1;
}

static mpu_result_t case_all_gather_v(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  size_t room = uneven_room(n), *counts = calloc((size_t)n, sizeof *counts),
         *at = calloc((size_t)n, sizeof *at);
  void *send = conf_buf(UNEVEN_BIG * 8 + 8 * (size_t)n * 8), *recv = conf_buf(room * 8);
  CHECK(send && recv && counts && at, "out of memory");
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    for (int p = 0; p < UNEVEN_PATTERNS; p++)
      for (int spaced = 0; spaced < 2; spaced++)
        for (int inplace = 0; inplace < 2; inplace++) {
          size_t es = mpu_dtype_size((mpu_dtype)dt);
          for (int k = 0; k < n; k++) counts[k] = uneven_count(p, k, n);
          const size_t *displs = uneven_displs(spaced, counts, n, at);
          conf_poison_fill(recv, room * es);
          void *in = inplace ? (char *)recv + at[rank] * es : send;
          conf_fill((mpu_dtype)dt, in, counts[rank], MPU_SUM, rank, 0);
          CHECK_OK(mpu_comm_all_gather_v(world, in, recv, counts, displs, (mpu_dtype)dt));
          for (int k = 0; k < n; k++) {
            for (size_t i = 0; i < counts[k]; i++) {
              double got = conf_get((mpu_dtype)dt, recv, at[k] + i);
              double want = conf_rounded((mpu_dtype)dt, conf_value(MPU_SUM, k, i));
              CHECK(got == want, "all_gather_v %s pattern %d%s%s: block %d [%zu] = %g, want %g",
                    mpu_dtype_name((mpu_dtype)dt), p, spaced ? " spaced" : "",
                    inplace ? " in place" : "", k, i, got, want);
            }
            CHECK(!spaced || poisoned(recv, at[k] - 1, es),
                  "all_gather_v %s pattern %d: the gap before block %d was written",
                  mpu_dtype_name((mpu_dtype)dt), p, k);
          }
        }
out:
  conf_free(send);
  conf_free(recv);
  free(counts);
  free(at);
  return res;
}

static mpu_result_t case_reduce_scatter_v(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  size_t room = uneven_room(n), *counts = calloc((size_t)n, sizeof *counts);
  void *send = conf_buf(room * 8), *recv = conf_buf(UNEVEN_BIG * 8 + 8 * (size_t)n * 8);
  CHECK(send && recv && counts, "out of memory");
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    for (int op = 0; op < MPU_OP_COUNT; op++)
      for (int p = 0; p < UNEVEN_PATTERNS; p++) {
        size_t es = mpu_dtype_size((mpu_dtype)dt), total = 0, mine = 0;
        for (int k = 0; k < n; k++) {
          counts[k] = uneven_count(p, k, n);
          if (k < rank) mine += counts[k];
          total += counts[k];
        }
        conf_fill((mpu_dtype)dt, send, total, (mpu_op)op, rank, 0);
        conf_poison_fill(recv, (counts[rank] + 1) * es);
        CHECK_OK(mpu_comm_reduce_scatter_v(world, send, recv, counts, (mpu_dtype)dt, (mpu_op)op));
        for (size_t i = 0; i < counts[rank]; i++) {
          double got = conf_get((mpu_dtype)dt, recv, i);
          double want = conf_expected((mpu_dtype)dt, (mpu_op)op, n, mine + i);
          CHECK(got == want, "reduce_scatter_v %s %s pattern %d: [%zu] = %g, want %g",
                mpu_dtype_name((mpu_dtype)dt), mpu_op_name((mpu_op)op), p, i, got, want);
        }
        CHECK(poisoned(recv, counts[rank], es), "reduce_scatter_v %s %s pattern %d: wrote past "
              "this rank's %zu elements", mpu_dtype_name((mpu_dtype)dt), mpu_op_name((mpu_op)op),
              p, counts[rank]);
      }
out:
  conf_free(send);
  conf_free(recv);
  free(counts);
  return res;
}

/* all_to_all_v: what rank `from` sends rank `to` under pattern p */
static size_t pair_count(int p, int from, int to, int n) {
  return uneven_count(p, (from + 2 * to) % n, n);
}

static mpu_result_t case_all_to_all_v(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  size_t room = uneven_room(n) + (size_t)UNEVEN_BIG * (size_t)n;
  size_t *sc = calloc((size_t)n * 4, sizeof *sc), *sd = sc ? sc + n : NULL,
         *rc = sc ? sc + 2 * n : NULL, *rd = sc ? sc + 3 * n : NULL;
  void *send = conf_buf(room * 8), *recv = conf_buf(room * 8);
  CHECK(send && recv && sc, "out of memory");
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    for (int p = 0; p < UNEVEN_PATTERNS; p++)
      for (int spaced = 0; spaced < 2; spaced++) {
        size_t es = mpu_dtype_size((mpu_dtype)dt);
        for (int k = 0; k < n; k++) {
          sc[k] = pair_count(p, rank, k, n);
          rc[k] = pair_count(p, k, rank, n);
        }
        const size_t *sdispls = uneven_displs(spaced, sc, n, sd);
        const size_t *rdispls = uneven_displs(!spaced, rc, n, rd); /* the other layout */
        for (int to = 0; to < n; to++)
          for (size_t i = 0; i < sc[to]; i++)
            conf_set((mpu_dtype)dt, send, sd[to] + i, a2a_value(rank, to, i));
        conf_poison_fill(recv, room * es);
        CHECK_OK(mpu_comm_all_to_all_v(world, send, sc, sdispls, recv, rc, rdispls,
                                       (mpu_dtype)dt));
        for (int from = 0; from < n; from++) {
          for (size_t i = 0; i < rc[from]; i++) {
            double got = conf_get((mpu_dtype)dt, recv, rd[from] + i);
            double want = conf_rounded((mpu_dtype)dt, a2a_value(from, rank, i));
            CHECK(got == want, "all_to_all_v %s pattern %d%s: block from %d [%zu] = %g, want %g",
                  mpu_dtype_name((mpu_dtype)dt), p, spaced ? " spaced" : "", from, i, got, want);
          }
          CHECK(!rdispls || poisoned(recv, rd[from] - 1, es),
                "all_to_all_v %s pattern %d: the gap before the block from %d was written",
                mpu_dtype_name((mpu_dtype)dt), p, from);
        }
      }
out:
  conf_free(send);
  conf_free(recv);
  free(sc);
  return res;
}

/* Bad counts fail on every rank alike, before anything moves; counts that
 * differ between ranks fail as a mismatch where calls are checked. */
static mpu_result_t case_uneven_bad_input(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  size_t *counts = calloc((size_t)n, sizeof *counts), *displs = calloc((size_t)n, sizeof *displs);
  /* the suite's memory (managed on NCCL): refused for the counts only */
  float *buf = conf_buf(64 * sizeof *buf), *out = conf_buf(64 * 8 * sizeof *out);
  CHECK(counts && displs && buf && out, "out of memory");
  for (int k = 0; k < n; k++) counts[k] = 1, displs[k] = (size_t)k;
  CHECK_ERR(MPU_ERR_INVALID_ARGUMENT,
            mpu_comm_all_gather_v(world, buf, out, NULL, NULL, MPU_FLOAT32));
  CHECK_ERR(MPU_ERR_INVALID_ARGUMENT,
            mpu_comm_reduce_scatter_v(world, buf, out, NULL, MPU_FLOAT32, MPU_SUM));
  CHECK_ERR(MPU_ERR_INVALID_ARGUMENT,
            mpu_comm_all_to_all_v(world, buf, counts, NULL, out, NULL, NULL, MPU_FLOAT32));
  counts[n - 1] = SIZE_MAX / 2; /* the extent overflows */
  CHECK_ERR(MPU_ERR_INVALID_ARGUMENT,
            mpu_comm_all_gather_v(world, buf, out, counts, NULL, MPU_FLOAT32));
  CHECK_ERR(MPU_ERR_INVALID_ARGUMENT,
            mpu_comm_reduce_scatter_v(world, buf, out, counts, MPU_FLOAT32, MPU_SUM));
  counts[n - 1] = 1;
  if (n > 1) {
    counts[0] = 2; /* block 0 covers elements 0..1, block 1 starts at 1 */
    CHECK_ERR(MPU_ERR_INVALID_ARGUMENT,
              mpu_comm_all_gather_v(world, buf, out, counts, displs, MPU_FLOAT32));
    counts[0] = 1;
  }
  if (n > 1) /* send inside recv, but not at this rank's block (the in-place form) */
    CHECK_ERR(MPU_ERR_INVALID_ARGUMENT,
              mpu_comm_all_gather_v(world, out + (rank + 1) % n, out, counts, NULL, MPU_FLOAT32));
  CHECK_ERR(MPU_ERR_INVALID_ARGUMENT,
            mpu_comm_reduce_scatter_v(world, buf, buf, counts, MPU_FLOAT32, MPU_SUM));
  CHECK_ERR(MPU_ERR_INVALID_ARGUMENT,
            mpu_comm_reduce_scatter_v(world, buf, out, counts, MPU_FLOAT32, MPU_OP_COUNT));
  mpu_comm_caps caps = {.size = sizeof caps};
  CHECK_OK(mpu_comm_capabilities(world, &caps));
  if (caps.call_checking && caps.moves_data && n > 1) {
    counts[0] = rank == 0 ? 2 : 1; /* rank 0 disagrees */
    CHECK_ERR(MPU_ERR_MISMATCH, mpu_comm_all_gather_v(world, buf, out, counts, NULL, MPU_FLOAT32));
    CHECK_ERR(MPU_ERR_MISMATCH,
              mpu_comm_reduce_scatter_v(world, buf, out, counts, MPU_FLOAT32, MPU_SUM));
    counts[0] = 1;
  }
  /* still usable afterwards */
  for (int k = 0; k < n; k++) buf[k] = (float)(rank + 1);
  CHECK_OK(mpu_comm_reduce_scatter_v(world, buf, out, counts, MPU_FLOAT32, MPU_SUM));
  CHECK(out[0] == (float)(n * (n + 1) / 2), "reduce_scatter_v after bad calls: %g", out[0]);
out:
  free(counts);
  free(displs);
  conf_free(buf);
  conf_free(out);
  return res;
}

/* The communicator's memory and copies: what mem_alloc did not hand out (or
 * handed out and took back) is refused by mem_free; copy2d checks every size
 * without wrapping and refuses a destination that overlaps its source. */
static mpu_result_t case_memory_bad_input(mpu_comm *world, void *suite) {
  mpu_result_t res = MPU_SUCCESS;
  const mpu_result_t BAD = MPU_ERR_INVALID_ARGUMENT;
  char *p = NULL, *q = NULL, stack[64] = {0};
  (void)suite;
  CHECK_OK(mpu_comm_mem_alloc(world, 64, (void **)&p));
  CHECK_ERR(BAD, mpu_comm_mem_free(world, stack));
  CHECK_ERR(BAD, mpu_comm_mem_free(world, p + 1));
  CHECK_OK(mpu_comm_mem_free(world, p));
  /* twice: refused. Ranks that share a process may be handed p's address
   * again at once (cudaMalloc reuses it, as the NCCL double's mmap does),
   * so no rank allocates between the two frees */
  CHECK_OK(mpu_comm_barrier(world));
  CHECK_ERR(BAD, mpu_comm_mem_free(world, p));
  CHECK_OK(mpu_comm_barrier(world));
  p = NULL;
  CHECK_OK(mpu_comm_mem_free(world, NULL));
  CHECK_OK(mpu_comm_mem_alloc(world, 0, (void **)&q));
  CHECK_OK(mpu_comm_mem_free(world, q));
  q = NULL;

  CHECK_OK(mpu_comm_mem_alloc(world, 64, (void **)&p));
  CHECK_OK(mpu_comm_mem_alloc(world, 64, (void **)&q));
  /* widths and pitches past PTRDIFF_MAX, spans that wrap */
  CHECK_ERR(BAD, mpu_comm_copy2d(world, p, SIZE_MAX, q, SIZE_MAX, SIZE_MAX - 1, 1));
  CHECK_ERR(BAD, mpu_comm_copy2d(world, p, SIZE_MAX, q, SIZE_MAX, (size_t)PTRDIFF_MAX + 1, 1));
  CHECK_ERR(BAD, mpu_comm_copy2d(world, p, SIZE_MAX / 2, q, 8, 8, 3));
  CHECK_ERR(BAD, mpu_comm_copy2d(world, p, 8, q, 8, 8, SIZE_MAX));
  CHECK_ERR(BAD, mpu_comm_copy2d(world, p, 4, q, 8, 8, 2)); /* pitch below width */
  CHECK_ERR(BAD, mpu_comm_copy2d(world, NULL, 8, q, 8, 8, 2));
  /* overlapping spans: one row down (rows would smear), the same rows, interleaved */
  CHECK_ERR(BAD, mpu_comm_copy2d(world, p + 16, 16, p, 16, 16, 3));
  CHECK_ERR(BAD, mpu_comm_copy2d(world, p, 16, p, 16, 16, 2));
  CHECK_ERR(BAD, mpu_comm_copy2d(world, p + 4, 16, p, 16, 4, 4));
  /* a good strided copy: every other 4-byte column of q into p's rows (the
   * host reaches the communicator's memory by copies: on a GPU it cannot read it) */
  char host[64];
  for (int i = 0; i < 64; i++) host[i] = (char)i;
  CHECK_OK(mpu_comm_copy2d(world, q, 64, host, 64, 64, 1));
  memset(host, 0, sizeof host);
  CHECK_OK(mpu_comm_copy2d(world, p, 64, host, 64, 64, 1));
  CHECK_OK(mpu_comm_copy2d(world, p, 4, q, 8, 4, 8));
  CHECK_OK(mpu_comm_copy2d(world, host, 64, p, 64, 64, 1));
  for (int i = 0; i < 32; i++)
    CHECK(host[i] == (char)((i / 4) * 8 + i % 4), "copy2d byte %d is %d", i, host[i]);
out:
  if (p) mpu_comm_mem_free(world, p);
  if (q) mpu_comm_mem_free(world, q);
  return res;
}

const conf_case conf_cases[] = {
    {"all_reduce", case_all_reduce, 0},
    {"all_reduce_large", case_all_reduce_large, 0},
    {"all_gather", case_all_gather, 0},
    {"reduce_scatter", case_reduce_scatter, 0},
    {"broadcast", case_broadcast, 0},
    {"reduce", case_reduce, 0},
    {"all_to_all", case_all_to_all, 0},
    {"all_gather_v", case_all_gather_v, 0},
    {"reduce_scatter_v", case_reduce_scatter_v, 0},
    {"all_to_all_v", case_all_to_all_v, 0},
    {"uneven_bad_input", case_uneven_bad_input, 0},
    {"barrier", case_barrier, 0},
    {"send_recv", case_send_recv, CONF_NEEDS_EAGER_SEND},
    {"sendrecv", case_sendrecv, 0},
    {"split", case_split, CONF_NEEDS_SPLIT},
    {"create_group", case_create_group, 0},
    {"bad_input", case_bad_input, 0},
    {"memory_bad_input", case_memory_bad_input, 0},
    {"edge_values", conf_case_edge_values, CONF_NEEDS_EXACT},
    {"path_edges", conf_case_path_edges, 0},
    {"nonblocking", case_nonblocking, 0},
    {"nonblocking_order", case_nonblocking_order, 0},
    {"request_free", case_request_free, 0},
    {NULL, NULL, 0},
};
