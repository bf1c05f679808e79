/*
 * calls.c - the MPI backend's blocking collectives: which MPI calls move each
 * call's bytes, after the signature exchange (check.c) and under the
 * timeout where there is one (timeout.c).
 *
 * Results must be the bits every backend gives, so reductions never use
 * MPI's own operators (whose tree order, NaN and overflow rules are MPI's):
 *   all_reduce      small: all_gather every input, reduce locally in rank order;
 *                   large: all_to_all so rank k holds chunk k of every input,
 *                   reduce it in rank order, all_gather the chunks (the
 *                   bandwidth of a ring all-reduce; the threads backend's split)
 *   reduce_scatter  all_to_all of the blocks, then the local reduction
 *   reduce          two ranks: MPI_Reduce with mpu's kernel as a non-commutative
 *                   operator (one combine, in rank order); more: small calls
 *                   gather the inputs at the root, large ones are all_reduce's
 *                   chunks with a gather to the root
 * With checking off, collectives are the plain blocking MPI calls; checked
 * with a timeout, each move is the non-blocking MPI call, polled.
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/base/reduce.h"
#include "comm/mpi/backend.h"
#include "core/error.h"

/* Calls whose inputs together fit here gather everything and reduce locally:
 * one collective, latency-bound anyway. */
#define SMALL_BYTES ((size_t)32 << 10)
/* Large all_reduce calls go a segment at a time, so the chunks received are
 * still in cache when reduced and sent on: measured on 2 and 4 processes,
 * 1 MiB beat 256 KiB, 2 MiB, 4 MiB and unsegmented (which lost 40% to
 * MPI_Allreduce at 16 MiB). */
#define SEGMENT_BYTES ((size_t)1 << 20)

/* The communicator's staging buffer, at least bytes long. */
static mpu_result_t scratch(mpu_comm *c, size_t bytes, const char *fn, char **out) {
  mpi_impl *m = impl_of(c);
  if (bytes > m->scratch_cap) {
    char *grown = realloc(m->scratch, bytes);
    if (!grown) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes of scratch", fn, bytes);
    m->scratch = grown;
    m->scratch_cap = bytes;
  }
  *out = m->scratch;
  return MPU_SUCCESS;
}

/* ---- the moves: blocking calls, or non-blocking ones under the timeout ---- */

static mpu_result_t x_allgather(mpu_comm *c, const char *fn, const void *s, void *r, int n,
                                MPI_Datatype t) {
  MPI_Request q;
  if (!impl_of(c)->timed) return mpu__mpi_check(MPI_Allgather(s, n, t, r, n, t, comm_of(c)), fn);
  MPU_CHECK(mpu__mpi_check(MPI_Iallgather(s, n, t, r, n, t, comm_of(c), &q), fn));
  return mpu__mpi_wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t x_allgatherv(mpu_comm *c, const char *fn, void *r, const int *counts,
                                 const int *displs, MPI_Datatype t) {
  MPI_Request q;
  if (!impl_of(c)->timed)
    return mpu__mpi_check(MPI_Allgatherv(MPI_IN_PLACE, 0, t, r, counts, displs, t, comm_of(c)), fn);
  MPU_CHECK(mpu__mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, t, r, counts, displs, t, comm_of(c), &q), fn));
  return mpu__mpi_wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t x_alltoall(mpu_comm *c, const char *fn, const void *s, void *r, int n,
                               MPI_Datatype t) {
  MPI_Request q;
  if (!impl_of(c)->timed) return mpu__mpi_check(MPI_Alltoall(s, n, t, r, n, t, comm_of(c)), fn);
  MPU_CHECK(mpu__mpi_check(MPI_Ialltoall(s, n, t, r, n, t, comm_of(c), &q), fn));
  return mpu__mpi_wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t x_alltoallv(mpu_comm *c, const char *fn, const void *s, const int *sc,
                                const int *sd, void *r, const int *rc, const int *rd,
                                MPI_Datatype t) {
  MPI_Request q;
  if (!impl_of(c)->timed)
    return mpu__mpi_check(MPI_Alltoallv(s, sc, sd, t, r, rc, rd, t, comm_of(c)), fn);
  MPU_CHECK(mpu__mpi_check(MPI_Ialltoallv(s, sc, sd, t, r, rc, rd, t, comm_of(c), &q), fn));
  return mpu__mpi_wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t x_bcast(mpu_comm *c, const char *fn, void *b, int n, MPI_Datatype t,
                            int root) {
  MPI_Request q;
  if (!impl_of(c)->timed) return mpu__mpi_check(MPI_Bcast(b, n, t, root, comm_of(c)), fn);
  MPU_CHECK(mpu__mpi_check(MPI_Ibcast(b, n, t, root, comm_of(c), &q), fn));
  return mpu__mpi_wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t x_gather(mpu_comm *c, const char *fn, const void *s, void *r, int n,
                             MPI_Datatype t, int root) {
  MPI_Request q;
  if (!impl_of(c)->timed) return mpu__mpi_check(MPI_Gather(s, n, t, r, n, t, root, comm_of(c)), fn);
  MPU_CHECK(mpu__mpi_check(MPI_Igather(s, n, t, r, n, t, root, comm_of(c), &q), fn));
  return mpu__mpi_wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t x_gatherv(mpu_comm *c, const char *fn, const void *s, int n, void *r,
                              const int *counts, const int *displs, MPI_Datatype t, int root) {
  MPI_Request q;
  if (!impl_of(c)->timed)
    return mpu__mpi_check(MPI_Gatherv(s, n, t, r, counts, displs, t, root, comm_of(c)), fn);
  MPU_CHECK(mpu__mpi_check(MPI_Igatherv(s, n, t, r, counts, displs, t, root, comm_of(c), &q), fn));
  return mpu__mpi_wait_for(c, &q, fn, DATA_PHASE);
}


/* ---- reductions ------------------------------------------------------------ */

/* The chunk plan of a large reduction over count elements: rank k owns chunk
 * k; v = [send counts | send displs | recv counts | recv displs], where each
 * rank sends chunk k of its input to rank k and receives its own chunk from
 * every rank, stacked in rank order. Returns this rank's chunk length. */
static int plan_chunks(mpu_comm *c, size_t count) {
  int n = c->size, *v = impl_of(c)->v;
  size_t lo = mpu__chunk_lo(count, n, c->rank), mine = mpu__chunk_lo(count, n, c->rank + 1) - lo;
  for (int k = 0; k < n; k++) {
    size_t a = mpu__chunk_lo(count, n, k), b = mpu__chunk_lo(count, n, k + 1);
    v[k] = (int)(b - a);
    v[n + k] = (int)a;
    v[2 * n + k] = (int)mine;
    v[3 * n + k] = (int)((size_t)k * mine);
  }
  return (int)mine;
}

/* Sources for the local reduction: the size blocks of `bytes` stacked at base. */
static const void *const *blocks(mpu_comm *c, const char *base, size_t bytes) {
  const void **ptrs = impl_of(c)->ptrs;
  for (int k = 0; k < c->size; k++) ptrs[k] = base + (size_t)k * bytes;
  return ptrs;
}

/* Every member's chunk of the inputs, in rank order, lands in the scratch
 * (which has room for `spare` more chunks after them); *mine is this rank's
 * chunk length. */
static mpu_result_t exchange_chunks(mpu_comm *c, const char *fn, const void *send, size_t count,
                                    mpu_dtype dt, int spare, int *mine, char **stacked) {
  int n = c->size, *v = impl_of(c)->v;
  *mine = plan_chunks(c, count);
  size_t chunk = (size_t)*mine * mpu_dtype_size(dt);
  MPU_CHECK(scratch(c, (size_t)(n + spare) * chunk + 1, fn, stacked));
  return x_alltoallv(c, fn, send, v, v + n, *stacked, v + 2 * n, v + 3 * n, bits_of(dt));
}

static mpu_result_t mpi_all_reduce(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_all_reduce";
  int n = c->size;
  size_t es = mpu_dtype_size(dt), bytes = count * es;
  int done;
  MPU_CHECK(mpu__mpi_enter(c, k, fn, &done));
  if (done) return mpu__mpi_finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(mpu__mpi_fits(fn, count, n));
  char *stacked = NULL;
  if (bytes * (size_t)n <= SMALL_BYTES) {
    MPU_CHECK(scratch(c, bytes * (size_t)n + 1, fn, &stacked));
    MPU_CHECK(x_allgather(c, fn, send, stacked, (int)count, bits_of(dt)));
    mpu__reduce(recv, blocks(c, stacked, bytes), n, count, dt, op, n);
    return MPU_SUCCESS;
  }
  /* segment by segment, so each segment's chunks are still in cache when
   * they are reduced and sent on */
  size_t seg = SEGMENT_BYTES / es < (size_t)n ? (size_t)n : SEGMENT_BYTES / es;
  for (size_t off = 0; off < count; off += seg) {
    size_t m = count - off < seg ? count - off : seg;
    int mine, *v = impl_of(c)->v;
    char *out = (char *)recv + off * es;
    MPU_CHECK(exchange_chunks(c, fn, (const char *)send + off * es, m, dt, 0, &mine, &stacked));
    mpu__reduce(out + (size_t)v[n + c->rank] * es, blocks(c, stacked, (size_t)mine * es), n,
                (size_t)mine, dt, op, n);
    MPU_CHECK(x_allgatherv(c, fn, out, v, v + n, bits_of(dt)));
  }
  return MPU_SUCCESS;
}

static mpu_result_t mpi_reduce_scatter(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_reduce_scatter";
  int n = c->size;
  size_t bytes = count * mpu_dtype_size(dt);
  int done;
  MPU_CHECK(mpu__mpi_enter(c, k, fn, &done));
  if (done) return mpu__mpi_finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(mpu__mpi_fits(fn, count, n));
  char *stacked = NULL;
  MPU_CHECK(scratch(c, bytes * (size_t)n + 1, fn, &stacked));
  MPU_CHECK(x_alltoall(c, fn, send, stacked, (int)count, bits_of(dt)));
  mpu__reduce(recv, blocks(c, stacked, bytes), n, count, dt, op, n);
  return MPU_SUCCESS;
}

/* ---- two ranks: MPI's own reduce with mpu's kernel as the operator ---------
 *
 * With two ranks there is one combine, x0 op x1, and MPI applies a
 * non-commutative operator in rank order (inoutvec = invec op inoutvec, invec
 * from the lower rank): so MPI_Reduce with mpu's kernel as a user operator
 * gives mpu's bits in one MPI call, the traffic of MPI's own reduce. Each
 * dtype moves as its own committed type, so the operator knows what it got. */

static MPI_Datatype pair_types[MPU_DTYPE_COUNT];
static MPI_Op pair_ops[MPU_OP_COUNT];
static int pair_ready;

static void pair_combine(void *in, void *inout, int *len, MPI_Datatype *type, mpu_op op) {
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++)
    if (*type == pair_types[dt]) {
      const void *srcs[2] = {in, inout};
      mpu__reduce(inout, srcs, 2, (size_t)*len, (mpu_dtype)dt, op, 2);
      return;
    }
}

#define PAIR_OP(name, op) \
  static void name(void *in, void *inout, int *len, MPI_Datatype *type) { \
    pair_combine(in, inout, len, type, op); \
  }
PAIR_OP(pair_sum, MPU_SUM)
PAIR_OP(pair_prod, MPU_PROD)
PAIR_OP(pair_min, MPU_MIN)
PAIR_OP(pair_max, MPU_MAX)
PAIR_OP(pair_avg, MPU_AVG)
#undef PAIR_OP

mpu_result_t mpu__mpi_pair_setup(const char *fn) {
  if (pair_ready) return MPU_SUCCESS;
  MPI_User_function *f[MPU_OP_COUNT] = {pair_sum, pair_prod, pair_min, pair_max, pair_avg};
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++) {
    MPU_CHECK(mpu__mpi_check(MPI_Type_contiguous(1, bits_of((mpu_dtype)dt), &pair_types[dt]), fn));
    MPU_CHECK(mpu__mpi_check(MPI_Type_commit(&pair_types[dt]), fn));
  }
  for (int op = 0; op < MPU_OP_COUNT; op++)
    MPU_CHECK(mpu__mpi_check(MPI_Op_create(f[op], 0 /* not commutative: rank order */, &pair_ops[op]), fn));
  pair_ready = 1;
  return MPU_SUCCESS;
}

MPI_Datatype mpu__mpi_pair_type(mpu_dtype dt) { return pair_types[dt]; }

MPI_Op mpu__mpi_pair_op(mpu_op op) { return pair_ops[op]; }

void mpu__mpi_pair_free(void) {
  if (!pair_ready) return;
  for (int dt = 0; dt < MPU_DTYPE_COUNT; dt++) MPI_Type_free(&pair_types[dt]);
  for (int op = 0; op < MPU_OP_COUNT; op++) MPI_Op_free(&pair_ops[op]);
  pair_ready = 0;
}

static mpu_result_t reduce_pair(mpu_comm *c, const char *fn, const void *send, void *recv,
                                size_t count, mpu_dtype dt, mpu_op op, int root) {
  MPU_CHECK(mpu__mpi_pair_setup(fn));
  int me = c->rank == root;
  const void *s = me && send == recv ? MPI_IN_PLACE : send;
  MPI_Datatype t = pair_types[dt];
  MPI_Request q;
  if (!impl_of(c)->timed)
    return mpu__mpi_check(MPI_Reduce(s, me ? recv : NULL, (int)count, t, pair_ops[op], root, comm_of(c)), fn);
  MPU_CHECK(mpu__mpi_check(MPI_Ireduce(s, me ? recv : NULL, (int)count, t, pair_ops[op], root, comm_of(c), &q),
                  fn));
  return mpu__mpi_wait_for(c, &q, fn, DATA_PHASE);
}

static mpu_result_t mpi_reduce(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_reduce";
  int n = c->size, me = c->rank == root;
  size_t es = mpu_dtype_size(dt), bytes = count * es;
  int done;
  MPU_CHECK(mpu__mpi_enter(c, k, fn, &done));
  if (done) return mpu__mpi_finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(mpu__mpi_fits(fn, count, n));
  if (n == 2) return reduce_pair(c, fn, send, recv, count, dt, op, root);
  char *stacked = NULL;
  if (bytes * (size_t)n <= SMALL_BYTES) {
    MPU_CHECK(scratch(c, bytes * (size_t)n + 1, fn, &stacked));
    MPU_CHECK(x_gather(c, fn, send, stacked, (int)count, bits_of(dt), root));
    if (me) mpu__reduce(recv, blocks(c, stacked, bytes), n, count, dt, op, n);
    return MPU_SUCCESS;
  }
  /* as all_reduce, segment by segment, with a gather to the root at the end */
  size_t seg = SEGMENT_BYTES / es < (size_t)n ? (size_t)n : SEGMENT_BYTES / es;
  for (size_t off = 0; off < count; off += seg) {
    size_t m = count - off < seg ? count - off : seg;
    int mine, *v = impl_of(c)->v;
    MPU_CHECK(exchange_chunks(c, fn, (const char *)send + off * es, m, dt, 1, &mine, &stacked));
    size_t chunk = (size_t)mine * es;
    /* the root reduces its chunk in place in recv; the others after the stack */
    char *out = me ? (char *)recv + off * es : NULL;
    char *dst = me ? out + (size_t)v[n + c->rank] * es : stacked + (size_t)n * chunk;
    mpu__reduce(dst, blocks(c, stacked, chunk), n, (size_t)mine, dt, op, n);
    MPU_CHECK(x_gatherv(c, fn, me ? MPI_IN_PLACE : dst, mine, out, v, v + n, bits_of(dt), root));
  }
  return MPU_SUCCESS;
}

/* ---- the uneven calls ----------------------------------------------------------- */

static mpu_result_t mpi_uneven(mpu_comm *c, const mpu__call *k) {
  const char *fn = mpu__coll_fn(k->sig.kind);
  int n = c->size, me = c->rank, *v = impl_of(c)->v;
  mpu_dtype dt = (mpu_dtype)k->sig.dtype;
  size_t es = mpu_dtype_size(dt);
  int done;
  MPU_CHECK(mpu__mpi_enter(c, k, fn, &done));
  if (done) return mpu__mpi_finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(mpu__mpi_ints(c, fn, k->counts, v));
  if (k->sig.kind == MPU_COLL_ALL_GATHER_V) {
    MPU_CHECK(mpu__mpi_ints(c, fn, k->displs, v + n));
    char *mine = (char *)k->recv + k->displs[me] * es;
    if (mine != k->send && k->counts[me]) memcpy(mine, k->send, k->counts[me] * es);
    return x_allgatherv(c, fn, k->recv, v, v + n, bits_of(dt));
  }
  if (k->sig.kind == MPU_COLL_ALL_TO_ALL_V) {
    MPU_CHECK(mpu__mpi_ints(c, fn, k->displs, v + n));
    MPU_CHECK(mpu__mpi_ints(c, fn, k->rcounts, v + 2 * n));
    MPU_CHECK(mpu__mpi_ints(c, fn, k->rdispls, v + 3 * n));
    return x_alltoallv(c, fn, k->send, v, v + n, k->recv, v + 2 * n, v + 3 * n, bits_of(dt));
  }
  /* reduce_scatter_v: block k of every input to rank k, stacked in rank
   * order, then reduced here in that order (mpu's bits, as reduce_scatter) */
  size_t mine = k->counts[me], off = 0;
  for (int p = 0; p < n; p++) {
    if (off > (size_t)INT_MAX) return mpu__error(MPU_ERR_UNSUPPORTED, "%s: offset %zu", fn, off);
    v[n + p] = (int)off;
    off += k->counts[p];
    v[2 * n + p] = (int)mine;
    v[3 * n + p] = (int)((size_t)p * mine);
  }
  MPU_CHECK(mpu__mpi_fits(fn, mine, n));
  char *stacked = NULL;
  MPU_CHECK(scratch(c, mine * es * (size_t)n + 1, fn, &stacked));
  MPU_CHECK(x_alltoallv(c, fn, k->send, v, v + n, stacked, v + 2 * n, v + 3 * n, bits_of(dt)));
  mpu__reduce(k->recv, blocks(c, stacked, mine * es), n, mine, dt, (mpu_op)k->sig.op, n);
  return MPU_SUCCESS;
}

/* ---- the start: one switch from the kind to the calls that move it ---------- */

static mpu_result_t mpi_all_gather(mpu_comm *c, const mpu__call *k);
static mpu_result_t mpi_broadcast(mpu_comm *c, const mpu__call *k);
static mpu_result_t mpi_all_to_all(mpu_comm *c, const mpu__call *k);
static mpu_result_t mpi_barrier(mpu_comm *c, const mpu__call *k);

mpu_result_t mpu__mpi_start(mpu_comm *c, const mpu__call *k, void **handle) {
  *handle = NULL;
  switch (k->sig.kind) {
  case MPU_COLL_ALL_REDUCE: return mpi_all_reduce(c, k);
  case MPU_COLL_ALL_GATHER: return mpi_all_gather(c, k);
  case MPU_COLL_REDUCE_SCATTER: return mpi_reduce_scatter(c, k);
  case MPU_COLL_BROADCAST: return mpi_broadcast(c, k);
  case MPU_COLL_REDUCE: return mpi_reduce(c, k);
  case MPU_COLL_ALL_TO_ALL: return mpi_all_to_all(c, k);
  case MPU_COLL_BARRIER: return mpi_barrier(c, k);
  default: return mpi_uneven(c, k);
  }
}

static mpu_result_t mpi_all_gather(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_all_gather";
  int done;
  MPU_CHECK(mpu__mpi_enter(c, k, fn, &done));
  if (done) return mpu__mpi_finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(mpu__mpi_fits(fn, count, c->size));
  const char *in_place = (const char *)recv + (size_t)c->rank * count * mpu_dtype_size(dt);
  return x_allgather(c, fn, send == in_place ? MPI_IN_PLACE : send, recv, (int)count,
                     bits_of(dt));
}

static mpu_result_t mpi_broadcast(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_broadcast";
  int done;
  MPU_CHECK(mpu__mpi_enter(c, k, fn, &done));
  if (done) return mpu__mpi_finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(mpu__mpi_fits(fn, count, 1));
  return x_bcast(c, fn, recv, (int)count, bits_of(dt), root);
}

static mpu_result_t mpi_all_to_all(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_all_to_all";
  int done;
  MPU_CHECK(mpu__mpi_enter(c, k, fn, &done));
  if (done) return mpu__mpi_finish_carried(c, k, impl_of(c)->blk);
  MPU_CHECK(mpu__mpi_fits(fn, count, c->size));
  return x_alltoall(c, fn, send, recv, (int)count, bits_of(dt));
}

static mpu_result_t mpi_barrier(mpu_comm *c, const mpu__call *k) {
  MPU__CALL_ARGS(k);
  static const char fn[] = "mpu_comm_barrier";
  int done;
  MPU_CHECK(mpu__mpi_enter(c, k, fn, &done));
  if (done) return mpu__mpi_finish_carried(c, k, impl_of(c)->blk);
  return mpu__mpi_check(MPI_Barrier(comm_of(c)), fn);
}
