/*
 * roof.c - the roof of `mpu bench`: the least data movement of a collective,
 * done by the threads the threads backend would use, with nothing between
 * them but one start line per iteration.
 *
 * A collective on n ranks must read every input it combines and write every
 * output at least once. Here that work is cut into n tasks, one per rank's
 * share (task t: chunk t of an all_reduce, output t of an all_gather, ...),
 * on buffers laid out as the bench's are (in place where the row is), and
 * run by as many threads as the threads backend runs them on (one per rank,
 * at most one per CPU, each taking every workers-th task), in several ways
 * (cached or streaming stores; an all_gather or a broadcast pulled by each
 * output's owner, pushed from each input, or the two alternating). Each way
 * is timed as the row is, by its mean over iterations made back to back
 * after untimed ones; each iteration is its slowest thread's own time
 * (threads that start together to the nanosecond, which no collective's
 * members do). The roof is the best such mean of any way and round: the
 * rate the same cores sustain moving those bytes when no rank ever waits
 * for another. A collective pays that and its synchronisation, so its time
 * is at or above the roof but for noise.
 */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench_internal.h"
#include "comm/base/copy.h"
#include "comm/base/reduce.h"
#include "core/clock.h"
#include "core/cpus.h"
#include "core/error.h"

enum { PULL, PUSH, ALTERNATING }; /* the ways of an all_gather or a broadcast */

typedef struct roof_plan {
  mpu_collective coll;
  mpu_dtype dt;
  mpu_op op;
  int n, stream, way;
  int alternate;       /* iteration i moves the bytes the way way ^ (i & 1) */
  size_t count, es;  /* per-rank count as the bench passes it, and the element size */
  char **send, **recv; /* [n]: each rank's buffers (in place: views into the other) */
  mpu__bench_roof_stub stub; /* tests: run this instead of the tasks */
  void *stub_arg;
} roof_plan;

typedef struct roof_thread {
  const roof_plan *p;
  int t, workers, iters, reps; /* this thread takes tasks t, t + workers, ... */
  start_line *line;
  double *begin, *end; /* [iters]: this thread's start and end of each iteration, us */
  const void **srcs;   /* [n] */
  void **dsts;         /* [n] */
} roof_thread;

/* Task t of one call of the collective, moved the way `way`. */
static void roof_task(roof_thread *th, int t, int way) {
  const roof_plan *p = th->p;
  int n = p->n;
  size_t es = p->es, cb = p->count * es;
  const void **srcs = th->srcs;
  void **dsts = th->dsts;
  switch (p->coll) {
  case MPU_COLL_ALL_REDUCE:
  case MPU_COLL_REDUCE: { /* chunk t of every input, reduced into chunk t of the outputs */
    size_t lo = mpu__chunk_lo(p->count, n, t), hi = mpu__chunk_lo(p->count, n, t + 1);
    for (int k = 0; k < n; k++) {
      srcs[k] = p->send[k] + lo * es;
      dsts[k] = p->recv[k] + lo * es;
    }
    int ndst = p->coll == MPU_COLL_ALL_REDUCE ? n : 1; /* reduce: the root's (rank 0's) */
    mpu__reduce_to(dsts, ndst, srcs, n, hi - lo, p->dt, p->op, n, p->stream);
    return;
  }
  case MPU_COLL_REDUCE_SCATTER: /* block t of every input, reduced into output t */
    for (int k = 0; k < n; k++) srcs[k] = p->send[k] + (size_t)t * cb;
    dsts[0] = p->recv[t];
    mpu__reduce_to(dsts, 1, srcs, n, p->count, p->dt, p->op, n, p->stream);
    return;
  case MPU_COLL_ALL_GATHER:
    if (way == PULL) { /* output t, from every input */
      for (int k = 0; k < n; k++) {
        char *dst = p->recv[t] + (size_t)k * cb;
        if (dst != p->send[k]) mpu__copy(dst, p->send[k], cb, p->stream);
      }
      if (p->stream) mpu__copy_fence();
    } else { /* input t, into every output */
      for (int k = 0; k < n; k++) {
        char *dst = p->recv[k] + (size_t)t * cb;
        dsts[k] = dst == p->send[t] ? NULL : dst;
      }
      mpu__copy_to(dsts, n, p->send[t], cb, p->stream);
    }
    return;
  case MPU_COLL_BROADCAST: /* from rank 0's buffer */
    if (way == PULL) { /* every other rank copies the whole buffer */
      if (t) mpu__copy(p->send[t], p->send[0], cb, p->stream);
      if (t && p->stream) mpu__copy_fence();
    } else { /* chunk t of the root's buffer, into every other rank's */
      size_t lo = mpu__chunk_lo(p->count, n, t) * es, hi = mpu__chunk_lo(p->count, n, t + 1) * es;
      for (int k = 0; k < n; k++) dsts[k] = k ? p->send[k] + lo : NULL;
      mpu__copy_to(dsts, n, p->send[0] + lo, hi - lo, p->stream);
    }
    return;
  default: /* all_to_all: block t of every input, into output t */
    for (int k = 0; k < n; k++)
      mpu__copy(p->recv[t] + (size_t)k * cb, p->send[k] + (size_t)t * cb, cb, p->stream);
    if (p->stream) mpu__copy_fence();
    return;
  }
}

static void *roof_loop(void *arg) {
  roof_thread *th = arg;
  const roof_plan *p = th->p;
  for (int i = 0; i < th->iters; i++) {
    int way = p->alternate ? p->way ^ (i & 1) : p->way;
    mpu__bench_start_wait(th->line);
    th->begin[i] = mpu__now() * 1e6;
    for (int k = 0; k < th->reps; k++)
      for (int t = th->t; t < p->n; t += th->workers)
        if (p->stub) p->stub(p->stub_arg, th->t, i, way);
        else roof_task(th, t, way);
    th->end[i] = mpu__now() * 1e6;
  }
  return NULL;
}

/* The CPUs the process may run on (0 if unknown): its main thread's, not
 * the caller's. `mpu bench` times the roof from a rank's thread, which
 * mpu_launch binds to one CPU; placed by that thread's mask, every roof
 * thread shared that one CPU (a 1 MiB all_gather on 2 ranks: 43 us against
 * 24 with a CPU each, so the row beat its roof by 30%). */
static int allowed_cpus(cpu_set_t *allowed) {
  if (!sched_getaffinity(getpid(), sizeof *allowed, allowed) && CPU_COUNT(allowed) > 0)
    return CPU_COUNT(allowed);
  return sched_getaffinity(0, sizeof *allowed, allowed) ? 0 : CPU_COUNT(allowed);
}

int mpu__bench_roof_cpu(int k) {
  cpu_set_t allowed;
  if (k < 0 || allowed_cpus(&allowed) < 1) return -1;
  return mpu__cpu_nth(&allowed, (unsigned)k);
}

/* Thread k starts on its CPU (mpu__bench_roof_cpu): a round's iterations
 * last less than the scheduler takes to spread threads started together,
 * and two of them on one CPU time the sharing, not the memory (the threads
 * backend binds its ranks to CPUs of their own). Advice only: without it
 * the thread runs where it is put. */
static void on_cpu(pthread_attr_t *attr, int k) {
  int c = mpu__bench_roof_cpu(k);
  if (c < 0) return;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(c, &one);
  pthread_attr_setaffinity_np(attr, sizeof one, &one);
}

/* One round of one way: MPU_BENCH_SETTLE untimed iterations, then `timed`
 * back to back, and their mean (each its slowest thread's time), per call. */
static mpu_result_t roof_way(const roof_plan *p, int workers, int timed, int reps,
                             double *mean_us) {
  int iters = MPU_BENCH_SETTLE + timed;
  int n = workers;
  roof_thread *th = calloc((size_t)n, sizeof *th);
  pthread_t *tid = calloc((size_t)n, sizeof *tid);
  double *times = calloc((size_t)n * 2 * (size_t)iters, sizeof *times);
  void **ptrs = calloc((size_t)n * 2 * (size_t)p->n, sizeof *ptrs);
  /* spinning where the threads have a CPU each (on_cpu) */
  cpu_set_t allowed;
  start_line line = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, n, 0, 0,
                     workers <= allowed_cpus(&allowed)};
  mpu_result_t r = MPU_SUCCESS;
  int started = 0;
  if (!th || !tid || !times || !ptrs) {
    r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_bench_roof: %d threads", n);
    goto out;
  }
  for (; started < n; started++) {
    roof_thread *h = &th[started];
    *h = (roof_thread){p, started, workers, iters, reps, &line,
                       times + (size_t)started * 2 * iters, times + ((size_t)started * 2 + 1) * iters,
                       (const void **)(ptrs + (size_t)started * 2 * p->n),
                       ptrs + ((size_t)started * 2 + 1) * p->n};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    on_cpu(&attr, started);
    int failed = pthread_create(&tid[started], &attr, roof_loop, h);
    pthread_attr_destroy(&attr);
    if (failed) {
      r = mpu__error(MPU_ERR_SYSTEM, "mpu_bench_roof: cannot start thread %d", started);
      mpu__bench_start_shrink(&line, started); /* the started ones run without it */
      break;
    }
  }
  for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
  if (!r) {
    /* the first iterations find the caches as what ran before left them
     * (the row's calls, another way), as the row's first calls after a pause
     * find them as the roof left them: neither is timed. The mean, not the
     * best: a way's best single iteration can come from a transient no loop
     * sustains (an 8 MiB all_gather pushed right after it was pulled on the
     * same buffers: 339-350 us; pushed after itself, 410-430) */
    double sum = 0;
    for (int i = MPU_BENCH_SETTLE; i < iters; i++) {
      double slowest = 0;
      for (int t = 0; t < n; t++)
        if (th[t].end[i] - th[t].begin[i] > slowest) slowest = th[t].end[i] - th[t].begin[i];
      sum += slowest / reps;
    }
    *mean_us = sum / timed;
  }
out:
  pthread_mutex_destroy(&line.lock);
  pthread_cond_destroy(&line.cond);
  free(th), free(tid), free(times), free(ptrs);
  return r;
}

struct mpu_bench_roof_run {
  roof_plan p;
  mpu_bench_config cfg;  /* the row's, in full */
  char **own;            /* [2n]: what was allocated, to free */
  char **lent_send, **lent_recv; /* [n]: where lent, the send and recv of each rank's own
                                    call in the row's buffers (mpu_bench_roof_lend) */
  int workers, reps, ways, per_round;
  int rounds;            /* the rounds mpu_bench_roof times */
  int timed;             /* ways timed so far, each once a round */
  double best;           /* us: the best of their figures */
};

void mpu__bench_roof_set_stub(mpu_bench_roof_run *run, mpu__bench_roof_stub stub, void *arg) {
  if (run) run->p.stub = stub, run->p.stub_arg = arg;
}

int mpu_bench_roof_rounds(const mpu_bench_config *cfg) {
  mpu_bench_config full;
  bench_layout lay;
  if (mpu__bench_layout("mpu_bench_roof_rounds", cfg, 1, &full, &lay)) return 0;
  /* up to 50 rounds where they are cheap, 40 past 4 MiB: the more, the
   * likelier the roof meets the machine's fast moments as its row does */
  int most = full.bytes <= ((size_t)4 << 20) ? 50 : 40;
  return full.iters < most ? full.iters : most;
}

mpu_result_t mpu_bench_roof_end(mpu_bench_roof_run *run, double *us) {
  if (!run) return us ? mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_bench_roof_end: run is NULL")
                      : MPU_SUCCESS;
  mpu_result_t r = MPU_SUCCESS;
  if (us && !run->timed)
    r = mpu__error(MPU_ERR_INVALID_USAGE, "mpu_bench_roof_end: no round was timed");
  else if (us)
    *us = run->best;
  for (int k = 0; run->own && k < 2 * run->p.n; k++) free(run->own[k]);
  free(run->own), free(run->p.send), free(run->p.recv);
  free(run->lent_send), free(run->lent_recv);
  free(run);
  return r;
}

mpu_result_t mpu_bench_roof_begin(const mpu_bench_config *cfg, int nranks, int workers,
                                  mpu_bench_roof_run **out) {
  static const char fn[] = "mpu_bench_roof_begin";
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  if (nranks < 1 || nranks > 1024)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d ranks (1..1024)", fn, nranks);
  mpu_bench_config full;
  bench_layout lay;
  MPU_CHECK(mpu__bench_layout(fn, cfg, nranks, &full, &lay));
  cfg = &full;
  size_t count = lay.count, send_bytes = lay.send_bytes, recv_bytes = lay.recv_bytes;
  mpu_bench_roof_run *run = calloc(1, sizeof *run);
  if (!run) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  roof_plan *p = &run->p;
  *p = (roof_plan){cfg->collective, cfg->dtype, cfg->op, nranks, 0, PULL, 0, count,
                   mpu_dtype_size(cfg->dtype), NULL, NULL, NULL, NULL};
  int n = nranks;
  run->cfg = full;
  p->send = calloc((size_t)n, sizeof *p->send);
  p->recv = calloc((size_t)n, sizeof *p->recv);
  run->own = calloc((size_t)n * 2, sizeof *run->own);
  run->lent_send = calloc((size_t)n, sizeof *run->lent_send);
  run->lent_recv = calloc((size_t)n, sizeof *run->lent_recv);
  if (!p->send || !p->recv || !run->own || !run->lent_send || !run->lent_recv) {
    mpu_bench_roof_end(run, NULL);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d ranks", fn, n);
  }
  for (int k = 0; k < n; k++) { /* the bench's buffers, in place where the row is */
    char **own = run->own;
    own[2 * k] = mpu__bench_alloc(send_bytes);
    own[2 * k + 1] = mpu__bench_alloc(recv_bytes);
    if (!own[2 * k] || !own[2 * k + 1]) {
      mpu_bench_roof_end(run, NULL);
      return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d x (%zu + %zu) bytes", fn, n, send_bytes,
                        recv_bytes);
    }
    /* touched, so no page faults in the timing, with the row's values */
    mpu__bench_fill(own[2 * k], send_bytes, cfg->dtype, k);
    mpu__bench_fill(own[2 * k + 1], recv_bytes, cfg->dtype, k);
    mpu__bench_place(cfg, own[2 * k], own[2 * k + 1], count, k, p->es, &p->send[k], &p->recv[k]);
  }
  /* small calls take less than the clock resolves: enough of them to move
   * 256 KiB per thread and iteration, timed together */
  size_t moved = send_bytes + recv_bytes;
  run->reps = moved >= ((size_t)256 << 10) ? 1 : (int)(((size_t)256 << 10) / (moved ? moved : 1));
  run->per_round = MPU_BENCH_ROOF_TIMED;
  run->rounds = mpu_bench_roof_rounds(cfg);
  /* pulled, pushed, and the two alternating iteration by iteration (which a
   * collective could do call by call too) */
  run->ways = p->coll == MPU_COLL_ALL_GATHER || p->coll == MPU_COLL_BROADCAST ? ALTERNATING + 1 : 1;
  long cpus = workers > 0 ? workers : sysconf(_SC_NPROCESSORS_ONLN);
  run->workers = cpus > 0 && cpus < n ? (int)cpus : n; /* as the threads backend (FOR_EACH_TASK) */
  *out = run;
  return MPU_SUCCESS;
}

mpu_result_t mpu_bench_roof_lend(mpu_bench_roof_run *run, int rank, void *send, void *recv) {
  static const char fn[] = "mpu_bench_roof_lend";
  if (!run || !send || !recv) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (rank < 0 || rank >= run->p.n)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: rank %d of %d", fn, rank, run->p.n);
  mpu__bench_place(&run->cfg, send, recv, run->p.count, rank, run->p.es, &run->lent_send[rank],
                   &run->lent_recv[rank]);
  return MPU_SUCCESS;
}

mpu_result_t mpu_bench_roof_round(mpu_bench_roof_run *run) {
  if (!run) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_bench_roof_round: run is NULL");
  roof_plan p = run->p;
  int lent = 1; /* every rank's, or none */
  for (int k = 0; k < p.n; k++) lent &= run->lent_send[k] != NULL;
  if (lent) p.send = run->lent_send, p.recv = run->lent_recv;
  for (int way = 0; way < run->ways; way++)
    for (int stream = 0; stream < 2; stream++) {
      p.way = way == PUSH ? PUSH : PULL, p.alternate = way == ALTERNATING, p.stream = stream;
      double t = 0;
      MPU_CHECK(roof_way(&p, run->workers, run->per_round, run->reps, &t));
      if (!run->timed++ || t < run->best) run->best = t;
    }
  return MPU_SUCCESS;
}

mpu_result_t mpu_bench_roof(const mpu_bench_config *cfg, int nranks, int workers, double *us) {
  static const char fn[] = "mpu_bench_roof";
  if (!us) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: us is NULL", fn);
  mpu_bench_roof_run *run = NULL;
  MPU_CHECK(mpu_bench_roof_begin(cfg, nranks, workers, &run));
  mpu_result_t r = MPU_SUCCESS;
  for (int i = 0; i < run->rounds && !r; i++) r = mpu_bench_roof_round(run);
  mpu_result_t e = mpu_bench_roof_end(run, r ? NULL : us);
  return r ? r : e;
}
