/*
 * test_progress_mpi.c - the MPI backend's non-blocking calls progress
 * without a wait, under mpirun with 2 or 3 processes: requests on two
 * communicators waited for in opposite orders (rank 0 waits A then B, the
 * others B then A) complete, for every collective, small (inputs riding with
 * the signature), staged and large, with call checking on and off, and give
 * the bits the blocking calls give. Run with a short MPU_TIMEOUT, so a
 * backend that runs calls only at their wait fails at once instead of
 * hanging; also mixed with blocking calls, p2p, tests and freed requests, a
 * blocking call beside a call pending on another communicator, and a
 * mismatch between ranks of a non-blocking call (or of a blocking call on
 * some ranks and a non-blocking one on the others) fails on every rank.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpu.h"
#include "test_helpers.h"

static int rank, size, failures;

#define CHECK MCHECK

enum { N_KINDS = 7 };
static const char *const kinds[N_KINDS] = {"all_reduce", "all_gather", "reduce_scatter",
                                           "broadcast",  "reduce",     "all_to_all", "barrier"};

/* Inputs whose sums depend on the order they are added in. */
static void fill(float *x, size_t n, int seed) {
  unsigned s = 2654435761u * (unsigned)(seed + 1);
  for (size_t i = 0; i < n; i++) {
    s = s * 1103515245u + 12345u;
    x[i] = (float)(s >> 8) / (float)(1u << 24) * 3.f - 1.3f;
  }
}

/* Kind k over n elements on c: non-blocking where req, else blocking. */
static mpu_result_t issue(mpu_comm *c, int k, const float *in, float *out, size_t n, int root,
                          mpu_request **req) {
  switch (k) {
  case 0:
    return req ? mpu_comm_iall_reduce(c, in, out, n, MPU_FLOAT32, MPU_SUM, req)
               : mpu_comm_all_reduce(c, in, out, n, MPU_FLOAT32, MPU_SUM);
  case 1:
    return req ? mpu_comm_iall_gather(c, in, out, n, MPU_FLOAT32, req)
               : mpu_comm_all_gather(c, in, out, n, MPU_FLOAT32);
  case 2:
    return req ? mpu_comm_ireduce_scatter(c, in, out, n, MPU_FLOAT32, MPU_SUM, req)
               : mpu_comm_reduce_scatter(c, in, out, n, MPU_FLOAT32, MPU_SUM);
  case 3:
    if (rank == root) memcpy(out, in, n * sizeof *out);
    return req ? mpu_comm_ibroadcast(c, out, n, MPU_FLOAT32, root, req)
               : mpu_comm_broadcast(c, out, n, MPU_FLOAT32, root);
  case 4:
    return req ? mpu_comm_ireduce(c, in, out, n, MPU_FLOAT32, MPU_SUM, root, req)
               : mpu_comm_reduce(c, in, out, n, MPU_FLOAT32, MPU_SUM, root);
  case 5:
    return req ? mpu_comm_iall_to_all(c, in, out, n, MPU_FLOAT32, req)
               : mpu_comm_all_to_all(c, in, out, n, MPU_FLOAT32);
  default: return req ? mpu_comm_ibarrier(c, req) : mpu_comm_barrier(c);
  }
}

/* Elements of output (and input) a call of n moves on this rank. */
static size_t room(size_t n) { return n * (size_t)size; }

/* Two requests on a and b, waited in opposite orders on rank 0 and the
 * others; their outputs must be the blocking calls' bits (on ref). */
static void opposite(mpu_comm *a, mpu_comm *b, mpu_comm *ref, int k, size_t n, const char *mode) {
  size_t len = room(n);
  float *ia = calloc(len, sizeof *ia), *ib = calloc(len, sizeof *ib);
  float *oa = calloc(len, sizeof *oa), *ob = calloc(len, sizeof *ob);
  float *wa = calloc(len, sizeof *wa), *wb = calloc(len, sizeof *wb);
  if (!ia || !ib || !oa || !ob || !wa || !wb) {
    CHECK(0, "out of memory");
    goto out;
  }
  int root = size - 1;
  fill(ia, len, 17 * rank + k), fill(ib, len, 31 * rank + k + 5);
  mpu_request *qa = NULL, *qb = NULL;
  mpu_result_t r = issue(a, k, ia, oa, n, root, &qa);
  CHECK(!r, "%s %s %zu on A -> %s", mode, kinds[k], n, mpu_result_name(r));
  r = issue(b, k, ib, ob, n, root, &qb);
  CHECK(!r, "%s %s %zu on B -> %s", mode, kinds[k], n, mpu_result_name(r));
  if (!qa || !qb) goto out;
  mpu_request *first = rank == 0 ? qa : qb, *second = rank == 0 ? qb : qa;
  r = mpu_request_wait(first);
  CHECK(!r, "%s %s %zu: first wait -> %s", mode, kinds[k], n, mpu_result_name(r));
  r = mpu_request_wait(second);
  CHECK(!r, "%s %s %zu: second wait -> %s", mode, kinds[k], n, mpu_result_name(r));
  CHECK(!issue(ref, k, ia, wa, n, root, NULL), "blocking reference");
  CHECK(!issue(ref, k, ib, wb, n, root, NULL), "blocking reference");
  int rooted = k == 4 && rank != root; /* reduce: only the root has an output */
  size_t outlen = k == 1 || k == 5 ? len : k == 6 ? 0 : n;
  if (!rooted && outlen) {
    CHECK(!memcmp(oa, wa, outlen * sizeof *oa), "%s %s %zu on A: not the blocking call's bits",
          mode, kinds[k], n);
    CHECK(!memcmp(ob, wb, outlen * sizeof *ob), "%s %s %zu on B: not the blocking call's bits",
          mode, kinds[k], n);
  }
out:
  free(ia), free(ib), free(oa), free(ob), free(wa), free(wb);
}

/* Blocking calls, tests and p2p between the requests: rank 0 issues A,
 * makes a blocking call on B and receives from rank 1; rank 1 issues A,
 * tests it, sends to rank 0, the blocking call on B, then waits A (rank 0
 * waits A last). A freed request completes on its own. */
static void mixed(mpu_comm *a, mpu_comm *b, const char *mode) {
  float in[64], out[64], blk_in[8], blk_out[8], msg[4] = {1, 2, 3, 4}, got[4] = {0};
  fill(in, 64, rank), fill(blk_in, 8, rank + 9);
  mpu_request *q = NULL, *gone = NULL;
  CHECK(!mpu_comm_iall_reduce(a, in, out, 64, MPU_FLOAT32, MPU_MAX, &q), "%s iall_reduce", mode);
  CHECK(!mpu_comm_ibarrier(b, &gone), "%s ibarrier", mode);
  CHECK(!mpu_request_free(gone), "%s free", mode);
  if (rank == 1) {
    int done = 0;
    CHECK(!mpu_request_test(q, &done), "%s test", mode);
    if (done) q = NULL;
    CHECK(!mpu_comm_send(b, msg, 4, MPU_FLOAT32, 0), "%s send", mode);
  } else if (rank == 0) {
    CHECK(!mpu_comm_recv(b, got, 4, MPU_FLOAT32, 1), "%s recv", mode);
    CHECK(got[3] == 4.f, "%s recv got %g", mode, got[3]);
  }
  CHECK(!mpu_comm_all_reduce(b, blk_in, blk_out, 8, MPU_FLOAT32, MPU_SUM), "%s blocking", mode);
  if (q) CHECK(!mpu_request_wait(q), "%s wait", mode);
  float want[64];
  fill(want, 64, 0);
  for (int p = 1; p < size; p++) {
    float x[64];
    fill(x, 64, p);
    for (int i = 0; i < 64; i++) want[i] = want[i] > x[i] ? want[i] : x[i];
  }
  CHECK(!memcmp(out, want, sizeof want), "%s max differs", mode);
}

/* Rank 1 issues a different count: every rank's request fails with
 * MPU_ERR_MISMATCH, and the communicator stays usable. */
static void mismatch(mpu_comm *a) {
  float in[16] = {0}, out[16];
  mpu_request *q = NULL;
  CHECK(!mpu_comm_iall_reduce(a, in, out, rank == 1 ? 15 : 16, MPU_FLOAT32, MPU_SUM, &q), "issue");
  if (!q) return;
  mpu_result_t r = mpu_request_wait(q);
  CHECK(r == MPU_ERR_MISMATCH, "mismatched iall_reduce -> %s", mpu_result_name(r));
  CHECK(!mpu_comm_all_reduce(a, in, out, 16, MPU_FLOAT32, MPU_SUM), "usable after mismatch");
}

/* A rank with a non-blocking call pending on A makes a checked blocking call
 * on B with ranks that have nothing pending (each rank's choice of exchange
 * must not depend on what else it has pending: MPI never matches a blocking
 * collective with a non-blocking one); the others issue the call on A after.
 * n = 2 rides with the signature, 1000 has a data phase. */
static void pending_elsewhere(mpu_comm *a, mpu_comm *b, size_t n, const char *mode) {
  float in[1000], out[1000], bin[1000], bout[1000];
  fill(in, n, rank + 3), fill(bin, n, rank + 40);
  mpu_request *q = NULL;
  if (rank == 0)
    CHECK(!mpu_comm_iall_reduce(a, in, out, n, MPU_FLOAT32, MPU_SUM, &q), "%s issue on A", mode);
  mpu_result_t r = mpu_comm_all_reduce(b, bin, bout, n, MPU_FLOAT32, MPU_SUM);
  CHECK(!r, "%s %zu: blocking on B beside a pending call on A -> %s", mode, n,
        mpu_result_name(r));
  if (rank != 0)
    CHECK(!mpu_comm_iall_reduce(a, in, out, n, MPU_FLOAT32, MPU_SUM, &q), "%s issue on A", mode);
  if (q) CHECK(!mpu_request_wait(q), "%s %zu: wait on A", mode, n);
  float want[1000], got[1000], bwant[1000];
  CHECK(!mpu_comm_all_reduce(a, in, want, n, MPU_FLOAT32, MPU_SUM), "%s reference", mode);
  CHECK(!mpu_comm_all_reduce(a, bin, bwant, n, MPU_FLOAT32, MPU_SUM), "%s reference", mode);
  memcpy(got, out, n * sizeof *got);
  CHECK(!memcmp(got, want, n * sizeof *got), "%s %zu: A's result differs", mode, n);
  CHECK(!memcmp(bout, bwant, n * sizeof *bout), "%s %zu: B's result differs", mode, n);
}

/* The same on one communicator: every rank issues a call on A, only the
 * others wait for it, then all make a blocking call on A (rank 0 still holds
 * its request, the others none) and rank 0 waits last. */
static void pending_same(mpu_comm *a, size_t n, const char *mode) {
  float in[1000], out[1000], bin[1000], bout[1000], want[1000];
  fill(in, n, rank + 5), fill(bin, n, rank + 50);
  mpu_request *q = NULL;
  CHECK(!mpu_comm_iall_reduce(a, in, out, n, MPU_FLOAT32, MPU_SUM, &q), "%s issue on A", mode);
  if (!q) return;
  if (rank != 0) {
    CHECK(!mpu_request_wait(q), "%s %zu: wait on A", mode, n);
    q = NULL;
  }
  mpu_result_t r = mpu_comm_all_reduce(a, bin, bout, n, MPU_FLOAT32, MPU_SUM);
  CHECK(!r, "%s %zu: blocking on A beside a request held -> %s", mode, n, mpu_result_name(r));
  if (q) CHECK(!mpu_request_wait(q), "%s %zu: late wait on A", mode, n);
  CHECK(!mpu_comm_all_reduce(a, in, want, n, MPU_FLOAT32, MPU_SUM), "%s reference", mode);
  CHECK(!memcmp(out, want, n * sizeof *out), "%s %zu: A's request result differs", mode, n);
  CHECK(!mpu_comm_all_reduce(a, bin, want, n, MPU_FLOAT32, MPU_SUM), "%s reference", mode);
  CHECK(!memcmp(bout, want, n * sizeof *bout), "%s %zu: A's blocking result differs", mode, n);
}

/* Mismatched calls where some ranks call blocking and the others
 * non-blocking on the same communicator: a collective against a barrier,
 * then different counts; every rank fails with MPU_ERR_MISMATCH (none
 * hangs) and the communicator stays usable. */
static void mixed_mismatch(mpu_comm *a) {
  float in[16] = {0}, out[16];
  int blocking = rank % 2 == 0;
  for (int pass = 0; pass < 2; pass++) {
    const char *what = pass ? "different counts" : "all_reduce against barrier";
    mpu_result_t r;
    if (blocking) {
      r = pass ? mpu_comm_all_reduce(a, in, out, 16, MPU_FLOAT32, MPU_SUM) : mpu_comm_barrier(a);
    } else {
      mpu_request *q = NULL;
      r = mpu_comm_iall_reduce(a, in, out, pass ? 2 : 16, MPU_FLOAT32, MPU_SUM, &q);
      CHECK(!r, "%s: issue -> %s", what, mpu_result_name(r));
      if (!q) continue;
      r = mpu_request_wait(q);
    }
    CHECK(r == MPU_ERR_MISMATCH, "%s (%s here) -> %s", what, blocking ? "blocking" : "non-blocking",
          mpu_result_name(r));
    CHECK(!mpu_comm_all_reduce(a, in, out, 16, MPU_FLOAT32, MPU_SUM), "usable after %s", what);
  }
}

int main(int argc, char **argv) {
  mpu_comm *ref = NULL;
  if (mpu_comm_mpi_world(&argc, &argv, &ref)) {
    fprintf(stderr, "mpu_comm_mpi_world: %s\n", mpu_last_error());
    return 1;
  }
  mpu_comm_rank(ref, &rank);
  mpu_comm_size(ref, &size);
  static const size_t sizes[] = {2, 1000, 40000};
  for (int checks = 0; checks < 2; checks++) {
    const char *mode = checks ? "checked" : "unchecked";
    mpu_comm *a = MFRESH(0, checks ? MPU_CHECKS_ON : MPU_CHECKS_OFF);
    mpu_comm *b = MFRESH(0, checks ? MPU_CHECKS_ON : MPU_CHECKS_OFF);
    if (!a || !b) break;
    for (int k = 0; k < N_KINDS; k++)
      for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        if (k == 6 && s) continue;
        /* k != 1 and 5 keep n small per rank: the large all-to-all is n x size */
        opposite(a, b, ref, k, sizes[s], mode);
      }
    mixed(a, b, mode);
    pending_elsewhere(a, b, 2, mode);
    pending_elsewhere(a, b, 1000, mode);
    pending_same(a, 2, mode);
    pending_same(a, 1000, mode);
    if (checks && size > 1) mismatch(a), mixed_mismatch(a);
    mpu_comm_destroy(a);
    mpu_comm_destroy(b);
  }
  int total = 0;
  mpu_comm_all_reduce(ref, &failures, &total, 1, MPU_INT32, MPU_SUM);
  if (rank == 0) printf("%s: %d failure(s) on %d ranks\n", total ? "FAIL" : "ok", total, size);
  mpu_comm_destroy(ref);
  mpu_mpi_finalize();
  return total != 0;
}
