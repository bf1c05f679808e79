/*
 * test_uneven.c - the uneven collectives (all_gather_v, reduce_scatter_v,
 * all_to_all_v) at their edges:
 *
 *   empty blocks  a rank whose block has no elements may pass NULL
 *                 (mpu/comm.h: "a buffer may be NULL only when its count is
 *                 0"), blocking, inside a group bracket, on threads ranks
 *                 and on a fake world of one; the sanitizer build fails on
 *                 any memcpy from or arithmetic on such a NULL
 *   many ranks    on a fake world of 2^20 ranks the checks of the caller's
 *                 displacements (no two blocks overlap) take a fraction of a
 *                 second of CPU, and still find the one overlapping pair
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "mpu.h"

#define TEST_RANK me
#include "test_helpers.h"

/* CPU time of the process: what the checks cost, whatever the machine's load */
static double cpu_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- empty blocks given as NULL ------------------------------------------------------- */

/* Rank 1's block is empty (its send, or its recv, is NULL); then every block
 * is (every buffer NULL). Blocking, then the same calls in a group bracket. */
static mpu_result_t empty_blocks(mpu_comm *c) {
  int me, n;
  ROK(mpu_comm_rank(c, &me));
  ROK(mpu_comm_size(c, &n));
  size_t counts[4] = {0}, displs[4] = {0}, none[4] = {0}, off = 0;
  for (int k = 0; k < n; k++) counts[k] = k == 1 ? 0 : (size_t)k + 2;
  for (int k = n - 1; k >= 0; k--) { /* the caller's placement: blocks in reverse order */
    displs[k] = off;
    off += counts[k];
  }
  mpu_comm_caps caps = {.size = sizeof caps};
  ROK(mpu_comm_capabilities(c, &caps));
  float send[8], recv[32];
  for (int round = 0; round < 2; round++) {
    if (round) ROK(mpu_group_start());
    memset(recv, 0, sizeof recv);
    for (size_t i = 0; i < 8; i++) send[i] = (float)(100 * me) + (float)i;
    const float *mine = counts[me] ? send : NULL;
    ROK(mpu_comm_all_gather_v(c, mine, recv, counts, displs, MPU_FLOAT32));
    if (round) ROK(mpu_group_end());
    for (int k = 0; k < n; k++)
      for (size_t i = 0; i < counts[k]; i++)
        RCHECK(!caps.moves_data || recv[displs[k] + i] == (float)(100 * k) + (float)i,
               "all_gather_v block %d [%zu] = %g", k, i, recv[displs[k] + i]);
    /* every block empty: both buffers NULL */
    ROK(mpu_comm_all_gather_v(c, NULL, NULL, none, NULL, MPU_FLOAT32));
    ROK(mpu_comm_all_gather_v(c, NULL, NULL, none, displs, MPU_FLOAT32));
    /* reduce_scatter_v: rank 1 gets nothing, so its recv is NULL */
    float in[32], out[8];
    for (size_t i = 0; i < 32; i++) in[i] = (float)i;
    if (round) ROK(mpu_group_start());
    ROK(mpu_comm_reduce_scatter_v(c, in, counts[me] ? out : NULL, counts, MPU_FLOAT32, MPU_SUM));
    ROK(mpu_comm_reduce_scatter_v(c, NULL, NULL, none, MPU_FLOAT32, MPU_SUM));
    /* all_to_all_v: nothing to or from rank 1; then nothing at all */
    size_t sc[4], sd[4], rc[4], rd[4];
    for (int k = 0; k < n; k++) {
      sc[k] = me == 1 || k == 1 ? 0 : 1, sd[k] = (size_t)k;
      rc[k] = sc[k], rd[k] = (size_t)(n - 1 - k);
    }
    ROK(mpu_comm_all_to_all_v(c, me == 1 ? NULL : send, sc, sd, me == 1 ? NULL : recv, rc, rd,
                              MPU_FLOAT32));
    ROK(mpu_comm_all_to_all_v(c, NULL, none, NULL, NULL, none, NULL, MPU_FLOAT32));
    if (round) ROK(mpu_group_end());
  }
  return MPU_SUCCESS;
}

static mpu_result_t empty_blocks_rank(mpu_comm *world, void *arg) {
  (void)arg;
  return empty_blocks(world);
}

static void test_empty_blocks_threads(void **state) {
  (void)state;
  mpu_result_t results[4];
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 60;
  for (int n = 2; n <= 4; n++) {
    mpu_launch(n, empty_blocks_rank, NULL, results, &o);
    for (int i = 0; i < n; i++)
      if (results[i]) print_message("rank %d of %d: %s\n", i, n, messages[i]);
    for (int i = 0; i < n; i++) assert_int_equal(results[i], MPU_SUCCESS);
  }
}

/* A fake world of one answers exactly; of four, it moves nothing. */
static void test_empty_blocks_fake(void **state) {
  (void)state;
  for (int size = 1; size <= 4; size += 3) {
    mpu_comm *c = NULL;
    assert_int_equal(mpu_comm_fake_create(1 % size, size, &c), MPU_SUCCESS);
    mpu_result_t r = empty_blocks(c);
    if (r) print_message("fake world of %d: %s\n", size, messages[1 % size]);
    assert_int_equal(r, MPU_SUCCESS);
    mpu_comm_destroy(c);
  }
}

/* ---- many ranks ------------------------------------------------------------------------ */

static void test_fake_million_ranks(void **state) {
  (void)state;
  const int n = 1 << 20;
  mpu_comm *c = NULL;
  assert_int_equal(mpu_comm_fake_create(12345, n, &c), MPU_SUCCESS);
  size_t *counts = malloc((size_t)n * sizeof *counts), *displs = malloc((size_t)n * sizeof *displs);
  float *recv = calloc((size_t)n, sizeof *recv), *send = calloc((size_t)n, sizeof *send), x = 1;
  assert_non_null(counts), assert_non_null(displs), assert_non_null(recv), assert_non_null(send);
  /* one element each, scattered over the buffer (7919 is odd: a permutation) */
  for (int k = 0; k < n; k++) counts[k] = 1, displs[k] = (size_t)k * 7919 % (size_t)n;
  double t0 = cpu_s();
  assert_int_equal(mpu_comm_all_gather_v(c, &x, recv, counts, displs, MPU_FLOAT32), MPU_SUCCESS);
  assert_int_equal(mpu_comm_all_to_all_v(c, send, counts, displs, recv, counts, displs,
                                         MPU_FLOAT32),
                   MPU_SUCCESS);
  double took = cpu_s() - t0;
  print_message("2^20 ranks: all_gather_v and all_to_all_v checked in %.3f s of CPU\n", took);
  /* quadratic checks took minutes here; the sort takes a fraction of a
   * second (seconds of margin for the sanitizer builds) */
  assert_true(took < 20);
  /* the one overlapping pair, far apart in rank order, is still found */
  size_t keep = displs[777];
  displs[777] = displs[900000];
  assert_int_equal(mpu_comm_all_gather_v(c, &x, recv, counts, displs, MPU_FLOAT32),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "blocks 777 and 900000 overlap"));
  displs[777] = keep;
  /* an empty block (this rank's: its send is NULL) placed anywhere overlaps nothing */
  counts[12345] = 0, displs[12345] = displs[6];
  x = 0;
  assert_int_equal(mpu_comm_all_gather_v(c, NULL, recv, counts, displs, MPU_FLOAT32),
                   MPU_SUCCESS);
  free(counts), free(displs), free(recv), free(send);
  mpu_comm_destroy(c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_empty_blocks_threads),
      cmocka_unit_test(test_empty_blocks_fake),
      cmocka_unit_test(test_fake_million_ranks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
