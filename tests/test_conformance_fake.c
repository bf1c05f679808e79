/*
 * test_conformance_fake.c - the conformance suite on the fake backend with
 * one rank, where it behaves exactly (a world of one moves data to itself).
 * Cases that need what the fake backend does not have (split) are skipped
 * and say so.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "conformance/conformance.h"

static void run_case(void **state) {
  const conf_case *c = *state;
  static conf_suite suite;
  if (c->needs & CONF_NEEDS_SPLIT) skip();
  mpu_comm *world = NULL;
  assert_int_equal(mpu_comm_fake_create(0, 1, &world), MPU_SUCCESS);
  memset(&suite, 0, sizeof suite);
  mpu_result_t r = c->fn(world, &suite);
  mpu_comm_destroy(world);
  if (r != MPU_SUCCESS)
    fail_msg("%s on fake(0 of 1): %s: %s %s", c->name, mpu_result_name(r), suite.message[0],
             mpu_last_error());
}

int main(void) {
  struct CMUnitTest tests[32];
  int n = 0;
  for (const conf_case *c = conf_cases; c->name && n < 32; c++)
    tests[n++] = (struct CMUnitTest){c->name, run_case, NULL, NULL, (void *)c};
  return _cmocka_run_group_tests("conformance_fake", tests, (size_t)n, NULL, NULL);
}
