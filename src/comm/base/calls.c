/*
 * calls.c - the public calls (collectives, uneven collectives, send, recv):
 * every argument checked once, for every backend, then the call described
 * once (mpu__call) and handed to request.c or the group.
 *
 * A call's checks follow from its row of the collective table
 * (collective.h): an invalid dtype or op, a count whose byte size
 * overflows, a NULL or misaligned buffer, overlapping buffers that are not
 * the row's in-place form, a root or peer out of range; the uneven calls'
 * count lists on top.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/base/collective.h"
#include "comm/base/group.h"
#include "comm/comm_internal.h"
#include "comm/services.h"
#include "core/error.h"
#include "core/span.h"

/* ---- argument checks ----------------------------------------------------- */


static mpu_result_t check_dtype(const char *fn, mpu_dtype dt) {
  if (!mpu_dtype_size(dt))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: invalid dtype %d", fn, (int)dt);
  return MPU_SUCCESS;
}

static mpu_result_t check_op(const char *fn, mpu_op op) {
  if ((unsigned)op >= MPU_OP_COUNT)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: invalid reduction op %d", fn, (int)op);
  return MPU_SUCCESS;
}

/* bytes = count * blocks * size(dt), refused when it overflows. */
static mpu_result_t check_bytes(const char *fn, size_t count, size_t blocks, mpu_dtype dt,
                                size_t *bytes) {
  size_t n;
  if (__builtin_mul_overflow(count, blocks, &n) ||
      __builtin_mul_overflow(n, mpu_dtype_size(dt), &n) || n > (size_t)PTRDIFF_MAX)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: count %zu x %zu block(s) of %s overflows the address space", fn, count,
                      blocks, mpu_dtype_name(dt));
  *bytes = n;
  return MPU_SUCCESS;
}

/* A buffer of bytes for elements of dt: not NULL unless empty, aligned to
 * the element size (the kernels load whole elements; mpu/comm.h says so),
 * and memory the communicator's calls can reach (a device backend's
 * check_buffer: host memory handed to NCCL would fault on the GPU). */
static mpu_result_t check_buf(const char *fn, const mpu_comm *c, const char *what, const void *p,
                              size_t bytes, mpu_dtype dt) {
  if (!p && bytes)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s buffer is NULL for %zu bytes", fn, what,
                      bytes);
  size_t align = mpu_dtype_size(dt);
  if (p && bytes && align > 1 && (uintptr_t)p % align)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: %s buffer %p is not aligned to %zu bytes (the size of %s)", fn, what, p,
                      align, mpu_dtype_name(dt));
  char why[256];
  if (p && bytes && c->ops->check_buffer && !c->ops->check_buffer(c, p, bytes, why, sizeof why))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s buffer %p (%zu bytes) %s", fn, what, p,
                      bytes, why);
  return MPU_SUCCESS;
}

/* send and recv may overlap only as the exact in-place form (send at in_place). */
static mpu_result_t check_overlap(const char *fn, const void *send, size_t sbytes,
                                  const void *recv, size_t rbytes, const void *in_place) {
  if (!mpu__spans_overlap(send, sbytes, recv, rbytes) || send == in_place) return MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                    "%s: send and recv buffers overlap but are not the in-place form", fn);
}

mpu_result_t mpu__comm_check_rank(const char *fn, const char *what, const mpu_comm *c, int r) {
  if (r < 0 || r >= c->size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s %d is outside 0..%d", fn, what, r,
                      c->size - 1);
  return MPU_SUCCESS;
}

#define CHECK_ENTRY(fn, c, dt)   \
  MPU_CHECK(mpu__comm_check(fn, c));  \
  MPU_CHECK(check_dtype(fn, dt))

/* ---- calls: one checked entry each, blocking or not -------------------------
 *
 * Every call is described once, as an mpu__call, and checked from its row of
 * the collective table (collective.h): which arguments it takes, how many
 * blocks of count elements each buffer holds, its one in-place form. The
 * call then goes to mpu__submit (request.c): run now, or queued / started
 * for a request; send and recv are run now or posted in a group. Backends
 * get the description as it is. */

mpu__call mpu__call_describe(int kind, size_t count, mpu_dtype dtype, mpu_op op, int rank,
                             const void *send, void *recv) {
  const mpu__coll *row = mpu__coll_of(kind);
  mpu__call k = {{(int32_t)kind, (int32_t)dtype, MPU_SUM, -1, (uint64_t)count, 0}, send, recv,
                 NULL, NULL, NULL, NULL, -1};
  if (row->has_op) k.sig.op = (int32_t)op;
  if (row->has_root) k.sig.root = rank;
  if (row->has_peer) k.peer = rank;
  return k;
}

/* send and recv may overlap only as the row's in-place form (block: one
 * block's bytes). */
static mpu_result_t check_in_place(const char *fn, const mpu__coll *row, const mpu_comm *c,
                                   const char *send, size_t sbytes, const char *recv,
                                   size_t rbytes, size_t block) {
  if (!mpu__spans_overlap(send, sbytes, recv, rbytes)) return MPU_SUCCESS;
  if (mpu__coll_in_place(row, send, recv, c->rank, block)) return MPU_SUCCESS;
  if (row->in_place == MPU__IN_PLACE_NONE)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: send and recv buffers overlap (%s has no in-place form)", fn,
                      row->name);
  return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                    "%s: send and recv buffers overlap but are not the in-place form", fn);
}

/* Every argument of a call of one count per block (the collectives but the
 * uneven ones, send and recv), as its row says. */
static mpu_result_t check_call(const char *fn, const mpu_comm *comm, const mpu__call *k) {
  const mpu__coll *row = mpu__coll_of(k->sig.kind);
  mpu_dtype dt = (mpu_dtype)k->sig.dtype;
  size_t count = (size_t)k->sig.count, block = 0, sbytes = 0, rbytes = 0;
  CHECK_ENTRY(fn, comm, dt);
  if (row->has_op) MPU_CHECK(check_op(fn, (mpu_op)k->sig.op));
  if (row->has_root) MPU_CHECK(mpu__comm_check_rank(fn, "root", comm, k->sig.root));
  if (row->has_peer) MPU_CHECK(mpu__comm_check_rank(fn, row->peer_name, comm, k->peer));
  MPU_CHECK(check_bytes(fn, count, 1, dt, &block));
  MPU_CHECK(check_bytes(fn, count, mpu__coll_blocks(row->send_blocks, comm->size), dt, &sbytes));
  MPU_CHECK(check_bytes(fn, count, mpu__coll_blocks(row->recv_blocks, comm->size), dt, &rbytes));
  if (row->in_place == MPU__IN_PLACE_ONE_BUFFER)
    return check_buf(fn, comm, "data", k->recv, block, dt);
  if (row->send_blocks) MPU_CHECK(check_buf(fn, comm, "send", k->send, sbytes, dt));
  if (!row->recv_blocks || (row->recv_at_root && comm->rank != k->sig.root)) return MPU_SUCCESS;
  MPU_CHECK(check_buf(fn, comm, row->recv_at_root ? "recv (at root)" : "recv", k->recv, rbytes,
                      dt));
  if (!row->send_blocks) return MPU_SUCCESS;
  return check_in_place(fn, row, comm, k->send, sbytes, k->recv, rbytes, block);
}

/* A collective of one count per rank: checked, then run or started. */
static mpu_result_t collective(mpu_comm *comm, mpu__call call, mpu_request **req) {
  const mpu__coll *row = mpu__coll_of(call.sig.kind);
  const char *fn = req ? row->ifn : row->fn;
  MPU_CHECK(check_call(fn, comm, &call));
  return mpu__submit(fn, comm, &call, req);
}

/* ---- uneven collectives --------------------------------------------------------- */

/* FNV-1a over the counts: what the ranks' signatures compare. */
static uint64_t digest(const size_t *counts, int n) {
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (int i = 0; i < n; i++)
    for (int b = 0; b < 8; b++) h = (h ^ (((uint64_t)counts[i] >> (8 * b)) & 0xff)) * UINT64_C(0x100000001b3);
  return h;
}

typedef struct placed {
  size_t at, count;
  int k;
} placed;

static int by_start(const void *a, const void *b) {
  const placed *x = a, *y = b;
  if (x->at != y->at) return x->at < y->at ? -1 : 1;
  return (x->k > y->k) - (x->k < y->k);
}

/* No two non-empty blocks placed by the caller overlap: sorted by start, each
 * ends before the next begins. O(n log n), so a world of millions of ranks
 * (the fake backend's) checks in well under a second. The ends do not
 * overflow: check_blocks checked them first. */
static mpu_result_t check_disjoint(const char *fn, const char *what, int n, const size_t *counts,
                                   const size_t *displs) {
  placed *b = malloc((size_t)n * sizeof *b);
  if (!b) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d %s blocks", fn, n, what);
  int m = 0;
  for (int k = 0; k < n; k++)
    if (counts[k]) b[m++] = (placed){displs[k], counts[k], k};
  qsort(b, (size_t)m, sizeof *b, by_start);
  mpu_result_t r = MPU_SUCCESS;
  for (int i = 1; i < m && !r; i++)
    if (b[i].at < b[i - 1].at + b[i - 1].count) {
      const placed *x = b[i - 1].k < b[i].k ? &b[i - 1] : &b[i], *y = x == &b[i] ? &b[i - 1] : &b[i];
      r = mpu__error(MPU_ERR_INVALID_ARGUMENT,
                     "%s: %s blocks %d and %d overlap (elements %zu..%zu and %zu..%zu)", fn, what,
                     x->k, y->k, x->at, x->at + x->count, y->at, y->at + y->count);
    }
  free(b);
  return r;
}

/* The blocks of one buffer: n blocks of counts[k] elements at displs[k] (NULL:
 * one after the other, written to packed[]), their extent in bytes checked
 * for overflow, no two overlapping. *total is the sum of the counts. */
static mpu_result_t check_blocks(const char *fn, const char *what, int n, const size_t *counts,
                                 const size_t *displs, size_t *packed, mpu_dtype dt,
                                 size_t *extent_bytes, size_t *total) {
  if (!counts) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s counts are NULL", fn, what);
  size_t end = 0, sum = 0, es = mpu_dtype_size(dt);
  for (int k = 0; k < n; k++) {
    size_t at = displs ? displs[k] : sum, stop;
    if (__builtin_add_overflow(sum, counts[k], &sum) ||
        __builtin_add_overflow(at, counts[k], &stop) || __builtin_mul_overflow(stop, es, &stop) ||
        stop > (size_t)PTRDIFF_MAX)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: %s block %d (%zu elements at %zu) overflows the address space", fn,
                        what, k, counts[k], at);
    if (packed) packed[k] = at;
    if (counts[k] && stop > end) end = stop; /* an empty block reaches no element */
  }
  if (displs) MPU_CHECK(check_disjoint(fn, what, n, counts, displs));
  *extent_bytes = end;
  *total = sum;
  return MPU_SUCCESS;
}

/* Room for the displacements of packed blocks (2 lists of size entries). */
static mpu_result_t packed_lists(const char *fn, int n, size_t **out) {
  *out = malloc((size_t)n * 2 * sizeof(size_t));
  if (!*out) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d displacements", fn, n);
  return MPU_SUCCESS;
}

mpu_result_t mpu_comm_all_gather_v(mpu_comm *comm, const void *send, void *recv,
                                   const size_t *counts, const size_t *displs, mpu_dtype dtype) {
  static const char fn[] = "mpu_comm_all_gather_v";
  size_t extent = 0, total = 0, *at = NULL;
  CHECK_ENTRY(fn, comm, dtype);
  MPU_CHECK(packed_lists(fn, comm->size, &at));
  mpu_result_t r = check_blocks(fn, "recv", comm->size, counts, displs, at, dtype, &extent, &total);
  size_t es = mpu_dtype_size(dtype), bytes = r ? 0 : counts[comm->rank] * es;
  if (!r) r = check_buf(fn, comm, "send", send, bytes, dtype);
  if (!r) r = check_buf(fn, comm, "recv", recv, extent, dtype);
  if (!r) r = check_overlap(fn, send, bytes, recv, extent,
                            recv ? (const char *)recv + at[comm->rank] * es : NULL);
  if (!r) {
    mpu__call call = mpu__call_describe(MPU_COLL_ALL_GATHER_V, total, dtype, MPU_SUM,
                                        -1, send, recv);
    call.sig.digest = digest(counts, comm->size);
    call.counts = counts, call.displs = at;
    r = mpu__submit(fn, comm, &call, NULL);
  }
  free(at);
  return r;
}

mpu_result_t mpu_comm_reduce_scatter_v(mpu_comm *comm, const void *send, void *recv,
                                       const size_t *counts, mpu_dtype dtype, mpu_op op) {
  static const char fn[] = "mpu_comm_reduce_scatter_v";
  size_t extent = 0, total = 0;
  CHECK_ENTRY(fn, comm, dtype);
  MPU_CHECK(check_op(fn, op));
  MPU_CHECK(check_blocks(fn, "send", comm->size, counts, NULL, NULL, dtype, &extent, &total));
  size_t bytes = counts[comm->rank] * mpu_dtype_size(dtype);
  MPU_CHECK(check_buf(fn, comm, "send", send, extent, dtype));
  MPU_CHECK(check_buf(fn, comm, "recv", recv, bytes, dtype));
  if (mpu__spans_overlap(send, extent, recv, bytes))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: send and recv buffers overlap", fn);
  mpu__call call = mpu__call_describe(MPU_COLL_REDUCE_SCATTER_V, total, dtype, op, -1, send, recv);
  call.sig.digest = digest(counts, comm->size);
  call.counts = counts;
  return mpu__submit(fn, comm, &call, NULL);
}

mpu_result_t mpu_comm_all_to_all_v(mpu_comm *comm, const void *send, const size_t *send_counts,
                                   const size_t *send_displs, void *recv,
                                   const size_t *recv_counts, const size_t *recv_displs,
                                   mpu_dtype dtype) {
  static const char fn[] = "mpu_comm_all_to_all_v";
  size_t sext = 0, rext = 0, stotal = 0, rtotal = 0, *at = NULL;
  CHECK_ENTRY(fn, comm, dtype);
  int n = comm->size;
  MPU_CHECK(packed_lists(fn, n, &at));
  mpu_result_t r = check_blocks(fn, "send", n, send_counts, send_displs, at, dtype, &sext, &stotal);
  if (!r) r = check_blocks(fn, "recv", n, recv_counts, recv_displs, at + n, dtype, &rext, &rtotal);
  if (!r) r = check_buf(fn, comm, "send", send, sext, dtype);
  if (!r) r = check_buf(fn, comm, "recv", recv, rext, dtype);
  if (!r && mpu__spans_overlap(send, sext, recv, rext))
    r = mpu__error(MPU_ERR_INVALID_ARGUMENT,
                   "%s: send and recv buffers overlap (all_to_all_v has no in-place form)", fn);
  if (!r && n == 1 && send_counts[0] != recv_counts[0])
    r = mpu__error(MPU_ERR_MISMATCH, "%s: rank 0 sends itself %zu elements but receives %zu", fn,
                   send_counts[0], recv_counts[0]);
  if (!r) {
    mpu__call call = mpu__call_describe(MPU_COLL_ALL_TO_ALL_V, 0, dtype, MPU_SUM, -1, send, recv);
    call.counts = send_counts, call.displs = at;
    call.rcounts = recv_counts, call.rdispls = at + n;
    r = mpu__submit(fn, comm, &call, NULL);
  }
  free(at);
  return r;
}

static mpu_result_t check_req(const char *fn, mpu_request **req) {
  if (!req) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: request is NULL", fn);
  *req = NULL;
  return MPU_SUCCESS;
}

mpu_result_t mpu_comm_all_reduce(mpu_comm *comm, const void *send, void *recv, size_t count,
                                 mpu_dtype dtype, mpu_op op) {
  mpu__call call = mpu__call_describe(MPU_COLL_ALL_REDUCE, count, dtype, op, -1, send, recv);
  return collective(comm, call, NULL);
}

mpu_result_t mpu_comm_iall_reduce(mpu_comm *comm, const void *send, void *recv, size_t count,
                                  mpu_dtype dtype, mpu_op op, mpu_request **req) {
  MPU_CHECK(check_req("mpu_comm_iall_reduce", req));
  mpu__call call = mpu__call_describe(MPU_COLL_ALL_REDUCE, count, dtype, op, -1, send, recv);
  return collective(comm, call, req);
}

mpu_result_t mpu_comm_all_gather(mpu_comm *comm, const void *send, void *recv, size_t count,
                                 mpu_dtype dtype) {
  mpu__call call = mpu__call_describe(MPU_COLL_ALL_GATHER, count, dtype, MPU_SUM, -1, send, recv);
  return collective(comm, call, NULL);
}

mpu_result_t mpu_comm_iall_gather(mpu_comm *comm, const void *send, void *recv, size_t count,
                                  mpu_dtype dtype, mpu_request **req) {
  MPU_CHECK(check_req("mpu_comm_iall_gather", req));
  mpu__call call = mpu__call_describe(MPU_COLL_ALL_GATHER, count, dtype, MPU_SUM, -1, send, recv);
  return collective(comm, call, req);
}

mpu_result_t mpu_comm_reduce_scatter(mpu_comm *comm, const void *send, void *recv, size_t count,
                                     mpu_dtype dtype, mpu_op op) {
  mpu__call call = mpu__call_describe(MPU_COLL_REDUCE_SCATTER, count, dtype, op, -1, send, recv);
  return collective(comm, call, NULL);
}

mpu_result_t mpu_comm_ireduce_scatter(mpu_comm *comm, const void *send, void *recv, size_t count,
                                      mpu_dtype dtype, mpu_op op, mpu_request **req) {
  MPU_CHECK(check_req("mpu_comm_ireduce_scatter", req));
  mpu__call call = mpu__call_describe(MPU_COLL_REDUCE_SCATTER, count, dtype, op, -1, send, recv);
  return collective(comm, call, req);
}

mpu_result_t mpu_comm_broadcast(mpu_comm *comm, void *buf, size_t count, mpu_dtype dtype,
                                int root) {
  mpu__call call = mpu__call_describe(MPU_COLL_BROADCAST, count, dtype, MPU_SUM, root, buf, buf);
  return collective(comm, call, NULL);
}

mpu_result_t mpu_comm_ibroadcast(mpu_comm *comm, void *buf, size_t count, mpu_dtype dtype,
                                 int root, mpu_request **req) {
  MPU_CHECK(check_req("mpu_comm_ibroadcast", req));
  mpu__call call = mpu__call_describe(MPU_COLL_BROADCAST, count, dtype, MPU_SUM, root, buf, buf);
  return collective(comm, call, req);
}

mpu_result_t mpu_comm_reduce(mpu_comm *comm, const void *send, void *recv, size_t count,
                             mpu_dtype dtype, mpu_op op, int root) {
  mpu__call call = mpu__call_describe(MPU_COLL_REDUCE, count, dtype, op, root, send, recv);
  return collective(comm, call, NULL);
}

mpu_result_t mpu_comm_ireduce(mpu_comm *comm, const void *send, void *recv, size_t count,
                              mpu_dtype dtype, mpu_op op, int root, mpu_request **req) {
  MPU_CHECK(check_req("mpu_comm_ireduce", req));
  mpu__call call = mpu__call_describe(MPU_COLL_REDUCE, count, dtype, op, root, send, recv);
  return collective(comm, call, req);
}

mpu_result_t mpu_comm_all_to_all(mpu_comm *comm, const void *send, void *recv, size_t count,
                                 mpu_dtype dtype) {
  mpu__call call = mpu__call_describe(MPU_COLL_ALL_TO_ALL, count, dtype, MPU_SUM, -1, send, recv);
  return collective(comm, call, NULL);
}

mpu_result_t mpu_comm_iall_to_all(mpu_comm *comm, const void *send, void *recv, size_t count,
                                  mpu_dtype dtype, mpu_request **req) {
  MPU_CHECK(check_req("mpu_comm_iall_to_all", req));
  mpu__call call = mpu__call_describe(MPU_COLL_ALL_TO_ALL, count, dtype, MPU_SUM, -1, send, recv);
  return collective(comm, call, req);
}

mpu_result_t mpu_comm_barrier(mpu_comm *comm) {
  mpu__call call = mpu__call_describe(MPU_COLL_BARRIER, 0, MPU_UINT8, MPU_SUM, -1, NULL, NULL);
  return collective(comm, call, NULL);
}

mpu_result_t mpu_comm_ibarrier(mpu_comm *comm, mpu_request **req) {
  MPU_CHECK(check_req("mpu_comm_ibarrier", req));
  mpu__call call = mpu__call_describe(MPU_COLL_BARRIER, 0, MPU_UINT8, MPU_SUM, -1, NULL, NULL);
  return collective(comm, call, req);
}

/* Point to point: checked as every call, then posted in an open group or
 * run now (after the communicator's queued requests). */
static mpu_result_t p2p(const char *fn, mpu_comm *comm, const mpu__call *call) {
  if (mpu__group_open()) return mpu__group_call(fn, comm, call);
  double t0 = mpu__clock_start();
  mpu_result_t r = mpu__flush(comm);
  if (!r) r = mpu__run_call(comm, call);
  return mpu__clock_add(t0, r);
}

mpu_result_t mpu_comm_send(mpu_comm *comm, const void *buf, size_t count, mpu_dtype dtype,
                           int peer) {
  static const char fn[] = "mpu_comm_send";
  mpu__call call = mpu__call_describe(MPU__CALL_SEND, count, dtype, MPU_SUM, peer, buf, NULL);
  MPU_CHECK(check_call(fn, comm, &call));
  return p2p(fn, comm, &call);
}

mpu_result_t mpu_comm_recv(mpu_comm *comm, void *buf, size_t count, mpu_dtype dtype, int peer) {
  static const char fn[] = "mpu_comm_recv";
  mpu__call call = mpu__call_describe(MPU__CALL_RECV, count, dtype, MPU_SUM, peer, NULL, buf);
  MPU_CHECK(check_call(fn, comm, &call));
  return p2p(fn, comm, &call);
}

/* A send and a recv described as every send and recv; inside a group they
 * are two posted calls, which a group runs as one step already. */
mpu_result_t mpu_comm_sendrecv(mpu_comm *comm, const void *sendbuf, size_t sendcount, int dst,
                               void *recvbuf, size_t recvcount, int src, mpu_dtype dtype) {
  static const char fn[] = "mpu_comm_sendrecv";
  mpu__call s = mpu__call_describe(MPU__CALL_SEND, sendcount, dtype, MPU_SUM, dst, sendbuf, NULL);
  mpu__call r = mpu__call_describe(MPU__CALL_RECV, recvcount, dtype, MPU_SUM, src, NULL, recvbuf);
  MPU_CHECK(check_call(fn, comm, &s));
  MPU_CHECK(check_call(fn, comm, &r));
  size_t es = mpu_dtype_size(dtype);
  if (mpu__spans_overlap(sendbuf, sendcount * es, recvbuf, recvcount * es))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: send and recv buffers overlap", fn);
  if (mpu__group_open()) {
    MPU_CHECK(mpu__group_call(fn, comm, &s));
    return mpu__group_call(fn, comm, &r);
  }
  double t0 = mpu__clock_start();
  mpu_result_t res = mpu__flush(comm);
  if (!res && comm->ops->sendrecv) res = comm->ops->sendrecv(comm, &s, &r);
  else if (!res && !(res = mpu__run_call(comm, &s))) res = mpu__run_call(comm, &r);
  return mpu__clock_add(t0, res);
}

mpu_result_t mpu__comm_native(mpu_comm *comm, mpu_collective kind, const void *send, void *recv,
                              size_t count, mpu_dtype dt, mpu_op op, int root) {
  MPU_CHECK(mpu__comm_check("native call", comm));
  if (!comm->ops->native || (unsigned)kind >= MPU_COLL_COUNT)
    return mpu__error(MPU_ERR_UNSUPPORTED, "the %s backend has no native library call for %s",
                      comm->ops->name, mpu_collective_name(kind));
  mpu__call call = mpu__call_describe(kind, count, dt, op, root, send, recv);
  return comm->ops->native(comm, &call);
}

mpu_result_t mpu__comm_call(mpu_comm *comm, mpu_collective kind, const void *send, void *recv,
                            size_t count, mpu_dtype dt, mpu_op op, int root) {
  if ((unsigned)kind >= MPU_COLL_COUNT)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "collective %d is not one of one count per rank",
                      (int)kind);
  mpu__call call = mpu__call_describe(kind, count, dt, op, root, send, recv);
  return collective(comm, call, NULL);
}

