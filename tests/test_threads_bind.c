/*
 * test_threads_bind.c - mpu_launch binds each rank's thread to a CPU of its
 * own when the ranks fit in the CPUs the launcher may use (world.c), and
 * leaves them to the scheduler otherwise or under MPU_BIND=0 (ctest runs
 * this file both ways: test_threads_bind_off sets MPU_BIND=0).
 */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"

int mpu__tbind_cpu(const cpu_set_t *allowed, int nranks, unsigned start, int rank);

static cpu_set_t set_of(const int *cpus, int n) {
  cpu_set_t s;
  CPU_ZERO(&s);
  for (int i = 0; i < n; i++) CPU_SET(cpus[i], &s);
  return s;
}

static void test_bind_rule(void **state) {
  (void)state;
  cpu_set_t two = set_of((int[]){0, 1}, 2), sparse = set_of((int[]){2, 5, 7}, 3);
  /* one CPU each, in order from the launch's start */
  assert_int_equal(mpu__tbind_cpu(&two, 2, 0, 0), 0);
  assert_int_equal(mpu__tbind_cpu(&two, 2, 0, 1), 1);
  assert_int_equal(mpu__tbind_cpu(&two, 2, 1, 0), 1);
  assert_int_equal(mpu__tbind_cpu(&two, 2, 1, 1), 0);
  /* only the CPUs allowed, rotating past the last */
  assert_int_equal(mpu__tbind_cpu(&sparse, 2, 0, 0), 2);
  assert_int_equal(mpu__tbind_cpu(&sparse, 2, 0, 1), 5);
  assert_int_equal(mpu__tbind_cpu(&sparse, 2, 2, 0), 7);
  assert_int_equal(mpu__tbind_cpu(&sparse, 2, 2, 1), 2);
  assert_int_equal(mpu__tbind_cpu(&sparse, 3, 4, 2), 2);
  /* more ranks than CPUs, one rank, or a rank out of range: unbound */
  assert_int_equal(mpu__tbind_cpu(&two, 3, 0, 0), -1);
  assert_int_equal(mpu__tbind_cpu(&sparse, 1, 0, 0), -1);
  assert_int_equal(mpu__tbind_cpu(&two, 2, 0, 2), -1);
  assert_int_equal(mpu__tbind_cpu(&two, 2, 0, -1), -1);
}

typedef struct seen {
  int count[2], cpu[2];
} seen;

static mpu_result_t report_affinity(mpu_comm *world, void *arg) {
  seen *s = arg;
  int rank;
  cpu_set_t mine;
  mpu_comm_rank(world, &rank);
  if (sched_getaffinity(0, sizeof mine, &mine)) return MPU_ERR_SYSTEM;
  s->count[rank] = CPU_COUNT(&mine);
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &mine)) {
      s->cpu[rank] = c;
      break;
    }
  return mpu_comm_barrier(world);
}

static void test_launch_binds(void **state) {
  (void)state;
  cpu_set_t allowed;
  assert_int_equal(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  if (CPU_COUNT(&allowed) < 2) skip(); /* two ranks do not fit: nothing is bound */
  const char *env = getenv("MPU_BIND");
  int off = env && !strcmp(env, "0");
  for (int launch = 0; launch < 3; launch++) {
    seen s = {{0, 0}, {-1, -1}};
    assert_int_equal(mpu_launch(2, report_affinity, &s, NULL, NULL), MPU_SUCCESS);
    if (off) { /* the launcher's own CPUs, as the threads inherit them */
      assert_int_equal(s.count[0], CPU_COUNT(&allowed));
      assert_int_equal(s.count[1], CPU_COUNT(&allowed));
      continue;
    }
    assert_int_equal(s.count[0], 1);
    assert_int_equal(s.count[1], 1);
    assert_int_not_equal(s.cpu[0], s.cpu[1]);
    assert_true(CPU_ISSET(s.cpu[0], &allowed) && CPU_ISSET(s.cpu[1], &allowed));
  }
  /* the launcher itself stays where it was allowed */
  cpu_set_t after;
  assert_int_equal(sched_getaffinity(0, sizeof after, &after), 0);
  assert_true(CPU_EQUAL(&after, &allowed));
}

static void test_more_ranks_than_cpus_unbound(void **state) {
  (void)state;
  cpu_set_t allowed, one;
  assert_int_equal(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int first = 0;
  while (!CPU_ISSET(first, &allowed)) first++;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0); /* 2 ranks on 1 CPU */
  seen s = {{0, 0}, {-1, -1}};
  mpu_result_t r = mpu_launch(2, report_affinity, &s, NULL, NULL);
  assert_int_equal(sched_setaffinity(0, sizeof allowed, &allowed), 0);
  assert_int_equal(r, MPU_SUCCESS);
  assert_int_equal(s.count[0], 1); /* the launcher's one CPU, inherited */
  assert_int_equal(s.cpu[0], first);
  assert_int_equal(s.cpu[1], first);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bind_rule),
      cmocka_unit_test(test_launch_binds),
      cmocka_unit_test(test_more_ranks_than_cpus_unbound),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
