/*
 * test_nccl_failures.c - the NCCL backend's watchdog and abort, on the test
 * double: a peer that never comes ends its peers' waits in MPU_ERR_TIMEOUT
 * within the timeout (NCCL aborted, the communicator broken, later calls
 * failing at once); a peer that aborts ends them in an error, not a hang; a
 * request's wait_timeout leaves it pending and a later wait completes it;
 * NCCL errors come back as mpu's codes with NCCL's message; capabilities.
 * Every buffer is device memory, filled and read by copies, as on a GPU.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "comm/comm_internal.h" /* a twin with the channel ops */
#include "mpu.h"

#define TEST_RANK me
#include "test_helpers.h"


static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* a rank function's start: its rank and an NCCL communicator over world */
static mpu_result_t join(mpu_comm *world, double timeout, int *me, mpu_comm **nc) {
  mpu_comm_rank(world, me);
  return test_nccl_timed(world, timeout, nc);
}

/* ... and its end: nobody leaves before the others are done with it */
static mpu_result_t leave(mpu_comm *world, mpu_comm *nc) {
  mpu_comm_barrier(world);
  mpu_comm_destroy(nc);
  return MPU_SUCCESS;
}

/* The call's buffers, as a GPU program's: device memory (the host cannot
 * touch it), x holding {1, 2, 3, 4}, y zeros; read back with test_dev_out. */
static mpu_result_t dev_xy(mpu_comm *nc, float **x, float **y) {
  static const float ones[4] = {1, 2, 3, 4};
  *x = *y = NULL;
  mpu_result_t r = test_dev_in(nc, ones, sizeof ones, (void **)x);
  if (!r) r = test_dev_in(nc, NULL, sizeof ones, (void **)y);
  return r;
}

static void dev_free(mpu_comm *nc, float *x, float *y) {
  test_dev_out(nc, x, NULL, 0);
  test_dev_out(nc, y, NULL, 0);
}

/* rank 1 never makes the call */
static mpu_result_t absent(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm *nc = NULL;
  RCHECK(!join(world, 0.5, &me, &nc), "create: %s", mpu_last_error());
  float *x, *y;
  RCHECK(!dev_xy(nc, &x, &y), "buffers: %s", mpu_last_error());
  if (me == 0) {
    double t0 = test_now();
    mpu_result_t r = mpu_comm_all_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM);
    double took = test_now() - t0;
    RCHECK(r == MPU_ERR_TIMEOUT, "absent peer: %s", mpu_result_name(r));
    RCHECK(took >= 0.5 && took < 1.5, "failed after %.3f s", took);
    RCHECK(strstr(mpu_last_error(), "NCCL aborted"), "message: %s", mpu_last_error());
    t0 = test_now();
    r = mpu_comm_barrier(nc);
    RCHECK(r == MPU_ERR_TIMEOUT && test_now() - t0 < 0.1, "broken: %s", mpu_result_name(r));
  }
  dev_free(nc, x, y);
  return leave(world, nc); /* rank 1 leaves only after rank 0 gave up */
}

static mpu_result_t aborts_with(int me, mpu_comm *nc, float *x, float *y);

/* rank 1 aborts while rank 0 waits: NCCL does not tell the peers of an
 * aborted rank (on NVLink, P2P, SHM; nor does the double), the abort reaches
 * rank 0 out of band, within a second, long before the 30 s watchdog */
static mpu_result_t one_aborts(mpu_comm *world, int me, mpu_comm *nc) {
  float *x, *y;
  RCHECK(!dev_xy(nc, &x, &y), "buffers: %s", mpu_last_error());
  mpu_comm_barrier(world); /* nobody aborts before both have their buffers */
  mpu_result_t r = aborts_with(me, nc, x, y);
  dev_free(nc, x, y);
  return r;
}

static mpu_result_t aborts_with(int me, mpu_comm *nc, float *x, float *y) {
  if (me == 1) {
    sleep_ms(100);
    RCHECK(!mpu_comm_abort(nc), "abort");
    RCHECK(mpu_comm_all_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM) == MPU_ERR_ABORTED,
           "after abort: %s", mpu_last_error());
  } else {
    double t0 = test_now();
    mpu_result_t r = mpu_comm_all_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM);
    RCHECK(r == MPU_ERR_ABORTED && test_now() - t0 < 1.1, "peer aborted: %s after %.3f s (%s)",
           mpu_result_name(r), test_now() - t0, mpu_last_error());
    RCHECK(strstr(mpu_last_error(), "rank 1 of this communicator"), "message: %s",
           mpu_last_error());
  }
  return MPU_SUCCESS;
}

/* rank 1 aborts while rank 0 waits */
static mpu_result_t aborted(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm *nc = NULL;
  RCHECK(!join(world, 30, &me, &nc), "create: %s", mpu_last_error());
  mpu_result_t r = one_aborts(world, me, nc);
  leave(world, nc);
  return r;
}

/* A host twin with an out-of-band channel (as the MPI backend's): the NCCL
 * communicator opens it once per member when it is made, posts its abort
 * there rather than on the in-process board, its peer's wait polls it, and
 * destroy closes it. The twin is the threads world with the channel's ops
 * added (the NCCL double cannot span processes to use MPI's). */
static struct {
  pthread_mutex_t lock;
  int opens, closes, posts, polls, poster;
  char why[128];
} chan = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0, -1, ""};

static mpu_result_t chan_open(mpu_comm *c, void **ctx) {
  pthread_mutex_lock(&chan.lock);
  chan.opens++;
  pthread_mutex_unlock(&chan.lock);
  *ctx = &chan;
  return MPU_SUCCESS;
}
static void chan_post(void *ctx, int rank, const char *why) {
  pthread_mutex_lock(&chan.lock);
  if (chan.poster < 0) chan.poster = rank, snprintf(chan.why, sizeof chan.why, "%s", why);
  chan.posts++;
  pthread_mutex_unlock(&chan.lock);
}
static int chan_poll(void *ctx, int *who, char *why, size_t len) {
  pthread_mutex_lock(&chan.lock);
  chan.polls++;
  int heard = chan.poster >= 0;
  if (heard) *who = chan.poster, snprintf(why, len, "%s", chan.why);
  pthread_mutex_unlock(&chan.lock);
  return heard;
}
static void chan_close(void *ctx) {
  pthread_mutex_lock(&chan.lock);
  chan.closes++;
  pthread_mutex_unlock(&chan.lock);
}

static mpu__comm_ops twin_ops;
static pthread_once_t twin_once = PTHREAD_ONCE_INIT;
static _Atomic(const mpu__comm_ops *) threads_ops; /* every rank stores the same */
static void twin_ops_init(void) {
  twin_ops = *atomic_load(&threads_ops);
  twin_ops.oob_open = chan_open;
  twin_ops.oob_post = chan_post;
  twin_ops.oob_poll = chan_poll;
  twin_ops.oob_close = chan_close;
}

static mpu_result_t twin_channel(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm_rank(world, &me);
  atomic_store(&threads_ops, world->ops); /* the same on both ranks */
  pthread_once(&twin_once, twin_ops_init);
  mpu_comm *twin = NULL, *nc = NULL;
  RCHECK(!mpu_comm_split(world, 0, me, &twin), "twin: %s", mpu_last_error());
  twin->ops = &twin_ops;
  RCHECK(!test_nccl_timed(twin, 30, &nc), "create: %s", mpu_last_error());
  mpu_result_t r = one_aborts(world, me, nc);
  mpu_comm_barrier(world);
  mpu_comm_destroy(nc);
  twin->ops = threads_ops;
  mpu_comm_destroy(twin);
  return r;
}

/* a request outlives a wait_timeout */
static mpu_result_t late(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm *nc = NULL;
  RCHECK(!join(world, 30, &me, &nc), "create: %s", mpu_last_error());
  float *x, *y, out[4] = {0};
  mpu_request *req = NULL;
  RCHECK(!dev_xy(nc, &x, &y), "buffers: %s", mpu_last_error());
  if (me == 0) {
    RCHECK(!mpu_comm_iall_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM, &req), "start");
    int done = 1;
    RCHECK(!mpu_request_test(req, &done) && !done, "test before the peer came");
    RCHECK(mpu_request_wait_timeout(req, 0.2) == MPU_ERR_TIMEOUT, "wait_timeout");
  }
  mpu_comm_barrier(world); /* now rank 1 joins */
  if (me == 1) RCHECK(!mpu_comm_all_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM), "late call");
  else RCHECK(!mpu_request_wait(req), "wait after the timeout: %s", mpu_last_error());
  RCHECK(!test_dev_out(nc, y, out, sizeof out) && out[3] == 8, "result %g", out[3]);
  test_dev_out(nc, x, NULL, 0);
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  RCHECK(!mpu_comm_capabilities(nc, &caps) && caps.memory == MPU_MEMORY_DEVICE && caps.streams &&
             caps.native_nonblocking && caps.fault_detection && !caps.exact_reductions,
         "capabilities");
  void *stream = NULL;
  RCHECK(!mpu_comm_stream(nc, &stream) && stream, "stream");
  RCHECK(mpu_comm_destroy(nc) == MPU_SUCCESS, "destroy");
  mpu_comm *host = NULL;
  RCHECK(mpu_comm_host_twin(world, &host) == MPU_ERR_INVALID_ARGUMENT, "twin of a host comm");
  return MPU_SUCCESS;
}

/* mpu_comm_abort from a helper thread while rank 0 waits in a collective
 * rank 1 has not joined: the wait ends in MPU_ERR_ABORTED (never success
 * with partial output), NCCL is aborted once (by the watchdog thread or the waiter); rank 1,
 * calling after the abort, learns of it through the host twin at once. */
static atomic_int abort_done;

static void *abort_soon(void *p) {
  sleep_ms(20);
  mpu_comm_abort(p);
  atomic_store(&abort_done, 1);
  return NULL;
}

static mpu_result_t abort_from_thread(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm *nc = NULL;
  RCHECK(!join(world, 30, &me, &nc), "create: %s", mpu_last_error());
  float *x, *y;
  RCHECK(!dev_xy(nc, &x, &y), "buffers: %s", mpu_last_error());
  mpu_comm_barrier(world); /* nobody aborts before both have their buffers */
  mpu_result_t r;
  double t0 = test_now();
  if (me == 0) {
    pthread_t helper;
    RCHECK(!pthread_create(&helper, NULL, abort_soon, nc), "helper thread");
    r = mpu_comm_all_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM);
    pthread_join(helper, NULL);
  } else {
    while (!atomic_load(&abort_done) && test_now() - t0 < 20) sleep_ms(1);
    t0 = test_now();
    r = mpu_comm_all_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM);
  }
  RCHECK(r == MPU_ERR_ABORTED && test_now() - t0 < 5, "rank %d: %s after %.3f s: %s", me,
         mpu_result_name(r), test_now() - t0, mpu_last_error());
  RCHECK(mpu_comm_barrier(nc) == MPU_ERR_ABORTED, "broken after the abort");
  dev_free(nc, x, y);
  return leave(world, nc);
}

/* mpu_request_test has a deadline too: tested again and again against a
 * peer that never comes, the request fails after the watchdog's timeout,
 * counted from the call's start. */
static mpu_result_t test_deadline(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm *nc = NULL;
  RCHECK(!join(world, 0.3, &me, &nc), "create: %s", mpu_last_error());
  float *x, *y;
  RCHECK(!dev_xy(nc, &x, &y), "buffers: %s", mpu_last_error());
  if (me == 0) {
    mpu_request *req = NULL;
    double t0 = test_now();
    RCHECK(!mpu_comm_iall_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM, &req), "start");
    mpu_result_t r = MPU_SUCCESS;
    int done = 0;
    while (!r && !done && test_now() - t0 < 10) {
      r = mpu_request_test(req, &done);
      sleep_ms(1);
    }
    double took = test_now() - t0;
    RCHECK(r == MPU_ERR_TIMEOUT && took >= 0.3 && took < 5, "test: %s after %.3f s",
           mpu_result_name(r), took);
    if (!done && !r) mpu_request_wait_timeout(req, 0);
  }
  dev_free(nc, x, y);
  return leave(world, nc); /* rank 1 leaves only after rank 0 gave up */
}

/* ncclCommSplit is collective over the parent: a rank that never calls it
 * ends the others' split in MPU_ERR_TIMEOUT at the deadline (the split is
 * non-blocking and polled), saying so, instead of a hang. */
static mpu_result_t split_missing(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm *nc = NULL, *sub = NULL;
  mpu_comm_rank(world, &me);
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.timeout_s = 0.5;
  o.keep_host = 0; /* no twin: groups by ncclCommSplit */
  RCHECK(!mpu_comm_nccl_create(world, &o, &nc), "create: %s", mpu_last_error());
  if (me == 0) {
    double t0 = test_now();
    mpu_result_t r = mpu_comm_split(nc, 0, 0, &sub);
    double took = test_now() - t0;
    RCHECK(r == MPU_ERR_TIMEOUT && took >= 0.5 && took < 5 && !sub, "split: %s after %.3f s",
           mpu_result_name(r), took);
    RCHECK(strstr(mpu_last_error(), "never called mpu_comm_split"), "message: %s",
           mpu_last_error());
  }
  return leave(world, nc);
}

/* A communicator running on the caller's stream hands it on: its splits
 * and groups run on that stream too (with a host twin and without). */
static mpu_result_t keeps_stream(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm_rank(world, &me);
  mpu_comm *a = NULL, *b = NULL, *bare = NULL, *child = NULL, *group = NULL, *bare_child = NULL;
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.keep_host = 0;
  RCHECK(!test_nccl_timed(world, 30, &a) && !test_nccl_timed(world, 30, &b), "create: %s",
         mpu_last_error());
  RCHECK(!mpu_comm_nccl_create(world, &o, &bare), "create bare: %s", mpu_last_error());
  void *user = NULL, *got = NULL; /* a's own stream plays the caller's */
  RCHECK(!mpu_comm_stream(a, &user) && user, "stream");
  RCHECK(!mpu_comm_set_stream(b, user) && !mpu_comm_set_stream(bare, user), "set_stream: %s",
         mpu_last_error());
  int members[2] = {1, 0};
  RCHECK(!mpu_comm_split(b, 0, 1 - me, &child), "split: %s", mpu_last_error());
  RCHECK(!mpu_comm_create_group(b, members, 2, &group), "group: %s", mpu_last_error());
  RCHECK(!mpu_comm_split(bare, 0, me, &bare_child), "bare split: %s", mpu_last_error());
  RCHECK(!mpu_comm_stream(child, &got) && got == user, "the split dropped the stream");
  RCHECK(!mpu_comm_stream(group, &got) && got == user, "the group dropped the stream");
  RCHECK(!mpu_comm_stream(bare_child, &got) && got == user, "the bare split dropped the stream");
  int rank = -1;
  RCHECK(!mpu_comm_rank(child, &rank) && rank == 1 - me, "split order: rank %d", rank);
  float x = (float)(me + 1), y = 0;
  RCHECK(!test_coll(child, 'r', &x, &y, 1, MPU_FLOAT32, MPU_SUM) && y == 3, "sum %g", y);
  mpu_comm_destroy(bare_child);
  mpu_comm_destroy(group);
  mpu_comm_destroy(child);
  mpu_comm_destroy(bare);
  mpu_comm_destroy(b);
  mpu_comm_destroy(a); /* the stream's owner last */
  return MPU_SUCCESS;
}

static void run(mpu_rank_fn fn) {
  memset(messages, 0, sizeof messages);
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 60;
  mpu_result_t r = mpu_launch(2, fn, NULL, NULL, &o);
  if (r) {
    for (int k = 0; k < 2; k++)
      if (messages[k][0]) print_error("rank %d: %s\n", k, messages[k]);
    fail_msg("%s", mpu_last_error());
  }
}

static void test_absent(void **state) { (void)state; run(absent); }
static void test_aborted(void **state) { (void)state; run(aborted); }
static void test_late(void **state) { (void)state; run(late); }
static void test_request_test_deadline(void **state) { (void)state; run(test_deadline); }
static void test_split_missing(void **state) { (void)state; run(split_missing); }
static void test_keeps_stream(void **state) { (void)state; run(keeps_stream); }

static void test_twin_channel(void **state) {
  (void)state;
  run(twin_channel);
  assert_int_equal(chan.opens, 2);
  assert_int_equal(chan.closes, 2);
  assert_true(chan.posts >= 1); /* rank 1 first (rank 0 posts too once it broke) */
  assert_int_equal(chan.poster, 1);
  assert_true(chan.polls > 0);
}

static void test_abort_from_thread(void **state) {
  (void)state;
  for (int i = 0; i < 20; i++) {
    atomic_store(&abort_done, 0);
    run(abort_from_thread);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_absent),
      cmocka_unit_test(test_aborted),
      cmocka_unit_test(test_twin_channel),
      cmocka_unit_test(test_late),
      cmocka_unit_test(test_abort_from_thread),
      cmocka_unit_test(test_request_test_deadline),
      cmocka_unit_test(test_split_missing),
      cmocka_unit_test(test_keeps_stream),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
