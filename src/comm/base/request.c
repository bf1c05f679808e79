/*
 * request.c - non-blocking collectives: requests, their queue per
 * communicator, and the order every backend keeps.
 *
 * A backend whose non-blocking calls progress on their own (threads: the last
 * member to start a call runs it; MPI: MPI's I-collectives; NCCL: the
 * stream) starts the call at once and its request wraps the backend's
 * handle. For the others the request holds the call, queued on its
 * communicator; the queue runs in order at a wait or test, and before any
 * blocking call on the communicator, so calls happen in the order they were
 * issued on every rank (the rule MPI and NCCL have), and a rank blocked in a
 * later call never waits for peers stuck behind an earlier one that was never
 * run.
 *
 * mpu_request_free hands a request over: it moves to its communicator's
 * freed list, which every later call on the communicator (and its destroy)
 * reaps from the front, releasing what has completed, so requests nobody
 * waits for do not pile up.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/base/group.h"
#include "comm/comm_internal.h"
#include "core/error.h"
#include "core/registry.h"

#define REQ_MAGIC UINT64_C(0x6d70752d72657175) /* "mpu-requ" */

typedef enum { QUEUED, STARTED, DONE } req_state;

struct mpu_request {
  uint64_t magic;
  mpu_comm *comm;      /* NULL once its communicator is gone */
  mpu__call call;
  const char *fn;
  req_state state;
  mpu_result_t result; /* when DONE */
  char message[512];   /* the failure's message, handed back at wait */
  void *native;        /* STARTED: the backend's handle */
  mpu_request *next;   /* the communicator's queue, or its freed list */
  mpu_request *next_live;
  uint64_t group;      /* the mpu_group_start bracket it was made in (0: none) */
  int freed;           /* mpu_request_free'd: nobody will wait for it */
};

static _Atomic long allocated; /* requests alive in the process (mpu__request_count) */

long mpu__request_count(void) { return atomic_load(&allocated); }

static mpu_request *request_new(void) {
  mpu_request *r = calloc(1, sizeof *r);
  if (r) atomic_fetch_add(&allocated, 1);
  return r;
}

static void request_delete(mpu_request *r) {
  r->magic = 0;
  free(r);
  atomic_fetch_sub(&allocated, 1);
}

/* Whether c's non-blocking calls are started at once (a backend handle, or
 * done already), never queued. */
static int starts_at_once(const mpu_comm *c) { return c->ops->start_nb || c->ops->wait; }

/* ---- live requests: a wait on a freed or foreign pointer is caught --------- */

static mpu__registry live = MPU__REGISTRY_INIT(mpu_request, next_live);

static void live_add(mpu_request *r) { mpu__registry_add(&live, r); }

/* 1 if r is live (and, with take, no longer), comparing pointers only. */
static int live_find(const mpu_request *r, int take) {
  return take ? mpu__registry_take(&live, r, NULL) == 1 : mpu__registry_find(&live, r);
}

static mpu_result_t check_request(const char *fn, const mpu_request *r) {
  if (!r) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: request is NULL", fn);
  if (!live_find(r, 0))
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "%s: %p is not a pending request (completed already, or never issued)", fn,
                      (const void *)r);
  if (r->group && r->group == mpu__group_serial())
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "%s: the request was made inside the open mpu_group_start/end bracket; "
                      "its call starts at mpu_group_end (call that first)",
                      fn);
  return MPU_SUCCESS;
}

/* ---- running calls ------------------------------------------------------------ */

/* A copy within the communicator's memory (device memory on device backends). */
static mpu_result_t local_copy(mpu_comm *c, void *dst, const void *src, size_t bytes) {
  if (!bytes || dst == src) return MPU_SUCCESS;
  if (c->ops->copy2d) return c->ops->copy2d(c, dst, bytes, src, bytes, bytes, 1);
  memmove(dst, src, bytes);
  return MPU_SUCCESS;
}

/* A group of one, the same for every backend: outputs are the inputs. */
static mpu_result_t alone(mpu_comm *c, const mpu__call *k) {
  size_t es = mpu_dtype_size((mpu_dtype)k->sig.dtype);
  char *recv = k->recv;
  const char *send = k->send;
  switch (k->sig.kind) {
  case MPU_COLL_BROADCAST:
  case MPU_COLL_BARRIER: return MPU_SUCCESS;
  /* an empty block's buffers may be NULL: no arithmetic on them */
  case MPU_COLL_ALL_GATHER_V:
    if (!k->counts[0]) return MPU_SUCCESS;
    return local_copy(c, recv + k->displs[0] * es, send, k->counts[0] * es);
  case MPU_COLL_REDUCE_SCATTER_V: return local_copy(c, recv, send, k->counts[0] * es);
  case MPU_COLL_ALL_TO_ALL_V:
    if (!k->counts[0]) return MPU_SUCCESS;
    return local_copy(c, recv + k->rdispls[0] * es, send + k->displs[0] * es, k->counts[0] * es);
  default: return local_copy(c, recv, send, (size_t)k->sig.count * es);
  }
}

mpu_result_t mpu__run_call(mpu_comm *c, const mpu__call *k) {
  int p2p = mpu__coll_of(k->sig.kind)->p2p; /* never answered here: a message to oneself */
  if (p2p) return p2p == MPU__CALL_SEND ? c->ops->send(c, k) : c->ops->recv(c, k);
  if (mpu__comm_answers_alone(c)) return alone(c, k);
  void *handle = NULL;
  MPU_CHECK(c->ops->start(c, k, &handle));
  if (!handle) return MPU_SUCCESS;
  mpu_result_t r = c->ops->wait(c, handle, -1);
  c->ops->release(c, handle);
  return r;
}

static void finish(mpu_request *r, mpu_result_t result) {
  r->state = DONE;
  r->result = result;
  if (result) snprintf(r->message, sizeof r->message, "%s", mpu_last_error());
}

/* Run queued requests in order, up to and including `until` (all if NULL). */
static void run_queue(mpu_comm *c, const mpu_request *until) {
  while (c->queue_head) {
    mpu_request *r = c->queue_head;
    c->queue_head = r->next;
    if (!c->queue_head) c->queue_tail = NULL;
    r->next = NULL;
    finish(r, mpu__run_call(c, &r->call));
    r->comm = NULL; /* off the list: nothing of the communicator is needed any more */
    int last = r == until;
    if (r->freed) request_delete(r); /* nobody waits for it */
    if (last) break;
  }
}

void mpu__request_run(mpu_request *r) {
  if (r->state == QUEUED && r->comm) run_queue(r->comm, r);
}

mpu_result_t mpu__flush(mpu_comm *c) {
  if (c->queue_head && !starts_at_once(c)) run_queue(c, NULL);
  return MPU_SUCCESS;
}

/* Take r off its communicator's list (native requests leave out of order). */
static void unlink_request(mpu_request *r) {
  mpu_comm *c = r->comm;
  if (!c) return;
  mpu_request *prev = NULL;
  for (mpu_request *p = c->queue_head; p; prev = p, p = p->next)
    if (p == r) {
      if (prev) prev->next = r->next;
      else c->queue_head = r->next;
      if (c->queue_tail == r) c->queue_tail = prev;
      break;
    }
  r->next = NULL;
}

/* Release the freed requests of c that have completed, oldest first, up to
 * the first still running (all of them with `all`: the communicator goes). */
static void reap(mpu_comm *c, int all) {
  while (c->freed_head) {
    mpu_request *r = c->freed_head;
    if (!all && r->state == STARTED) {
      int fin = 0;
      if (!c->ops->test(c, r->native, &fin) && !fin) break; /* a failure ends it too */
    }
    c->freed_head = r->next;
    if (!c->freed_head) c->freed_tail = NULL;
    if (r->state == STARTED) c->ops->release(c, r->native);
    request_delete(r);
  }
}

void mpu__detach_requests(mpu_comm *c) {
  reap(c, 1);
  for (mpu_request *r = c->queue_head, *next; r; r = next) {
    next = r->next;
    if (r->state == STARTED) c->ops->release(c, r->native);
    r->native = NULL;
    r->next = NULL;
    r->comm = NULL;
    r->state = DONE;
    if (r->freed) { /* nobody will ask */
      request_delete(r);
      continue;
    }
    r->result = MPU_ERR_INVALID_USAGE;
    snprintf(r->message, sizeof r->message,
             "%s: the communicator was destroyed before the call ran", r->fn);
  }
  c->queue_head = c->queue_tail = NULL;
}

mpu_result_t mpu__submit(const char *fn, mpu_comm *c, const mpu__call *call, mpu_request **req) {
  MPU_CHECK(mpu__group_enter(c));
  if (!req && mpu__group_open()) return mpu__group_call(fn, c, call);
  if (c->freed_head) reap(c, 0);
  if (!req) { /* blocking: what was issued before runs first */
    double t0 = mpu__clock_start();
    mpu_result_t res = mpu__flush(c);
    if (!res) res = mpu__run_call(c, call);
    return mpu__clock_add(t0, res);
  }
  mpu_request *r = request_new();
  if (!r) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a request", fn);
  *r = (mpu_request){REQ_MAGIC, c, *call, fn, QUEUED, MPU_SUCCESS, "", NULL, NULL, NULL,
                     mpu__group_serial(), 0};
  if (starts_at_once(c)) {
    /* earlier queued calls cannot exist (nothing is ever queued). The start
     * is on the clock (a backend's start may move data) */
    double t0 = mpu__clock_start();
    mpu_result_t res = mpu__comm_answers_alone(c) ? alone(c, call)
                       : c->ops->start_nb ? c->ops->start_nb(c, call, &r->native)
                                          : c->ops->start(c, call, &r->native);
    res = mpu__clock_add_time(t0, res);
    if (res) {
      request_delete(r);
      return res;
    }
    if (r->native) r->state = STARTED;
    else r->state = DONE, r->comm = NULL;
  }
  /* every outstanding request is on the list (native ones, to be detached
   * if the communicator goes first) */
  if (r->state == DONE) {
    /* a group of one: answered already */
  } else if (c->queue_tail) {
    c->queue_tail->next = r;
    c->queue_tail = r;
  } else {
    c->queue_head = c->queue_tail = r;
  }
  if (r->state == QUEUED && mpu__group_open()) { /* runs in order at the group's end */
    mpu_result_t res = mpu__group_request(fn, c, r);
    if (res) {
      unlink_request(r);
      request_delete(r);
      return res;
    }
  }
  live_add(r);
  *req = r;
  return MPU_SUCCESS;
}

/* ---- waiting ------------------------------------------------------------------- */

static mpu_result_t complete(mpu_request *r) {
  live_find(r, 1);
  mpu_result_t res = r->result;
  if (res) mpu__error(res, "%s", r->message);
  if (r->native && r->comm) r->comm->ops->release(r->comm, r->native);
  unlink_request(r);
  request_delete(r);
  return res;
}

/* Progress r: run the queue up to it, or ask the backend. */
static mpu_result_t progress(mpu_request *r, int block, double timeout_s, int *done) {
  *done = 0;
  if (r->state == QUEUED) run_queue(r->comm, r);
  if (r->state == STARTED) {
    mpu_comm *c = r->comm;
    mpu_result_t res;
    if (block) {
      res = c->ops->wait(c, r->native, timeout_s);
      if (res == MPU_ERR_TIMEOUT && timeout_s >= 0) {
        /* the caller's own limit passed, or a peer's timeout failed the call:
         * a test tells which, so a failed call ends here rather than being
         * called pending at every wait */
        char why[sizeof r->message];
        snprintf(why, sizeof why, "%s", mpu_last_error());
        int fin = 0;
        mpu_result_t t = c->ops->test(c, r->native, &fin);
        if (!t && !fin) return mpu__error(res, "%s", why); /* still pending */
        res = t;
      }
      finish(r, res);
    } else {
      int fin = 0;
      res = c->ops->test(c, r->native, &fin);
      if (res || fin) finish(r, res);
    }
  }
  *done = r->state == DONE;
  return MPU_SUCCESS;
}

mpu_result_t mpu_request_wait(mpu_request *req) {
  int done;
  MPU_CHECK(check_request("mpu_request_wait", req));
  double t0 = mpu__clock_start();
  mpu_result_t res = progress(req, 1, -1, &done);
  MPU_CHECK(mpu__clock_add(t0, res));
  return complete(req);
}

mpu_result_t mpu_request_wait_timeout(mpu_request *req, double timeout_s) {
  static const char fn[] = "mpu_request_wait_timeout";
  int done;
  MPU_CHECK(check_request(fn, req));
  if (!(timeout_s >= 0) || timeout_s > 1e9)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: timeout %g s (want 0..1e9)", fn, timeout_s);
  double t0 = mpu__clock_start();
  MPU_CHECK(mpu__clock_add(t0, progress(req, 1, timeout_s, &done)));
  return complete(req);
}

mpu_result_t mpu_request_test(mpu_request *req, int *done) {
  static const char fn[] = "mpu_request_test";
  MPU_CHECK(check_request(fn, req));
  if (!done) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: done is NULL", fn);
  double t0 = mpu__clock_start();
  MPU_CHECK(mpu__clock_add(t0, progress(req, 0, 0, done)));
  return *done ? complete(req) : MPU_SUCCESS;
}

mpu_result_t mpu_request_free(mpu_request *req) {
  MPU_CHECK(check_request("mpu_request_free", req));
  live_find(req, 1); /* the caller's handle is gone from here on */
  mpu_comm *c = req->comm;
  req->freed = 1;
  if (req->state == DONE) { /* a group of one, or already detached */
    request_delete(req);
    return MPU_SUCCESS;
  }
  if (req->state == QUEUED) { /* queued backends run it now, as a test would: then it goes */
    run_queue(c, req);
    return MPU_SUCCESS;
  }
  unlink_request(req);
  req->comm = c;
  if (c->freed_tail) c->freed_tail->next = req;
  else c->freed_head = req;
  c->freed_tail = req;
  reap(c, 0);
  return MPU_SUCCESS;
}

/* A device backend makes the stream wait for the request's event and returns
 * at once; the others have no stream, so the host waits for the call (a
 * program written once for both then reads correct results either way). The
 * request stays pending: mpu_request_wait or _test still free it. */
mpu_result_t mpu_request_stream_wait(mpu_request *req, void *stream) {
  static const char fn[] = "mpu_request_stream_wait";
  int done;
  MPU_CHECK(check_request(fn, req));
  if (req->state == STARTED && req->comm->ops->stream_wait)
    return req->comm->ops->stream_wait(req->comm, req->native, stream);
  double t0 = mpu__clock_start();
  MPU_CHECK(mpu__clock_add(t0, progress(req, 1, -1, &done)));
  if (req->result) return mpu__error(req->result, "%s", req->message);
  return MPU_SUCCESS;
}
