/*
 * test_stream_all_to_all.c - the threads backend's all_to_all, and its
 * in-place all_gather, stream their writes where a core's reads fit its
 * level-2 cache, its reads and writes together do not and it writes no
 * more than it reads (mpu__stream_rule, comm/base/copy.c): on 2 ranks with a CPU each, a rank that sends as many
 * bytes as one core's L2 reads and writes that much per call. Cached copies
 * go through memcpy, streaming ones only for their few unaligned head and
 * tail bytes, so the test counts the process's large memcpy calls out of
 * the ranks' inputs by defining memcpy here (the objects it links call this
 * one). And the results stay what they are.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpu.h"

size_t mpu__stream_l2_bytes(void); /* copy.c (the test links the objects) */
size_t mpu__stream_min_bytes(void);

/* clang's sanitizers lower the library's memcpy to __asan_memcpy / __tsan_memcpy,
 * which never reach the memcpy below: the count would be 0 whatever was copied */
#if defined(__clang__) && defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define MEMCPY_HIDDEN 1
#endif
#endif
#ifndef MEMCPY_HIDDEN
#define MEMCPY_HIDDEN 0
#endif

/* Whether the rule can be seen here: a known L2, a CPU per rank (on one CPU a
 * worker runs both tasks and streams at half the size), the last-level
 * threshold above both sizes, copies that reach this file's memcpy. */
static size_t usable_l2(void) {
  const char *forced = getenv("MPU_STREAM_MIN_BYTES");
  size_t l2 = mpu__stream_l2_bytes();
  if (MEMCPY_HIDDEN || (forced && *forced) || l2 < ((size_t)128 << 10) ||
      sysconf(_SC_NPROCESSORS_ONLN) < 2 || mpu__stream_min_bytes() / 4 <= l2)
    return 0;
  return l2;
}

static const char *input_lo[2], *input_hi[2]; /* [rank]: its send buffer */
static _Atomic int watching, cached_copies;

/* Every memcpy of the process comes here (memmove does the copy). */
void *memcpy(void *dst, const void *src, size_t n) {
  if (n >= 4096 && atomic_load_explicit(&watching, memory_order_acquire))
    for (int k = 0; k < 2; k++)
      if ((const char *)src >= input_lo[k] && (const char *)src < input_hi[k])
        atomic_fetch_add(&cached_copies, 1);
  return memmove(dst, src, n);
}

static size_t block_count; /* floats a rank sends to each rank */

static mpu_result_t exchange(mpu_comm *world, void *arg) {
  (void)arg;
  int me = -1;
  mpu_comm_rank(world, &me);
  size_t count = block_count;
  float *send = malloc(2 * count * sizeof *send), *recv = malloc(2 * count * sizeof *recv);
  if (!send || !recv) {
    free(send), free(recv);
    return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "buffers");
  }
  for (size_t i = 0; i < 2 * count; i++) send[i] = (float)(me * 2 + (int)(i / count));
  input_lo[me] = (const char *)send, input_hi[me] = (const char *)(send + 2 * count);
  mpu_result_t r = mpu_comm_barrier(world);
  if (!r && me == 0) atomic_store_explicit(&watching, 1, memory_order_release);
  if (!r) r = mpu_comm_barrier(world);
  if (!r) r = mpu_comm_all_to_all(world, send, recv, count, MPU_FLOAT32);
  /* block k of recv is block me of rank k's send */
  for (size_t i = 0; !r && i < 2 * count; i++)
    if (recv[i] != (float)((int)(i / count) * 2 + me))
      r = mpu_fail(MPU_ERR_INTERNAL, "recv[%zu] = %g", i, recv[i]);
  mpu_result_t b = mpu_comm_barrier(world); /* both done before the buffers go */
  if (me == 0) atomic_store_explicit(&watching, 0, memory_order_release);
  free(send), free(recv);
  return r ? r : b;
}

static void test_l2_sized_all_to_all_streams(void **state) {
  (void)state;
#if !defined(__x86_64__)
  skip(); /* no streaming stores: every copy is memcpy */
#endif
  size_t l2 = usable_l2();
  if (!l2) skip();
  block_count = l2 / 2 / sizeof(float); /* a rank sends l2 bytes, half to each */
  atomic_store(&cached_copies, 0);
  assert_int_equal(mpu_launch(2, exchange, NULL, NULL, NULL), MPU_SUCCESS);
  if (atomic_load(&cached_copies))
    fail_msg("%d cached copies of %zu KiB a rank's core reads: they would evict its inputs",
             atomic_load(&cached_copies), l2 >> 10);
}

/* Half that fits the L2 with its writes: cached, as before. */
static void test_smaller_all_to_all_stays_cached(void **state) {
  (void)state;
  size_t l2 = usable_l2();
  if (!l2) skip();
  block_count = l2 / 4 / sizeof(float);
  atomic_store(&cached_copies, 0);
  assert_int_equal(mpu_launch(2, exchange, NULL, NULL, NULL), MPU_SUCCESS);
  assert_true(atomic_load(&cached_copies) > 0);
}

/* An all_gather of block_count floats a rank, in place (`in_place`: each
 * rank's input is its block of its output) or not (`adjacent`: its output
 * right after its input in one allocation, as an arena hands them out);
 * the inputs watched. */
static int gather_in_place, gather_adjacent;

static mpu_result_t gather(mpu_comm *world, void *arg) {
  (void)arg;
  int me = -1;
  mpu_comm_rank(world, &me);
  size_t count = block_count;
  float *own = NULL, *recv;
  if (gather_adjacent) {
    own = malloc(3 * count * sizeof *own);
    recv = own ? own + count : NULL;
  } else {
    recv = malloc(2 * count * sizeof *recv);
    own = gather_in_place ? NULL : malloc(count * sizeof *own);
  }
  if (!recv || (!gather_in_place && !own)) {
    if (!gather_adjacent) free(recv);
    free(own);
    return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "buffers");
  }
  float *send = gather_in_place ? recv + (size_t)me * count : own;
  for (size_t i = 0; i < count; i++) send[i] = (float)(me + 1);
  input_lo[me] = (const char *)send, input_hi[me] = (const char *)(send + count);
  mpu_result_t r = mpu_comm_barrier(world);
  if (!r && me == 0) atomic_store_explicit(&watching, 1, memory_order_release);
  if (!r) r = mpu_comm_barrier(world);
  if (!r) r = mpu_comm_all_gather(world, send, recv, count, MPU_FLOAT32);
  for (size_t i = 0; !r && i < 2 * count; i++) /* block k is rank k's input */
    if (recv[i] != (float)((int)(i / count) + 1))
      r = mpu_fail(MPU_ERR_INTERNAL, "recv[%zu] = %g", i, recv[i]);
  mpu_result_t b = mpu_comm_barrier(world);
  if (me == 0) atomic_store_explicit(&watching, 0, memory_order_release);
  if (!gather_adjacent) free(recv);
  free(own);
  return r ? r : b;
}

static int gather_cached_copies(size_t bytes, int in_place, int adjacent) {
  block_count = bytes / sizeof(float);
  gather_in_place = in_place, gather_adjacent = adjacent;
  atomic_store(&cached_copies, 0);
  assert_int_equal(mpu_launch(2, gather, NULL, NULL, NULL), MPU_SUCCESS);
  return atomic_load(&cached_copies);
}

/* In place, a rank reads its own block (one L2) and writes it to the other
 * rank's output: streamed, as the all_to_all of one L2. (Where 6 L2s reach
 * the last-level threshold, an out-of-place footprint would stream too.) */
static void test_l2_sized_in_place_all_gather_streams(void **state) {
  (void)state;
#if !defined(__x86_64__)
  skip();
#endif
  size_t l2 = usable_l2();
  if (!l2) skip();
  int cached = gather_cached_copies(l2, 1, 0);
  if (cached) fail_msg("%d cached copies of a rank's %zu KiB block in place", cached, l2 >> 10);
}

/* Out of place the same call writes twice what it reads, and cached
 * stores to its own output are faster there: cached, as before. */
static void test_l2_sized_all_gather_stays_cached(void **state) {
  (void)state;
  size_t l2 = usable_l2();
  if (!l2) skip();
  assert_true(gather_cached_copies(l2, 0, 0) > 0);
}

/* Out of place with each output right after its input: rank 1's output
 * starts one block past its input, which is a reduce_scatter's in-place
 * form, not an all_gather's (its input at its block of its output), so the
 * call is out of place and stays cached. */
static void test_adjacent_all_gather_is_not_in_place(void **state) {
  (void)state;
  size_t l2 = usable_l2();
  if (!l2) skip();
  assert_true(gather_cached_copies(l2, 0, 1) > 0);
}

/* In place, blocks past the L2 whose outputs (4 of them in all) stay under
 * the last-level threshold are cached: the inputs live in the outputs, so
 * they are not counted twice (out of place, 6 blocks would stream). */
static void test_large_in_place_all_gather_stays_cached(void **state) {
  (void)state;
  size_t l2 = usable_l2(), threshold = mpu__stream_min_bytes();
  if (!l2 || threshold / 5 <= l2 || threshold / 5 > ((size_t)64 << 20)) skip(); /* memory */
  assert_true(gather_cached_copies(threshold / 5 / 4096 * 4096, 1, 0) > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_l2_sized_all_to_all_streams),
      cmocka_unit_test(test_smaller_all_to_all_stays_cached),
      cmocka_unit_test(test_l2_sized_in_place_all_gather_streams),
      cmocka_unit_test(test_l2_sized_all_gather_stays_cached),
      cmocka_unit_test(test_adjacent_all_gather_is_not_in_place),
      cmocka_unit_test(test_large_in_place_all_gather_stays_cached),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
