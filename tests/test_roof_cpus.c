/*
 * Where the roof of `mpu bench` places its threads (mpu__bench_roof_cpu):
 * thread k on the k-th CPU the process may run on, whichever thread asks.
 * `mpu bench` times the roof from a rank's thread, which mpu_launch binds to
 * one CPU; a roof placed by that thread's own mask put every roof thread on
 * that CPU, and the rows beat such a roof. Here a thread bound to one CPU
 * asks, as a bound rank does.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "bench/bench_internal.h"

typedef struct asked {
  int bound; /* CPUs the asking thread may run on */
  int cpu[3];
} asked;

static void *ask(void *arg) {
  asked *a = arg;
  cpu_set_t mine;
  a->bound = sched_getaffinity(0, sizeof mine, &mine) ? -1 : CPU_COUNT(&mine);
  for (int k = 0; k < 3; k++) a->cpu[k] = mpu__bench_roof_cpu(k);
  return NULL;
}

static void test_bound_caller_spreads(void **state) {
  (void)state;
  cpu_set_t all, one;
  assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
  if (CPU_COUNT(&all) < 2) skip(); /* one CPU: nothing to spread over */
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
    if (CPU_ISSET(c, &all)) first = c;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  pthread_attr_t attr;
  pthread_t t;
  asked a = {0, {-1, -1, -1}};
  assert_int_equal(pthread_attr_init(&attr), 0);
  assert_int_equal(pthread_attr_setaffinity_np(&attr, sizeof one, &one), 0);
  assert_int_equal(pthread_create(&t, &attr, ask, &a), 0);
  pthread_join(t, NULL);
  pthread_attr_destroy(&attr);
  assert_int_equal(a.bound, 1);
  /* threads 0 and 1 on two different CPUs of the process, thread 2 wraps
   * round to thread 0's when there are two */
  assert_true(a.cpu[0] >= 0 && CPU_ISSET(a.cpu[0], &all));
  assert_true(a.cpu[1] >= 0 && CPU_ISSET(a.cpu[1], &all));
  assert_int_not_equal(a.cpu[0], a.cpu[1]);
  if (CPU_COUNT(&all) == 2) assert_int_equal(a.cpu[2], a.cpu[0]);
  /* the same answer from an unbound thread */
  assert_int_equal(mpu__bench_roof_cpu(0), a.cpu[0]);
  assert_int_equal(mpu__bench_roof_cpu(1), a.cpu[1]);
  assert_int_equal(mpu__bench_roof_cpu(-1), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bound_caller_spreads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
