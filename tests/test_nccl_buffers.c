/*
 * test_nccl_buffers.c - what the NCCL backend takes as a buffer, and what it
 * allocates, on the faithful test double (no "pointers" switch):
 *   - the whole span must lie in one allocation: a span that runs from one
 *     allocation into the next, adjacent one (two page-locked registrations
 *     side by side, as CUDA's small blocks often are) is refused naming the
 *     buffer, though both its first and its last byte are usable memory;
 *   - registered host memory is taken only where the device maps it at the
 *     host's own address (runtime.h's double_pretend_host_alias);
 *   - gather_from_tp along the last dim stages its blocks in the
 *     communicator's scratch buffer: one stream-ordered allocation for any
 *     number of calls, released once at destroy, no cudaMalloc or cudaFree
 *     per call (cudaFree may synchronise the whole device).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "mpu.h"
#include "nccl_double/runtime.h"
#include "test_helpers.h"

typedef struct rank_msg {
  char text[4][320];
  int calls; /* gather_rank's */
} rank_msg;

#define REFUSED(call, a, b)                                                                   \
  CHECK_OUT((call) == MPU_ERR_INVALID_ARGUMENT && strstr(mpu_last_error(), a) &&              \
                strstr(mpu_last_error(), b),                                                 \
            "%s: want a refusal naming '%s' and '%s', got: %s", #call, a, b, mpu_last_error())

static void run_ranks_calls(int n, mpu_result_t (*fn)(mpu_comm *, void *), int calls) {
  rank_msg m;
  memset(&m, 0, sizeof m);
  m.calls = calls;
  mpu_result_t r = mpu_launch(n, fn, &m, NULL, NULL);
  for (int k = 0; k < n; k++)
    if (m.text[k][0]) print_error("rank %d: %s\n", k, m.text[k]);
  if (r) fail_msg("%d ranks: %s: %s", n, mpu_result_name(r), mpu_last_error());
}

static void run_ranks(int n, mpu_result_t (*fn)(mpu_comm *, void *)) { run_ranks_calls(n, fn, 0); }

/* ---- spans ------------------------------------------------------------------------ */

enum { PAGE = 4096 };

static mpu_result_t adjacent_rank(mpu_comm *world, void *arg) {
  rank_msg *m = arg;
  int me = 0, n = 0, first = 0, second = 0;
  mpu_comm *nc = NULL;
  mpu_result_t r = test_nccl_over(world, NULL, &me, &n, &nc);
  if (r) return r;
  float *pages = aligned_alloc(PAGE, 2 * PAGE); /* two registrations side by side */
  CHECK_OUT(pages, "aligned_alloc");
  CHECK_OUT(cudaHostRegister(pages, PAGE, cudaHostRegisterDefault) == cudaSuccess, "register 1");
  first = 1;
  CHECK_OUT(cudaHostRegister((char *)pages + PAGE, PAGE, cudaHostRegisterDefault) == cudaSuccess,
            "register 2");
  second = 1;
  size_t per_page = PAGE / sizeof(float);
  for (size_t i = 0; i < 2 * per_page; i++) pages[i] = 1.0f;
  REFUSED(mpu_comm_all_reduce(nc, pages, pages, 2 * per_page, MPU_FLOAT32, MPU_SUM), "send buffer",
          "runs past the end of its allocation");
  REFUSED(mpu_comm_all_reduce(nc, pages + 8, pages + 8, per_page, MPU_FLOAT32, MPU_SUM),
          "runs past the end of its allocation", "by 32 bytes");
  REFUSED(mpu_comm_all_gather(nc, pages, pages, per_page, MPU_FLOAT32), "recv buffer",
          "runs past the end of its allocation");
  /* each allocation alone is fine, and nothing reached NCCL before */
  CHECK_OUT(!mpu_comm_all_reduce(nc, pages, pages, per_page, MPU_FLOAT32, MPU_SUM), "page 1: %s",
            mpu_last_error());
  CHECK_OUT(!mpu_comm_all_reduce(nc, pages + per_page, pages + per_page, per_page, MPU_FLOAT32,
                                 MPU_SUM),
            "page 2: %s", mpu_last_error());
  CHECK_OUT(pages[0] == (float)n && pages[2 * per_page - 1] == (float)n, "sums %g %g, want %d",
            pages[0], pages[2 * per_page - 1], n);
out:
  if (second) cudaHostUnregister((char *)pages + PAGE);
  if (first) cudaHostUnregister(pages);
  free(pages);
  mpu_result_t d = mpu_comm_destroy(nc);
  return r ? r : d;
}

static void span_into_adjacent_allocation_refused(void **state) {
  (void)state;
  run_ranks(2, adjacent_rank);
}

/* ---- registered host memory the device maps elsewhere --------------------------------- */

static mpu_result_t alias_rank(mpu_comm *world, void *arg) {
  rank_msg *m = arg;
  int me = 0, n = 0, registered = 0;
  mpu_comm *nc = NULL;
  mpu_result_t r = test_nccl_over(world, NULL, &me, &n, &nc);
  if (r) return r;
  float *host = aligned_alloc(PAGE, PAGE);
  CHECK_OUT(host, "aligned_alloc");
  CHECK_OUT(cudaHostRegister(host, PAGE, cudaHostRegisterMapped) == cudaSuccess, "register");
  registered = 1;
  REFUSED(mpu_comm_all_reduce(nc, host, host, 4, MPU_FLOAT32, MPU_SUM), "send buffer",
          "maps at another address");
  REFUSED(mpu_comm_broadcast(nc, host, 4, MPU_FLOAT32, 0), "data buffer", "cudaHostGetDevicePointer");
out:
  if (registered) cudaHostUnregister(host);
  free(host);
  mpu_result_t d = mpu_comm_destroy(nc);
  return r ? r : d;
}

static void registered_memory_mapped_elsewhere_refused(void **state) {
  (void)state;
  double_pretend_host_alias(1);
  run_ranks(2, alias_rank);
  double_pretend_host_alias(0);
}

/* ---- gather_from_tp's staging ------------------------------------------------------- */

enum { ROWS = 3, COLS = 4 };

static mpu_result_t gather_rank(mpu_comm *world, void *arg) {
  rank_msg *m = arg;
  int me = 0, n = 0;
  mpu_comm *nc = NULL;
  mpu_result_t r = test_nccl_over(world, NULL, &me, &n, &nc);
  if (r) return r;
  float host[ROWS * COLS * 4], *part = NULL, *whole = NULL;
  size_t part_bytes = sizeof(float) * ROWS * COLS, whole_bytes = part_bytes * (size_t)n;
  CHECK_OUT(!mpu_comm_mem_alloc(nc, part_bytes, (void **)&part), "alloc");
  CHECK_OUT(!mpu_comm_mem_alloc(nc, whole_bytes, (void **)&whole), "alloc");
  for (int i = 0; i < ROWS * COLS; i++) host[i] = (float)(100 * me + i);
  CHECK_OUT(!mpu_comm_copy2d(nc, part, part_bytes, host, part_bytes, part_bytes, 1), "copy in");
  mpu_tensor in, out_t;
  int64_t ps[2] = {ROWS, COLS}, ws[2] = {ROWS, (int64_t)COLS * n};
  CHECK_OUT(!mpu_tensor_init(&in, part, MPU_FLOAT32, 2, ps) &&
                !mpu_tensor_init(&out_t, whole, MPU_FLOAT32, 2, ws),
            "tensors");
  for (int k = 0; k < m->calls; k++)
    CHECK_OUT(!mpu_region_forward(MPU_GATHER_FROM_TP, nc, &in, &out_t), "gather %d: %s", k,
              mpu_last_error());
  CHECK_OUT(!mpu_comm_copy2d(nc, host, whole_bytes, whole, whole_bytes, whole_bytes, 1), "copy out");
  for (int row = 0; row < ROWS; row++) /* row = [rank 0's row | rank 1's row | ...] */
    for (int p = 0; p < n; p++)
      for (int c = 0; c < COLS; c++) {
        float want = (float)(100 * p + row * COLS + c), got = host[row * COLS * n + p * COLS + c];
        CHECK_OUT(got == want, "row %d rank %d col %d: %g, want %g", row, p, c, got, want);
      }
out:
  mpu_comm_mem_free(nc, part);
  mpu_comm_mem_free(nc, whole);
  mpu_result_t d = mpu_comm_destroy(nc);
  return r ? r : d;
}

typedef struct counts {
  long allocs, frees, async_frees;
} counts;

static counts count_now(void) {
  return (counts){double_cuda_count("cudaMalloc") + double_cuda_count("cudaMallocAsync"),
                  double_cuda_count("cudaFree"), double_cuda_count("cudaFreeAsync")};
}

/* What a run of `calls` gathers per rank allocated and freed, in all. */
static counts gathers(int n, int calls) {
  counts a = count_now();
  run_ranks_calls(n, gather_rank, calls);
  counts b = count_now();
  print_message("%d ranks, %d gathers each: %ld allocations, %ld cudaFree, %ld cudaFreeAsync\n", n,
                calls, b.allocs - a.allocs, b.frees - a.frees, b.async_frees - a.async_frees);
  return (counts){b.allocs - a.allocs, b.frees - a.frees, b.async_frees - a.async_frees};
}

static void gather_last_dim_allocates_once(void **state) {
  (void)state;
  const int n = 2;
  counts one = gathers(n, 1), many = gathers(n, 10);
  /* the same whatever the number of calls: one scratch buffer per rank,
   * released in stream order once, at destroy */
  assert_int_equal(many.allocs, one.allocs);
  assert_int_equal(many.frees, one.frees);
  assert_int_equal(one.async_frees, n);
  assert_int_equal(many.async_frees, n);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(span_into_adjacent_allocation_refused),
      cmocka_unit_test(registered_memory_mapped_elsewhere_refused),
      cmocka_unit_test(gather_last_dim_allocates_once),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
