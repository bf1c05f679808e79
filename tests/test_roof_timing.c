/*
 * How the roof of `mpu bench` times what it runs (roof.c), with a stub in
 * place of the collective's tasks: each way of a round runs
 * MPU_BENCH_SETTLE untimed iterations and MPU_BENCH_ROOF_TIMED timed ones
 * back to back, and the roof is the mean of the timed ones, not the best
 * single iteration (a row is its mean over calls made back to back); an
 * all_gather is also timed with its pulled and pushed iterations
 * alternating. Rounds work on the row's own buffers once every rank has
 * lent them (mpu_bench_roof_lend), and on the roof's own until then. The
 * only timing here is a lower bound set by sleeps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "bench/bench_internal.h"

enum { SLOW_US = 2000, MOST = 4096 };

typedef struct seen {
  int n;               /* thread 0's calls of the stub */
  int iter[MOST], way[MOST];
} seen;

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts)) {
  }
}

/* The first timed iteration of each way does nothing; every later one
 * sleeps SLOW_US: the best single iteration is about 0, the mean of the
 * timed ones at least (TIMED - 1) / TIMED of SLOW_US. */
static void first_fast(void *arg, int thread, int iteration, int way) {
  seen *s = arg;
  if (thread == 0 && s->n < MOST) s->iter[s->n] = iteration, s->way[s->n] = way, s->n++;
  if (iteration > MPU_BENCH_SETTLE) sleep_us(SLOW_US);
}

static mpu_bench_config gather_1m(void) {
  mpu_bench_config cfg = MPU_BENCH_CONFIG_INIT;
  cfg.collective = MPU_COLL_ALL_GATHER, cfg.bytes = (size_t)1 << 20, cfg.iters = 3;
  return cfg; /* 1.5 MiB moved per rank: one repetition per iteration */
}

/* `rounds` rounds of the 1 MiB all_gather's roof on 2 ranks with first_fast
 * in place of every way's work; the roof's figure */
static double stub_roof(seen *s, int rounds) {
  mpu_bench_config cfg = gather_1m();
  mpu_bench_roof_run *run = NULL;
  double us = 0;
  assert_int_equal(mpu_bench_roof_begin(&cfg, 2, 2, &run), MPU_SUCCESS);
  mpu__bench_roof_set_stub(run, first_fast, s);
  for (int i = 0; i < rounds; i++) assert_int_equal(mpu_bench_roof_round(run), MPU_SUCCESS);
  assert_int_equal(mpu_bench_roof_end(run, &us), MPU_SUCCESS);
  return us;
}

static void test_sustained_not_best(void **state) {
  (void)state;
  static seen s;
  double us = stub_roof(&s, 2);
  /* a sleep never ends early: the mean of the timed iterations is at least
   * this, where the best single one (the old rule) was the fast one */
  assert_true(us >= (double)SLOW_US * (MPU_BENCH_ROOF_TIMED - 1) / MPU_BENCH_ROOF_TIMED);
  /* every way of every round: the untimed iterations, then the timed ones */
  int per_way = MPU_BENCH_SETTLE + MPU_BENCH_ROOF_TIMED;
  assert_int_equal(s.n % per_way, 0);
  for (int k = 0; k < s.n; k++) assert_int_equal(s.iter[k], k % per_way);
}

static void test_gather_alternates(void **state) {
  (void)state;
  static seen s;
  stub_roof(&s, 1);
  /* one round: each way cached and streaming; a way is pulled (0) all
   * along, pushed (1) all along, or the two alternating */
  int per_way = MPU_BENCH_SETTLE + MPU_BENCH_ROOF_TIMED, runs = s.n / per_way;
  int pulled = 0, pushed = 0, alternating = 0;
  for (int r = 0; r < runs; r++) {
    const int *w = &s.way[r * per_way];
    int same = 1, alt = 1;
    for (int i = 1; i < per_way; i++) {
      same &= w[i] == w[0];
      alt &= w[i] != w[i - 1];
    }
    pulled += same && w[0] == 0, pushed += same && w[0] == 1, alternating += alt;
  }
  assert_int_equal(runs, 6);
  assert_int_equal(pulled, 2);
  assert_int_equal(pushed, 2);
  assert_int_equal(alternating, 2);
}

static int all_bytes(const char *p, size_t n, int v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (char)v) return 0;
  return 1;
}

static void test_lent_buffers(void **state) {
  (void)state;
  mpu_bench_config cfg = gather_1m(), full;
  bench_layout lay;
  assert_int_equal(mpu__bench_layout("test", &cfg, 2, &full, &lay), MPU_SUCCESS);
  char *send[2], *recv[2];
  for (int k = 0; k < 2; k++) {
    send[k] = malloc(lay.send_bytes), recv[k] = malloc(lay.recv_bytes);
    assert_non_null(send[k]);
    assert_non_null(recv[k]);
    memset(send[k], k + 1, lay.send_bytes);
    memset(recv[k], 0, lay.recv_bytes);
  }
  mpu_bench_roof_run *run = NULL;
  assert_int_equal(mpu_bench_roof_begin(&cfg, 2, 2, &run), MPU_SUCCESS);
  assert_int_equal(mpu_bench_roof_lend(NULL, 0, send[0], recv[0]), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_bench_roof_lend(run, 0, NULL, recv[0]), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_bench_roof_lend(run, -1, send[0], recv[0]), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_bench_roof_lend(run, 2, send[0], recv[0]), MPU_ERR_INVALID_ARGUMENT);
  /* one rank's alone: the round keeps the roof's own buffers */
  assert_int_equal(mpu_bench_roof_lend(run, 0, send[0], recv[0]), MPU_SUCCESS);
  assert_int_equal(mpu_bench_roof_round(run), MPU_SUCCESS);
  assert_true(all_bytes(recv[0], lay.recv_bytes, 0));
  /* every rank's: the round gathers the lent inputs into the lent outputs */
  assert_int_equal(mpu_bench_roof_lend(run, 1, send[1], recv[1]), MPU_SUCCESS);
  assert_int_equal(mpu_bench_roof_round(run), MPU_SUCCESS);
  size_t block = lay.count * sizeof(float);
  for (int k = 0; k < 2; k++) {
    assert_true(all_bytes(recv[k], block, 1));
    assert_true(all_bytes(recv[k] + block, block, 2));
    assert_true(all_bytes(send[k], lay.send_bytes, k + 1)); /* inputs only read */
  }
  double us = 0;
  assert_int_equal(mpu_bench_roof_end(run, &us), MPU_SUCCESS); /* frees its own, not the lent */
  for (int k = 0; k < 2; k++) free(send[k]), free(recv[k]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sustained_not_best),
      cmocka_unit_test(test_gather_alternates),
      cmocka_unit_test(test_lent_buffers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
