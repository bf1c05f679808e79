/*
 * group.c - the NCCL backend's part of mpu_group_start/end (the base's
 * src/comm/base/group.c decides what a group means) and the ncclComm_t
 * handed to callers.
 *
 * Inside ncclGroupStart/End NCCL only records calls: they reach the stream
 * at ncclGroupEnd. An event recorded after a call inside the group would be
 * on the stream before the call and complete at once, so a request's event
 * made inside a group is recorded after ncclGroupEnd (per thread, like
 * NCCL's group).
 */
#include <stdlib.h>

#include "comm/nccl/backend.h"
#include "core/clock.h"
#include "core/error.h"

typedef struct deferred {
  cudaEvent_t event;
  cudaStream_t stream;
  mpu_comm *comm;
} deferred;

static _Thread_local int open_group;
static _Thread_local deferred *records;
static _Thread_local size_t nrecords, cap_records;
/* the communicators this thread's open group holds calls of: NCCL keeps
 * their handles until ncclGroupEnd launches, so the watchdog leaves them
 * alone (nccl_impl.grouped) until then */
static _Thread_local nccl_impl **held;
static _Thread_local size_t nheld, cap_held;

static int held_here(const nccl_impl *m) {
  for (size_t i = 0; i < nheld; i++)
    if (held[i] == m) return 1;
  return 0;
}

mpu_result_t mpu__nccl_enter(mpu_comm *c, const char *fn) {
  nccl_impl *m = impl_of(c);
  if (open_group && nheld == cap_held) {
    size_t cap = cap_held ? 2 * cap_held : 8;
    nccl_impl **more = realloc(held, cap * sizeof *more);
    if (!more) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu grouped communicators", fn, cap);
    held = more, cap_held = cap;
  }
  pthread_mutex_lock(&m->lock);
  if (!m->comm) { /* ended by the watchdog since the caller last looked */
    pthread_mutex_unlock(&m->lock);
    return mpu__nccl_broken_error(m, fn);
  }
  if (open_group && !held_here(m)) {
    held[nheld++] = m;
    m->grouped = 1;
  }
  return MPU_SUCCESS;
}

void mpu__nccl_leave(mpu_comm *c) { pthread_mutex_unlock(&impl_of(c)->lock); }

static void release_held(void) {
  for (size_t i = 0; i < nheld; i++) {
    pthread_mutex_lock(&held[i]->lock);
    held[i]->grouped = 0;
    pthread_mutex_unlock(&held[i]->lock);
  }
  free(held);
  held = NULL, nheld = cap_held = 0;
}

/* A request: its event (recorded after the call, or after ncclGroupEnd) and
 * when it started, from which mpu_request_test's deadline counts. */
mpu_result_t mpu__nccl_request_new(const char *fn, nccl_request **out) {
  nccl_request *q = calloc(1, sizeof *q);
  if (!q) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a request", fn);
  q->start = mpu__now();
  mpu_result_t r = mpu__nccl_cuda_error(cudaEventCreateWithFlags(&q->event, cudaEventDisableTiming), fn);
  if (r) {
    free(q);
    return r;
  }
  *out = q;
  return MPU_SUCCESS;
}

void mpu__nccl_request_free(nccl_request *q) {
  if (!q) return;
  cudaEventDestroy(q->event);
  free(q);
}

mpu_result_t mpu__nccl_event_record(mpu_comm *c, cudaEvent_t ev, const char *fn) {
  nccl_impl *m = impl_of(c);
  if (!open_group) {
    MPU_CHECK(mpu__nccl_cuda_error(cudaEventRecord(ev, m->stream), fn));
    return mpu__nccl_track(m, fn);
  }
  if (nrecords == cap_records) {
    size_t cap = cap_records ? 2 * cap_records : 16;
    deferred *more = realloc(records, cap * sizeof *more);
    if (!more) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu grouped calls", fn, cap);
    records = more, cap_records = cap;
  }
  records[nrecords++] = (deferred){ev, m->stream, c};
  return MPU_SUCCESS;
}

mpu_result_t mpu__nccl_group_start(void) {
  MPU_CHECK(mpu__nccl_error(ncclGroupStart(), NULL, "mpu_group_start"));
  open_group = 1;
  return MPU_SUCCESS;
}

mpu_result_t mpu__nccl_group_end(void) {
  static const char fn[] = "mpu_group_end";
  open_group = 0;
  ncclResult_t end = ncclGroupEnd();
  mpu_result_t r = end == ncclInProgress ? MPU_SUCCESS : mpu__nccl_error(end, NULL, fn);
  /* non-blocking communicators may still be enqueuing: each waits that out
   * (under its own deadline) before its events go on the stream */
  for (size_t i = 0; end == ncclInProgress && i < nrecords; i++) {
    mpu_result_t e = mpu__nccl_issued(records[i].comm, ncclInProgress, fn);
    if (!r) r = e;
  }
  /* the events go after the launched calls; after a failed launch too, so a
   * request's wait does not stay pending forever (the failure is the group's) */
  for (size_t i = 0; i < nrecords; i++) {
    mpu_result_t e = mpu__nccl_cuda_error(cudaEventRecord(records[i].event, records[i].stream), fn);
    if (!e) e = mpu__nccl_track(impl_of(records[i].comm), fn);
    if (!r) r = e;
  }
  free(records);
  records = NULL, nrecords = cap_records = 0;
  release_held();
  return r;
}

mpu_result_t mpu__nccl_p2p_start(mpu_comm *c, const mpu__call *k, void **handle) {
  const char *fn = mpu__coll_fn(k->sig.kind);
  nccl_request *q = NULL;
  MPU_CHECK(mpu__nccl_begin(c, fn));
  MPU_CHECK(mpu__nccl_request_new(fn, &q));
  mpu_result_t r = mpu__nccl_enter(c, fn);
  if (!r) {
    r = mpu__nccl_issued(c, mpu__nccl_p2p(impl_of(c), k), fn);
    mpu__nccl_leave(c);
  }
  if (!r) r = mpu__nccl_event_record(c, q->event, fn);
  q->captured = mpu__nccl_capturing(impl_of(c));
  if (r) {
    mpu__nccl_request_free(q);
    return r;
  }
  *handle = q;
  return MPU_SUCCESS;
}

mpu_result_t mpu__nccl_native_handle(const mpu_comm *c, void **out) {
  MPU_CHECK(mpu__nccl_usable(c, "mpu_comm_nccl_handle"));
  *out = impl_of(c)->comm;
  return MPU_SUCCESS;
}
