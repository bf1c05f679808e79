/*
 * sizes.c - every collective of one count per rank at the sizes where a
 * backend changes how it moves the data: one element under, at and over each
 * edge, every dtype and op, in place and not, at rotating roots.
 *
 * The edges are bytes a rank stages: the threads backend stages up to
 * MPU_THREADS_BOX (96) bytes in its box beside the call's signature and up to
 * MPU_THREADS_SCRATCH (16 KiB) in its scratch slot, and goes zero-copy past
 * that (src/comm/threads/threads.h). A reduce_scatter or an all_to_all
 * stages n blocks of count elements, the others one.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

static const size_t edges[] = {96, 16384};

/* One call of `kind` on count elements of dt, checked on every rank. */
static mpu_result_t one(mpu_comm *world, void *suite, mpu_collective kind, mpu_dtype dt,
                        mpu_op op, size_t count, int inplace, int root, void *send, void *recv) {
  mpu_result_t res = MPU_SUCCESS;
  int rank, n;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &n);
  size_t es = mpu_dtype_size(dt), block = count * es;
  const char *how = inplace ? " in place" : "";
  switch (kind) {
  case MPU_COLL_ALL_REDUCE: {
    conf_fill(dt, send, count, op, rank, 0);
    void *out = inplace ? send : recv;
    conf_poison_fill(recv, block);
    CHECK_OK(mpu_comm_all_reduce(world, send, out, count, dt, op));
    for (size_t i = 0; i < count; i++)
      CHECK(conf_get(dt, out, i) == conf_expected(dt, op, n, i),
            "all_reduce %s %s count %zu%s: [%zu] = %g, want %g", mpu_dtype_name(dt),
            mpu_op_name(op), count, how, i, conf_get(dt, out, i), conf_expected(dt, op, n, i));
    break;
  }
  case MPU_COLL_ALL_GATHER: {
    conf_poison_fill(recv, block * (size_t)n);
    void *in = inplace ? (char *)recv + (size_t)rank * block : send;
    conf_fill(dt, in, count, MPU_SUM, rank, 0);
    CHECK_OK(mpu_comm_all_gather(world, in, recv, count, dt));
    for (int k = 0; k < n; k++)
      for (size_t i = 0; i < count; i++) {
        double got = conf_get(dt, recv, (size_t)k * count + i);
        double want = conf_rounded(dt, conf_value(MPU_SUM, k, i));
        CHECK(got == want, "all_gather %s count %zu%s: block %d [%zu] = %g, want %g",
              mpu_dtype_name(dt), count, how, k, i, got, want);
      }
    break;
  }
  case MPU_COLL_REDUCE_SCATTER: {
    conf_fill(dt, send, count * (size_t)n, op, rank, 0);
    void *out = inplace ? (char *)send + (size_t)rank * block : recv;
    conf_poison_fill(recv, block);
    CHECK_OK(mpu_comm_reduce_scatter(world, send, out, count, dt, op));
    for (size_t i = 0; i < count; i++) {
      double got = conf_get(dt, out, i), want = conf_expected(dt, op, n, (size_t)rank * count + i);
      CHECK(got == want, "reduce_scatter %s %s count %zu%s: [%zu] = %g, want %g",
            mpu_dtype_name(dt), mpu_op_name(op), count, how, i, got, want);
    }
    break;
  }
  case MPU_COLL_BROADCAST:
    if (rank == root) conf_fill(dt, send, count, MPU_SUM, root, 0);
    else conf_poison_fill(send, block);
    CHECK_OK(mpu_comm_broadcast(world, send, count, dt, root));
    for (size_t i = 0; i < count; i++) {
      double got = conf_get(dt, send, i), want = conf_rounded(dt, conf_value(MPU_SUM, root, i));
      CHECK(got == want, "broadcast %s root %d count %zu: [%zu] = %g, want %g",
            mpu_dtype_name(dt), root, count, i, got, want);
    }
    break;
  case MPU_COLL_REDUCE: {
    conf_fill(dt, send, count, op, rank, 0);
    conf_poison_fill(recv, block);
    void *out = rank != root ? NULL : inplace ? send : recv;
    CHECK_OK(mpu_comm_reduce(world, send, out, count, dt, op, root));
    for (size_t i = 0; i < count; i++) {
      double got = conf_get(dt, rank == root ? out : send, i);
      double want = rank == root ? conf_expected(dt, op, n, i)
                                 : conf_rounded(dt, conf_value(op, rank, i)); /* untouched */
      CHECK(got == want, "reduce %s %s root %d count %zu%s on rank %d: [%zu] = %g, want %g",
            mpu_dtype_name(dt), mpu_op_name(op), root, count, how, rank, i, got, want);
    }
    break;
  }
  default: /* all_to_all: block `to` of rank `from` holds conf_value(SUM, from * n + to, i) */
    for (int to = 0; to < n; to++)
      conf_fill(dt, (char *)send + (size_t)to * block, count, MPU_SUM, rank * n + to, 0);
    conf_poison_fill(recv, block * (size_t)n);
    CHECK_OK(mpu_comm_all_to_all(world, send, recv, count, dt));
    for (int from = 0; from < n; from++)
      for (size_t i = 0; i < count; i++) {
        double got = conf_get(dt, recv, (size_t)from * count + i);
        double want = conf_rounded(dt, conf_value(MPU_SUM, from * n + rank, i));
        CHECK(got == want, "all_to_all %s count %zu: block from %d [%zu] = %g, want %g",
              mpu_dtype_name(dt), count, from, i, got, want);
      }
  }
out:
  return res;
}

mpu_result_t conf_case_path_edges(mpu_comm *world, void *suite) {
  static const mpu_collective kinds[] = {MPU_COLL_ALL_REDUCE, MPU_COLL_ALL_GATHER,
                                         MPU_COLL_REDUCE_SCATTER, MPU_COLL_BROADCAST,
                                         MPU_COLL_REDUCE, MPU_COLL_ALL_TO_ALL};
  mpu_result_t res = MPU_SUCCESS;
  int n;
  mpu_comm_size(world, &n);
  /* the largest buffer: n blocks of one element past the last edge */
  size_t cap = (edges[1] + 2 * sizeof(double)) * (size_t)n;
  void *send = conf_buf(cap), *recv = conf_buf(cap);
  CHECK(send && recv, "out of memory");
  for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++) {
    mpu_collective kind = kinds[k];
    int reduces = kind == MPU_COLL_ALL_REDUCE || kind == MPU_COLL_REDUCE_SCATTER ||
                  kind == MPU_COLL_REDUCE;
    int blocks = kind == MPU_COLL_REDUCE_SCATTER || kind == MPU_COLL_ALL_TO_ALL ? n : 1;
    int forms = kind == MPU_COLL_ALL_TO_ALL || kind == MPU_COLL_BROADCAST ? 1 : 2;
    for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
      for (size_t e = 0; e < sizeof edges / sizeof *edges; e++) {
        size_t at = edges[e] / (mpu_dtype_size((mpu_dtype)dt) * (size_t)blocks);
        for (size_t count = at ? at - 1 : 0; count <= at + 1; count++)
          for (int op = 0; op < (reduces ? MPU_OP_COUNT : 1); op++)
            for (int inplace = 0; inplace < forms; inplace++) {
              int root = (int)(count + (size_t)op) % n;
              res = one(world, suite, kind, (mpu_dtype)dt, (mpu_op)op, count, inplace, root,
                        send, recv);
              if (res) goto out;
            }
      }
  }
out:
  conf_free(send);
  conf_free(recv);
  return res;
}
