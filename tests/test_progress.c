/*
 * test_progress.c - non-blocking calls progress without a wait: requests
 * waited for in any order complete, a call completes while its first member
 * does something else, mpu_request_free'd requests release themselves, and
 * failures of a pending call reach every member.
 */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpu.h"

/* request.c's count of requests alive in the process */
long mpu__request_count(void);

#define CHECK(call)               \
  do {                            \
    mpu_result_t r_ = (call);     \
    if (r_) return r_;            \
  } while (0)

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int rank_of(mpu_comm *c) {
  int r = -1;
  mpu_comm_rank(c, &r);
  return r;
}

static mpu_launch_options quick(double timeout_s) {
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = timeout_s;
  return o;
}

/* Sum of 1..n over ranks, plus a per-element offset: exact in float. */
static mpu_result_t check_sum(const float *got, size_t n, int size, float base, const char *what) {
  for (size_t i = 0; i < n; i++) {
    float want = base * (float)size + (float)(size * (size + 1) / 2) + (float)(i % 7) * (float)size;
    if (got[i] != want)
      return mpu_fail(MPU_ERR_INTERNAL, "%s[%zu] = %g, want %g", what, i, got[i], want);
  }
  return MPU_SUCCESS;
}

static void fill(float *x, size_t n, int rank, float base) {
  for (size_t i = 0; i < n; i++) x[i] = base + (float)(rank + 1) + (float)(i % 7);
}

/* ---- waits in any order ---------------------------------------------------------------- */

/* Rank 0 waits A then B, rank 1 waits B then A, on two communicators; the
 * sizes cover the staged and the zero-copy paths. */
static mpu_result_t opposite_order(mpu_comm *world, void *arg) {
  size_t n = *(const size_t *)arg;
  int rank, size;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &size);
  mpu_comm *a = NULL, *b = NULL;
  CHECK(mpu_comm_split(world, 0, rank, &a));
  CHECK(mpu_comm_split(world, 0, rank, &b));
  float *sa = malloc(n * sizeof *sa), *ra = malloc(n * sizeof *ra);
  float *sb = malloc(n * sizeof *sb), *rb = malloc(n * sizeof *rb);
  mpu_result_t r = !sa || !ra || !sb || !rb ? MPU_ERR_OUT_OF_MEMORY : MPU_SUCCESS;
  for (int round = 0; !r && round < 3; round++) {
    fill(sa, n, rank, 10.f * (float)round);
    fill(sb, n, rank, 100.f + (float)round);
    mpu_request *qa, *qb;
    if ((r = mpu_comm_iall_reduce(a, sa, ra, n, MPU_FLOAT32, MPU_SUM, &qa))) break;
    if ((r = mpu_comm_iall_reduce(b, sb, rb, n, MPU_FLOAT32, MPU_SUM, &qb))) break;
    if (rank == 0) {
      if ((r = mpu_request_wait(qa)) || (r = mpu_request_wait(qb))) break;
    } else {
      if ((r = mpu_request_wait(qb)) || (r = mpu_request_wait(qa))) break;
    }
    if ((r = check_sum(ra, n, size, 10.f * (float)round, "A")) ||
        (r = check_sum(rb, n, size, 100.f + (float)round, "B")))
      break;
  }
  free(sa), free(ra), free(sb), free(rb);
  mpu_comm_destroy(a);
  mpu_comm_destroy(b);
  return r;
}

static void test_opposite_order_waits(void **state) {
  (void)state;
  mpu_launch_options o = quick(20);
  size_t small = 64, large = 1 << 16;
  assert_int_equal(mpu_launch(2, opposite_order, &small, NULL, &o), MPU_SUCCESS);
  assert_int_equal(mpu_launch(2, opposite_order, &large, NULL, &o), MPU_SUCCESS);
  assert_int_equal(mpu_launch(3, opposite_order, &large, NULL, &o), MPU_SUCCESS);
}

/* Every kind of call, started on both communicators, waited in reverse. */
static mpu_result_t every_kind(mpu_comm *world, void *arg) {
  (void)arg;
  int rank, size;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &size);
  enum { N = 4096 };
  static _Thread_local int32_t in[N * 3], out[7][N * 3];
  for (int i = 0; i < N * 3; i++) in[i] = rank * 100000 + i;
  mpu_request *q[7];
  CHECK(mpu_comm_iall_reduce(world, in, out[0], N, MPU_INT32, MPU_SUM, &q[0]));
  CHECK(mpu_comm_iall_gather(world, in, out[1], N, MPU_INT32, &q[1]));
  CHECK(mpu_comm_ireduce_scatter(world, in, out[2], N, MPU_INT32, MPU_MAX, &q[2]));
  memcpy(out[3], in, sizeof(int32_t) * N);
  CHECK(mpu_comm_ibroadcast(world, out[3], N, MPU_INT32, 1, &q[3]));
  CHECK(mpu_comm_ireduce(world, in, out[4], N, MPU_INT32, MPU_MIN, 0, &q[4]));
  CHECK(mpu_comm_iall_to_all(world, in, out[5], N, MPU_INT32, &q[5]));
  CHECK(mpu_comm_ibarrier(world, &q[6]));
  for (int k = 6; k >= 0; k--) CHECK(mpu_request_wait(q[k]));
  for (int i = 0; i < N; i++) {
    int32_t sum = 0;
    for (int p = 0; p < size; p++) sum += p * 100000 + i;
    if (out[0][i] != sum) return mpu_fail(MPU_ERR_INTERNAL, "all_reduce[%d] = %d", i, out[0][i]);
    if (out[3][i] != 100000 + i) return mpu_fail(MPU_ERR_INTERNAL, "broadcast[%d]", i);
    if (rank == 0 && out[4][i] != i) return mpu_fail(MPU_ERR_INTERNAL, "reduce[%d]", i);
    if (out[2][i] != (size - 1) * 100000 + rank * N + i)
      return mpu_fail(MPU_ERR_INTERNAL, "reduce_scatter[%d] = %d", i, out[2][i]);
    for (int p = 0; p < size; p++) {
      if (out[1][p * N + i] != p * 100000 + i) return mpu_fail(MPU_ERR_INTERNAL, "all_gather");
      if (out[5][p * N + i] != p * 100000 + rank * N + i)
        return mpu_fail(MPU_ERR_INTERNAL, "all_to_all");
    }
  }
  return MPU_SUCCESS;
}

static void test_every_kind_reverse_waits(void **state) {
  (void)state;
  mpu_launch_options o = quick(20);
  assert_int_equal(mpu_launch(2, every_kind, NULL, NULL, &o), MPU_SUCCESS);
  assert_int_equal(mpu_launch(3, every_kind, NULL, NULL, &o), MPU_SUCCESS);
}

/* ---- progress while the first member does something else ------------------------------ */

typedef struct handoff {
  _Atomic int peer_done;
} handoff;

/* Rank 0 starts the call and never waits until rank 1 has finished its own
 * wait: rank 1's wait can only return if the call ran without rank 0. Then
 * rank 0's first test finds it complete. */
static mpu_result_t without_a_wait(mpu_comm *world, void *arg) {
  handoff *h = arg;
  int rank = rank_of(world);
  enum { N = 1 << 15 };
  float *s = malloc(N * sizeof *s), *r = malloc(N * sizeof *r);
  if (!s || !r) return free(s), free(r), MPU_ERR_OUT_OF_MEMORY;
  fill(s, N, rank, 5);
  mpu_request *q;
  mpu_result_t res = mpu_comm_iall_reduce(world, s, r, N, MPU_FLOAT32, MPU_SUM, &q);
  if (!res && rank == 1) {
    res = mpu_request_wait(q);
    if (!res) res = check_sum(r, N, 2, 5, "rank 1");
    atomic_store(&h->peer_done, 1);
  } else if (!res) {
    while (!atomic_load(&h->peer_done)) sched_yield(); /* computing, as far as mpu knows */
    int done = 0;
    res = mpu_request_test(q, &done);
    if (!res && !done) {
      mpu_request_wait(q);
      res = mpu_fail(MPU_ERR_INTERNAL, "rank 0: the call was not complete at the first test");
    }
    if (!res) res = check_sum(r, N, 2, 5, "rank 0");
  }
  free(s), free(r);
  return res;
}

static void test_progress_without_a_wait(void **state) {
  (void)state;
  handoff h = {0};
  /* on code that runs calls only at a wait, rank 1 times out */
  mpu_launch_options o = quick(5);
  mpu_result_t res[2];
  assert_int_equal(mpu_launch(2, without_a_wait, &h, res, &o), MPU_SUCCESS);
}

/* ---- failures of pending calls --------------------------------------------------------- */

/* Rank 1 starts nothing: rank 0's own limit leaves the call pending, the
 * communicator's timeout fails it and names the missing rank. */
static mpu_result_t never_started(mpu_comm *world, void *arg) {
  (void)arg;
  int rank = rank_of(world);
  if (rank == 1) return MPU_SUCCESS; /* returns: its exit is seen */
  float x = 1, y = 0;
  mpu_request *q;
  CHECK(mpu_comm_iall_reduce(world, &x, &y, 1, MPU_FLOAT32, MPU_SUM, &q));
  mpu_result_t r = mpu_request_wait(q);
  if (r != MPU_ERR_ABORTED)
    return mpu_fail(MPU_ERR_INTERNAL, "wait gave %s: %s", mpu_result_name(r), mpu_last_error());
  if (!strstr(mpu_last_error(), "world rank 1"))
    return mpu_fail(MPU_ERR_INTERNAL, "message: %s", mpu_last_error());
  return MPU_SUCCESS;
}

static mpu_result_t late_start(mpu_comm *world, void *arg) {
  handoff *h = arg;
  int rank = rank_of(world);
  float x = (float)rank + 1, y = 0;
  mpu_request *q;
  if (rank == 1) {
    while (!atomic_load(&h->peer_done)) sched_yield();
    CHECK(mpu_comm_iall_reduce(world, &x, &y, 1, MPU_FLOAT32, MPU_SUM, &q));
    CHECK(mpu_request_wait(q));
    return y == 3 ? MPU_SUCCESS : mpu_fail(MPU_ERR_INTERNAL, "rank 1 got %g", y);
  }
  CHECK(mpu_comm_iall_reduce(world, &x, &y, 1, MPU_FLOAT32, MPU_SUM, &q));
  mpu_result_t r = mpu_request_wait_timeout(q, 0.05);
  if (r != MPU_ERR_TIMEOUT || !strstr(mpu_last_error(), "world 1"))
    return mpu_fail(MPU_ERR_INTERNAL, "wait_timeout gave %s: %s", mpu_result_name(r),
                    mpu_last_error());
  atomic_store(&h->peer_done, 1);
  CHECK(mpu_request_wait(q)); /* still pending: now it completes */
  return y == 3 ? MPU_SUCCESS : mpu_fail(MPU_ERR_INTERNAL, "rank 0 got %g", y);
}

static mpu_result_t timed_out(mpu_comm *world, void *arg) {
  handoff *h = arg;
  int rank = rank_of(world);
  float x = 1, y = 0;
  mpu_request *q;
  if (rank == 1) { /* comes after rank 0 gave up: finds the call failed */
    while (!atomic_load(&h->peer_done)) sched_yield();
    CHECK(mpu_comm_iall_reduce(world, &x, &y, 1, MPU_FLOAT32, MPU_SUM, &q));
    mpu_result_t r = mpu_request_wait(q);
    return r == MPU_ERR_TIMEOUT ? MPU_SUCCESS
                                : mpu_fail(MPU_ERR_INTERNAL, "late rank got %s", mpu_result_name(r));
  }
  CHECK(mpu_comm_iall_reduce(world, &x, &y, 1, MPU_FLOAT32, MPU_SUM, &q));
  mpu_result_t r = mpu_request_wait(q);
  atomic_store(&h->peer_done, 1);
  if (r != MPU_ERR_TIMEOUT || !strstr(mpu_last_error(), "1 (world 1)"))
    return mpu_fail(MPU_ERR_INTERNAL, "wait gave %s: %s", mpu_result_name(r), mpu_last_error());
  return MPU_SUCCESS;
}

static void test_pending_failures(void **state) {
  (void)state;
  mpu_launch_options o = quick(20);
  mpu_result_t res[2];
  mpu_launch(2, never_started, NULL, res, &o);
  assert_int_equal(res[0], MPU_SUCCESS);
  handoff h = {0};
  assert_int_equal(mpu_launch(2, late_start, &h, NULL, &o), MPU_SUCCESS);
  handoff h2 = {0};
  mpu_launch_options t = quick(0.3);
  assert_int_equal(mpu_launch(2, timed_out, &h2, res, &t), MPU_SUCCESS);
}

/* ---- every outstanding request ends when a peer dies ------------------------------------ */

/* How the peer (rank 1) goes while rank 0 has three requests outstanding. */
typedef enum { PEER_EXITS, PEER_ABORTS_AFTER_ONE, PEER_STUCK } peer_fate;

typedef struct lost_peer {
  peer_fate fate;
  int how;             /* 0: wait the last first, 1: test the last, 2: a blocking call */
  _Atomic int done;    /* rank 0 is finished: a stuck peer may go */
} lost_peer;

/* Rank 0 starts three calls; rank 1 starts none (or one) and exits, aborts or
 * stays away. Rank 0 then waits for the last one first (or tests it, or makes
 * a blocking call, which settles them all): every request must end, by the
 * communicator's deadline, with the peer's failure, never hang. */
static mpu_result_t last_of_three(mpu_comm *world, void *arg) {
  lost_peer *lp = arg;
  int rank = rank_of(world);
  float x[3] = {1, 2, 3}, y[3] = {0, 0, 0};
  mpu_request *q[3];
  mpu_result_t want = lp->fate == PEER_STUCK ? MPU_ERR_TIMEOUT : MPU_ERR_ABORTED;
  if (rank == 1) {
    if (lp->fate == PEER_EXITS) return MPU_SUCCESS; /* returns: its exit is seen */
    if (lp->fate == PEER_STUCK) {                    /* alive, but never comes */
      while (!atomic_load(&lp->done)) sched_yield();
      return MPU_SUCCESS;
    }
    CHECK(mpu_comm_iall_reduce(world, &x[0], &y[0], 1, MPU_FLOAT32, MPU_SUM, &q[0]));
    mpu_comm_abort(world);
    mpu_request_wait(q[0]);
    return MPU_SUCCESS;
  }
  for (int i = 0; i < 3; i++)
    CHECK(mpu_comm_iall_reduce(world, &x[i], &y[i], 1, MPU_FLOAT32, MPU_SUM, &q[i]));
  mpu_result_t r = MPU_SUCCESS, got[3];
  if (lp->how == 1) { /* a test loop on the last: it must end too (dead peers only) */
    int done = 0;
    while (!done && !(r = mpu_request_test(q[2], &done))) sched_yield();
    got[2] = r;
  } else if (lp->how == 2) { /* a blocking call settles the requests before it */
    float z = 0;
    r = mpu_comm_all_reduce(world, &x[0], &z, 1, MPU_FLOAT32, MPU_SUM);
    if (r != want) {
      atomic_store(&lp->done, 1);
      return mpu_fail(MPU_ERR_INTERNAL, "blocking call gave %s: %s", mpu_result_name(r),
                      mpu_last_error());
    }
    got[2] = mpu_request_wait(q[2]);
  } else {
    got[2] = mpu_request_wait(q[2]);
  }
  const char *text = mpu_last_error();
  mpu_result_t res = MPU_SUCCESS;
  if (got[2] != want || !strstr(text, lp->fate == PEER_STUCK ? "(world 1)" : "world rank 1"))
    res = mpu_fail(MPU_ERR_INTERNAL, "the last request gave %s: %s", mpu_result_name(got[2]), text);
  for (int i = 0; i < 2; i++) {
    got[i] = mpu_request_wait(q[i]);
    if (!res && got[i] != want && !(lp->fate == PEER_ABORTS_AFTER_ONE && i == 0))
      res = mpu_fail(MPU_ERR_INTERNAL, "request %d gave %s: %s", i, mpu_result_name(got[i]),
                     mpu_last_error());
  }
  atomic_store(&lp->done, 1);
  return res;
}

static void test_wait_after_peer_died(void **state) {
  (void)state;
  alarm(120); /* the old code waited forever: fail, never hang the suite */
  mpu_launch_options o = quick(20), t = quick(0.5);
  mpu_result_t res[2];
  for (int how = 0; how < 3; how++) {
    lost_peer exits = {PEER_EXITS, how, 0}, aborts = {PEER_ABORTS_AFTER_ONE, how, 0};
    mpu_launch(2, last_of_three, &exits, res, &o);
    assert_int_equal(res[0], MPU_SUCCESS);
    mpu_launch(2, last_of_three, &aborts, res, &o);
    assert_int_equal(res[0], MPU_SUCCESS);
    if (how == 1) continue; /* a test has no deadline of its own: the peer may still come */
    lost_peer stuck = {PEER_STUCK, how, 0};
    double t0 = now_s();
    mpu_launch(2, last_of_three, &stuck, res, &t);
    assert_int_equal(res[0], MPU_SUCCESS);
    assert_true(now_s() - t0 < 15); /* by the deadline, not long after */
  }
  assert_int_equal(mpu__request_count(), 0);
  alarm(0);
}

/* A call that a peer's timeout failed is over: a wait under the caller's own
 * limit returns its failure and frees the request, rather than calling it
 * pending forever. Rank 2 never comes; rank 1 waits with the communicator's
 * timeout and fails the call for all; rank 0 waits with its own limit. */
static mpu_result_t own_limit_after_failure(mpu_comm *world, void *arg) {
  handoff *h = arg;
  int rank = rank_of(world);
  float x = 1, y = 0;
  mpu_request *q;
  if (rank == 2) {
    while (atomic_load(&h->peer_done) < 2) sched_yield();
    return MPU_SUCCESS;
  }
  CHECK(mpu_comm_iall_reduce(world, &x, &y, 1, MPU_FLOAT32, MPU_SUM, &q));
  if (rank == 1) {
    mpu_result_t r = mpu_request_wait(q);
    atomic_fetch_add(&h->peer_done, 1);
    return r == MPU_ERR_TIMEOUT ? MPU_SUCCESS
                                : mpu_fail(MPU_ERR_INTERNAL, "rank 1 got %s", mpu_result_name(r));
  }
  while (atomic_load(&h->peer_done) < 1) sched_yield();
  mpu_result_t r = mpu_request_wait_timeout(q, 0.05);
  long left = mpu__request_count();
  atomic_fetch_add(&h->peer_done, 1);
  if (r != MPU_ERR_TIMEOUT || !strstr(mpu_last_error(), "timed out"))
    return mpu_fail(MPU_ERR_INTERNAL, "rank 0 got %s: %s", mpu_result_name(r), mpu_last_error());
  if (left != 0) { /* still pending: every later wait_timeout would say the same */
    mpu_request_wait(q);
    return mpu_fail(MPU_ERR_INTERNAL, "the failed request was left pending");
  }
  return MPU_SUCCESS;
}

static void test_own_limit_after_failure(void **state) {
  (void)state;
  handoff h = {0};
  mpu_launch_options o = quick(0.3);
  mpu_result_t res[3];
  mpu_launch(3, own_limit_after_failure, &h, res, &o);
  assert_int_equal(res[0], MPU_SUCCESS);
  assert_int_equal(res[1], MPU_SUCCESS);
}

/* A mismatch found when the last member starts the call fails it for all. */
static mpu_result_t mismatched(mpu_comm *world, void *arg) {
  (void)arg;
  int rank = rank_of(world);
  float x[4] = {1, 2, 3, 4}, y[4];
  mpu_request *q;
  CHECK(mpu_comm_iall_reduce(world, x, y, rank ? 4 : 3, MPU_FLOAT32, MPU_SUM, &q));
  mpu_result_t r = mpu_request_wait(q);
  return r == MPU_ERR_MISMATCH ? MPU_SUCCESS
                               : mpu_fail(MPU_ERR_INTERNAL, "got %s", mpu_result_name(r));
}

static void test_mismatch(void **state) {
  (void)state;
  mpu_launch_options o = quick(20);
  assert_int_equal(mpu_launch(2, mismatched, NULL, NULL, &o), MPU_SUCCESS);
}

/* ---- mpu_request_free ---------------------------------------------------------------- */

typedef struct freed {
  long calls;
  _Atomic long peak;
} freed;

/* Many freed requests: released as they complete, so the count of requests
 * alive stays bounded (a barrier every 1000 keeps the ranks within reach). */
static mpu_result_t free_many(mpu_comm *world, void *arg) {
  freed *f = arg;
  int rank = rank_of(world);
  float x = (float)rank, y = 0;
  for (long i = 0; i < f->calls; i++) {
    mpu_request *q;
    CHECK(mpu_comm_iall_reduce(world, &x, &y, 1, MPU_FLOAT32, MPU_SUM, &q));
    CHECK(mpu_request_free(q));
    if (i % 1000 == 999) {
      long now = mpu__request_count(), seen = atomic_load(&f->peak);
      while (now > seen && !atomic_compare_exchange_weak(&f->peak, &seen, now)) {
      }
      CHECK(mpu_comm_barrier(world));
    }
  }
  /* a later request completed: every freed one has, and the next call reaps them */
  float z = 0;
  mpu_request *last;
  CHECK(mpu_comm_iall_reduce(world, &x, &z, 1, MPU_FLOAT32, MPU_SUM, &last));
  CHECK(mpu_request_wait(last));
  if (z != 1) return mpu_fail(MPU_ERR_INTERNAL, "last sum %g", z);
  CHECK(mpu_comm_barrier(world));
  CHECK(mpu_comm_barrier(world));
  long left = mpu__request_count();
  return left == 0 ? MPU_SUCCESS : mpu_fail(MPU_ERR_INTERNAL, "%ld requests left", left);
}

static void test_free_many_threads(void **state) {
  (void)state;
  const char *quick_env = getenv("MPU_TEST_QUICK");
  freed f = {quick_env && *quick_env == '1' ? 20000 : 200000, 0};
  mpu_launch_options o = quick(60);
  assert_int_equal(mpu_launch(2, free_many, &f, NULL, &o), MPU_SUCCESS);
  /* 2 ranks x 1000 between barriers, and what the slower rank had not reaped */
  assert_true(atomic_load(&f.peak) < 8000);
  assert_int_equal(mpu__request_count(), 0);
}

/* Freed requests whose communicator goes first: destroy releases them. */
static mpu_result_t free_then_destroy(mpu_comm *world, void *arg) {
  (void)arg;
  int rank = rank_of(world);
  mpu_comm *c;
  CHECK(mpu_comm_split(world, 0, rank, &c));
  float x = 1, y[3];
  for (int i = 0; i < 3; i++) {
    mpu_request *q;
    CHECK(mpu_comm_iall_reduce(c, &x, &y[i], 1, MPU_FLOAT32, MPU_SUM, &q));
    CHECK(mpu_request_free(q));
  }
  CHECK(mpu_comm_barrier(c));
  CHECK(mpu_comm_destroy(c));
  return MPU_SUCCESS;
}

static void test_free_then_destroy(void **state) {
  (void)state;
  mpu_launch_options o = quick(20);
  assert_int_equal(mpu_launch(2, free_then_destroy, NULL, NULL, &o), MPU_SUCCESS);
  assert_int_equal(mpu__request_count(), 0);
}

static void test_free_fake(void **state) {
  (void)state;
  mpu_comm *c, *one;
  assert_int_equal(mpu_comm_fake_create(3, 8, &c), MPU_SUCCESS);
  assert_int_equal(mpu_comm_fake_create(0, 1, &one), MPU_SUCCESS);
  float x = 2, y = 0;
  for (int i = 0; i < 200000; i++) {
    mpu_request *q;
    assert_int_equal(mpu_comm_iall_reduce(i % 2 ? c : one, &x, &y, 1, MPU_FLOAT32, MPU_SUM, &q),
                     MPU_SUCCESS);
    assert_int_equal(mpu_request_free(q), MPU_SUCCESS);
    if (i < 10) assert_true(mpu__request_count() <= 1);
  }
  assert_int_equal(mpu__request_count(), 0);
  assert_true(y == 2); /* the group of one answered exactly */
  /* a freed request is gone: using it again is an error, not a read of freed memory */
  mpu_request *q;
  assert_int_equal(mpu_comm_ibarrier(c, &q), MPU_SUCCESS);
  assert_int_equal(mpu_request_free(q), MPU_SUCCESS);
  assert_int_equal(mpu_request_free(q), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_request_wait(q), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_request_free(NULL), MPU_ERR_INVALID_ARGUMENT);
  mpu_comm_destroy(c);
  mpu_comm_destroy(one);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_opposite_order_waits),
      cmocka_unit_test(test_every_kind_reverse_waits),
      cmocka_unit_test(test_progress_without_a_wait),
      cmocka_unit_test(test_pending_failures),
      cmocka_unit_test(test_wait_after_peer_died),
      cmocka_unit_test(test_own_limit_after_failure),
      cmocka_unit_test(test_mismatch),
      cmocka_unit_test(test_free_many_threads),
      cmocka_unit_test(test_free_then_destroy),
      cmocka_unit_test(test_free_fake),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
