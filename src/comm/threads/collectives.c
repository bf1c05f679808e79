/*
 * collectives.c - the threads backend's collectives over shared memory.
 *
 * Small calls (what a rank contributes fits in MPU_THREADS_SCRATCH) copy
 * their input into the group's staging buffer before the barrier and need
 * that one barrier: afterwards each rank computes its output from the staged
 * inputs. Large calls publish their buffer pointers instead and work on the
 * peers' buffers directly (zero-copy), then meet at an exit barrier so no rank
 * returns, and reuses its buffers, while a peer still reads them.
 *
 * Large calls split the work so that every input byte is read once and every
 * output byte written once, the least memory traffic there is: in an
 * all_reduce rank k reduces chunk k of the vector from every input and writes
 * the result into every rank's output; in an all_gather past the cache each
 * rank writes its input into every output (in cache each rank fills its own
 * output, keeping its lines in one core); a broadcast's chunks are pushed by
 * different ranks. Every chunk is reduced by one rank in rank order, so all ranks get
 * the same bits. Calls whose buffers (everything read and written) do not
 * fit in the last-level cache write with streaming stores (copy.h): their
 * outputs would be evicted before anyone read them.
 *
 * That work comes in n tasks, task k by default done by rank k. When ranks
 * outnumber the cores, only as many ranks as there are cores work, rank w
 * taking tasks w, w + W, ...; the others go straight to the exit barrier and
 * sleep, so the workers run without being time-sliced against them.
 */
#include <stdio.h>
#include <string.h>

#include "comm/base/copy.h"
#include "comm/base/reduce.h"
#include "comm/threads/threads.h"
#include "core/error.h"

/* Every member runs this on the same descriptions, so all reach one verdict. */
static mpu_result_t compare_calls(const tcomm *tc, int parity, const char *fn) {
  const tgroup *g = tc->g;
  return mpu__sig_compare(fn, &g->calls[parity][0].sig, sizeof(mpu__call), g->n, g->members,
                          g->world->check_calls ? MPU__CHECK_ALL : MPU__CHECK_SAFETY);
}

static char *scratch_of(const tgroup *g, int parity, int member) {
  return g->scratch[parity] + (size_t)member * MPU_THREADS_SCRATCH;
}

/* Describe the call, stage `stage_bytes` of `stage`, meet every member and
 * check that they all made this call. Sets *parity for the data phase. */
static mpu_result_t enter(tcomm *tc, const mpu__call *call, const void *stage, size_t stage_bytes,
                          const char *fn, int *parity) {
  tgroup *g = tc->g;
  uint64_t seq = ++tc->seq;
  int p = (int)(seq & 1);
  g->calls[p][tc->me] = *call;
  if (stage_bytes) memcpy(scratch_of(g, p, tc->me), stage, stage_bytes);
  atomic_store(&g->entered[tc->me], seq);
  MPU_CHECK(mpu__tbarrier(tc, 1, fn));
  MPU_CHECK(compare_calls(tc, p, fn));
  *parity = p;
  return MPU_SUCCESS;
}

/* Wait until every member is done with this call's buffers. */
static mpu_result_t leave(tcomm *tc, const char *fn) { return mpu__tbarrier(tc, 0, fn); }

/* Whether a call touching a * b + c * d bytes in all streams (saturating: a
 * product past the address space only has to be big). */
static int streams(size_t a, size_t b, size_t c, size_t d) {
  size_t x, y, z;
  if (__builtin_mul_overflow(a, b, &x) || __builtin_mul_overflow(c, d, &y) ||
      __builtin_add_overflow(x, y, &z))
    return 1;
  return mpu__streams(z);
}


/* Loop over this rank's tasks of a large call (see the top of the file). */
#define FOR_EACH_TASK(k, tc)                                                      \
  for (int k = (tc)->me, step_ = (tc)->g->world->cpus < (tc)->g->n                \
                                     ? (tc)->g->world->cpus                      \
                                     : (tc)->g->n;                               \
       (tc)->me < step_ && k < (tc)->g->n; k += step_)


static mpu_result_t all_reduce(tcomm *tc, const mpu__call *call) {
  MPU__CALL_ARGS(call);
  static const char fn[] = "mpu_comm_all_reduce";
  tgroup *g = tc->g;
  int n = g->n, p;
  size_t es = mpu_dtype_size(dt), bytes = count * es;
  int small = bytes <= MPU_THREADS_SCRATCH;
  MPU_CHECK(enter(tc, call, send, small ? bytes : 0, fn, &p));
  if (small) {
    for (int k = 0; k < n; k++) tc->ptrs[k] = scratch_of(g, p, k);
    mpu__reduce(recv, tc->ptrs, n, count, dt, op, n);
    return MPU_SUCCESS;
  }
  /* task t: reduce chunk t of every input into chunk t of every output */
  const mpu__call *calls = g->calls[p];
  int stream = streams(bytes, (size_t)n, bytes, (size_t)n); /* n inputs, n outputs */
  FOR_EACH_TASK(t, tc) {
    size_t lo = mpu__chunk_lo(count, n, t), hi = mpu__chunk_lo(count, n, t + 1);
    for (int k = 0; k < n; k++) {
      tc->ptrs[k] = (const char *)calls[k].send + lo * es;
      tc->dsts[k] = (char *)calls[k].recv + lo * es;
    }
    mpu__reduce_to(tc->dsts, n, tc->ptrs, n, hi - lo, dt, op, n, stream);
  }
  return leave(tc, fn);
}

static mpu_result_t all_gather(tcomm *tc, const mpu__call *call) {
  MPU__CALL_ARGS(call);
  static const char fn[] = "mpu_comm_all_gather";
  tgroup *g = tc->g;
  int n = g->n, me = tc->me, p;
  size_t bytes = count * mpu_dtype_size(dt);
  char *out = recv;
  int small = bytes <= MPU_THREADS_SCRATCH;
  MPU_CHECK(enter(tc, call, send, small ? bytes : 0, fn, &p));
  if (!bytes) return MPU_SUCCESS;
  if (small) { /* each rank pulls the staged inputs */
    for (int k = 0; k < n; k++)
      if (!(k == me && send == out + (size_t)me * bytes)) /* in place: already there */
        memcpy(out + (size_t)k * bytes, scratch_of(g, p, k), bytes);
    return MPU_SUCCESS;
  }
  /* task t: copy rank t's input into block t of every output */
  const mpu__call *calls = g->calls[p];
  int stream = streams(bytes, (size_t)n, bytes * (size_t)n, (size_t)n); /* n inputs, n outputs */
  if (!stream) { /* in cache: task t pulls every input into rank t's output, so each output
                    is written by one core and its lines do not bounce between caches */
    FOR_EACH_TASK(t, tc) {
      for (int k = 0; k < n; k++) {
        char *dst = (char *)calls[t].recv + (size_t)k * bytes;
        if (dst != calls[k].send) mpu__copy(dst, calls[k].send, bytes, 0);
      }
    }
    return leave(tc, fn);
  }
  /* past the cache: task t pushes rank t's input into every output, a slice
   * at a time, so that each input is read from memory once */
  FOR_EACH_TASK(t, tc) {
    for (int k = 0; k < n; k++) {
      char *dst = (char *)calls[k].recv + (size_t)t * bytes;
      tc->dsts[k] = dst == calls[t].send ? NULL : dst; /* in place: already there */
    }
    mpu__copy_to(tc->dsts, n, calls[t].send, bytes, stream);
  }
  return leave(tc, fn);
}

static mpu_result_t reduce_scatter(tcomm *tc, const mpu__call *call) {
  MPU__CALL_ARGS(call);
  static const char fn[] = "mpu_comm_reduce_scatter";
  tgroup *g = tc->g;
  int n = g->n, me = tc->me, p;
  size_t bytes = count * mpu_dtype_size(dt), total = bytes * (size_t)n;
  int small = total <= MPU_THREADS_SCRATCH;
  MPU_CHECK(enter(tc, call, send, small ? total : 0, fn, &p));
  if (small) {
    for (int k = 0; k < n; k++) tc->ptrs[k] = scratch_of(g, p, k) + (size_t)me * bytes;
    mpu__reduce(recv, tc->ptrs, n, count, dt, op, n);
    return MPU_SUCCESS;
  }
  /* task t: reduce block t of every input into rank t's output */
  const mpu__call *calls = g->calls[p];
  FOR_EACH_TASK(t, tc) {
    for (int k = 0; k < n; k++) tc->ptrs[k] = (const char *)calls[k].send + (size_t)t * bytes;
    mpu__reduce_to(&calls[t].recv, 1, tc->ptrs, n, count, dt, op, n,
                   streams(total, (size_t)n, bytes, (size_t)n));
  }
  return leave(tc, fn);
}

static mpu_result_t broadcast(tcomm *tc, const mpu__call *call) {
  MPU__CALL_ARGS(call);
  static const char fn[] = "mpu_comm_broadcast";
  tgroup *g = tc->g;
  int p;
  size_t bytes = count * mpu_dtype_size(dt);
  int small = bytes <= MPU_THREADS_SCRATCH;
  MPU_CHECK(enter(tc, call, send, small && tc->me == root ? bytes : 0, fn, &p));
  if (small) {
    if (tc->me != root && bytes) memcpy(recv, scratch_of(g, p, root), bytes);
    return MPU_SUCCESS;
  }
  /* chunk k of the root's buffer is pushed by rank k to every other rank.
   * Without call checking the roots named may differ: each rank then pushes
   * from the root it named, which is wrong data but stays within buffers of
   * the checked count. */
  const mpu__call *calls = g->calls[p];
  size_t es = mpu_dtype_size(dt);
  FOR_EACH_TASK(t, tc) { /* task t: chunk t of the root's buffer to every other rank */
    size_t lo = mpu__chunk_lo(count, g->n, t), hi = mpu__chunk_lo(count, g->n, t + 1);
    for (int k = 0; k < g->n; k++)
      tc->dsts[k] = k == root ? NULL : (char *)calls[k].recv + lo * es;
    mpu__copy_to(tc->dsts, g->n, (const char *)calls[root].send + lo * es, (hi - lo) * es,
                 streams(bytes, (size_t)g->n, 0, 0));
  }
  return leave(tc, fn);
}

static mpu_result_t reduce(tcomm *tc, const mpu__call *call) {
  MPU__CALL_ARGS(call);
  static const char fn[] = "mpu_comm_reduce";
  tgroup *g = tc->g;
  int n = g->n, me = tc->me, p;
  size_t es = mpu_dtype_size(dt), bytes = count * es;
  int small = bytes <= MPU_THREADS_SCRATCH;
  MPU_CHECK(enter(tc, call, send, small ? bytes : 0, fn, &p));
  const mpu__call *calls = g->calls[p];
  if (small) {
    if (me != root) return MPU_SUCCESS;
    for (int k = 0; k < n; k++) tc->ptrs[k] = scratch_of(g, p, k);
    mpu__reduce(recv, tc->ptrs, n, count, dt, op, n);
    return MPU_SUCCESS;
  }
  /* large: task t reduces chunk t straight into the root's output */
  if (calls[root].sig.kind == MPU_COLL_REDUCE && calls[root].sig.root == root) FOR_EACH_TASK(t, tc) {
      size_t lo = mpu__chunk_lo(count, n, t), hi = mpu__chunk_lo(count, n, t + 1);
      for (int k = 0; k < n; k++) tc->ptrs[k] = (const char *)calls[k].send + lo * es;
      void *dst = (char *)calls[root].recv + lo * es;
      mpu__reduce_to(&dst, 1, tc->ptrs, n, hi - lo, dt, op, n,
                     streams(bytes, (size_t)n + 1, 0, 0));
    }
  return leave(tc, fn);
}

static mpu_result_t all_to_all(tcomm *tc, const mpu__call *call) {
  MPU__CALL_ARGS(call);
  static const char fn[] = "mpu_comm_all_to_all";
  tgroup *g = tc->g;
  int n = g->n, me = tc->me, p;
  size_t bytes = count * mpu_dtype_size(dt), total = bytes * (size_t)n;
  int small = total <= MPU_THREADS_SCRATCH;
  MPU_CHECK(enter(tc, call, send, small ? total : 0, fn, &p));
  if (small) {
    for (int k = 0; k < n && bytes; k++)
      memcpy((char *)recv + (size_t)k * bytes, scratch_of(g, p, k) + (size_t)me * bytes, bytes);
    return MPU_SUCCESS;
  }
  const mpu__call *calls = g->calls[p];
  int stream = streams(total, (size_t)n, total, (size_t)n); /* n inputs, n outputs */
  FOR_EACH_TASK(t, tc) /* task t: fill rank t's output, block k from rank k's input */
  for (int k = 0; k < n; k++)
    mpu__copy((char *)calls[t].recv + (size_t)k * bytes,
              (const char *)calls[k].send + (size_t)t * bytes, bytes, stream);
  if (stream) mpu__copy_fence();
  return leave(tc, fn);
}

mpu_result_t mpu__tstart(mpu_comm *c, const mpu__call *call, void **handle) {
  tcomm *tc = c->impl;
  int p;
  *handle = NULL; /* the threads backend runs every call to its end */
  switch (call->sig.kind) {
  case MPU_COLL_ALL_REDUCE: return all_reduce(tc, call);
  case MPU_COLL_ALL_GATHER: return all_gather(tc, call);
  case MPU_COLL_REDUCE_SCATTER: return reduce_scatter(tc, call);
  case MPU_COLL_BROADCAST: return broadcast(tc, call);
  case MPU_COLL_REDUCE: return reduce(tc, call);
  case MPU_COLL_ALL_TO_ALL: return all_to_all(tc, call);
  case MPU_COLL_BARRIER: return enter(tc, call, NULL, 0, "mpu_comm_barrier", &p);
  default: return mpu__tuneven(tc, call);
  }
}

/* ---- uneven collectives ------------------------------------------------------------
 * Zero-copy: every member publishes its call, then pulls its own output from
 * the peers' inputs. The count lists are compared in full, not only through
 * the signature's digest, because a mismatch would read past a peer's buffer:
 * every member checks every pair, so all reach the same verdict. */

static mpu_result_t uneven_counts_agree(const tcomm *tc, const mpu__call *calls, const char *fn) {
  const tgroup *g = tc->g;
  int n = g->n;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      const mpu__call *a = &calls[i];
      size_t sent = a->counts[j];
      size_t got = a->sig.kind == MPU_COLL_ALL_TO_ALL_V ? calls[j].rcounts[i] : calls[0].counts[j];
      if (sent != got)
        return mpu__error(MPU_ERR_MISMATCH,
                          "%s: mismatched counts on a communicator of %d ranks: rank %d (world "
                          "%d) says %zu elements for rank %d, rank %d (world %d) says %zu",
                          fn, n, i, g->members[i], sent, j,
                          a->sig.kind == MPU_COLL_ALL_TO_ALL_V ? j : 0,
                          g->members[a->sig.kind == MPU_COLL_ALL_TO_ALL_V ? j : 0], got);
    }
  return MPU_SUCCESS;
}

mpu_result_t mpu__tuneven(tcomm *tc, const mpu__call *call) {
  const char *fn = call->sig.kind == MPU_COLL_ALL_GATHER_V       ? "mpu_comm_all_gather_v"
                   : call->sig.kind == MPU_COLL_REDUCE_SCATTER_V ? "mpu_comm_reduce_scatter_v"
                                                                 : "mpu_comm_all_to_all_v";
  tgroup *g = tc->g;
  int n = g->n, me = tc->me, p;
  mpu_dtype dt = (mpu_dtype)call->sig.dtype;
  size_t es = mpu_dtype_size(dt);
  MPU_CHECK(enter(tc, call, NULL, 0, fn, &p));
  const mpu__call *calls = g->calls[p];
  MPU_CHECK(uneven_counts_agree(tc, calls, fn));
  char *recv = call->recv;
  switch (call->sig.kind) {
  case MPU_COLL_ALL_GATHER_V:
    for (int k = 0; k < n; k++)
      if (recv + call->displs[k] * es != calls[k].send) /* in place: already there */
        mpu__copy(recv + call->displs[k] * es, calls[k].send, call->counts[k] * es, 0);
    break;
  case MPU_COLL_REDUCE_SCATTER_V: {
    size_t off = 0;
    for (int k = 0; k < me; k++) off += call->counts[k];
    for (int k = 0; k < n; k++) tc->ptrs[k] = (const char *)calls[k].send + off * es;
    mpu__reduce(recv, tc->ptrs, n, call->counts[me], dt, (mpu_op)call->sig.op, n);
    break;
  }
  default:
    for (int k = 0; k < n; k++)
      mpu__copy(recv + call->rdispls[k] * es,
                (const char *)calls[k].send + calls[k].displs[me] * es, call->rcounts[k] * es, 0);
  }
  return leave(tc, fn);
}
