/*
 * test_conformance_threads.c - the conformance suite on the threads backend,
 * with every call checked across ranks (check_calls) and each case run with
 * 1, 2, 3, 4 and 8 ranks (8 oversubscribes this machine's cores).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "conformance/conformance.h"

/* Each case with every rank count, twice: with as many working ranks as the
 * machine has CPUs (the default), and with a single rank doing every task of
 * the large calls for all (workers = 1), so both ways of sharing the work are
 * tested whatever machine this runs on. */
static void run_case(void **state) {
  const conf_case *c = *state;
  static conf_suite suite;
  for (int workers = 0; workers <= 1; workers++)
    for (int i = 0; i < conf_rank_counts_len; i++) {
      mpu_launch_options opt = MPU_LAUNCH_OPTIONS_INIT;
      opt.check_calls = 1;
      opt.timeout_s = 120;
      opt.workers = workers;
      int n = conf_rank_counts[i];
      mpu_result_t results[CONF_MAX_RANKS];
      memset(&suite, 0, sizeof suite);
      mpu_result_t r = mpu_launch(n, c->fn, &suite, results, &opt);
      if (r != MPU_SUCCESS) {
        for (int k = 0; k < n; k++)
          if (suite.message[k][0]) print_error("%s\n", suite.message[k]);
        fail_msg("%s with %d ranks, workers %d: %s: %s", c->name, n, workers,
                 mpu_result_name(r), mpu_last_error());
      }
    }
}

int main(void) {
  struct CMUnitTest tests[32];
  int n = 0;
  for (const conf_case *c = conf_cases; c->name; c++)
    tests[n++] = (struct CMUnitTest){c->name, run_case, NULL, NULL, (void *)c};
  return _cmocka_run_group_tests("conformance_threads", tests, (size_t)n, NULL, NULL);
}
