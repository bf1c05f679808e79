/*
 * watch.c - the NCCL backend's errors and waiting: NCCL's and CUDA's codes
 * as mpu's, every wait polled together with ncclCommGetAsyncError under the
 * communicator's timeout, and the way out (ncclCommAbort) when a peer died
 * or never came. A broken communicator fails every later call at once.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>

#include "comm/nccl/backend.h"
#include "core/clock.h"
#include "core/error.h"

/* ---- errors: NCCL's and CUDA's codes as mpu's, with their messages -------- */

mpu_result_t mpu__nccl_error(ncclResult_t r, ncclComm_t comm, const char *what) {
  if (r == ncclSuccess) return MPU_SUCCESS;
  mpu_result_t code = r == ncclInvalidArgument ? MPU_ERR_INVALID_ARGUMENT
                      : r == ncclInvalidUsage  ? MPU_ERR_INVALID_USAGE
                      : r == ncclRemoteError   ? MPU_ERR_ABORTED
                      : r == ncclSystemError   ? MPU_ERR_SYSTEM
                                               : MPU_ERR_BACKEND;
  /* NCCL's last error is one string for the process: another thread's or
   * communicator's failure may have written it since, so it is a hint */
  const char *last = ncclGetLastError(comm);
  return mpu__error(code, "%s: NCCL error %d: %s%s%s", what, (int)r, ncclGetErrorString(r),
                    last && *last ? ": " : "", last ? last : "");
}

mpu_result_t mpu__nccl_cuda_error(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return MPU_SUCCESS;
  return mpu__error(e == cudaErrorMemoryAllocation ? MPU_ERR_OUT_OF_MEMORY : MPU_ERR_BACKEND,
                    "%s: CUDA error %d: %s", what, (int)e, cudaGetErrorString(e));
}

/* ---- breaking: once, from any thread ------------------------------------------- */

mpu_result_t mpu__nccl_broken_error(const nccl_impl *m, const char *fn) {
  mpu_result_t code = atomic_load(&m->broken);
  return mpu__error(code, "%s: communicator is broken: %s", fn, m->why);
}

/* Break the communicator with code and a reason, once: the first caller
 * claims it, writes why, then publishes the code (any thread may read it),
 * tells the peers out of band and wakes the watchdog, which ends the handles
 * (so a host waiting in CUDA behind the work is released). 1 if this call
 * broke it. */
int mpu__nccl_mark_broken(mpu_comm *c, mpu_result_t code, const char *fmt, ...) {
  nccl_impl *m = impl_of(c);
  int expected = 0;
  if (!atomic_compare_exchange_strong(&m->breaking, &expected, 1)) return 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->why, sizeof m->why, fmt, ap);
  va_end(ap);
  atomic_store(&m->broken, code);
  if (m->oob_post_abort) m->oob_post_abort(m->oob_ctx, c->rank, m->why);
  mpu__nccl_watchdog_kick();
  return 1;
}
#define mark_broken mpu__nccl_mark_broken

/* The one way the NCCL handles end early (ncclCommAbort, the documented way
 * out of a hung collective), once: under the lock, so neither the owner
 * (a wait, the next call, destroy) nor the watchdog thread ends them while
 * the other is inside NCCL with them. */
void mpu__nccl_end_handle(nccl_impl *m) {
  pthread_mutex_lock(&m->lock);
  if (m->comm || m->maker) mpu__nccl_family_abort(m);
  if (m->comm) ncclCommAbort(m->comm);
  if (m->maker) ncclCommAbort(m->maker); /* after comm: NCCL frees a parent last */
  if (m->local) ncclCommAbort(m->local); /* one rank: nobody waits for it */
  m->comm = m->maker = m->local = NULL;
  pthread_mutex_unlock(&m->lock);
}

ncclResult_t mpu__nccl_async(nccl_impl *m) {
  ncclResult_t async = ncclSuccess;
  pthread_mutex_lock(&m->lock);
  if (m->comm) ncclCommGetAsyncError(m->comm, &async);
  pthread_mutex_unlock(&m->lock);
  return async;
}

void mpu__nccl_family_abort(nccl_impl *m) {
  if (m->family) atomic_store(&m->family->aborted, 1);
}

int mpu__nccl_family_broke(mpu_comm *c, const char *fn) {
  nccl_impl *m = impl_of(c);
  if (!m->family || !atomic_load(&m->family->aborted)) return 0;
  (void)fn; /* the message is the communicator's, named by each call that meets it */
  mark_broken(c, MPU_ERR_ABORTED,
              "a communicator sharing NCCL resources with this one (share_resources: one abort "
              "flag) was aborted, so its kernels may have returned unfinished");
  return 1;
}

/* The owner's exit from a broken communicator: end the handle, say why. */
static mpu_result_t leave_broken(mpu_comm *c, const char *fn) {
  nccl_impl *m = impl_of(c);
  mpu__nccl_end_handle(m);
  return mpu__nccl_broken_error(m, fn);
}

/* The same, for the call that has just broken it (why names the call). */
static mpu_result_t leave_fresh(mpu_comm *c) {
  nccl_impl *m = impl_of(c);
  mpu__nccl_end_handle(m);
  return mpu__error(atomic_load(&m->broken), "%s", m->why);
}

/* Whether a peer posted an abort; if so break this rank too: 1 if this call
 * broke it, -1 if it was broken already, 0 if no peer aborted. */
int mpu__nccl_peer_aborted(mpu_comm *c, const char *fn) {
  nccl_impl *m = impl_of(c);
  char why[256] = "";
  int who = -1;
  if (!m->oob_poll_abort || !m->oob_poll_abort(m->oob_ctx, &who, why, sizeof why)) return 0;
  if (who == c->rank) return 0; /* our own post */
  return mark_broken(c, MPU_ERR_ABORTED, "%s: rank %d of this communicator of %d ranks aborted (%s)",
                     fn, who, c->size, why)
             ? 1
             : -1;
}

/* ---- waiting: polled, with the watchdog -------------------------------------- */

/* Wait until the event (NULL: the stream) completes, watching NCCL's
 * asynchronous errors, the broken state (another thread's mpu_comm_abort)
 * and the peers' out-of-band aborts, for at most timeout_s (< 0: the
 * communicator's), counted from `since` (< 0: now). On timeout with `keep`,
 * the work stays pending (a request can be waited for again); otherwise the
 * communicator is broken and NCCL aborted. Success only if the work completed
 * and the communicator was not broken meanwhile: never partial output. */
static mpu_result_t watch_from(mpu_comm *c, cudaEvent_t event, double timeout_s, double since,
                               int keep, int once, const char *fn) {
  nccl_impl *m = impl_of(c);
  double limit = timeout_s < 0 ? m->timeout_s : timeout_s;
  double start = since < 0 ? mpu__now() : since;
  for (long spins = 0;; spins++) {
    if (atomic_load(&m->broken)) return leave_broken(c, fn);
    cudaError_t e = event ? cudaEventQuery(event) : cudaStreamQuery(m->stream);
    /* a relative's abort ends shared kernels early: done, but not whole */
    if (mpu__nccl_family_broke(c, fn)) return leave_broken(c, fn);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) { /* sticky on a GPU: the communicator cannot go on */
      mpu__nccl_cuda_error(e, fn);
      if (mark_broken(c, e == cudaErrorMemoryAllocation ? MPU_ERR_OUT_OF_MEMORY : MPU_ERR_BACKEND,
                      "%s (NCCL aborted)", mpu_last_error()))
        return leave_fresh(c);
      return leave_broken(c, fn);
    }
    ncclResult_t async = mpu__nccl_async(m);
    if (async != ncclSuccess && async != ncclInProgress) {
      mpu_result_t r = mpu__nccl_error(async, NULL, fn);
      if (mark_broken(c, r, "%s", mpu_last_error())) return leave_fresh(c);
      return leave_broken(c, fn);
    }
    if (once || (spins & 255) == 255) {
      int fresh = mpu__nccl_peer_aborted(c, fn);
      if (fresh) return fresh > 0 ? leave_fresh(c) : leave_broken(c, fn);
      if (mpu__now() - start > limit) {
        if (keep) return mpu__error(MPU_ERR_TIMEOUT, "%s: not complete after %.3g s", fn, limit);
        if (mark_broken(c, MPU_ERR_TIMEOUT,
                        "%s: timed out after %.3g s waiting for the peers of a communicator of %d "
                        "ranks (NCCL aborted)",
                        fn, limit, c->size))
          return leave_fresh(c);
        return leave_broken(c, fn);
      }
      if (once) return MPU_ERR_TIMEOUT; /* not done yet; no message: nothing failed */
      sched_yield();
    }
  }
  /* aborted while it ran, here or by a peer: the output may be partial */
  int fresh = mpu__nccl_peer_aborted(c, fn);
  if (fresh > 0) return leave_fresh(c);
  if (atomic_load(&m->broken)) return leave_broken(c, fn);
  ncclResult_t async = mpu__nccl_async(m);
  if (async == ncclSuccess || async == ncclInProgress) return MPU_SUCCESS;
  mpu_result_t r = mpu__nccl_error(async, NULL, fn);
  if (mark_broken(c, r, "%s", mpu_last_error())) return leave_fresh(c);
  return leave_broken(c, fn);
}

mpu_result_t mpu__nccl_watch(mpu_comm *c, cudaEvent_t event, double timeout_s, int keep,
                             const char *fn) {
  return watch_from(c, event, timeout_s, -1, keep, 0, fn);
}

/* mpu_request_test: one look, but under the watchdog counted from the
 * call's start, so a request tested forever against a dead peer ends. */
mpu_result_t mpu__nccl_test(mpu_comm *c, const nccl_request *q, int *done) {
  static const char fn[] = "mpu_request_test";
  nccl_impl *m = impl_of(c);
  *done = 0;
  if (atomic_load(&m->broken)) return leave_broken(c, fn);
  if (q->captured) { /* it runs when the graph does */
    *done = 1;
    return MPU_SUCCESS;
  }
  mpu_result_t r = watch_from(c, q->event, -1, q->start, 0, 1, fn);
  if (r == MPU_ERR_TIMEOUT && !atomic_load(&m->broken)) return MPU_SUCCESS; /* pending */
  *done = r == MPU_SUCCESS;
  return r;
}

/* A call on a non-blocking communicator that returned ncclInProgress is
 * still being enqueued by NCCL: wait until ncclCommGetAsyncError says it is
 * on the stream (or failed) before anything is recorded after it. */
mpu_result_t mpu__nccl_issued(mpu_comm *c, ncclResult_t r, const char *fn) {
  nccl_impl *m = impl_of(c);
  if (r != ncclInProgress) return mpu__nccl_error(r, NULL, fn);
  double start = mpu__now();
  for (long spins = 0;; spins++) {
    ncclResult_t async = mpu__nccl_async(m);
    if (async != ncclInProgress) {
      if (async == ncclSuccess) return MPU_SUCCESS;
      mpu_result_t e = mpu__nccl_error(async, NULL, fn);
      if (mark_broken(c, e, "%s", mpu_last_error())) return leave_fresh(c);
      return leave_broken(c, fn);
    }
    if ((spins & 255) == 255) {
      if (atomic_load(&m->broken)) return leave_broken(c, fn);
      if (mpu__now() - start > m->timeout_s) {
        if (mark_broken(c, MPU_ERR_TIMEOUT, "%s: NCCL still enqueuing after %.3g s (NCCL aborted)",
                        fn, m->timeout_s))
          return leave_fresh(c);
        return leave_broken(c, fn);
      }
      sched_yield();
    }
  }
}

mpu_result_t mpu__nccl_usable(const mpu_comm *c, const char *fn) {
  nccl_impl *m = impl_of(c);
  if (mpu__nccl_peer_aborted((mpu_comm *)c, fn) > 0) return leave_fresh((mpu_comm *)c);
  mpu__nccl_family_broke((mpu_comm *)c, fn);
  if (atomic_load(&m->broken)) return leave_broken((mpu_comm *)c, fn);
  return mpu__nccl_cuda_error(cudaSetDevice(m->device), fn); /* this thread's calls go to the rank's GPU */
}

/* mpu_comm_abort: safe from any thread. It marks the communicator broken and
 * tells the peers at once; the watchdog thread then ends the handles (within
 * its tick, even while the owner waits in cudaStreamSynchronize), or the
 * owner does first (its wait sees the mark within a few spins). */
mpu_result_t mpu__nccl_abort(mpu_comm *c) {
  mark_broken(c, MPU_ERR_ABORTED, "mpu_comm_abort was called on rank %d of this communicator",
              c->rank);
  return MPU_SUCCESS;
}

/* ---- making: non-blocking init and split under the deadline ----------------------- */

/* Wait for a communicator being made with a non-blocking config: poll
 * NCCL's async state (of poll: the new handle, or the parent for a rank that
 * takes no part in the result) until it is no longer ncclInProgress, for at
 * most timeout_s; on expiry abort the new handle and fail with
 * MPU_ERR_TIMEOUT naming who is missing. */
mpu_result_t mpu__nccl_await(mpu_comm *c, ncclComm_t comm, ncclComm_t poll, double timeout_s,
                             const char *fn, const char *who) {
  (void)c;
  double start = mpu__now();
  for (long spins = 0;; spins++) {
    ncclResult_t async = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(poll, &async);
    if (q != ncclSuccess) async = q;
    if (async != ncclInProgress) return mpu__nccl_error(async, poll, fn);
    if ((spins & 63) == 63) {
      if (mpu__now() - start > timeout_s) {
        if (comm) ncclCommAbort(comm);
        return mpu__error(MPU_ERR_TIMEOUT,
                          "%s: the NCCL communicator was not complete after %.3g s: %s (NCCL "
                          "aborted)",
                          fn, timeout_s, who);
      }
      sched_yield();
    }
  }
}

/* ---- the out-of-band channel of ranks in one process ------------------------------ */

/* Ranks that share a process (threads over a host twin) share a board per
 * NCCL id: an abort is one store, polled by every peer's wait. */
typedef struct oob_board {
  struct oob_board *next;
  ncclUniqueId id;
  uint64_t serial;   /* unique in the process: names its children (an address may be reused) */
  int refs;
  atomic_int posted; /* the rank that posted + 1 */
  char why[256];     /* written before posted */
} oob_board;

static pthread_mutex_t boards_lock = PTHREAD_MUTEX_INITIALIZER;
static oob_board *boards;

static void board_post(void *ctx, int rank, const char *why) {
  oob_board *b = ctx;
  pthread_mutex_lock(&boards_lock);
  if (!atomic_load(&b->posted)) {
    snprintf(b->why, sizeof b->why, "%s", why);
    atomic_store(&b->posted, rank + 1);
  }
  pthread_mutex_unlock(&boards_lock);
}

static int board_poll(void *ctx, int *who, char *why, size_t len) {
  oob_board *b = ctx;
  int posted = atomic_load(&b->posted);
  if (!posted) return 0;
  *who = posted - 1;
  pthread_mutex_lock(&boards_lock);
  snprintf(why, len, "%s", b->why);
  pthread_mutex_unlock(&boards_lock);
  return 1;
}

static void board_free(void *ctx) {
  oob_board *b = ctx;
  pthread_mutex_lock(&boards_lock);
  if (--b->refs == 0) {
    for (oob_board **p = &boards; *p; p = &(*p)->next)
      if (*p == b) {
        *p = b->next;
        break;
      }
    free(b);
  }
  pthread_mutex_unlock(&boards_lock);
}

/* Join the board of the NCCL id (members in this process share it). */
mpu_result_t mpu__nccl_oob_join(nccl_impl *m, const ncclUniqueId *id) {
  pthread_mutex_lock(&boards_lock);
  oob_board *b = boards;
  while (b && memcmp(&b->id, id, sizeof *id)) b = b->next;
  if (!b && (b = calloc(1, sizeof *b)) != NULL) {
    static uint64_t boards_made; /* under boards_lock */
    b->serial = ++boards_made;
    b->id = *id;
    b->next = boards;
    boards = b;
  }
  if (b) b->refs++;
  pthread_mutex_unlock(&boards_lock);
  if (!b) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_comm_nccl_create: abort board");
  m->oob_post_abort = board_post;
  m->oob_poll_abort = board_poll;
  m->oob_free = board_free;
  m->oob_ctx = b;
  return MPU_SUCCESS;
}

void mpu__nccl_oob_leave(nccl_impl *m) {
  if (m->oob_free) m->oob_free(m->oob_ctx);
  m->oob_post_abort = NULL;
  m->oob_poll_abort = NULL;
  m->oob_free = NULL;
  m->oob_ctx = NULL;
}

/* Whether m's channel is the in-process board (its children get one too). */
int mpu__nccl_oob_is_board(const nccl_impl *m) { return m->oob_post_abort == board_post; }

uint64_t mpu__nccl_oob_board_serial(const nccl_impl *m) {
  return mpu__nccl_oob_is_board(m) ? ((const oob_board *)m->oob_ctx)->serial : 0;
}
