/*
 * test_group.c - mpu_group_start/end and mpu_comm_nccl_handle on every
 * backend: built plain (threads ranks and the fake backend), with
 * MPU_TEST_NCCL (NCCL communicators on the test double, every buffer from
 * mpu_comm_mem_alloc) and with MPU_TEST_MPI (one process per rank, under
 * mpirun).
 *
 * What a group must give on each: a ring whose every rank receives before it
 * sends completes (it would deadlock as blocking calls on NCCL, whose send
 * waits for its recv, and on any backend, whose recv waits for its send);
 * all-reduces on two communicators, a sendrecv and a non-blocking call in one
 * group complete at the end with exact sums; nesting counts; and the
 * refusals: group_end without start, waiting inside the group for a request
 * it made, split or destroy inside a group, NULL or non-NCCL handles.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifndef MPU_TEST_MPI
#include <cmocka.h>
#endif

#include "mpu.h"
#ifdef MPU_TEST_MPI
#include "mpu/comm_mpi.h"
#endif
#ifdef MPU_TEST_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#define TEST_RANK me
#include "test_helpers.h"

enum { N = 8 }; /* floats per buffer */

/* n floats of c's memory kind (device memory on NCCL) */
static mpu_result_t mem(mpu_comm *c, float **p) { return mpu_comm_mem_alloc(c, N * sizeof(float), (void **)p); }
static mpu_result_t put(mpu_comm *c, float *dev, const float *host) {
  return mpu_comm_copy2d(c, dev, sizeof(float) * N, host, sizeof(float) * N, sizeof(float) * N, 1);
}
static mpu_result_t get(mpu_comm *c, float *host, const float *dev) {
  return mpu_comm_copy2d(c, host, sizeof(float) * N, dev, sizeof(float) * N, sizeof(float) * N, 1);
}

/* the group cases on communicator c (the rank's world of its backend) */
static mpu_result_t group_cases(mpu_comm *c) {
  int me, n;
  ROK(mpu_comm_rank(c, &me));
  ROK(mpu_comm_size(c, &n));
  float host[N], out[N], *a, *b, *x, *y, *z, *w;
  float **bufs[] = {&a, &b, &x, &y, &z, &w};
  for (int i = 0; i < 6; i++) ROK(mem(c, bufs[i]));

  /* a ring in which every rank receives first: one step inside a group */
  for (int k = 0; k < N; k++) host[k] = (float)(100 * me + k);
  ROK(put(c, a, host));
  ROK(mpu_group_start());
  ROK(mpu_comm_recv(c, b, N, MPU_FLOAT32, (me + n - 1) % n));
  ROK(mpu_comm_send(c, a, N, MPU_FLOAT32, (me + 1) % n));
  ROK(mpu_group_end());
  ROK(get(c, out, b));
  for (int k = 0; k < N; k++)
    RCHECK(out[k] == (float)(100 * ((me + n - 1) % n) + k), "ring: [%d] = %g", k, out[k]);

  /* all-reduces on two communicators, a sendrecv and a request in one nested group */
  mpu_comm *half = NULL;
  ROK(mpu_comm_split(c, me % 2, me, &half));
  int want_half = 0, want_all = n * (n - 1) / 2;
  for (int r = me % 2; r < n; r += 2) want_half += r;
  for (int k = 0; k < N; k++) host[k] = (float)me;
  ROK(put(c, x, host));
  mpu_request *req = NULL;
  ROK(mpu_group_start());
  ROK(mpu_comm_all_reduce(c, x, y, N, MPU_FLOAT32, MPU_SUM));
  ROK(mpu_group_start()); /* nested: only the outermost end runs the calls */
  ROK(mpu_comm_all_reduce(half, x, z, N, MPU_FLOAT32, MPU_SUM));
  ROK(mpu_comm_iall_reduce(c, x, w, N, MPU_FLOAT32, MPU_MAX, &req));
  ROK(mpu_comm_sendrecv(c, x, N, (me + 1) % n, a, N, (me + n - 1) % n, MPU_FLOAT32));
  ROK(mpu_group_end());
  /* still inside the outer group: refusals that change nothing */
  RCHECK(mpu_request_wait(req) == MPU_ERR_INVALID_USAGE, "wait inside the group: %s", mpu_last_error());
  RCHECK(strstr(mpu_last_error(), "mpu_group_end"), "message: %s", mpu_last_error());
  int done = 0;
  RCHECK(mpu_request_test(req, &done) == MPU_ERR_INVALID_USAGE && !done, "test inside the group");
  mpu_comm *other = NULL;
  RCHECK(mpu_comm_split(c, 0, me, &other) == MPU_ERR_INVALID_USAGE && !other, "split inside");
  if (n > 2) /* half has peers: its all-reduce is held (a group of one answers at once) */
    RCHECK(mpu_comm_destroy(half) == MPU_ERR_INVALID_USAGE, "destroy of a held communicator");
  ROK(mpu_group_end());
  ROK(mpu_request_wait(req));
  ROK(get(c, out, y));
  RCHECK(out[0] == (float)want_all && out[N - 1] == (float)want_all, "world sum %g", out[0]);
  ROK(get(c, out, z));
  RCHECK(out[0] == (float)want_half, "half sum %g, want %d", out[0], want_half);
  ROK(get(c, out, w));
  RCHECK(out[0] == (float)(n - 1), "max %g", out[0]);
  ROK(get(c, out, a));
  RCHECK(out[0] == (float)((me + n - 1) % n), "sendrecv got %g", out[0]);

  /* an empty group, and a group end without a start */
  ROK(mpu_group_start());
  ROK(mpu_group_end());
  RCHECK(mpu_group_end() == MPU_ERR_INVALID_USAGE, "end without start");
  RCHECK(strstr(mpu_last_error(), "no group is open"), "message: %s", mpu_last_error());

  /* the handle: NCCL's own communicator, or a refusal */
  void *h = (void *)1;
  RCHECK(mpu_comm_nccl_handle(c, NULL) == MPU_ERR_INVALID_ARGUMENT, "NULL out");
  RCHECK(mpu_comm_nccl_handle(NULL, &h) != MPU_SUCCESS, "NULL comm");
  mpu_result_t hr = mpu_comm_nccl_handle(c, &h);
#ifdef MPU_TEST_NCCL
  ROK(hr);
  RCHECK(h, "handle NULL");
  /* a raw NCCL call on it, on mpu's stream, ordered with mpu's calls */
  void *stream = NULL;
  ROK(mpu_comm_stream(c, &stream));
  for (int k = 0; k < N; k++) host[k] = 1;
  ROK(put(c, x, host));
  /* mpu's communicators are non-blocking ones (config.blocking = 0): a raw
   * call may answer ncclInProgress, and ncclCommGetAsyncError says when it
   * is enqueued, as NCCL documents */
  ncclResult_t raw = ncclAllReduce(x, y, N, ncclFloat32, ncclSum, (ncclComm_t)h, (cudaStream_t)stream);
  while (raw == ncclInProgress) ncclCommGetAsyncError((ncclComm_t)h, &raw);
  RCHECK(raw == ncclSuccess, "raw all-reduce: %d", (int)raw);
  ROK(mpu_comm_all_reduce(c, y, z, N, MPU_FLOAT32, MPU_SUM)); /* after it, on the same stream */
  ROK(get(c, out, z));
  RCHECK(out[0] == (float)(n * n), "raw then mpu: %g", out[0]);
#else
  RCHECK(hr == MPU_ERR_UNSUPPORTED && !h, "%s handle: %s", mpu_comm_backend(c), mpu_result_name(hr));
  RCHECK(strstr(mpu_last_error(), mpu_comm_backend(c)), "message: %s", mpu_last_error());
#endif
  ROK(mpu_comm_barrier(c));
  ROK(mpu_comm_destroy(half));
  for (int i = 0; i < 6; i++) ROK(mpu_comm_mem_free(c, *bufs[i]));
  return MPU_SUCCESS;
}

/* A host backend runs a group's receives and collectives in order at the
 * end: a recv that gets the wrong size fails group_end with the recv's
 * mismatch, and every other call of the group still runs. */
static __attribute__((unused)) mpu_result_t host_failure(mpu_comm *c) {
  int me, n;
  ROK(mpu_comm_rank(c, &me));
  ROK(mpu_comm_size(c, &n));
  float s[4] = {1, 2, 3, 4}, r[4] = {0}, x = 1, y = 0;
  ROK(mpu_group_start());
  if (me == 0) ROK(mpu_comm_send(c, s, 4, MPU_FLOAT32, 1));
  if (me == 1) ROK(mpu_comm_recv(c, r, 2, MPU_FLOAT32, 0));
  ROK(mpu_comm_all_reduce(c, &x, &y, 1, MPU_FLOAT32, MPU_SUM));
  mpu_result_t e = mpu_group_end();
  if (me == 1) {
    RCHECK(e == MPU_ERR_MISMATCH, "short recv: %s", mpu_result_name(e));
    RCHECK(strstr(mpu_last_error(), "mpu_group_end"), "message: %s", mpu_last_error());
  } else {
    ROK(e);
  }
  RCHECK(y == (float)n, "all-reduce after the failure: %g", y);
  return MPU_SUCCESS;
}

#ifdef MPU_TEST_MPI

int main(int argc, char **argv) {
  mpu_comm *world;
  if (mpu_comm_mpi_world(&argc, &argv, &world)) {
    fprintf(stderr, "MPI world: %s\n", mpu_last_error());
    return 1;
  }
  int me = 0;
  mpu_comm_rank(world, &me);
  mpu_result_t r = group_cases(world);
  if (!r) r = host_failure(world);
  if (r) fprintf(stderr, "rank %d: %s\n", me, messages[me]);
  else if (me == 0) printf("groups on MPI: OK\n");
  mpu_comm_destroy(world);
  mpu_mpi_finalize();
  return r ? 1 : 0;
}

#else

#ifdef MPU_TEST_NCCL
/* a broken communicator: its error and no handle; a call on it inside a
 * group fails at once, and the group still ends cleanly */
static mpu_result_t broken(mpu_comm *world) {
  int me;
  mpu_comm_rank(world, &me);
  mpu_comm *nc = NULL;
  float *x = NULL, *y = NULL;
  ROK(mpu_comm_nccl_create(world, NULL, &nc));
  ROK(mem(nc, &x));
  ROK(mem(nc, &y));
  ROK(mpu_comm_barrier(world)); /* every rank made it before any aborts */
  ROK(mpu_comm_abort(nc));
  void *h = (void *)1;
  RCHECK(mpu_comm_nccl_handle(nc, &h) == MPU_ERR_ABORTED && !h, "aborted: %s", mpu_last_error());
  ROK(mpu_group_start());
  RCHECK(mpu_comm_all_reduce(nc, x, y, N, MPU_FLOAT32, MPU_SUM) == MPU_ERR_ABORTED, "broken in group");
  RCHECK(mpu_comm_send(nc, x, N, MPU_FLOAT32, (me + 1) % 2) == MPU_ERR_ABORTED, "send in group");
  ROK(mpu_group_end());
  mpu_comm_mem_free(nc, x), mpu_comm_mem_free(nc, y);
  mpu_comm_destroy(nc);
  return MPU_SUCCESS;
}
#endif

static mpu_result_t rank_fn(mpu_comm *world, void *arg) {
#ifdef MPU_TEST_NCCL
  if (arg) return broken(world);
#endif
  (void)arg;
  int me;
  mpu_comm_rank(world, &me);
#ifdef MPU_TEST_NCCL
  mpu_comm *nc = NULL;
  ROK(mpu_comm_nccl_create(world, NULL, &nc));
  RCHECK(!strcmp(mpu_comm_backend(nc), "nccl"), "backend %s", mpu_comm_backend(nc));
  mpu_result_t r = group_cases(nc);
  mpu_comm_destroy(nc);
  return r;
#else
  mpu_result_t r = group_cases(world);
  return r ? r : host_failure(world);
#endif
}

static void run_ranks(int n, void *arg) {
  mpu_result_t results[TEST_MAX_RANKS];
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 60;
  mpu_launch(n, rank_fn, arg, results, &o);
  for (int i = 0; i < n; i++) {
    if (results[i]) print_message("rank %d: %s\n", i, messages[i]);
    assert_int_equal(results[i], MPU_SUCCESS);
  }
}

static void test_groups_2(void **state) { (void)state, run_ranks(2, NULL); }
static void test_groups_4(void **state) { (void)state, run_ranks(4, NULL); }
#ifdef MPU_TEST_NCCL
static void test_groups_broken(void **state) { (void)state, run_ranks(2, "broken"); }
#endif

#ifndef MPU_TEST_NCCL
/* A rank that returns inside an open bracket (nested twice, a send and an
 * all-reduce posted) has failed: its calls never ran, and mpu_launch says so
 * rather than succeed; what it posted is freed (the sanitizer build's leak
 * check). Its peer's all-reduce fails instead of waiting. */
static mpu_result_t left_open(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm_rank(world, &me);
  float x = 1, y = 0;
  if (me == 0) {
    mpu_result_t r = mpu_comm_all_reduce(world, &x, &y, 1, MPU_FLOAT32, MPU_SUM);
    RCHECK(r == MPU_ERR_ABORTED, "peer's all-reduce: %s", mpu_result_name(r));
    return MPU_SUCCESS;
  }
  ROK(mpu_group_start());
  ROK(mpu_group_start());
  ROK(mpu_comm_send(world, &x, 1, MPU_FLOAT32, 0));
  ROK(mpu_comm_all_reduce(world, &x, &y, 1, MPU_FLOAT32, MPU_SUM));
  ROK(mpu_group_end()); /* the inner one: the outer stays open */
  return MPU_SUCCESS;
}

static void test_group_left_open(void **state) {
  (void)state;
  mpu_result_t results[2];
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 60;
  assert_int_equal(mpu_launch(2, left_open, NULL, results, &o), MPU_ERR_INVALID_USAGE);
  assert_non_null(strstr(mpu_last_error(), "rank 1"));
  assert_non_null(strstr(mpu_last_error(), "mpu_group_start"));
  assert_non_null(strstr(mpu_last_error(), "2 posted calls never ran"));
  if (results[0]) print_message("rank 0: %s\n", messages[0]);
  assert_int_equal(results[0], MPU_SUCCESS);
  assert_int_equal(results[1], MPU_ERR_INVALID_USAGE);
  /* this thread's brackets are its own: none is open here */
  assert_int_equal(mpu_group_end(), MPU_ERR_INVALID_USAGE);
}

/* the fake backend: no data moves, the bracket means the same */
static void test_groups_fake(void **state) {
  (void)state;
  mpu_comm *c = NULL;
  assert_int_equal(mpu_comm_fake_create(1, 4, &c), MPU_SUCCESS);
  float a[4] = {1, 2, 3, 4}, b[4] = {0};
  mpu_request *req = NULL;
  assert_int_equal(mpu_group_start(), MPU_SUCCESS);
  assert_int_equal(mpu_comm_recv(c, b, 4, MPU_FLOAT32, 0), MPU_SUCCESS);
  assert_int_equal(mpu_comm_send(c, a, 4, MPU_FLOAT32, 2), MPU_SUCCESS);
  assert_int_equal(mpu_comm_all_reduce(c, a, b, 4, MPU_FLOAT32, MPU_SUM), MPU_SUCCESS);
  assert_int_equal(mpu_comm_ibarrier(c, &req), MPU_SUCCESS);
  assert_int_equal(mpu_request_wait(req), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_destroy(c), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_group_end(), MPU_SUCCESS);
  assert_int_equal(mpu_request_wait(req), MPU_SUCCESS);
  assert_int_equal(mpu_group_end(), MPU_ERR_INVALID_USAGE);
  void *h = (void *)1;
  assert_int_equal(mpu_comm_nccl_handle(c, &h), MPU_ERR_UNSUPPORTED);
  assert_null(h);
  assert_int_equal(mpu_comm_destroy(c), MPU_SUCCESS);
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_groups_2),
      cmocka_unit_test(test_groups_4),
#ifndef MPU_TEST_NCCL
      cmocka_unit_test(test_groups_fake),
      cmocka_unit_test(test_group_left_open),
#else
      cmocka_unit_test(test_groups_broken),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
