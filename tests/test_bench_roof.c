/*
 * mpu_bench_roof: the roof of `mpu bench`'s rows (the least data movement of
 * a collective, done by the same threads with no waiting between them).
 * It refuses what mpu_bench_collectives refuses, answers a positive time for
 * every collective and placement, and a buffer 1024 times larger takes
 * longer (a roof that did not move the bytes would not). The roof a round
 * at a time (mpu_bench_roof_begin, _round, _end) refuses misuse and frees
 * what it laid out; mpu_bench_collectives' pauses come as many times as
 * asked on every rank, outside the timing, and a pause's error ends the
 * measurement with it; it lends each rank's buffers once, filled (the
 * roof's rounds work on them). What the bench reports of each collective (its
 * name, nccl-tests' bus factor, its least traffic) is the collective
 * table's, pinned here to nccl-tests' definitions (doc/PERFORMANCE.md).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

#include "mpu.h"

static mpu_bench_config config(mpu_collective c, size_t bytes, int in_place) {
  mpu_bench_config cfg = MPU_BENCH_CONFIG_INIT;
  cfg.collective = c, cfg.bytes = bytes, cfg.in_place = in_place, cfg.iters = 3;
  return cfg;
}

static void test_collective_facts(void **state) {
  (void)state;
  /* n = 4, S = 100 bytes: busbw factors and bytes read + written */
  static const struct {
    mpu_collective c;
    const char *name;
    double bus, traffic;
  } want[] = {
      {MPU_COLL_ALL_REDUCE, "all_reduce", 1.5, 800},  {MPU_COLL_ALL_GATHER, "all_gather", 0.75, 500},
      {MPU_COLL_REDUCE_SCATTER, "reduce_scatter", 0.75, 500},
      {MPU_COLL_BROADCAST, "broadcast", 1, 400},      {MPU_COLL_REDUCE, "reduce", 1, 500},
      {MPU_COLL_ALL_TO_ALL, "all_to_all", 0.75, 800}, {MPU_COLL_BARRIER, "barrier", 0, 0},
      {MPU_COLL_ALL_GATHER_V, "all_gather_v", 0, 0},
      {MPU_COLL_REDUCE_SCATTER_V, "reduce_scatter_v", 0, 0},
      {MPU_COLL_ALL_TO_ALL_V, "all_to_all_v", 0, 0},
  };
  assert_int_equal(sizeof want / sizeof want[0], MPU_COLL_KINDS);
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    mpu_collective back = MPU_COLL_KINDS;
    assert_string_equal(mpu_collective_name(want[i].c), want[i].name);
    assert_int_equal(mpu_collective_from_name(want[i].name, &back), MPU_SUCCESS);
    assert_int_equal(back, want[i].c);
    assert_true(fabs(mpu_bench_bus_factor(want[i].c, 4) - want[i].bus) < 1e-12);
    assert_true(fabs(mpu_bench_traffic(want[i].c, 4, 100) - want[i].traffic) < 1e-9);
    assert_true(mpu_bench_bus_factor(want[i].c, 0) == 0);
  }
  assert_true(fabs(mpu_bench_bus_factor(MPU_COLL_ALL_REDUCE, 1)) < 1e-12); /* 2 (n - 1) / n */
  assert_string_equal(mpu_collective_name(MPU_COLL_KINDS), "invalid");
  assert_string_equal(mpu_collective_name((mpu_collective)-1), "invalid");
  assert_true(mpu_bench_bus_factor(MPU_COLL_KINDS, 4) == 0); /* send/recv rows are not collectives */
  assert_true(mpu_bench_traffic(MPU_COLL_KINDS + 1, 4, 100) == 0);
  mpu_collective out;
  assert_int_equal(mpu_collective_from_name("send", &out), MPU_ERR_INVALID_ARGUMENT);
}

static void test_refusals(void **state) {
  (void)state;
  mpu_bench_config cfg = config(MPU_COLL_ALL_REDUCE, 1024, 0);
  double us = -1;
  assert_int_equal(mpu_bench_roof(&cfg, 2, 0, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_bench_roof(NULL, 2, 0, &us), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_bench_roof(&cfg, 0, 0, &us), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_bench_roof(&cfg, 2000, 0, &us), MPU_ERR_INVALID_ARGUMENT);
  mpu_bench_config bad = cfg;
  bad.collective = MPU_COLL_COUNT;
  assert_int_equal(mpu_bench_roof(&bad, 2, 0, &us), MPU_ERR_INVALID_ARGUMENT);
  bad = cfg, bad.dtype = (mpu_dtype)999;
  assert_int_equal(mpu_bench_roof(&bad, 2, 0, &us), MPU_ERR_INVALID_ARGUMENT);
  bad = cfg, bad.iters = 0;
  assert_int_equal(mpu_bench_roof(&bad, 2, 0, &us), MPU_ERR_INVALID_ARGUMENT);
  bad = config(MPU_COLL_ALL_TO_ALL, SIZE_MAX, 0); /* n blocks of it overflow */
  assert_int_equal(mpu_bench_roof(&bad, 4, 0, &us), MPU_ERR_INVALID_ARGUMENT);
  bad = cfg, bad.size = 3; /* not a config */
  assert_int_equal(mpu_bench_roof(&bad, 2, 0, &us), MPU_ERR_INVALID_ARGUMENT);
  assert_true(us == -1); /* a refused call writes nothing */
}

static void test_every_row(void **state) {
  (void)state;
  for (int c = 0; c < MPU_COLL_COUNT; c++) /* the collectives of mpu bench's rows */
    for (int n = 1; n <= 3; n++)
      for (int ip = 0; ip < 2; ip++)
        for (int workers = 0; workers <= 1; workers++) {
          mpu_bench_config cfg = config((mpu_collective)c, 96 << 10, ip);
          double us = 0;
          assert_int_equal(mpu_bench_roof(&cfg, n, workers, &us), MPU_SUCCESS);
          assert_true(isfinite(us) && us > 0);
        }
}

static void test_more_bytes_take_longer(void **state) {
  (void)state;
  mpu_bench_config small = config(MPU_COLL_ALL_REDUCE, 16 << 10, 0);
  mpu_bench_config large = config(MPU_COLL_ALL_REDUCE, (size_t)16 << 20, 0);
  double s = 0, l = 0;
  assert_int_equal(mpu_bench_roof(&small, 2, 0, &s), MPU_SUCCESS);
  assert_int_equal(mpu_bench_roof(&large, 2, 0, &l), MPU_SUCCESS);
  assert_true(l > 10 * s); /* 1024x the bytes: far more than 10x the time on any machine */
}

static void test_rounds(void **state) {
  (void)state;
  mpu_bench_config cfg = config(MPU_COLL_ALL_GATHER, 64 << 10, 1);
  mpu_bench_roof_run *run = (mpu_bench_roof_run *)&cfg; /* must be overwritten */
  double us = -1;
  assert_int_equal(mpu_bench_roof_begin(&cfg, 2, 0, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_bench_roof_begin(NULL, 2, 0, &run), MPU_ERR_INVALID_ARGUMENT);
  assert_null(run);
  assert_int_equal(mpu_bench_roof_begin(&cfg, 0, 0, &run), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_bench_roof_round(NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_bench_roof_end(NULL, NULL), MPU_SUCCESS);
  assert_int_equal(mpu_bench_roof_end(NULL, &us), MPU_ERR_INVALID_ARGUMENT);
  /* ended before any round: nothing to give, everything freed (ASan's leak check) */
  assert_int_equal(mpu_bench_roof_begin(&cfg, 2, 0, &run), MPU_SUCCESS);
  assert_int_equal(mpu_bench_roof_end(run, &us), MPU_ERR_INVALID_USAGE);
  assert_true(us == -1);
  assert_int_equal(mpu_bench_roof_begin(&cfg, 3, 1, &run), MPU_SUCCESS);
  for (int i = 0; i < 3; i++) assert_int_equal(mpu_bench_roof_round(run), MPU_SUCCESS);
  assert_int_equal(mpu_bench_roof_end(run, &us), MPU_SUCCESS);
  assert_true(isfinite(us) && us > 0);
  /* the rounds mpu_bench_roof times: the iterations, at most 50 up to 4 MiB, 40 above */
  assert_int_equal(mpu_bench_roof_rounds(&cfg), 3);
  cfg.iters = 100;
  assert_int_equal(mpu_bench_roof_rounds(&cfg), 50);
  cfg.bytes = (size_t)8 << 20;
  assert_int_equal(mpu_bench_roof_rounds(&cfg), 40);
  cfg.iters = 0;
  assert_int_equal(mpu_bench_roof_rounds(&cfg), 0);
  assert_int_equal(mpu_bench_roof_rounds(NULL), 0);
}

/* ---- mpu_bench_collectives' pauses, on 2 thread ranks ---- */

typedef struct pauses_case {
  int iters, pauses, fail_at; /* fail_at: the pause (1-based) that fails on every rank; 0: none */
  int no_function;
  mpu_result_t want;
  int seen[2];                /* pauses per rank */
  int sleep_ms;               /* each pause sleeps this long: outside the timing */
} pauses_case;

typedef struct rank_arg {
  pauses_case *c;
  int rank;
} rank_arg;

static mpu_result_t count_pause(void *arg) {
  rank_arg *a = arg;
  int k = ++a->c->seen[a->rank];
  if (a->c->sleep_ms) nanosleep(&(struct timespec){0, a->c->sleep_ms * 1000000L}, NULL);
  return k == a->c->fail_at ? mpu_fail(MPU_ERR_TIMEOUT, "test: pause %d fails", k) : MPU_SUCCESS;
}

static mpu_result_t pauses_rank(mpu_comm *world, void *arg) {
  pauses_case *c = arg;
  rank_arg a = {c, 0};
  mpu_comm_rank(world, &a.rank);
  mpu_bench_config cfg = config(MPU_COLL_ALL_REDUCE, 4096, 0);
  cfg.iters = c->iters, cfg.warmup = 1, cfg.pauses = c->pauses;
  cfg.pause = c->no_function ? NULL : count_pause;
  cfg.pause_arg = &a;
  mpu_bench_result res = MPU_BENCH_RESULT_INIT;
  mpu_result_t r = mpu_bench_collective(world, &cfg, &res);
  if (r != c->want) return MPU_ERR_INTERNAL;
  if (!r && !(res.mean_us > 0 && res.time_us > 0)) return MPU_ERR_INTERNAL;
  /* a 4 KiB all_reduce takes microseconds; a pause's 100 ms counted would show */
  if (!r && c->sleep_ms && !(res.mean_us < 50e3 && res.time_us < 50e3)) return MPU_ERR_INTERNAL;
  return MPU_SUCCESS;
}

static void test_pauses(void **state) {
  (void)state;
  pauses_case cases[] = {
      {7, 3, 0, 0, MPU_SUCCESS, {0, 0}, 0},              /* spread over the iterations */
      {5, 5, 0, 0, MPU_SUCCESS, {0, 0}, 0},              /* before every one */
      {2, 2, 0, 0, MPU_SUCCESS, {0, 0}, 100},         /* not timed */
      {5, 0, 0, 0, MPU_SUCCESS, {0, 0}, 0},              /* none */
      {5, -1, 0, 0, MPU_ERR_INVALID_ARGUMENT, {0, 0}, 0}, /* negative */
      {5, 6, 0, 0, MPU_ERR_INVALID_ARGUMENT, {0, 0}, 0}, /* more than the iterations */
      {5, 2, 0, 1, MPU_ERR_INVALID_ARGUMENT, {0, 0}, 0}, /* no function */
      {6, 3, 2, 0, MPU_ERR_TIMEOUT, {0, 0}, 0},          /* the second pause fails */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pauses_case *c = &cases[i];
    mpu_result_t r = mpu_launch(2, pauses_rank, c, NULL, NULL);
    assert_int_equal(r, MPU_SUCCESS);
    int want = c->want == MPU_SUCCESS ? c->pauses : c->want == MPU_ERR_TIMEOUT ? c->fail_at : 0;
    assert_int_equal(c->seen[0], want);
    assert_int_equal(c->seen[1], want);
  }
}

/* ---- mpu_bench_collectives lends each rank's buffers once, filled ---- */

typedef struct lend_case {
  int calls[2];
  int filled[2]; /* the first input element was the rank's fill value */
} lend_case;

static void count_lend(void *arg, int rank, void *send, void *recv) {
  lend_case *c = arg;
  if (rank < 0 || rank > 1 || !send || !recv) return;
  c->calls[rank]++;
  c->filled[rank] = *(const float *)send == (float)(rank % 3 + 1);
}

static mpu_result_t lend_rank(mpu_comm *world, void *arg) {
  mpu_bench_config cfg = config(MPU_COLL_ALL_GATHER, 64 << 10, 0);
  cfg.lend = count_lend, cfg.pause_arg = arg;
  mpu_bench_result res = MPU_BENCH_RESULT_INIT;
  return mpu_bench_collective(world, &cfg, &res);
}

static void test_lend(void **state) {
  (void)state;
  lend_case c = {{0, 0}, {0, 0}};
  assert_int_equal(mpu_launch(2, lend_rank, &c, NULL, NULL), MPU_SUCCESS);
  for (int k = 0; k < 2; k++) {
    assert_int_equal(c.calls[k], 1);
    assert_true(c.filled[k]);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_collective_facts),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_every_row),
      cmocka_unit_test(test_more_bytes_take_longer),
      cmocka_unit_test(test_rounds),
      cmocka_unit_test(test_pauses),
      cmocka_unit_test(test_lend),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
