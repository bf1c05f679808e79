/*
 * pending.c - the process-wide list of pending non-blocking calls, and the
 * one pass over it (mpu__mpi_drive) that every wait of the backend makes.
 *
 * A non-blocking call starts when it is issued, so it progresses while its
 * caller waits for something else (a wait in any order completes, as with
 * MPI's own I-calls). Unchecked, the call is one MPI I-call at once (the
 * reductions gather the inputs into the request's own buffer and reduce them
 * in rank order when it completes: mpu's bits). Checked, the signature
 * exchange (check.c) starts at once, in issue order with the blocking
 * calls' exchanges; the data phase, the same single I-call, starts
 * once the signatures matched, on a duplicate of the communicator (`nb`),
 * where data phases start in issue order on every rank (MPI's rule for a
 * communicator's collectives).
 *
 * Only mpu code can start a data phase, so the list is re-entered from every
 * wait, test, recv and blocking call's signature exchange (timeout.c's
 * polled waits, p2p.c's recv, the request calls here): each calls
 * mpu__mpi_drive, which walks every pending call of the process, on every
 * communicator. The backend is FUNNELED: one thread calls MPI, so the list
 * needs no lock.
 */
#include <limits.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/base/reduce.h"
#include "comm/mpi/backend.h"
#include "core/error.h"

enum { NB_SIG, NB_READY, NB_DATA, NB_DONE };

typedef struct nbreq {
  struct nbreq *next; /* every pending call of the process, in issue order */
  mpu_comm *c;
  mpu__call call;
  const char *fn;
  int phase;
  int counted;       /* its turn in the communicator's data-phase order is taken */
  uint64_t seq;      /* issue number among the communicator's checked calls */
  MPI_Request req;   /* the data phase */
  MPI_Request x[SIG_REQS]; /* the signature exchange (checked) */
  int nx;
  mpu_result_t result;
  char message[512];
  carrier *blk;      /* [1 + size]: the signatures (checked) */
  char *buf;         /* the gathered inputs of a reduction */
  int *v;            /* [4 * size]: the v-calls' counts and displacements */
  const void **ptrs; /* [size]: the reduction's sources */
} nbreq;

static nbreq *nb_head, *nb_tail;

static void nb_fail(nbreq *q, mpu_result_t r) {
  q->phase = NB_DONE;
  q->result = r;
  snprintf(q->message, sizeof q->message, "%s", mpu_last_error());
}

static int nb_finished(const nbreq *q) { return q->phase == NB_DONE && q->counted; }

static void nb_free_bufs(nbreq *q) {
  free(q->blk), free(q->buf), free(q->v), free(q->ptrs);
  q->blk = NULL, q->buf = NULL, q->v = NULL, q->ptrs = NULL;
}

/* The data phase: one MPI I-call over `w` (the caller's buffers, or the
 * request's own where a reduction follows). */
static mpu_result_t nb_data_start(nbreq *q, MPI_Comm w) {
  mpu__call *k = &q->call;
  MPU__CALL_ARGS(k);
  mpu_comm *c = q->c;
  const char *fn = q->fn;
  int n = c->size, me = c->rank, *v = q->v;
  size_t es = mpu_dtype_size(dt), bytes = count * es;
  MPI_Datatype t = bits_of(dt);
  switch (k->sig.kind) {
  case MPU_COLL_ALL_REDUCE:
    MPU_CHECK(mpu__mpi_fits(fn, count, n));
    return mpu__mpi_check(MPI_Iallgather(send, (int)count, t, q->buf, (int)count, t, w, &q->req), fn);
  case MPU_COLL_ALL_GATHER: {
    const char *in_place = (const char *)recv + (size_t)me * bytes;
    MPU_CHECK(mpu__mpi_fits(fn, count, n));
    return mpu__mpi_check(MPI_Iallgather(send == in_place ? MPI_IN_PLACE : send, (int)count, t, recv,
                                (int)count, t, w, &q->req),
                 fn);
  }
  case MPU_COLL_REDUCE_SCATTER:
    MPU_CHECK(mpu__mpi_fits(fn, count, n));
    return mpu__mpi_check(MPI_Ialltoall(send, (int)count, t, q->buf, (int)count, t, w, &q->req), fn);
  case MPU_COLL_BROADCAST:
    MPU_CHECK(mpu__mpi_fits(fn, count, 1));
    return mpu__mpi_check(MPI_Ibcast(recv, (int)count, t, root, w, &q->req), fn);
  case MPU_COLL_REDUCE:
    MPU_CHECK(mpu__mpi_fits(fn, count, n));
    if (n == 2) { /* one combine in rank order: MPI's reduce with mpu's kernel */
      MPU_CHECK(mpu__mpi_pair_setup(fn));
      const void *s = me == root && send == recv ? MPI_IN_PLACE : send;
      return mpu__mpi_check(MPI_Ireduce(s, me == root ? recv : NULL, (int)count, mpu__mpi_pair_type(dt), mpu__mpi_pair_op(op),
                               root, w, &q->req),
                   fn);
    }
    return mpu__mpi_check(MPI_Igather(send, (int)count, t, q->buf, (int)count, t, root, w, &q->req), fn);
  case MPU_COLL_ALL_TO_ALL:
    MPU_CHECK(mpu__mpi_fits(fn, count, n));
    return mpu__mpi_check(MPI_Ialltoall(send, (int)count, t, recv, (int)count, t, w, &q->req), fn);
  case MPU_COLL_BARRIER: return mpu__mpi_check(MPI_Ibarrier(w, &q->req), fn);
  case MPU_COLL_ALL_GATHER_V: {
    char *mine = (char *)recv + k->displs[me] * es;
    if (mine != send && k->counts[me]) memcpy(mine, send, k->counts[me] * es);
    return mpu__mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, t, recv, v, v + n, t, w, &q->req), fn);
  }
  case MPU_COLL_ALL_TO_ALL_V:
    return mpu__mpi_check(MPI_Ialltoallv(send, v, v + n, t, recv, v + 2 * n, v + 3 * n, t, w, &q->req), fn);
  default: /* reduce_scatter_v: block k of every input to rank k, stacked */
    return mpu__mpi_check(MPI_Ialltoallv(send, v, v + n, t, q->buf, v + 2 * n, v + 3 * n, t, w, &q->req),
                 fn);
  }
}

/* The data phase completed: the reductions reduce in rank order. */
static void nb_data_finish(nbreq *q) {
  mpu__call *k = &q->call;
  MPU__CALL_ARGS(k);
  const mpu__coll *row = mpu__coll_of(k->sig.kind);
  int n = q->c->size, me = q->c->rank;
  /* a reduce only at its root, and not on two ranks (MPI's reduce did it) */
  if (!row->has_op || (row->has_root && (n == 2 || me != root))) return;
  size_t es = mpu_dtype_size(dt), per = row->listed ? k->counts[me] : count;
  for (int p = 0; p < n; p++) q->ptrs[p] = q->buf + (size_t)p * per * es;
  mpu__reduce(recv, q->ptrs, n, per, dt, op, n);
}

/* Buffers and int counts for the data phase (checked where a call can
 * fail, before anything starts). */
static mpu_result_t nb_prepare(nbreq *q) {
  mpu__call *k = &q->call;
  mpu_comm *c = q->c;
  const char *fn = q->fn;
  int n = c->size, kind = k->sig.kind;
  size_t es = mpu_dtype_size((mpu_dtype)k->sig.dtype), count = (size_t)k->sig.count, stack = 0;
  q->v = calloc(4 * (size_t)n, sizeof *q->v);
  q->ptrs = calloc((size_t)n, sizeof *q->ptrs);
  if (!q->v || !q->ptrs) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a request", fn);
  int *v = q->v;
  if (kind == MPU_COLL_ALL_GATHER_V || kind == MPU_COLL_ALL_TO_ALL_V) {
    MPU_CHECK(mpu__mpi_ints(c, fn, k->counts, v));
    MPU_CHECK(mpu__mpi_ints(c, fn, k->displs, v + n));
    if (kind == MPU_COLL_ALL_TO_ALL_V) {
      MPU_CHECK(mpu__mpi_ints(c, fn, k->rcounts, v + 2 * n));
      MPU_CHECK(mpu__mpi_ints(c, fn, k->rdispls, v + 3 * n));
    }
  } else if (kind == MPU_COLL_REDUCE_SCATTER_V) {
    size_t mine = k->counts[c->rank], off = 0;
    MPU_CHECK(mpu__mpi_ints(c, fn, k->counts, v));
    for (int p = 0; p < n; p++) {
      if (off > (size_t)INT_MAX) return mpu__error(MPU_ERR_UNSUPPORTED, "%s: offset %zu", fn, off);
      v[n + p] = (int)off;
      off += k->counts[p];
    }
    MPU_CHECK(mpu__mpi_fits(fn, mine, n));
    for (int p = 0; p < n; p++) v[2 * n + p] = (int)mine, v[3 * n + p] = (int)((size_t)p * mine);
    stack = mine;
  } else if (kind == MPU_COLL_ALL_REDUCE || kind == MPU_COLL_REDUCE_SCATTER ||
             (kind == MPU_COLL_REDUCE && n > 2 && c->rank == k->sig.root)) {
    MPU_CHECK(mpu__mpi_fits(fn, count, n));
    stack = count;
  }
  if (stack) {
    size_t bytes;
    if (__builtin_mul_overflow(stack * es, (size_t)n, &bytes))
      return mpu__error(MPU_ERR_UNSUPPORTED, "%s: %zu elements x %d ranks", fn, stack, n);
    q->buf = malloc(bytes);
    if (!q->buf) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes", fn, bytes);
  }
  return MPU_SUCCESS;
}

/* Start the data phase of q (its turn has come), or finish it. */
static void nb_begin_data(nbreq *q) {
  mpi_impl *m = impl_of(q->c);
  mpu_result_t r = m->broken ? mpu__mpi_broken(m, q->fn) : nb_data_start(q, m->checked ? m->nb : m->comm);
  if (r) nb_fail(q, r);
  else q->phase = NB_DATA;
}

/* One pass over every pending call of the process, in issue order. */
void mpu__mpi_drive(void) {
  for (nbreq *q = nb_head; q; q = q->next) {
    mpu_comm *c = q->c;
    mpi_impl *m = impl_of(c);
    if (m->broken && !nb_finished(q)) { /* a timeout broke it: MPI keeps the call */
      q->phase = NB_DONE, q->counted = 1, q->result = m->broken;
      snprintf(q->message, sizeof q->message, "%s: communicator is broken: %s", q->fn, m->why);
      continue;
    }
    if (q->phase == NB_SIG || q->phase == NB_DATA) {
      int done = 0;
      mpu_result_t r =
          mpu__mpi_check(q->phase == NB_SIG ? MPI_Testall(q->nx, q->x, &done, MPI_STATUSES_IGNORE)
                                   : MPI_Test(&q->req, &done, MPI_STATUS_IGNORE),
                q->fn);
      if (r) {
        nb_fail(q, r);
      } else if (done && q->phase == NB_DATA) {
        nb_data_finish(q);
        q->phase = NB_DONE;
      } else if (done) { /* the signatures came */
        q->phase = NB_READY;
        for (int p = 0; p < c->size; p++)
          if (memcmp(&q->blk[1 + p].sig, &q->blk[0].sig, sizeof q->blk[0].sig)) {
            r = mpu__sig_compare(q->fn, &q->blk[1], sizeof *q->blk, c->size, c->world_ranks,
                                 MPU__CHECK_ALL);
            if (r) nb_fail(q, r);
            break;
          }
        if (q->phase == NB_READY && mpu__mpi_carried_bytes(c, &q->call) != SIZE_MAX && !m->timed) {
          /* the inputs rode with the signatures */
          mpu__mpi_finish_carried(c, &q->call, q->blk);
          q->phase = NB_DONE;
        }
      }
    }
    /* the communicator's calls run one after the other in issue order, as
     * the blocking ones do (a later call may read an earlier one's output):
     * a data phase starts when the one before it completed (a failed or
     * carried call takes its turn without one, on every rank alike) */
    if (!q->counted && q->seq == m->nb_next) {
      if (q->phase == NB_READY) nb_begin_data(q);
      if (q->phase == NB_DONE) q->counted = 1, m->nb_next++;
    }
  }
}

static void nb_unlink(nbreq *q) {
  nbreq *prev = NULL;
  for (nbreq *p = nb_head; p; prev = p, p = p->next)
    if (p == q) {
      if (prev) prev->next = q->next;
      else nb_head = q->next;
      if (nb_tail == q) nb_tail = prev;
      return;
    }
}


mpu_result_t mpu__mpi_start_nb(mpu_comm *c, const mpu__call *call, void **handle) {
  mpi_impl *m = impl_of(c);
  *handle = NULL;
  nbreq *q = calloc(1, sizeof *q);
  if (!q) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a request", mpu__coll_of(call->sig.kind)->ifn);
  q->c = c, q->call = *call, q->fn = mpu__coll_of(call->sig.kind)->ifn, q->req = MPI_REQUEST_NULL;
  mpu_result_t r = m->broken ? mpu__mpi_broken(m, q->fn) : nb_prepare(q);
  if (!r) mpu__mpi_orphans_progress(0);
  if (!r && m->checked) {
    q->blk = calloc((size_t)c->size + 1, sizeof *q->blk);
    if (!q->blk) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a request", q->fn);
    if (!r) {
      mpu__mpi_sig_fill(c, call, &q->blk[0]);
      r = mpu__mpi_sig_start(c, q->blk, q->x, &q->nx, q->fn);
      if (r) { /* what was posted stays with MPI; peers time out as on a lost rank */
        mpu__mpi_sig_abandon(c, q->x, q->nx, q->blk, r);
        q->blk = NULL;
      }
      q->phase = NB_SIG;
      q->seq = m->nb_issued++;
    }
  } else if (!r) { /* unchecked: the data phase at once where no earlier call is pending */
    q->phase = NB_READY;
    q->seq = m->nb_issued++;
  }
  if (r) { /* nothing was started */
    nb_free_bufs(q);
    free(q);
    return r;
  }
  if (nb_tail) nb_tail->next = q;
  else nb_head = q;
  nb_tail = q;
  mpu__mpi_drive();
  *handle = q;
  return MPU_SUCCESS;
}

static mpu_result_t nb_result(nbreq *q) {
  if (!q->result) return MPU_SUCCESS;
  return mpu__error(q->result, "%s", q->message);
}

mpu_result_t mpu__mpi_test(mpu_comm *c, void *handle, int *done) {
  (void)c;
  nbreq *q = handle;
  mpu__mpi_drive();
  *done = nb_finished(q);
  return *done ? nb_result(q) : MPU_SUCCESS;
}

/* Polls every pending call until q completes. timeout_s < 0: the
 * communicator's timeout, after which it is broken (as a blocking call);
 * otherwise q stays pending. */
mpu_result_t mpu__mpi_wait(mpu_comm *c, void *handle, double timeout_s) {
  nbreq *q = handle;
  mpi_impl *m = impl_of(c);
  double limit = timeout_s < 0 ? m->timeout_s : timeout_s, start = MPI_Wtime();
  for (long spins = 0;; spins++) {
    mpu__mpi_drive();
    if (nb_finished(q)) return nb_result(q);
    if ((spins & 63) == 63) {
      if (MPI_Wtime() - start > limit) break;
      sched_yield(); /* ranks may outnumber cores: let the late one run */
    }
  }
  if (timeout_s >= 0)
    return mpu__error(MPU_ERR_TIMEOUT, "%s: not complete within %.3g s", q->fn, timeout_s);
  snprintf(m->why, sizeof m->why,
           "%s timed out after %.3g s %s (communicator of %d ranks: MPI cannot name the missing "
           "ones of a non-blocking call)",
           q->fn, limit,
           q->phase == NB_SIG ? "waiting for every rank to enter the call" : DATA_PHASE, c->size);
  m->broken = MPU_ERR_TIMEOUT;
  return mpu__error(MPU_ERR_TIMEOUT, "%s", m->why);
}

/* Never blocks: a call MPI still runs keeps its buffers in the orphans. */
void mpu__mpi_release(mpu_comm *c, void *handle) {
  (void)c;
  nbreq *q = handle;
  nb_unlink(q);
  MPI_Request all[1 + SIG_REQS]; /* the data phase and the exchange (left by a broken call) */
  int n = 0, done = 1, sig_done = 1;
  if (q->nx) MPI_Testall(q->nx, q->x, &sig_done, MPI_STATUSES_IGNORE);
  if (q->req != MPI_REQUEST_NULL) all[n++] = q->req;
  for (int i = 0; i < q->nx; i++) all[n++] = q->x[i];
  if (n) MPI_Testall(n, all, &done, MPI_STATUSES_IGNORE);
  if (!done) {
    mpi_impl *m = impl_of(q->c);
    m->orphaned++;
    if (!sig_done) m->sig_left = 1;
    mpu__mpi_orphan_add_all(all, n, q->blk, q->buf, q->v, (void *)q->ptrs);
    q->blk = NULL, q->buf = NULL, q->v = NULL, q->ptrs = NULL;
  }
  nb_free_bufs(q);
  free(q);
}
