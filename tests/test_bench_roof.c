/*
 * mpu_bench_roof: the roof of `mpu bench`'s rows (the least data movement of
 * a collective, done by the same threads with no waiting between them).
 * It refuses what mpu_bench_collectives refuses, answers a positive time for
 * every collective and placement, and a buffer 1024 times larger takes
 * longer (a roof that did not move the bytes would not).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "mpu/bench.h"

static mpu_bench_config config(mpu_collective c, size_t bytes, int in_place) {
  mpu_bench_config cfg = MPU_BENCH_CONFIG_INIT;
  cfg.collective = c, cfg.bytes = bytes, cfg.in_place = in_place, cfg.iters = 3;
  return cfg;
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_every_row),
      cmocka_unit_test(test_more_bytes_take_longer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
