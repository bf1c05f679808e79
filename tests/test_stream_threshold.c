/*
 * test_stream_threshold.c - the streaming-store threshold of the threads
 * collectives (comm/base/copy.c): 3/4 of the last-level cache, the cache
 * counted at most 24 MiB per CPU that shares it, so a virtual machine that
 * reports its host's whole cache as its own still streams the calls that
 * outgrow what it really holds; the sysfs cpu lists that count those CPUs;
 * and the rule of a task whose reads fit the core's level-2 cache, whose
 * reads and writes together do not and whose writes are no larger than its
 * reads (it streams, so its inputs stay there).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#define MIB ((size_t)1 << 20)

/* copy.c's rules (hidden in libmpu.so; the test links the objects) */
size_t mpu__stream_threshold(size_t llc, int sharing);
int mpu__cpulist_count(const char *list);
size_t mpu__stream_min_bytes(void);
int mpu__stream_rule(size_t footprint, size_t reads, size_t writes, size_t threshold, size_t l2);

static void test_real_caches_unchanged(void **state) {
  (void)state;
  assert_int_equal(mpu__stream_threshold(32 * MIB, 2), 24 * MIB);  /* an EPYC VM's CCX share */
  assert_int_equal(mpu__stream_threshold(32 * MIB, 8), 24 * MIB);  /* one Zen CCX */
  assert_int_equal(mpu__stream_threshold(96 * MIB, 8), 72 * MIB);  /* 3D V-cache: 12 MiB a core */
  assert_int_equal(mpu__stream_threshold(480 * MIB, 128), 360 * MIB); /* a whole big socket */
}

static void test_vm_reporting_its_hosts_cache(void **state) {
  (void)state;
  /* a 2-CPU VM of an Intel Xeon: 480 MiB said shared by CPUs 0-1 */
  assert_int_equal(mpu__stream_threshold(480 * MIB, 2), 36 * MIB);
  assert_int_equal(mpu__stream_threshold(480 * MIB, 1), 18 * MIB);
}

static void test_unknowns(void **state) {
  (void)state;
  assert_int_equal(mpu__stream_threshold(0, 2), 8 * MIB);          /* no cache known */
  assert_int_equal(mpu__stream_threshold(480 * MIB, 0), 360 * MIB); /* sharing unknown: as said */
}

static void test_cpu_lists(void **state) {
  (void)state;
  assert_int_equal(mpu__cpulist_count("0-1\n"), 2);
  assert_int_equal(mpu__cpulist_count("0"), 1);
  assert_int_equal(mpu__cpulist_count("0-3,8-11\n"), 8);
  assert_int_equal(mpu__cpulist_count("0,2,4-5"), 4);
  assert_int_equal(mpu__cpulist_count(""), 0);
  assert_int_equal(mpu__cpulist_count("3-1"), 0);
  assert_int_equal(mpu__cpulist_count("x"), 0);
  assert_int_equal(mpu__cpulist_count("0-1;"), 0);
  assert_int_equal(mpu__cpulist_count("0-9999999999999"), 0);
}

/* An all_to_all on 2 ranks of a 2-CPU Xeon (2 MiB of L2 a core, threshold
 * 36 MiB): a rank sending S bytes reads and writes S per call on its core,
 * 4 S in all. */
static void test_rule_all_to_all_two_ranks(void **state) {
  (void)state;
  size_t l2 = 2 * MIB, min = 36 * MIB;
  assert_false(mpu__stream_rule(4 * MIB, 1 * MIB, 1 * MIB, min, l2));  /* both fit: cached */
  assert_true(mpu__stream_rule(8 * MIB, 2 * MIB, 2 * MIB, min, l2));   /* reads fit, not both */
  assert_false(mpu__stream_rule(16 * MIB, 4 * MIB, 4 * MIB, min, l2)); /* reads alone outgrow it */
  assert_false(mpu__stream_rule(32 * MIB, 8 * MIB, 8 * MIB, min, l2));
  assert_true(mpu__stream_rule(64 * MIB, 16 * MIB, 16 * MIB, min, l2)); /* the threshold */
}

static void test_rule_edges(void **state) {
  (void)state;
  size_t l2 = 2 * MIB, min = 36 * MIB;
  assert_false(mpu__stream_rule(0, 0, 0, min, l2));                       /* nothing to move */
  assert_false(mpu__stream_rule(4 * MIB, 2 * MIB - 1, 1, min, l2));      /* exactly L2 in all */
  assert_true(mpu__stream_rule(4 * MIB, 2 * MIB - 1, 2, min, l2));       /* one byte past it */
  assert_false(mpu__stream_rule(8 * MIB, 2 * MIB, 2 * MIB, min, 0));    /* L2 unknown: threshold */
  assert_true(mpu__stream_rule(min, 0, 0, min, l2));                     /* at the threshold */
  assert_false(mpu__stream_rule(8 * MIB, 1, SIZE_MAX, min, l2)); /* writes past the reads */
  assert_true(mpu__stream_rule(8 * MIB, 2 * MIB, 2 * MIB, min, l2)); /* as many as the reads */
  assert_false(mpu__stream_rule(8 * MIB, 1 * MIB, 7 * MIB, min, l2)); /* 7 times: cached */
  assert_false(mpu__stream_rule(8 * MIB, SIZE_MAX, SIZE_MAX, min, l2));
}

/* This machine's threshold (unless MPU_STREAM_MIN_BYTES sets it) is at most
 * 3/4 of 24 MiB per CPU sharing the cache sysfs names, whatever size it says. */
static void test_this_machine(void **state) {
  (void)state;
  const char *forced = getenv("MPU_STREAM_MIN_BYTES");
  FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list", "r");
  char list[256] = "";
  if (f) {
    if (!fgets(list, sizeof list, f)) list[0] = 0;
    fclose(f);
  }
  int sharing = mpu__cpulist_count(list);
  if ((forced && *forced) || sharing <= 0) skip();
  assert_true(mpu__stream_min_bytes() <= (size_t)sharing * 18 * MIB);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_real_caches_unchanged),
      cmocka_unit_test(test_vm_reporting_its_hosts_cache),
      cmocka_unit_test(test_unknowns),
      cmocka_unit_test(test_cpu_lists),
      cmocka_unit_test(test_rule_all_to_all_two_ranks),
      cmocka_unit_test(test_rule_edges),
      cmocka_unit_test(test_this_machine),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
