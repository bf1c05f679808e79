/*
 * test_env.c - the environment knobs reach the threads backend. ctest runs it
 * with MPU_TIMEOUT=0.2 and MPU_CHECK_CALLS=1 and no launch options.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "mpu.h"

static mpu_result_t late_rank(mpu_comm *world, void *arg) {
  int rank;
  mpu_comm_rank(world, &rank);
  if (rank == 1) {
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
  }
  mpu_result_t r = mpu_comm_barrier(world);
  if (rank == 0) *(mpu_result_t *)arg = r;
  return MPU_SUCCESS;
}

static void test_timeout_from_env(void **state) {
  (void)state;
  mpu_result_t seen = MPU_SUCCESS;
  assert_int_equal(mpu_launch(2, late_rank, &seen, NULL, NULL), MPU_SUCCESS);
  assert_int_equal(seen, MPU_ERR_TIMEOUT);
}

static mpu_result_t op_mismatch(mpu_comm *world, void *arg) {
  (void)arg;
  int rank;
  mpu_comm_rank(world, &rank);
  float x = 1, y;
  mpu_result_t r = mpu_comm_all_reduce(world, &x, &y, 1, MPU_FLOAT32, rank ? MPU_MAX : MPU_MIN);
  return r == MPU_ERR_MISMATCH ? MPU_SUCCESS : MPU_ERR_INTERNAL;
}

static void test_check_calls_from_env(void **state) {
  (void)state;
  assert_int_equal(mpu_launch(2, op_mismatch, NULL, NULL, NULL), MPU_SUCCESS);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_timeout_from_env),
      cmocka_unit_test(test_check_calls_from_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
