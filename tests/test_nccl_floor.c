/*
 * test_nccl_floor.c - libmpu_nccl over a libnccl.so.2 older than the floor
 * (the test double answering ncclGetVersion with MPU_DOUBLE_NCCL_VERSION,
 * tests/CMakeLists.txt): the backend loads, then refuses in one line that
 * names the library's version, the floor and the nccl.h it was built with;
 * every entry point of the backend says the same and nothing crashes.
 * MPU_OLD_NCCL, MPU_FLOOR and MPU_HEADER are the three versions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"

static void refused_by_version(void **state) {
  (void)state;
  assert_int_equal(mpu_nccl_available(), 0);
  const char *why = mpu_last_error();
  print_message("%s\n", why);
  assert_non_null(strstr(why, "the nccl backend is not available: "));
  /* the library by its path (the double is one file for libnccl.so.2 and libcudart.so.13) */
  assert_non_null(strstr(why, ".so."));
  assert_non_null(strstr(why, " is NCCL " MPU_OLD_NCCL ";"));
  assert_non_null(strstr(why, "needs NCCL " MPU_FLOOR " or newer"));
  assert_non_null(strstr(why, "built against nccl.h " MPU_HEADER));
  assert_null(strchr(why, '\n'));
}

static mpu_result_t rank_fn(mpu_comm *world, void *arg) {
  mpu_comm *nc = NULL;
  mpu_result_t r = mpu_comm_nccl_create(world, NULL, &nc);
  *(mpu_result_t *)arg = r;
  if (!r) mpu_comm_destroy(nc);
  return MPU_SUCCESS;
}

static void create_refused(void **state) {
  (void)state;
  mpu_result_t got = MPU_SUCCESS;
  assert_int_equal(mpu_launch(1, rank_fn, &got, NULL, NULL), MPU_SUCCESS);
  assert_int_equal(got, MPU_ERR_UNSUPPORTED);
  mpu_comm *nc = NULL;
  assert_int_equal(mpu_comm_nccl_from_env(NULL, &nc), MPU_ERR_UNSUPPORTED);
  assert_non_null(strstr(mpu_last_error(), "mpu_comm_nccl_from_env: the nccl backend is not available"));
  assert_null(nc);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(refused_by_version),
                                     cmocka_unit_test(create_refused)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
