/*
 * test_stream_threshold.c - the streaming-store threshold of the threads
 * collectives (comm/base/copy.c): 3/4 of the last-level cache, the cache
 * counted at most 24 MiB per CPU that shares it, so a virtual machine that
 * reports its host's whole cache as its own still streams the calls that
 * outgrow what it really holds; and the sysfs cpu lists that count those CPUs.
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
      cmocka_unit_test(test_this_machine),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
