/*
 * test_threads_failures.c - what the threads backend does when ranks go
 * wrong: mismatched calls, abort, a rank that returns early or fails, a
 * timeout, a destroyed peer, bad point-to-point traffic; and that waiting
 * ranks sleep instead of spinning when they outnumber the cores.
 *
 * Each rank function records its outcome (result and message) in a shared
 * table; the main thread checks the table after mpu_launch returns.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "mpu.h"

#define MAXR 64

typedef struct outcome {
  mpu_result_t result[MAXR];
  char message[MAXR][1024];
  _Atomic int counter;
  int bad_rounds;
} outcome;

static outcome out;

static void reset(void) { memset(&out, 0, sizeof out); }

static int rank_of(mpu_comm *c) {
  int r = -1;
  mpu_comm_rank(c, &r);
  return r;
}

/* Record a call's result for this rank, return it unchanged. */
static mpu_result_t note(mpu_comm *world, mpu_result_t r) {
  int me = rank_of(world);
  out.result[me] = r;
  snprintf(out.message[me], sizeof out.message[me], "%s", r ? mpu_last_error() : "");
  return r;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static mpu_launch_options opts(double timeout_s, int check_calls) {
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = timeout_s;
  o.check_calls = check_calls;
  return o;
}

#define assert_contains(hay, needle)                                                       \
  do {                                                                                     \
    if (!strstr((hay), (needle))) fail_msg("'%s' does not contain '%s'", (hay), (needle)); \
  } while (0)

/* ---- mismatched calls --------------------------------------------------------- */

static mpu_result_t count_mismatch(mpu_comm *world, void *arg) {
  (void)arg;
  float in[16] = {1}, res[16];
  int me = rank_of(world);
  mpu_result_t r = mpu_comm_all_reduce(world, in, res, me == 2 ? 16 : 8, MPU_FLOAT32, MPU_SUM);
  note(world, r);
  /* the group is intact: a matching call still works */
  return mpu_comm_all_reduce(world, in, res, 8, MPU_FLOAT32, MPU_SUM);
}

static void test_count_mismatch(void **state) {
  (void)state;
  reset();
  mpu_launch_options o = opts(30, 0);
  assert_int_equal(mpu_launch(4, count_mismatch, NULL, NULL, &o), MPU_SUCCESS);
  for (int r = 0; r < 4; r++) {
    assert_int_equal(out.result[r], MPU_ERR_MISMATCH);
    assert_contains(out.message[r], "count=16");
    assert_contains(out.message[r], "rank 2");
    assert_contains(out.message[r], "ranks differing from rank 0: 2");
  }
}

static mpu_result_t kind_mismatch2(mpu_comm *world, void *arg) {
  (void)arg;
  int64_t in[4] = {0}, res[16];
  int me = rank_of(world);
  mpu_result_t r = me == 1 ? mpu_comm_all_gather(world, in, res, 4, MPU_INT64)
                           : mpu_comm_all_reduce(world, in, res, 4, MPU_INT64, MPU_SUM);
  note(world, r);
  return MPU_SUCCESS;
}

static void test_kind_mismatch_small(void **state) {
  (void)state;
  reset();
  mpu_launch_options o = opts(30, 0);
  assert_int_equal(mpu_launch(3, kind_mismatch2, NULL, NULL, &o), MPU_SUCCESS);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(out.result[r], MPU_ERR_MISMATCH);
    assert_contains(out.message[r], "called all_reduce(count=4, int64, op=sum)");
    assert_contains(out.message[r], "rank 1 (world 1) called all_gather(count=4, int64)");
  }
}

/* A tiny call (staged beside its signature) against one staged in scratch, a
 * large one and an uneven one: every member compares the same signatures and
 * reports the same mismatch, and the group is intact after it. */
static mpu_result_t mixed_mismatch(mpu_comm *world, void *arg) {
  static float big[100000], big_out[100000];
  int how = *(int *)arg, me = rank_of(world), n = 0;
  mpu_comm_size(world, &n);
  float in[32] = {1, 2}, res[32 * 4];
  size_t counts[4] = {1, 1, 1, 1};
  mpu_result_t r;
  if (me != 1) r = mpu_comm_all_reduce(world, in, res, 24, MPU_FLOAT32, MPU_SUM); /* 96 bytes */
  else if (how == 0) r = mpu_comm_all_reduce(world, in, res, 25, MPU_FLOAT32, MPU_SUM);
  else if (how == 1) r = mpu_comm_all_reduce(world, big, big_out, 100000, MPU_FLOAT32, MPU_SUM);
  else r = mpu_comm_all_gather_v(world, in, res, counts, NULL, MPU_FLOAT32);
  note(world, r);
  r = mpu_comm_all_reduce(world, in, res, 2, MPU_FLOAT32, MPU_SUM);
  if (!r && (res[0] != (float)n || res[1] != 2.0f * (float)n)) return MPU_ERR_INTERNAL;
  return r;
}

static void test_mismatch_across_paths(void **state) {
  (void)state;
  static const char *called[] = {"called all_reduce(count=25, float32, op=sum)",
                                 "called all_reduce(count=100000, float32, op=sum)",
                                 "called all_gather_v(total=4, float32"};
  for (int how = 0; how < 3; how++) {
    reset();
    mpu_launch_options o = opts(30, how == 2);
    assert_int_equal(mpu_launch(4, mixed_mismatch, &how, NULL, &o), MPU_SUCCESS);
    for (int r = 0; r < 4; r++) {
      assert_int_equal(out.result[r], MPU_ERR_MISMATCH);
      assert_contains(out.message[r], "called all_reduce(count=24, float32, op=sum)");
      assert_contains(out.message[r], called[how]);
      assert_contains(out.message[r], "ranks differing from rank 0: 1");
      assert_string_equal(strchr(out.message[r], ':'), strchr(out.message[0], ':')); /* past fn */
    }
  }
}

static mpu_result_t op_root_mismatch(mpu_comm *world, void *arg) {
  int check = *(int *)arg, me = rank_of(world);
  float in[4] = {1, 2, 3, 4}, res[4];
  mpu_result_t r1 = note(world, mpu_comm_all_reduce(world, in, res, 4, MPU_FLOAT32,
                                                    me == 1 ? MPU_MAX : MPU_SUM));
  mpu_result_t r2 = mpu_comm_broadcast(world, in, 4, MPU_FLOAT32, me == 0 ? 1 : 0);
  if (check && !strstr(mpu_last_error(), "root=1")) return MPU_ERR_INTERNAL;
  if (check && (r1 != MPU_ERR_MISMATCH || r2 != MPU_ERR_MISMATCH)) return MPU_ERR_INTERNAL;
  if (!check && (r1 || r2)) return MPU_ERR_INTERNAL;
  return MPU_SUCCESS;
}

static void test_op_root_mismatch(void **state) {
  (void)state;
  int check = 1;
  reset();
  mpu_launch_options o = opts(30, 1);
  assert_int_equal(mpu_launch(2, op_root_mismatch, &check, NULL, &o), MPU_SUCCESS);
  assert_contains(out.message[0], "op=max");
  /* checking is on by default (MPU_CHECK_CALLS unset) */
  reset();
  o = opts(30, MPU_CHECKS_DEFAULT);
  assert_int_equal(mpu_launch(2, op_root_mismatch, &check, NULL, &o), MPU_SUCCESS);
  /* with call checking off op and root are the caller's business */
  check = 0;
  reset();
  o = opts(30, MPU_CHECKS_OFF);
  assert_int_equal(mpu_launch(2, op_root_mismatch, &check, NULL, &o), MPU_SUCCESS);
}

/* ---- ranks that leave ------------------------------------------------------------ */

static mpu_result_t aborter(mpu_comm *world, void *arg) {
  (void)arg;
  int me = rank_of(world);
  float x = 1, y;
  if (me == 1) {
    sleep_ms(50); /* let the others block first */
    return mpu_comm_abort(world);
  }
  note(world, mpu_comm_all_reduce(world, &x, &y, 1, MPU_FLOAT32, MPU_SUM));
  /* later calls fail at once */
  mpu_result_t again = mpu_comm_barrier(world);
  return again == MPU_ERR_ABORTED ? out.result[me] : MPU_ERR_INTERNAL;
}

static void test_abort(void **state) {
  (void)state;
  reset();
  mpu_result_t results[4];
  mpu_launch_options o = opts(60, 0);
  assert_int_equal(mpu_launch(4, aborter, NULL, results, &o), MPU_ERR_ABORTED);
  /* rank 1 returned success: the first victim reports, naming it */
  assert_contains(mpu_last_error(), "world rank 1 called mpu_comm_abort");
  assert_int_equal(results[1], MPU_SUCCESS);
  for (int r = 0; r < 4; r++) {
    if (r == 1) continue;
    assert_int_equal(results[r], MPU_ERR_ABORTED);
    assert_contains(out.message[r], "world rank 1 called mpu_comm_abort");
  }
}

static mpu_result_t early_exit(mpu_comm *world, void *arg) {
  (void)arg;
  int me = rank_of(world);
  float x = 1, y = 0;
  if (me == 2) return MPU_SUCCESS;
  /* a group without rank 2 is unaffected */
  int pair[2] = {0, 1};
  mpu_comm *g;
  mpu_result_t r = mpu_comm_create_group(world, pair, 2, &g);
  if (r) return r;
  r = mpu_comm_all_reduce(g, &x, &y, 1, MPU_FLOAT32, MPU_SUM);
  mpu_comm_destroy(g);
  if (r || y != 2) return MPU_ERR_INTERNAL;
  note(world, mpu_comm_all_reduce(world, &x, &y, 1, MPU_FLOAT32, MPU_SUM));
  return MPU_SUCCESS;
}

static void test_early_exit(void **state) {
  (void)state;
  reset();
  mpu_launch_options o = opts(60, 0);
  assert_int_equal(mpu_launch(3, early_exit, NULL, NULL, &o), MPU_SUCCESS);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(out.result[r], MPU_ERR_ABORTED);
    assert_contains(out.message[r], "world rank 2 returned while its peers still waited");
  }
}

static mpu_result_t failer(mpu_comm *world, void *arg) {
  (void)arg;
  if (rank_of(world) == 0) return MPU_ERR_INVALID_ARGUMENT;
  return note(world, mpu_comm_barrier(world));
}

static void test_failed_rank(void **state) {
  (void)state;
  reset();
  mpu_result_t results[3];
  mpu_launch_options o = opts(60, 0);
  assert_int_equal(mpu_launch(3, failer, NULL, results, &o), MPU_ERR_INVALID_ARGUMENT);
  assert_contains(mpu_last_error(), "rank 0 of 3 failed");
  for (int r = 1; r < 3; r++) {
    assert_int_equal(results[r], MPU_ERR_ABORTED);
    assert_contains(out.message[r], "world rank 0 failed (its function returned MPU_ERR_INVALID_ARGUMENT)");
  }
}

static mpu_result_t late(mpu_comm *world, void *arg) {
  (void)arg;
  if (rank_of(world) == 1) sleep_ms(600);
  note(world, mpu_comm_barrier(world));
  /* the communicator is broken for good: this fails at once */
  return mpu_comm_barrier(world) == MPU_ERR_TIMEOUT ? MPU_SUCCESS : MPU_ERR_INTERNAL;
}

static void test_timeout(void **state) {
  (void)state;
  reset();
  mpu_launch_options o = opts(0.1, 0);
  assert_int_equal(mpu_launch(3, late, NULL, NULL, &o), MPU_SUCCESS);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(out.result[r], MPU_ERR_TIMEOUT);
    assert_contains(out.message[r], "timed out waiting for world rank 1");
  }
  /* whichever rank broke the barrier also lists who was missing */
  int listed = 0;
  for (int r = 0; r < 3; r++) listed |= strstr(out.message[r], "missing ranks of this communicator: 1 (world 1)") != NULL;
  assert_true(listed);
}

static mpu_result_t destroyer(mpu_comm *world, void *arg) {
  (void)arg;
  int pair[2] = {0, 1}, me = rank_of(world);
  mpu_comm *g;
  double x = 1, y;
  mpu_result_t r = mpu_comm_create_group(world, pair, 2, &g);
  if (r) return r;
  if (me == 1) return mpu_comm_destroy(g);
  note(world, mpu_comm_all_reduce(g, &x, &y, 1, MPU_FLOAT64, MPU_SUM));
  return mpu_comm_destroy(g);
}

static void test_destroyed_peer(void **state) {
  (void)state;
  reset();
  mpu_launch_options o = opts(60, 0);
  assert_int_equal(mpu_launch(2, destroyer, NULL, NULL, &o), MPU_SUCCESS);
  assert_int_equal(out.result[0], MPU_ERR_ABORTED);
  assert_contains(out.message[0], "world rank 1 destroyed its communicator");
}

/* ---- point to point ----------------------------------------------------------- */

static mpu_result_t p2p_faults(mpu_comm *world, void *arg) {
  (void)arg;
  int me = rank_of(world);
  float buf[8] = {0};
  if (me == 1) {
    mpu_result_t r = mpu_comm_send(world, buf, 4, MPU_FLOAT32, 0);
    if (r) return r;
    sleep_ms(300);
    return MPU_SUCCESS; /* leaves without sending the second message */
  }
  mpu_result_t wrong = mpu_comm_recv(world, buf, 8, MPU_FLOAT32, 1); /* it sent 4 */
  mpu_result_t lonely = mpu_comm_recv(world, buf, 4, MPU_FLOAT32, 1);
  if (wrong != MPU_ERR_MISMATCH || !strstr(mpu_last_error(), "left without sending"))
    return MPU_ERR_INTERNAL;
  return lonely == MPU_ERR_ABORTED ? MPU_SUCCESS : MPU_ERR_INTERNAL;
}

static void test_p2p_faults(void **state) {
  (void)state;
  mpu_launch_options o = opts(60, 0);
  assert_int_equal(mpu_launch(2, p2p_faults, NULL, NULL, &o), MPU_SUCCESS);
}

static mpu_result_t recv_timeout(mpu_comm *world, void *arg) {
  (void)arg;
  float buf[1];
  if (rank_of(world) == 1) {
    sleep_ms(400);
    return MPU_SUCCESS;
  }
  mpu_result_t r = mpu_comm_recv(world, buf, 1, MPU_FLOAT32, 1);
  return r == MPU_ERR_TIMEOUT && strstr(mpu_last_error(), "no message from rank 1") ? MPU_SUCCESS
                                                                                     : MPU_ERR_INTERNAL;
}

static void test_recv_timeout(void **state) {
  (void)state;
  mpu_launch_options o = opts(0.1, 0);
  assert_int_equal(mpu_launch(2, recv_timeout, NULL, NULL, &o), MPU_SUCCESS);
}

/* ---- the launcher ----------------------------------------------------------------- */

static mpu_result_t destroy_world(mpu_comm *world, void *arg) {
  (void)arg;
  mpu_result_t r = mpu_comm_destroy(world);
  return r == MPU_ERR_INVALID_USAGE ? mpu_comm_barrier(world) : MPU_ERR_INTERNAL;
}

static mpu_result_t nothing(mpu_comm *world, void *arg) {
  (void)world, (void)arg;
  return MPU_SUCCESS;
}

static void test_launcher(void **state) {
  (void)state;
  assert_int_equal(mpu_launch(2, destroy_world, NULL, NULL, NULL), MPU_SUCCESS);
  assert_int_equal(mpu_launch(0, nothing, NULL, NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_launch(MPU_LAUNCH_MAX_RANKS + 1, nothing, NULL, NULL, NULL),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_launch(2, NULL, NULL, NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.size = 3;
  assert_int_equal(mpu_launch(2, nothing, NULL, NULL, &o), MPU_ERR_INVALID_ARGUMENT);
  assert_contains(mpu_last_error(), "MPU_LAUNCH_OPTIONS_INIT");
}

/* Everyone increments before the barrier; after it, all increments show. */
static mpu_result_t barrier_rounds(mpu_comm *world, void *arg) {
  int n = *(int *)arg;
  for (int round = 1; round <= 100; round++) {
    atomic_fetch_add(&out.counter, 1);
    mpu_result_t r = mpu_comm_barrier(world);
    if (r) return r;
    if (atomic_load(&out.counter) < round * n) out.bad_rounds++;
    r = mpu_comm_barrier(world); /* nobody starts the next round early */
    if (r) return r;
  }
  return MPU_SUCCESS;
}

static void test_barrier_orders(void **state) {
  (void)state;
  for (int n = 2; n <= 16; n *= 2) {
    reset();
    assert_int_equal(mpu_launch(n, barrier_rounds, &n, NULL, NULL), MPU_SUCCESS);
    assert_int_equal(out.bad_rounds, 0);
  }
}

/* 16 ranks on 2 cores: while rank 0 sleeps, the 15 others wait in a barrier.
 * Spinning would burn about 2 cores x 0.5 s of CPU; sleeping burns almost none. */
static mpu_result_t sleepy(mpu_comm *world, void *arg) {
  (void)arg;
  if (rank_of(world) == 0) sleep_ms(500);
  return mpu_comm_barrier(world);
}

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_oversubscribed_waits_sleep(void **state) {
  (void)state;
  /* under valgrind (and TSan) the process's CPU time is mostly the tool's
   * own instrumentation of the waits: the plain run is the one that checks */
  if (getenv("MPU_TEST_FEW_THREADS")) skip();
  double before = cpu_seconds();
  assert_int_equal(mpu_launch(16, sleepy, NULL, NULL, NULL), MPU_SUCCESS);
  double used = cpu_seconds() - before;
  if (used > 0.3) fail_msg("waiting ranks used %.3f s of CPU in 0.5 s (spinning?)", used);
}

/* 64 ranks, many small collectives: the layouts of later layers need this. */
static mpu_result_t many(mpu_comm *world, void *arg) {
  (void)arg;
  int n, me = rank_of(world);
  mpu_comm_size(world, &n);
  for (int i = 0; i < 20; i++) {
    int64_t x = me, sum = 0;
    mpu_result_t r = mpu_comm_all_reduce(world, &x, &sum, 1, MPU_INT64, MPU_SUM);
    if (r) return r;
    if (sum != (int64_t)n * (n - 1) / 2) return MPU_ERR_INTERNAL;
  }
  return MPU_SUCCESS;
}

static void test_64_ranks(void **state) {
  (void)state;
  assert_int_equal(mpu_launch(64, many, NULL, NULL, NULL), MPU_SUCCESS);
}

/* The documented maximum of thread ranks finishes its calls (waiting costs
 * O(1) per sleeper; before, 4096 sleepers scanning each other starved the
 * late ranks for tens of seconds). The timeout only guards against a hang. */
static mpu_result_t max_ranks(mpu_comm *world, void *arg) {
  (void)arg;
  int32_t one = 1, sum = 0;
  mpu_result_t r = mpu_comm_barrier(world);
  if (!r) r = mpu_comm_all_reduce(world, &one, &sum, 1, MPU_INT32, MPU_SUM);
  if (!r && sum != MPU_LAUNCH_MAX_RANKS) r = mpu_fail(MPU_ERR_INTERNAL, "sum %d", sum);
  return r;
}

static void test_max_ranks(void **state) {
  (void)state;
  /* valgrind caps threads at 500 and TSan's shadow memory grows with them */
  if (getenv("MPU_TEST_FEW_THREADS")) skip();
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 120;
  assert_int_equal(mpu_launch(MPU_LAUNCH_MAX_RANKS, max_ranks, NULL, NULL, &o), MPU_SUCCESS);
}

/* A rank function's own message, set with mpu_fail, is what mpu_launch reports. */
static mpu_result_t says_why(mpu_comm *world, void *arg) {
  (void)arg;
  if (rank_of(world) == 2) return mpu_fail(MPU_ERR_INVALID_ARGUMENT, "rank %d ran out of %s", 2, "data");
  return MPU_SUCCESS;
}

/* The highest rank fails late while the others wait for it: the report is
 * its failure in its own words, not a victim's MPU_ERR_ABORTED. */
static mpu_result_t fails_last(mpu_comm *world, void *arg) {
  int me = rank_of(world), n = *(int *)arg;
  if (me == n - 1) {
    sleep_ms(50); /* the others are waiting by now (and if not, they fail later) */
    return mpu_fail(MPU_ERR_INVALID_ARGUMENT, "rank %d found a bad batch", me);
  }
  return mpu_comm_barrier(world);
}

static void test_first_failure_reported(void **state) {
  (void)state;
  int n = 4;
  mpu_result_t results[4];
  mpu_launch_options o = opts(60, 0);
  assert_int_equal(mpu_launch(n, fails_last, &n, results, &o), MPU_ERR_INVALID_ARGUMENT);
  assert_contains(mpu_last_error(), "rank 3 of 4 failed: rank 3 found a bad batch");
  assert_contains(mpu_last_error(), "3 more after it");
  for (int r = 0; r < 3; r++) assert_int_equal(results[r], MPU_ERR_ABORTED);
}

static void test_rank_message(void **state) {
  (void)state;
  mpu_fail(MPU_ERR_INTERNAL, "a stale message");
  assert_int_equal(mpu_launch(4, says_why, NULL, NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_contains(mpu_last_error(), "rank 2 of 4 failed: rank 2 ran out of data");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_count_mismatch),
      cmocka_unit_test(test_rank_message),
      cmocka_unit_test(test_first_failure_reported),
      cmocka_unit_test(test_max_ranks),
      cmocka_unit_test(test_kind_mismatch_small),
      cmocka_unit_test(test_mismatch_across_paths),
      cmocka_unit_test(test_op_root_mismatch),
      cmocka_unit_test(test_abort),
      cmocka_unit_test(test_early_exit),
      cmocka_unit_test(test_failed_rank),
      cmocka_unit_test(test_timeout),
      cmocka_unit_test(test_destroyed_peer),
      cmocka_unit_test(test_p2p_faults),
      cmocka_unit_test(test_recv_timeout),
      cmocka_unit_test(test_launcher),
      cmocka_unit_test(test_barrier_orders),
      cmocka_unit_test(test_oversubscribed_waits_sleep),
      cmocka_unit_test(test_64_ranks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
