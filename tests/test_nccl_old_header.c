/*
 * test_nccl_old_header.c - the NCCL backend on NCCLs other than the one it
 * was built with, on the test double. all_to_all takes the grouped
 * ncclSend/ncclRecv path exactly when the libnccl.so.2 loaded has no
 * ncclAlltoAll (looked up at run time, whatever nccl.h said), with the same
 * results; bfloat16 sums work either way. Built three ways
 * (tests/CMakeLists.txt):
 *   _now   the backend against today's nccl.h, the double linked in: ncclAlltoAll
 *   _2_20  the backend against a copy of nccl.h lowered to 2.20.5 (no
 *          ncclAlltoAll declared, ncclBfloat16 hidden from C), the double
 *          linked in, which has ncclAlltoAll: used all the same
 *   _lib_2_27  the installed libmpu_nccl itself, unchanged, loaded by libmpu
 *          over a libnccl.so.2 that is the double pretending to be NCCL
 *          2.27.7 (runtime.h: no ncclAlltoAll): the grouped path
 *          (MPU_EXPECT_GROUPED=1, MPU_EXPECT_BACKEND=1: it must load)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <dlfcn.h>

#include "mpu.h"
#include "test_helpers.h"

/* The double's counters (double.h), wherever the double was loaded from:
 * linked in, or as libnccl.so.2 under libmpu_nccl (RTLD_GLOBAL). */
static long double_call_count(const char *nccl_function) {
  long (*count)(const char *) = (long (*)(const char *))dlsym(RTLD_DEFAULT, "double_call_count");
  if (!count) fail_msg("the NCCL test double is not loaded");
  return count(nccl_function);
}

typedef struct shared {
  char message[8][256];
} shared;

static mpu_result_t rank_fn(mpu_comm *world, void *arg) {
  shared *sh = arg;
  int me = 0, n = 0;
  mpu_comm *nc = NULL;
  mpu_result_t r = test_nccl_over(world, NULL, &me, &n, &nc);
  if (r) return r;
  enum { COUNT = 3 };
  size_t bytes = (size_t)n * COUNT * sizeof(int32_t);
  int32_t host[8 * COUNT], *send = NULL, *recv = NULL;
  uint16_t bf[2] = {0x3f80, 0x4000}, *dbf = NULL; /* bfloat16 1 and 2 */
  r = mpu_comm_mem_alloc(nc, bytes, (void **)&send);
  if (!r) r = mpu_comm_mem_alloc(nc, bytes, (void **)&recv);
  if (!r) r = mpu_comm_mem_alloc(nc, sizeof bf, (void **)&dbf);
  for (int i = 0; i < n * COUNT; i++) host[i] = 1000 * me + i; /* block p goes to rank p */
  if (!r) r = mpu_comm_copy2d(nc, send, bytes, host, bytes, bytes, 1);
  if (!r) r = mpu_comm_all_to_all(nc, send, recv, COUNT, MPU_INT32);
  if (!r) r = mpu_comm_copy2d(nc, host, bytes, recv, bytes, bytes, 1);
  for (int p = 0; !r && p < n; p++)
    for (int j = 0; j < COUNT; j++)
      if (host[p * COUNT + j] != 1000 * p + me * COUNT + j) {
        snprintf(sh->message[me], sizeof sh->message[me], "block %d element %d: %d, want %d", p, j,
                 host[p * COUNT + j], 1000 * p + me * COUNT + j);
        r = MPU_ERR_INTERNAL;
      }
  if (!r) r = mpu_comm_copy2d(nc, dbf, sizeof bf, bf, sizeof bf, sizeof bf, 1);
  if (!r) r = mpu_comm_all_reduce(nc, dbf, dbf, 2, MPU_BFLOAT16, MPU_SUM);
  if (!r) r = mpu_comm_copy2d(nc, bf, sizeof bf, dbf, sizeof bf, sizeof bf, 1);
  if (!r && (mpu_bfloat16_to_float(bf[0]) != (float)n || mpu_bfloat16_to_float(bf[1]) != 2.0f * (float)n)) {
    snprintf(sh->message[me], sizeof sh->message[me], "bfloat16 sums %g %g over %d ranks",
             mpu_bfloat16_to_float(bf[0]), mpu_bfloat16_to_float(bf[1]), n);
    r = MPU_ERR_INTERNAL;
  }
  mpu_comm_mem_free(nc, send);
  mpu_comm_mem_free(nc, recv);
  mpu_comm_mem_free(nc, dbf);
  mpu_result_t d = mpu_comm_destroy(nc);
  return r ? r : d;
}

static void all_to_all_path(void **state) {
  (void)state;
  for (int n = 2; n <= 4; n += 2) {
    shared sh;
    memset(&sh, 0, sizeof sh);
    long a2a = double_call_count("ncclAlltoAll"), sends = double_call_count("ncclSend");
    mpu_result_t r = mpu_launch(n, rank_fn, &sh, NULL, NULL);
    for (int k = 0; k < n; k++)
      if (sh.message[k][0]) print_error("rank %d: %s\n", k, sh.message[k]);
    if (r) fail_msg("%d ranks: %s: %s", n, mpu_result_name(r), mpu_last_error());
    a2a = double_call_count("ncclAlltoAll") - a2a;
    sends = double_call_count("ncclSend") - sends;
    if (MPU_EXPECT_GROUPED) { /* every rank sends a block to every rank, itself included */
      assert_int_equal(a2a, 0);
      assert_int_equal(sends, (long)n * n);
    } else {
      assert_int_equal(a2a, n);
      assert_int_equal(sends, 0);
    }
  }
}

int main(void) {
  if (!mpu_nccl_available()) {
#ifdef MPU_EXPECT_BACKEND
    fprintf(stderr, "the NCCL backend did not load: %s\n", mpu_last_error());
    return 1;
#else
    printf("no NCCL backend in this build\n");
    return 0;
#endif
  }
  const struct CMUnitTest tests[] = {cmocka_unit_test(all_to_all_path)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
