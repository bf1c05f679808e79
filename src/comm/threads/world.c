/*
 * world.c - the threads backend's world: mpu_launch, groups and handles.
 *
 * mpu_launch makes a world of n ranks and one group over all of them, starts
 * one thread per rank with its own handle on that group, and after the last
 * thread returns frees everything the ranks left behind (handles they did not
 * destroy, messages never received), so a failing test leaks nothing.
 *
 * Group creation is collective over the members only and does not block: the
 * first member to ask for a member list makes the group and leaves it in the
 * world's pending list; the others join it. A member that asks for the same
 * list again joins the next pending group it is not yet part of, so repeated
 * creations pair up in order. Members meet at the group's first call.
 */
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/base/group.h"
#include "comm/threads/threads.h"
#include "core/cpus.h"
#include "core/env.h"
#include "core/error.h"
#include "core/options.h"

struct tpending {
  tpending *next;
  uint64_t parent;
  tgroup *g;
  int joined;
  char *has; /* [member]: already joined */
};

static const mpu__comm_ops threads_ops;

/* ---- groups ---------------------------------------------------------------- */

/* n zeroed elements of size bytes (a multiple of MPU_THREADS_LINE), starting
 * on a line of their own, for free(); NULL on overflow or without memory. */
static void *line_calloc(size_t n, size_t size) {
  void *p = NULL;
  if (!n || (size && n > SIZE_MAX / size) || posix_memalign(&p, MPU_THREADS_LINE, n * size))
    return NULL;
  memset(p, 0, n * size);
  return p;
}

static void group_free(tgroup *g) {
  if (!g) return;
  mpu__tops_free(g);
  free(g->members);
  free(g->calls[0]);
  free(g->calls[1]);
  free(g->scratch[0]);
  free(g->scratch[1]);
  free(g->mem);
  free(g);
}

/* A group over world ranks members[0..n-1]. Caller holds w->lock (for the id). */
static tgroup *group_new(tworld *w, const int *members, int n) {
  tgroup *g = line_calloc(1, sizeof *g);
  if (!g) return NULL;
  mpu__tops_init(g);
  g->world = w;
  g->n = n;
  g->id = ++w->next_id;
  g->members = malloc((size_t)n * sizeof(int));
  g->calls[0] = calloc((size_t)n, sizeof(mpu__call));
  g->calls[1] = calloc((size_t)n, sizeof(mpu__call));
  g->scratch[0] = aligned_alloc(64, (size_t)n * MPU_THREADS_SCRATCH);
  g->scratch[1] = aligned_alloc(64, (size_t)n * MPU_THREADS_SCRATCH);
  g->mem = line_calloc((size_t)n, sizeof *g->mem);
  if (!g->members || !g->calls[0] || !g->calls[1] || !g->scratch[0] || !g->scratch[1] ||
      !g->mem) {
    group_free(g);
    return NULL;
  }
  memcpy(g->members, members, (size_t)n * sizeof(int));
  for (int m = 0; m < n; m++) atomic_init(&g->mem[m].cpu, -1);
  return g;
}

static void group_release(tgroup *g) {
  if (atomic_fetch_sub(&g->refs, 1) == 1) group_free(g);
}

/* ---- handles --------------------------------------------------------------- */

/* A handle for member `me` of g (takes one reference). Caller holds w->lock. */
static mpu_result_t handle_new(tworld *w, tgroup *g, int me, mpu_comm **out) {
  tcomm *tc = line_calloc(1, sizeof *tc);
  const void **ptrs = calloc((size_t)g->n, sizeof *ptrs);
  void **dsts = calloc((size_t)g->n, sizeof *dsts);
  mpu_comm *c = tc && ptrs && dsts ? mpu__comm_new(&threads_ops, me, g->n, g->members, tc) : NULL;
  if (!c) {
    free(tc);
    free(ptrs);
    free(dsts);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "threads: cannot allocate a communicator of %d",
                      g->n);
  }
  tc->g = g;
  tc->me = me;
  tc->spin = w->spin;
  tc->ptrs = ptrs;
  tc->dsts = dsts;
  tc->base = c;
  atomic_fetch_add(&g->refs, 1);
  tc->next = w->handles;
  if (w->handles) w->handles->prev = tc;
  w->handles = tc;
  *out = c;
  return MPU_SUCCESS;
}

/* Unlink and free the impl of a handle; the base is freed by the caller. */
static void handle_release(tcomm *tc) {
  tgroup *g = tc->g;
  tworld *w = g->world;
  atomic_store(&g->mem[tc->me].departed, 1);
  atomic_fetch_add(&g->departures, 1); /* after the flag: a waiter that sees the count sees it */
  pthread_mutex_lock(&w->lock);
  if (tc->prev) tc->prev->next = tc->next;
  else w->handles = tc->next;
  if (tc->next) tc->next->prev = tc->prev;
  pthread_mutex_unlock(&w->lock);
  free(tc->ptrs);
  free(tc->dsts);
  free(tc);
  group_release(g);
}

static void threads_destroy(mpu_comm *c) { handle_release(c->impl); }

static mpu_result_t threads_abort(mpu_comm *c) {
  tcomm *tc = c->impl;
  mpu__tworld_poison(tc->g->world, TC_ABORTED, MPU_ERR_ABORTED, tc->g->members[tc->me]);
  return MPU_SUCCESS;
}

/* ---- group creation ---------------------------------------------------------- */

static mpu_result_t threads_create_group(mpu_comm *c, const int *members, int n,
                                         mpu_comm **out) {
  tcomm *tc = c->impl;
  tworld *w = tc->g->world;
  int *wr = malloc((size_t)n * sizeof(int));
  if (!wr) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_comm_create_group: %d members", n);
  int me = -1;
  for (int i = 0; i < n; i++) {
    wr[i] = tc->g->members[members[i]];
    if (members[i] == c->rank) me = i;
  }

  mpu_result_t r = MPU_SUCCESS;
  pthread_mutex_lock(&w->lock);
  tpending *p, **link = &w->pending;
  for (p = w->pending; p; link = &p->next, p = p->next)
    if (p->parent == tc->g->id && p->g->n == n && !p->has[me] &&
        !memcmp(p->g->members, wr, (size_t)n * sizeof(int)))
      break;
  if (!p) {
    p = calloc(1, sizeof *p);
    char *has = calloc((size_t)n, 1);
    tgroup *g = p && has ? group_new(w, wr, n) : NULL;
    if (!g) {
      free(p);
      free(has);
      r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_comm_create_group: group of %d", n);
      goto out;
    }
    p->parent = tc->g->id;
    p->g = g;
    atomic_store(&g->refs, 1); /* the pending entry's: members may leave before all join */
    p->has = has;
    p->next = NULL;
    while (*link) link = &(*link)->next; /* keep creation order */
    *link = p;
  }
  r = handle_new(w, p->g, me, out);
  if (r != MPU_SUCCESS) {
    if (p->joined == 0) { /* we made it and nobody joined: take it back */
      for (link = &w->pending; *link != p; link = &(*link)->next) {
      }
      *link = p->next;
      group_release(p->g);
      free(p->has);
      free(p);
    }
    goto out;
  }
  p->has[me] = 1;
  if (++p->joined == n) { /* everyone is in: the group no longer needs finding */
    for (link = &w->pending; *link != p; link = &(*link)->next) {
    }
    *link = p->next;
    group_release(p->g);
    free(p->has);
    free(p);
  }
out:
  pthread_mutex_unlock(&w->lock);
  free(wr);
  return r;
}

/* ---- the world ------------------------------------------------------------- */

static void world_free(tworld *w) {
  if (!w) return;
  while (w->pending) { /* creations some member never joined */
    tpending *p = w->pending;
    w->pending = p->next;
    group_release(p->g);
    free(p->has);
    free(p);
  }
  while (w->handles) { /* handles the ranks left behind */
    mpu_comm *c = w->handles->base;
    mpu__detach_requests(c); /* while the handle still is */
    handle_release(w->handles);
    mpu__comm_free(c);
  }
  for (int r = 0; r < w->n && w->boxes; r++) {
    mpu__tmailbox_drain(&w->boxes[r]);
    pthread_mutex_destroy(&w->boxes[r].lock);
    pthread_cond_destroy(&w->boxes[r].cond);
  }
  pthread_mutex_destroy(&w->lock);
  free(w->boxes);
  free((void *)w->gone);
  free(w);
}

static long default_spin(int n) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  /* with a core per rank a peer is about to arrive: spin ~100 us; when ranks
   * share cores, spinning steals the time the late peer needs: sleep soon */
  return n <= cpus ? 4000 : 50;
}

static mpu_result_t world_new(int n, const mpu_launch_options *o, tworld **out) {
  const mpu__env_values *env = mpu__env();
  tworld *w = calloc(1, sizeof *w);
  if (!w) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_launch: world of %d", n);
  w->n = n;
  w->timeout_s = mpu__env_timeout(o ? o->timeout_s : 0);
  w->check_calls = mpu__env_check_calls(o ? o->check_calls : MPU_CHECKS_DEFAULT);
  w->spin = o && o->spin >= 0 ? o->spin : env->spin >= 0 ? env->spin : default_spin(n);
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  long cpus = o && o->workers > 0 ? o->workers : online;
  w->cpus = cpus < 1 ? 1 : cpus > n ? n : (int)cpus;
  w->yields = n > online ? 100 : 0;
  w->online = online < 1 ? 1 : online;
  atomic_init(&w->spin_cap, w->spin);
  pthread_mutex_init(&w->lock, NULL);
  w->gone = calloc((size_t)n, sizeof *w->gone);
  w->boxes = calloc((size_t)n, sizeof *w->boxes);
  if (!w->gone || !w->boxes) {
    free(w->boxes);
    w->boxes = NULL;
    world_free(w);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_launch: world of %d", n);
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  for (int r = 0; r < n; r++) {
    pthread_mutex_init(&w->boxes[r].lock, NULL);
    pthread_cond_init(&w->boxes[r].cond, &ca);
  }
  pthread_condattr_destroy(&ca);
  *out = w;
  return MPU_SUCCESS;
}

typedef struct rank_ctx {
  tworld *w;
  int rank;
  mpu_comm *comm;
  mpu_rank_fn fn;
  void *arg;
  mpu_result_t result;
  int failed_as; /* its place among the failures in time (0: the first) */
  char message[1024];
} rank_ctx;

/* Where rank `rank` of a world of `nranks` runs: the CPU its thread is bound
 * to, or -1 (left to the scheduler). When the ranks fit in the CPUs the
 * launcher may use, each gets one of its own, as mpirun binds each process to
 * a core (Open MPI 4.1's default for 2 processes or fewer): left to itself
 * the scheduler puts two ranks that hand each other the CPU through short
 * waits on one CPU and leaves them there, where each wait yields to the peer
 * instead of spinning (an idle 8-byte all_reduce on 2 ranks: 2.2 us against
 * 0.8 bound, docs/bench.md). `start` rotates the CPUs between launches, so
 * that worlds launched side by side in one process take different ones while
 * they fit. More ranks than CPUs, or one rank, are not bound. */
int mpu__tbind_cpu(const cpu_set_t *allowed, int nranks, unsigned start, int rank) {
  if (nranks < 2 || CPU_COUNT(allowed) < nranks || rank < 0 || rank >= nranks) return -1;
  return mpu__cpu_nth(allowed, start + (unsigned)rank);
}

static void *rank_main(void *p);

/* Start rank i's thread, bound to `cpu` when it is not -1 (where the binding
 * cannot be set, the thread starts unbound). */
static int start_rank(pthread_t *thread, rank_ctx *ctx, int cpu) {
  pthread_attr_t attr;
  if (cpu >= 0 && !pthread_attr_init(&attr)) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    int failed = pthread_attr_setaffinity_np(&attr, sizeof one, &one) ||
                 pthread_create(thread, &attr, rank_main, ctx);
    pthread_attr_destroy(&attr);
    if (!failed) return 0;
  }
  return pthread_create(thread, NULL, rank_main, ctx);
}

static void *rank_main(void *p) {
  rank_ctx *ctx = p;
  mpu_clear_error();
  ctx->result = ctx->fn(ctx->comm, ctx->arg);
  if (ctx->result != MPU_SUCCESS)
    snprintf(ctx->message, sizeof ctx->message, "%s", mpu_last_error());
  /* a bracket left open would never run its calls: the rank failed */
  char who[64];
  snprintf(who, sizeof who, "mpu_launch: the function of rank %d", ctx->rank);
  mpu_result_t open = mpu__group_abandon(who);
  if (open && ctx->result == MPU_SUCCESS) {
    ctx->result = open;
    snprintf(ctx->message, sizeof ctx->message, "%s", mpu_last_error());
  }
  if (ctx->result != MPU_SUCCESS) {
    /* numbered before the world hears of it, so a victim that fails because
     * of this failure is always numbered after it */
    ctx->failed_as = atomic_fetch_add(&ctx->w->failures, 1);
    mpu__tworld_poison(ctx->w, TC_FAILED, ctx->result, ctx->rank);
  }
  atomic_store(&ctx->w->gone[ctx->rank], 1);
  atomic_fetch_add(&ctx->w->exits, 1);
  return NULL;
}

mpu_result_t mpu_launch(int nranks, mpu_rank_fn fn, void *arg, mpu_result_t *results,
                        const mpu_launch_options *options) {
  if (nranks <= 0 || nranks > MPU_LAUNCH_MAX_RANKS || !fn)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "mpu_launch: %d ranks and fn %s (want 1..%d ranks and a function)", nranks,
                      fn ? "set" : "NULL", MPU_LAUNCH_MAX_RANKS);
  mpu_launch_options full = MPU_LAUNCH_OPTIONS_INIT;
  if (options) {
    MPU_CHECK(mpu__take_options("mpu_launch", "options", "MPU_LAUNCH_OPTIONS_INIT",
                                options, sizeof full,
                                MPU_LAUNCH_OPTIONS_MIN_SIZE, &full));
    options = &full;
  }
  if (options && (options->check_calls < MPU_CHECKS_OFF || options->check_calls > MPU_CHECKS_ON))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "mpu_launch: options.check_calls is %d (want MPU_CHECKS_DEFAULT, _ON or _OFF)",
                      options->check_calls);
  tworld *w = NULL;
  MPU_CHECK(world_new(nranks, options, &w));
  rank_ctx *ctx = calloc((size_t)nranks, sizeof *ctx);
  pthread_t *threads = calloc((size_t)nranks, sizeof *threads);
  int *everyone = malloc((size_t)nranks * sizeof(int));
  tgroup *g = NULL;
  mpu_result_t r = MPU_SUCCESS;
  if (!ctx || !threads || !everyone) {
    r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_launch: %d ranks", nranks);
    goto out;
  }
  for (int i = 0; i < nranks; i++) everyone[i] = i;
  pthread_mutex_lock(&w->lock);
  g = group_new(w, everyone, nranks);
  for (int i = 0; g && i < nranks && r == MPU_SUCCESS; i++) {
    r = handle_new(w, g, i, &ctx[i].comm);
    if (r == MPU_SUCCESS) ctx[i].comm->owned_by_launcher = 1;
  }
  pthread_mutex_unlock(&w->lock);
  if (!g) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_launch: world group of %d", nranks);
  if (r != MPU_SUCCESS) goto out;

  static _Atomic unsigned bind_next; /* where the next launch's binding starts */
  cpu_set_t allowed;
  int bind = mpu__env()->bind && !sched_getaffinity(0, sizeof allowed, &allowed);
  unsigned start = bind ? atomic_fetch_add(&bind_next, (unsigned)nranks) : 0;
  int started = 0;
  for (int i = 0; i < nranks; i++, started++) {
    ctx[i] = (rank_ctx){w, i, ctx[i].comm, fn, arg, MPU_SUCCESS, 0, ""};
    if (start_rank(&threads[i], &ctx[i], bind ? mpu__tbind_cpu(&allowed, nranks, start, i) : -1)) {
      r = mpu__error(MPU_ERR_SYSTEM, "mpu_launch: cannot start the thread of rank %d of %d", i,
                     nranks);
      mpu__tworld_poison(w, TC_START, MPU_ERR_SYSTEM, i);
      break;
    }
  }
  for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
  if (r != MPU_SUCCESS) goto out;

  /* the report is the first failure in time, in its own words: the ranks
   * that failed after it are mostly its victims saying MPU_ERR_ABORTED */
  int first = -1;
  for (int i = 0; i < nranks; i++) {
    if (results) results[i] = ctx[i].result;
    if (ctx[i].result != MPU_SUCCESS && (first < 0 || ctx[i].failed_as < ctx[first].failed_as))
      first = i;
  }
  if (first >= 0) {
    int others = atomic_load(&w->failures) - 1;
    char after[64] = "";
    if (others)
      snprintf(after, sizeof after, " (the first failure; %d more after it)", others);
    r = mpu__error(ctx[first].result, "rank %d of %d failed: %s%s", first, nranks,
                   ctx[first].message, after);
  }
out:
  if (w) {
    /* the launcher's own handles go too: lift their protection first */
    for (tcomm *h = w->handles; h; h = h->next) h->base->owned_by_launcher = 0;
    if (!g || atomic_load(&g->refs) == 0) group_free(g);
    world_free(w);
  }
  free(ctx);
  free(threads);
  free(everyone);
  return r;
}

static void threads_caps(const mpu_comm *c, mpu_comm_caps *caps) {
  const tcomm *tc = c->impl;
  caps->native_nonblocking = 1; /* a call runs once every member started it, without a wait */
  caps->fault_detection = 1; /* aborts, failures, exits and timeouts break the waits */
  caps->call_checking = tc->g->world->check_calls;
}

static const mpu__comm_ops threads_ops = {
    .name = "threads",
    .start = mpu__tstart,
    .start_nb = mpu__tstart_nb,
    .test = mpu__ttest,
    .wait = mpu__twait,
    .release = mpu__trelease,
    .send = mpu__tsend,
    .recv = mpu__trecv,
    .create_group = threads_create_group,
    .split = NULL,
    .abort = threads_abort,
    .caps = threads_caps,
    .destroy = threads_destroy,
};
