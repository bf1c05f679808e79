/*
 * watchdog.c - one watchdog thread per process, as ProcessGroupNCCL has
 * (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, ncclCommWatchdog): it
 * follows the work every NCCL communicator of the process has enqueued, and
 * when a call outlives its communicator's timeout, NCCL reports an
 * asynchronous error, a peer posts an abort, or mpu_comm_abort is called
 * (from any thread), it breaks the communicator and ends its handles with
 * ncclCommAbort. NCCL's aborted kernels then return, so a host waiting for
 * them in cudaStreamSynchronize (after mpu_request_stream_wait, which does
 * not block) is released by the deadline, not never.
 *
 * The thread runs while a communicator lives (started by the first, joined
 * when the last ends). It never blocks an owner: it takes a communicator's
 * lock only when free (trylock) and looks again on its next tick.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "comm/nccl/backend.h"
#include "core/clock.h"
#include "core/error.h"

#define TICK_MS 10

/* dog_lock: the list, held by the thread over a round (an abort in it may
 * wait for queued kernels); kick_lock: only its sleep, so that breaking a
 * communicator (any thread) never waits for a round */
static pthread_mutex_t life_lock = PTHREAD_MUTEX_INITIALIZER; /* starting and joining it */
static pthread_mutex_t dog_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t kick_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t kick_cond = PTHREAD_COND_INITIALIZER;
static nccl_impl *watched;
static int nwatched;
static atomic_int stopping, kicked;
static pthread_t dog;
static _Thread_local int on_dog; /* this thread is the watchdog (it holds dog_lock) */

/* The oldest pending call that has not completed, dropping those that have. */
static nccl_pending *oldest(nccl_impl *m) {
  while (m->npending) {
    nccl_pending *p = &m->pending[m->pending_head];
    if (cudaEventQuery(p->event) == cudaErrorNotReady) return p;
    cudaGetLastError(); /* a failed event: the wait that reads it reports it */
    m->pending_head = (m->pending_head + 1) % m->cap_pending;
    m->npending--;
  }
  return NULL;
}

/* One look at m, its lock held. */
static void check(nccl_impl *m) {
  static const char fn[] = "the NCCL watchdog";
  mpu_comm *c = m->self;
  if (!c || m->grouped) return; /* being made or destroyed; or NCCL's group holds its handle */
  nccl_pending *p = atomic_load(&m->broken) || !m->comm ? NULL : oldest(m);
  if (p) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(m->comm, &async);
    double waited = mpu__now() - p->start;
    if (async != ncclSuccess && async != ncclInProgress)
      mpu__nccl_mark_broken(c, MPU_ERR_BACKEND, "%s: NCCL error %d: %s (NCCL aborted)", fn,
                            (int)async, ncclGetErrorString(async));
    else if (mpu__nccl_peer_aborted(c, fn) == 0 && waited > m->timeout_s)
      mpu__nccl_mark_broken(c, MPU_ERR_TIMEOUT,
                            "%s: a call on this communicator of %d ranks was not complete after "
                            "%.3g s (timeout %.3g s; NCCL aborted)",
                            fn, c->size, waited, m->timeout_s);
  }
  /* broken, by anyone: its kernels must end so no host waits for them */
  if (atomic_load(&m->broken) && (m->comm || m->maker)) mpu__nccl_end_handle(m);
}

static void *dog_main(void *arg) {
  (void)arg;
  on_dog = 1;
  /* Its event queries must not break another thread's graph capture: under
   * cudaStreamCaptureModeGlobal any thread's cudaEventQuery invalidates it
   * (seen on an H200: docs/gpu.md), unless this thread is relaxed, as
   * ProcessGroupNCCL's watchdog makes itself. */
  enum cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&relaxed);
  while (!atomic_load(&stopping)) {
    pthread_mutex_lock(&dog_lock);
    for (nccl_impl *m = watched; m; m = m->watch_next) {
      if (pthread_mutex_trylock(&m->lock)) continue; /* its owner is inside NCCL: next tick */
      check(m);
      pthread_mutex_unlock(&m->lock);
    }
    pthread_mutex_unlock(&dog_lock);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += TICK_MS * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&kick_lock);
    while (!atomic_load(&stopping) && !atomic_load(&kicked) &&
           pthread_cond_timedwait(&kick_cond, &kick_lock, &until) != ETIMEDOUT) {
    }
    atomic_store(&kicked, 0);
    pthread_mutex_unlock(&kick_lock);
  }
  return NULL;
}

mpu_result_t mpu__nccl_watchdog_add(nccl_impl *m) {
  pthread_mutex_lock(&life_lock);
  pthread_mutex_lock(&dog_lock);
  mpu_result_t r = MPU_SUCCESS;
  if (nwatched == 0) {
    atomic_store(&stopping, 0);
    if (pthread_create(&dog, NULL, dog_main, NULL))
      r = mpu__error(MPU_ERR_SYSTEM, "mpu_comm_nccl_create: could not start the watchdog thread");
  }
  if (!r) {
    m->watch_next = watched;
    watched = m;
    nwatched++;
  }
  pthread_mutex_unlock(&dog_lock);
  pthread_mutex_unlock(&life_lock);
  return r;
}

void mpu__nccl_watchdog_remove(nccl_impl *m) {
  pthread_mutex_lock(&life_lock);
  pthread_mutex_lock(&dog_lock);
  int found = 0;
  for (nccl_impl **p = &watched; *p; p = &(*p)->watch_next)
    if (*p == m) {
      *p = m->watch_next;
      found = 1;
      break;
    }
  int last = found && --nwatched == 0;
  pthread_mutex_unlock(&dog_lock);
  if (last) {
    atomic_store(&stopping, 1);
    mpu__nccl_watchdog_kick();
    pthread_join(dog, NULL); /* a later communicator starts a new one */
  }
  pthread_mutex_unlock(&life_lock);
}

void mpu__nccl_watchdog_kick(void) {
  if (on_dog) return; /* it is looking already */
  pthread_mutex_lock(&kick_lock);
  atomic_store(&kicked, 1);
  pthread_cond_broadcast(&kick_cond);
  pthread_mutex_unlock(&kick_lock);
}

mpu_result_t mpu__nccl_track(nccl_impl *m, const char *fn) {
  mpu_result_t r = MPU_SUCCESS;
  /* captured work runs when the graph is launched, not now: an event of
   * it cannot be queried (cudaErrorCapturedEvent) */
  if (mpu__nccl_capturing(m)) return MPU_SUCCESS;
  pthread_mutex_lock(&m->lock);
  oldest(m); /* what completed goes first, so the ring stays as long as the work in flight */
  if (m->npending == m->cap_pending) { /* grow the ring, oldest first */
    size_t cap = m->cap_pending ? 2 * m->cap_pending : 8;
    nccl_pending *more = calloc(cap, sizeof *more);
    if (!more) {
      pthread_mutex_unlock(&m->lock);
      return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu pending calls", fn, cap);
    }
    for (size_t i = 0; i < m->cap_pending; i++)
      more[i] = m->pending[(m->pending_head + i) % m->cap_pending];
    free(m->pending);
    m->pending = more, m->pending_head = 0, m->cap_pending = cap;
  }
  nccl_pending *p = &m->pending[(m->pending_head + m->npending) % m->cap_pending];
  if (!p->event)
    r = mpu__nccl_cuda_error(cudaEventCreateWithFlags(&p->event, cudaEventDisableTiming), fn);
  if (!r) r = mpu__nccl_cuda_error(cudaEventRecord(p->event, m->stream), fn);
  if (!r) {
    p->start = mpu__now();
    m->npending++;
  }
  pthread_mutex_unlock(&m->lock);
  return r;
}

void mpu__nccl_pending_free(nccl_impl *m) {
  for (size_t i = 0; i < m->cap_pending; i++)
    if (m->pending[i].event) cudaEventDestroy(m->pending[i].event);
  free(m->pending);
  m->pending = NULL;
  m->npending = m->cap_pending = m->pending_head = 0;
}
