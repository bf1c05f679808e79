/*
 * progress.c - the threads backend's non-blocking calls: they progress
 * without a wait.
 *
 * A non-blocking call is an op of its group, found by its number among the
 * group's non-blocking calls (every member issues them in the same order).
 * Starting one describes this member's call in the op and returns at once.
 * Once every member has started it the op is ready (every member's buffers
 * are known: collectives need nothing else), and the first member that then
 * waits for, tests or settles it (or a later op of the group), or releases
 * it, starts moving its data; the op's work is one task per member (as in a
 * blocking call, where each member runs its own), and every member that comes
 * to wait, test or settle while tasks are left takes the next one. So a
 * member that is still computing when the call becomes ready keeps
 * computing, one that waits (idle anyway) does the work, and members that
 * wait together share it as a blocking call would: the call's copies are
 * hidden behind the slower members' compute. A test of a call that every
 * member has started returns with it complete: it takes the tasks left and
 * waits for those other members are running. Waits in any order complete,
 * since the waiter runs what it waits for once its members have started it,
 * whatever the others are doing.
 *
 * Measured against a progress thread per world (docs/design.md, "progress
 * without a wait"): on a machine whose cores all run ranks, a progress thread
 * takes a core from a rank exactly when it has work, and each call pays two
 * hand-offs; a waiting member does the same work with no hand-off.
 *
 * Buffers: an op reads and writes the members' buffers only between its last
 * member's start and its completion, and never afterwards; a member must not
 * touch them from its start until its wait (or test) says the call completed
 * (mpu_request_free: until a later completed call on the communicator).
 *
 * An op either completes for every member or fails for every member: a
 * member that waits past the communicator's timeout, sees the world poisoned
 * or a missing member gone fails the pending op for all; one that is still
 * running always completes. An op settles only after every earlier op of its
 * group, so a wait or test fails the earlier pending ops in the same way
 * (a wait for the last of several calls ends by its deadline too).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/threads/threads.h"
#include "core/clock.h"
#include "core/error.h"

#define SLICE_S 0.01

enum { TOP_PENDING, TOP_READY, TOP_RUNNING, TOP_DONE };

void mpu__tops_init(tgroup *g) {
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_mutex_init(&g->ops_lock, NULL);
  pthread_cond_init(&g->ops_cond, &ca);
  pthread_condattr_destroy(&ca);
}

static void op_free(top *op) {
  free(op->calls);
  free(op->has);
  free(op);
}

void mpu__tops_free(tgroup *g) {
  while (g->ops) {
    top *op = g->ops;
    g->ops = op->next;
    op_free(op);
  }
  pthread_mutex_destroy(&g->ops_lock);
  pthread_cond_destroy(&g->ops_cond);
}

/* The op numbered seq, made if no member has started it yet. Caller holds
 * the lock. NULL: out of memory. */
static top *op_find(tgroup *g, uint64_t seq) {
  top **link = &g->ops;
  for (; *link; link = &(*link)->next)
    if ((*link)->seq == seq) return *link;
  top *op = calloc(1, sizeof *op);
  mpu__call *calls = calloc((size_t)g->n, sizeof *calls);
  char *has = calloc((size_t)g->n, 1);
  if (!op || !calls || !has) {
    free(op), free(calls), free(has);
    return NULL;
  }
  *op = (top){.seq = seq, .state = TOP_PENDING, .calls = calls, .has = has};
  *link = op;
  return op;
}

/* End op with result and message, for every member. Caller holds the lock. */
static void op_finish(tgroup *g, top *op, mpu_result_t result, const char *message) {
  op->state = TOP_DONE;
  op->result = result;
  snprintf(op->message, sizeof op->message, "%s", result ? message : "");
  pthread_cond_broadcast(&g->ops_cond);
}

static void op_move(tcomm *tc, top *op);

static int tasks_left(const tgroup *g, const top *op) {
  return op->state == TOP_RUNNING && op->moving && op->next_task < g->n;
}

/* Take the op's tasks one at a time until none is left; the member that
 * finishes the last one ends the op. Caller holds the lock; it is dropped
 * while a task runs. */
static void run_tasks(tcomm *tc, top *op) {
  tgroup *g = tc->g;
  while (tasks_left(g, op)) {
    int t = op->next_task++;
    pthread_mutex_unlock(&g->ops_lock);
    mpu__ttask(tc, op->calls, t);
    pthread_mutex_lock(&g->ops_lock);
    if (++op->tasks_done == g->n) op_finish(g, op, MPU_SUCCESS, "");
  }
}

/* Run the ready ops of the group up to and including `upto` (all with NULL),
 * oldest first: claim the ready ones, and take tasks of running ones. Caller
 * holds the lock; it is dropped while data moves. */
static void drive(tcomm *tc, const top *upto) {
  tgroup *g = tc->g;
  for (top *p = g->ops; p;) {
    if (p->state == TOP_READY) {
      p->state = TOP_RUNNING;
      pthread_mutex_unlock(&g->ops_lock);
      op_move(tc, p);
      pthread_mutex_lock(&g->ops_lock);
      p = g->ops; /* the list may have changed meanwhile */
      continue;
    }
    if (tasks_left(g, p)) {
      run_tasks(tc, p);
      p = g->ops;
      continue;
    }
    if (p == upto) break;
    p = p->next;
  }
}

/* Move the op's data: every member has started it, and this member claimed
 * it. Runs without the lock: nothing in the op changes while it runs. */
static void op_move(tcomm *tc, top *op) {
  tgroup *g = tc->g;
  /* after every earlier call: one may read what an earlier one writes. Every
   * member started them before this one, so they are ready or running: run
   * the ready ones here, and wait for the running ones to end */
  pthread_mutex_lock(&g->ops_lock);
  for (const top *p = g->ops; p != op;) {
    if (p->state == TOP_DONE) {
      p = p->next;
      continue;
    }
    if (p->state == TOP_READY || tasks_left(g, p)) {
      drive(tc, p);
    } else {
      struct timespec until = mpu__tabs_after(SLICE_S);
      pthread_cond_timedwait(&g->ops_cond, &g->ops_lock, &until);
    }
    p = g->ops; /* the list may have changed meanwhile */
  }
  pthread_mutex_unlock(&g->ops_lock);
  const char *fn = mpu__coll_fn(op->calls[0].sig.kind);
  mpu_result_t r = mpu__tcheck(tc, op->calls, fn);
  pthread_mutex_lock(&g->ops_lock);
  if (r) {
    op_finish(g, op, r, mpu_last_error());
  } else {
    op->moving = 1;
    pthread_cond_broadcast(&g->ops_cond); /* waiters may take tasks */
    run_tasks(tc, op);
  }
  pthread_mutex_unlock(&g->ops_lock);
}

mpu_result_t mpu__tstart_nb(mpu_comm *c, const mpu__call *call, void **handle) {
  tcomm *tc = c->impl;
  tgroup *g = tc->g;
  pthread_mutex_lock(&g->ops_lock);
  top *op = op_find(g, tc->nb_seq + 1);
  if (!op) {
    pthread_mutex_unlock(&g->ops_lock);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a non-blocking call of %d ranks",
                      mpu__coll_fn(call->sig.kind), g->n);
  }
  tc->nb_seq++;
  op->calls[tc->me] = *call;
  op->has[tc->me] = 1;
  if (++op->posted == g->n && op->state == TOP_PENDING) {
    op->state = TOP_READY; /* the first member to wait, test or settle moves it */
    pthread_cond_broadcast(&g->ops_cond);
  }
  pthread_mutex_unlock(&g->ops_lock);
  *handle = op;
  return MPU_SUCCESS;
}

/* Why a pending op cannot complete (a reason word, 0: it still may). Caller
 * holds the lock. */
static uint64_t op_failure(const tgroup *g, const top *op) {
  tworld *w = g->world;
  uint64_t poison = atomic_load(&w->poison);
  if (poison) return poison;
  for (int m = 0; m < g->n; m++) {
    if (op->has[m]) continue;
    if (atomic_load(&g->mem[m].departed)) return tc_pack(TC_DESTROYED, MPU_ERR_ABORTED, g->members[m]);
    if (atomic_load(&w->gone[g->members[m]]))
      return tc_pack(TC_EXITED, MPU_ERR_ABORTED, g->members[m]);
  }
  return 0;
}

/* Fail a pending op for every member, for `reason`. Caller holds the lock. */
static void op_fail(tgroup *g, top *op, uint64_t reason, const char *detail) {
  char text[200], msg[1024];
  mpu__treason_text(reason, text, sizeof text);
  snprintf(msg, sizeof msg, "%s: communicator of %d ranks is broken: %s%s",
           mpu__coll_fn(op->calls[0].sig.kind), g->n, text, detail);
  op_finish(g, op, (tcause)(reason >> 48) == TC_TIMEOUT ? MPU_ERR_TIMEOUT : MPU_ERR_ABORTED, msg);
}

/* The members that have not started op, for a timeout's message. */
static void missing(const tgroup *g, const top *op, char *buf, size_t len, int *first) {
  size_t used = (size_t)snprintf(buf, len, "; missing ranks of this communicator:");
  *first = -1;
  for (int m = 0; m < g->n && used < len; m++)
    if (!op->has[m]) {
      used += (size_t)snprintf(buf + used, len - used, " %d (world %d)", m, g->members[m]);
      if (*first < 0) *first = g->members[m];
    }
}

/* Whether op is done, and so is every earlier op of the group: calls complete
 * in order, so a completed request says the buffers of every earlier call on
 * the communicator (freed requests' too) are the owner's again. Earlier ops
 * still running end soon: every member started them before op.
 * Caller holds the lock. */
static int op_settled(const tgroup *g, const top *op) {
  if (op->state != TOP_DONE) return 0;
  for (const top *p = g->ops; p != op; p = p->next)
    if (p->state != TOP_DONE) return 0;
  return 1;
}

/* Fail every pending op up to and including `upto` that can no longer
 * complete (a member that has not started it is gone, or the world is
 * poisoned). An op settles only once every earlier one has, so a wait or test
 * of a later op must end the earlier ones too: else it would wait for calls
 * nobody can finish. Caller holds the lock. */
static void fail_lost(tgroup *g, const top *upto) {
  for (top *p = g->ops; p; p = p->next) {
    if (p->state == TOP_PENDING) {
      uint64_t reason = op_failure(g, p);
      if (reason) op_fail(g, p, reason, "");
    }
    if (p == upto) break;
  }
}

/* The oldest op up to and including `upto` that not every member has started
 * (NULL: none). Caller holds the lock. */
static top *oldest_pending(const tgroup *g, const top *upto) {
  for (top *p = g->ops; p; p = p->next) {
    if (p->state == TOP_PENDING) return p;
    if (p == upto) break;
  }
  return NULL;
}

/* The op's result for this member, as the call's error. Caller holds the lock. */
static mpu_result_t op_result(const top *op) {
  return op->result ? mpu__error(op->result, "%s", op->message) : MPU_SUCCESS;
}

mpu_result_t mpu__ttest(mpu_comm *c, void *handle, int *done) {
  tgroup *g = ((tcomm *)c->impl)->g;
  top *op = handle;
  mpu_result_t r = MPU_SUCCESS;
  pthread_mutex_lock(&g->ops_lock);
  fail_lost(g, op);
  drive((tcomm *)c->impl, op); /* a test progresses what is ready, as MPI_Test does */
  /* every member started it, and its tasks that are left are under way on
   * other members (copies that end by themselves): the test waits for them,
   * so a member that tests a call all members started finds it complete */
  while (op->state == TOP_RUNNING) {
    struct timespec until = mpu__tabs_after(SLICE_S);
    pthread_cond_timedwait(&g->ops_cond, &g->ops_lock, &until);
    drive((tcomm *)c->impl, op);
  }
  *done = op_settled(g, op);
  if (*done) {
    r = op_result(op);
    tcomm *tc = c->impl;
    if (op->seq > tc->nb_settled) tc->nb_settled = op->seq;
  }
  pthread_mutex_unlock(&g->ops_lock);
  return r;
}

/* Wait for op to settle, up to timeout_s (< 0: the communicator's timeout,
 * which fails the op, and every earlier op still pending, for every member).
 * Ops that a gone member never started fail at once. So a wait on any of a
 * communicator's requests ends by its deadline whatever happened to the
 * earlier ones. Caller holds the lock. */
static mpu_result_t wait_locked(tcomm *tc, top *op, double timeout_s) {
  tgroup *g = tc->g;
  double limit = timeout_s < 0 ? g->world->timeout_s : timeout_s;
  double deadline = mpu__now() + limit;
  while (!op_settled(g, op)) {
    fail_lost(g, op);
    top *stuck = oldest_pending(g, op);
    if (stuck && mpu__now() >= deadline) {
      char detail[400];
      int first;
      missing(g, stuck, detail, sizeof detail, &first);
      if (timeout_s >= 0) /* the caller's own limit: the call stays pending */
        return mpu__error(MPU_ERR_TIMEOUT, "%s: not complete after %.3g s%s%s",
                          mpu__coll_fn(op->calls[tc->me].sig.kind), limit,
                          stuck == op ? "" : " (an earlier call on the communicator is not)",
                          detail);
      op_fail(g, stuck, tc_pack(TC_TIMEOUT, MPU_ERR_TIMEOUT, first), detail);
      continue;
    }
    drive(tc, op); /* ready ones (this or earlier): this member moves them */
    if (op_settled(g, op)) break;
    /* running (or an earlier op is, or pending): whoever claimed it finishes it */
    struct timespec until = mpu__tabs_after(SLICE_S);
    pthread_cond_timedwait(&g->ops_cond, &g->ops_lock, &until);
  }
  if (op->seq > tc->nb_settled) tc->nb_settled = op->seq;
  return op_result(op);
}

mpu_result_t mpu__twait(mpu_comm *c, void *handle, double timeout_s) {
  tcomm *tc = c->impl;
  pthread_mutex_lock(&tc->g->ops_lock);
  mpu_result_t r = wait_locked(tc, handle, timeout_s);
  pthread_mutex_unlock(&tc->g->ops_lock);
  return r;
}

mpu_result_t mpu__tsettle(tcomm *tc, const char *fn) {
  tgroup *g = tc->g;
  mpu_result_t r = MPU_SUCCESS;
  pthread_mutex_lock(&g->ops_lock);
  top *op = g->ops;
  while (op && op->seq != tc->nb_seq) op = op->next;
  if (op) r = wait_locked(tc, op, -1); /* absent: every member released it, so done */
  else tc->nb_settled = tc->nb_seq;
  pthread_mutex_unlock(&g->ops_lock);
  if (r) {
    char msg[1200];
    snprintf(msg, sizeof msg, "%s: an earlier non-blocking call failed: %s", fn, mpu_last_error());
    mpu__error(r, "%s", msg);
  }
  return r;
}

void mpu__trelease(mpu_comm *c, void *handle) {
  tcomm *tc = c->impl;
  tgroup *g = tc->g;
  top *op = handle;
  pthread_mutex_lock(&g->ops_lock);
  drive(tc, op); /* ready: every member's buffers are still there, so it runs */
  if (op->state == TOP_PENDING) { /* leaving before it ran: its buffers go too */
    char msg[300];
    snprintf(msg, sizeof msg,
             "%s: world rank %d released the call (destroyed its communicator) before it ran",
             mpu__coll_fn(op->calls[tc->me].sig.kind), g->members[tc->me]);
    op_finish(g, op, MPU_ERR_ABORTED, msg);
  }
  while (op->state != TOP_DONE) { /* running: it reads our buffers until it is done */
    struct timespec until = mpu__tabs_after(SLICE_S);
    pthread_cond_timedwait(&g->ops_cond, &g->ops_lock, &until);
  }
  if (++op->released == g->n) { /* every member is done with it */
    top **link = &g->ops;
    while (*link != op) link = &(*link)->next;
    *link = op->next;
    op_free(op);
  }
  pthread_mutex_unlock(&g->ops_lock);
}
