/*
 * group.c - mpu_group_start / mpu_group_end: several calls on several
 * communicators issued as one step, for every backend in one place.
 *
 * A backend with its own groups (NCCL: ops->group_start) gets one
 * ncclGroupStart at the first of its calls in the bracket and one
 * ncclGroupEnd at the outermost mpu_group_end; its calls are enqueued at
 * once (NCCL launches them at its group end) and waited for after it.
 *
 * The host backends (threads, MPI, fake) have no such launch, so their
 * blocking calls are recorded and run at the outermost mpu_group_end: every
 * send first (a host send is eager, it never waits for its recv), then the
 * receives and collectives in the order they were issued. A send/recv pair
 * that would deadlock as two blocking calls (both ranks sending first with
 * a rendezvous, or both receiving first) therefore completes, as in NCCL.
 * Collectives on several communicators run one after the other, so on host
 * backends every rank issues them in the same order (NCCL does not need
 * this; a program that keeps it runs on every backend).
 *
 * State is per thread, like NCCL's: a rank of the threads backend is a
 * thread, an MPI rank a process.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/base/group.h"
#include "core/error.h"

typedef enum { G_CALL, G_REQUEST } grouped_kind;

typedef struct grouped {
  struct grouped *next;
  grouped_kind kind;
  mpu_comm *comm;
  const char *fn;
  mpu__call call;   /* G_CALL on a host backend; its count lists are owned copies */
  size_t *lists;    /* those copies, one block */
  void *native;     /* started on a backend with groups: its handle, waited after the group */
  mpu_request *req; /* G_REQUEST: a host backend's non-blocking call, started in order at the end */
} grouped;

#define MAX_OPENED 4 /* backends with groups in one bracket (there is one: NCCL) */

static _Thread_local int depth;
static _Thread_local uint64_t serial;
static _Atomic uint64_t next_serial; /* unique over threads: a request may be waited for elsewhere */
static _Thread_local grouped *head, *tail;
static _Thread_local const mpu__comm_ops *opened[MAX_OPENED];
static _Thread_local int nopened;

int mpu__group_open(void) { return depth > 0; }

uint64_t mpu__group_serial(void) { return depth > 0 ? serial : 0; }

int mpu__group_holds(const mpu_comm *c) {
  for (const grouped *g = head; g; g = g->next)
    if (g->comm == c) return 1;
  return 0;
}

mpu_result_t mpu__group_refuse(const char *fn) {
  if (depth > 0)
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "%s: not allowed between mpu_group_start and mpu_group_end (call "
                      "mpu_group_end first)",
                      fn);
  return MPU_SUCCESS;
}

mpu_result_t mpu__group_enter(mpu_comm *c) {
  if (depth == 0) return MPU_SUCCESS;
  /* a host backend runs what was queued on c before the group now, as a
   * blocking call would: the group's calls then keep the issue order */
  if (!c->ops->group_start) return mpu__group_holds(c) ? MPU_SUCCESS : mpu__flush(c);
  for (int i = 0; i < nopened; i++)
    if (opened[i] == c->ops) return MPU_SUCCESS;
  if (nopened == MAX_OPENED)
    return mpu__error(MPU_ERR_UNSUPPORTED, "mpu_group_start: more than %d device backends in one group",
                      MAX_OPENED);
  MPU_CHECK(c->ops->group_start());
  opened[nopened++] = c->ops;
  return MPU_SUCCESS;
}

static void append(grouped *g) {
  if (tail) tail->next = g;
  else head = g;
  tail = g;
}

static grouped *new_entry(const char *fn, mpu_comm *c, grouped_kind kind) {
  grouped *g = calloc(1, sizeof *g);
  if (!g) {
    mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a call inside mpu_group_start/end", fn);
    return NULL;
  }
  g->kind = kind, g->comm = c, g->fn = fn;
  return g;
}

/* Copy the count lists a host call holds until it runs (the caller's may go). */
static mpu_result_t own_lists(const char *fn, grouped *g, int n) {
  const size_t **lists[4] = {&g->call.counts, &g->call.displs, &g->call.rcounts, &g->call.rdispls};
  size_t bytes;
  if (__builtin_mul_overflow((size_t)n, 4 * sizeof(size_t), &bytes))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d ranks' counts overflow", fn, n);
  int any = 0;
  for (int i = 0; i < 4; i++) any |= *lists[i] != NULL;
  if (!any) return MPU_SUCCESS;
  g->lists = malloc(bytes);
  if (!g->lists) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d ranks' counts", fn, n);
  for (int i = 0; i < 4; i++)
    if (*lists[i]) {
      memcpy(g->lists + (size_t)i * (size_t)n, *lists[i], (size_t)n * sizeof(size_t));
      *lists[i] = g->lists + (size_t)i * (size_t)n;
    }
  return MPU_SUCCESS;
}

mpu_result_t mpu__group_call(const char *fn, mpu_comm *c, const mpu__call *call) {
  int p2p = mpu__coll_of(call->sig.kind)->p2p;
  MPU_CHECK(mpu__group_enter(c));
  /* a collective of one is a copy at most; a message to oneself waits for its turn */
  if (!p2p && mpu__comm_answers_alone(c)) return mpu__run_call(c, call);
  grouped *g = new_entry(fn, c, G_CALL);
  if (!g) return MPU_ERR_OUT_OF_MEMORY;
  mpu_result_t r;
  if (c->ops->group_start) {
    r = p2p ? c->ops->p2p_start(c, call, &g->native) : c->ops->start(c, call, &g->native);
  } else {
    g->call = *call;
    r = own_lists(fn, g, c->size);
  }
  if (r) {
    free(g->lists);
    free(g);
    return r;
  }
  append(g);
  return MPU_SUCCESS;
}

mpu_result_t mpu__group_request(const char *fn, mpu_comm *c, mpu_request *req) {
  grouped *g = new_entry(fn, c, G_REQUEST);
  if (!g) return MPU_ERR_OUT_OF_MEMORY;
  g->req = req;
  append(g);
  return MPU_SUCCESS;
}

mpu_result_t mpu_group_start(void) {
  if (depth == INT32_MAX)
    return mpu__error(MPU_ERR_INVALID_USAGE, "mpu_group_start: groups nested too deep");
  if (depth++ == 0) serial = atomic_fetch_add(&next_serial, 1) + 1;
  return MPU_SUCCESS;
}

/* Keep the first failure (code and message) of the calls run at the end. */
static void keep(mpu_result_t r, mpu_result_t *first, char *msg, size_t cap) {
  if (r && !*first) {
    *first = r;
    snprintf(msg, cap, "%s", mpu_last_error());
  }
}

/* Run one recorded host call now (the bracket is closed: nothing defers). */
static mpu_result_t run_host(grouped *g) {
  if (g->kind == G_CALL) return mpu__run_call(g->comm, &g->call);
  mpu__request_run(g->req); /* started here; its wait hands back its result */
  return MPU_SUCCESS;
}

/* A host send is eager: it runs first, so no receive waits for it. */
static int is_send(const grouped *g) {
  return g->kind == G_CALL && mpu__coll_of(g->call.sig.kind)->p2p == MPU__CALL_SEND;
}

mpu_result_t mpu_group_end(void) {
  static const char fn[] = "mpu_group_end";
  if (depth == 0)
    return mpu__error(MPU_ERR_INVALID_USAGE, "%s: no group is open (mpu_group_start first)", fn);
  if (--depth > 0) return MPU_SUCCESS;
  grouped *list = head;
  head = tail = NULL;
  mpu_result_t first = MPU_SUCCESS;
  char msg[512] = "";
  double t0 = mpu__clock_start();
  /* the device backends launch their calls */
  const mpu__comm_ops *failed[MAX_OPENED];
  int nfailed = 0;
  for (int i = 0; i < nopened; i++) {
    mpu_result_t r = opened[i]->group_end();
    if (r) failed[nfailed++] = opened[i];
    keep(r, &first, msg, sizeof msg);
  }
  nopened = 0;
  /* the host backends: sends, then everything else in order */
  for (grouped *g = list; g; g = g->next)
    if (!g->comm->ops->group_start && is_send(g)) keep(run_host(g), &first, msg, sizeof msg);
  for (grouped *g = list; g; g = g->next)
    if (!g->comm->ops->group_start && !is_send(g)) keep(run_host(g), &first, msg, sizeof msg);
  /* then the device calls complete */
  for (grouped *g = list, *next; g; g = next) {
    next = g->next;
    if (g->native) {
      mpu_comm *c = g->comm;
      int launched = 1;
      for (int i = 0; i < nfailed; i++) launched &= failed[i] != c->ops;
      if (launched) keep(c->ops->wait(c, g->native, -1), &first, msg, sizeof msg);
      c->ops->release(c, g->native);
    }
    free(g->lists);
    free(g);
  }
  mpu__clock_add(t0, first);
  if (first) return mpu__error(first, "%s: %s", fn, msg);
  return MPU_SUCCESS;
}

mpu_result_t mpu__group_abandon(const char *who) {
  if (depth == 0) return MPU_SUCCESS;
  int open = depth;
  size_t calls = 0;
  grouped *list = head;
  head = tail = NULL;
  depth = 0;
  /* a device backend's own group is closed (its calls launch: NCCL has no way
   * to drop them), so none of its state outlives the thread; nothing waits */
  for (int i = 0; i < nopened; i++) opened[i]->group_end();
  nopened = 0;
  for (grouped *g = list, *next; g; g = next) {
    next = g->next;
    if (g->native) g->comm->ops->release(g->comm, g->native);
    free(g->lists);
    free(g);
    calls++;
  }
  return mpu__error(MPU_ERR_INVALID_USAGE,
                    "%s returned inside %d open mpu_group_start bracket%s: its %zu posted "
                    "call%s never ran (end every bracket with mpu_group_end)",
                    who, open, open == 1 ? "" : "s", calls, calls == 1 ? "" : "s");
}
