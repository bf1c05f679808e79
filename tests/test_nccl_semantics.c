/*
 * test_nccl_semantics.c - the NCCL backend against NCCL 2.28's semantics as
 * the test double models them (tests/nccl_double/double.h): a split past its
 * deadline (the child NULL until NCCL's job ends, the job run by the parent),
 * groups that share no resources unless asked, the watchdog thread that
 * releases a host blocked in cudaStreamSynchronize, the raw handle a caller
 * can treat like llm.c's ncclCheck does, a group of one through NCCL, and
 * destroy while work is queued. Every buffer is the double's device memory,
 * read back with cudaMemcpy.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "mpu.h"
#include "nccl_double/double.h" /* double_call_count */

#define TEST_RANK me
#include "test_helpers.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* An NCCL communicator over world without a host twin (groups by
 * ncclCommSplit, as from torchrun's environment). */
static mpu_result_t bare(mpu_comm *world, double timeout_s, int share, mpu_comm **nc) {
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.timeout_s = timeout_s;
  o.keep_host = 0;
  o.share_resources = share;
  return mpu_comm_nccl_create(world, &o, nc);
}

/* n floats of device memory set to v */
static float *device_floats(int n, float v) {
  float *d = NULL, h[16];
  if (n > 16 || cudaMalloc((void **)&d, (size_t)n * sizeof *d)) return NULL;
  for (int i = 0; i < n; i++) h[i] = v;
  cudaMemcpy(d, h, (size_t)n * sizeof *d, cudaMemcpyHostToDevice);
  return d;
}

static float first(const float *d) {
  float h = -1;
  cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
  return h;
}

static atomic_int flag;

/* ---- a split past its deadline ----------------------------------------------------- */

/* Rank 1 calls the split only after rank 0 gave up on it. Rank 0's split
 * fails at its deadline with no child; its parent is then clearly broken (a
 * call fails at once, saying why) rather than answering NCCL's "invalid
 * argument" forever; rank 1's late split fails too (its peer is gone), not
 * completing against a job that would write into rank 0's returned frame.
 * Another communicator goes on: its all-reduce writes its output (NCCL
 * 2.28's ncclCommDestroy of the parent in progress would leave the thread
 * inside a group, every later call held and "successful"). */
static mpu_result_t split_past_deadline(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm_rank(world, &me);
  mpu_comm *nc = NULL, *other = NULL, *sub = NULL;
  ROK(bare(world, 0.5, 0, &nc));
  ROK(bare(world, 10, 0, &other));
  if (me == 1)
    for (double t0 = test_now(); !atomic_load(&flag) && test_now() - t0 < 20;) sleep_ms(5);
  double t0 = test_now();
  mpu_result_t r = mpu_comm_split(nc, 0, me, &sub);
  double took = test_now() - t0;
  if (me == 0) atomic_store(&flag, 1);
  /* rank 1 learns of rank 0's abort at once (the in-process abort board) */
  RCHECK(me == 0 ? r == MPU_ERR_TIMEOUT && took >= 0.5 : r != MPU_SUCCESS, "split: %s: %s",
         mpu_result_name(r), mpu_last_error());
  RCHECK(!sub && took < 5, "split: a child, or %.3f s", took);
  float *d = device_floats(4, 1);
  RCHECK(d, "cudaMalloc");
  t0 = test_now();
  mpu_result_t broke = r;
  r = mpu_comm_all_reduce(nc, d, d, 4, MPU_FLOAT32, MPU_SUM);
  RCHECK(r == broke && test_now() - t0 < 0.5 && strstr(mpu_last_error(), "broken"),
         "the parent after the split: %s (%s)", mpu_result_name(r), mpu_last_error());
  mpu_comm_destroy(nc);
  float *e = device_floats(4, (float)(me + 1)), *f = device_floats(4, 0);
  RCHECK(e && f, "cudaMalloc");
  ROK(mpu_comm_all_reduce(other, e, f, 4, MPU_FLOAT32, MPU_SUM));
  RCHECK(first(f) == 3, "another communicator's sum: %g", first(f));
  mpu_comm_barrier(world);
  mpu_comm_destroy(other);
  cudaFree(d), cudaFree(e), cudaFree(f);
  return MPU_SUCCESS;
}

/* A split on one rank meeting an all-reduce on the other, on one parent:
 * both wait (the bootstrap and the kernels do not meet) until the
 * deadline, and both fail. */
static mpu_result_t split_meets_all_reduce(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm_rank(world, &me);
  mpu_comm *nc = NULL, *sub = NULL;
  ROK(bare(world, 0.5, 0, &nc));
  float *d = device_floats(4, 1);
  RCHECK(d, "cudaMalloc");
  mpu_result_t r = me == 0 ? mpu_comm_split(nc, 0, me, &sub)
                           : mpu_comm_all_reduce(nc, d, d, 4, MPU_FLOAT32, MPU_SUM);
  /* rank 0 at its deadline; rank 1 then, or at once from rank 0's abort */
  RCHECK((me == 0 ? r == MPU_ERR_TIMEOUT : r != MPU_SUCCESS) && !sub, "%s: %s",
         mpu_result_name(r), mpu_last_error());
  mpu_comm_barrier(world);
  mpu_comm_destroy(nc);
  cudaFree(d);
  return MPU_SUCCESS;
}

/* ---- groups share nothing unless asked --------------------------------------------- */

/* Two groups of the same two ranks, issued in opposite orders on the two
 * ranks: with their own resources each progresses; sharing one device
 * stream per rank (splitShare) they would wait for each other forever. */
static mpu_result_t groups_overlap(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm_rank(world, &me);
  mpu_comm *nc = NULL, *a = NULL, *b = NULL;
  long shared = double_count("split_shared");
  ROK(bare(world, 3, 0, &nc));
  ROK(mpu_comm_split(nc, 0, me, &a));
  ROK(mpu_comm_split(nc, 0, me, &b));
  float *x = device_floats(4, 1), *y = device_floats(4, 2);
  RCHECK(x && y, "cudaMalloc");
  mpu_request *qa = NULL, *qb = NULL;
  if (me == 0) {
    ROK(mpu_comm_iall_reduce(a, x, x, 4, MPU_FLOAT32, MPU_SUM, &qa));
    ROK(mpu_comm_iall_reduce(b, y, y, 4, MPU_FLOAT32, MPU_SUM, &qb));
  } else {
    ROK(mpu_comm_iall_reduce(b, y, y, 4, MPU_FLOAT32, MPU_SUM, &qb));
    ROK(mpu_comm_iall_reduce(a, x, x, 4, MPU_FLOAT32, MPU_SUM, &qa));
  }
  mpu_result_t ra = mpu_request_wait(qa), rb = mpu_request_wait(qb);
  RCHECK(!ra && !rb, "opposite orders: %s, %s: %s", mpu_result_name(ra), mpu_result_name(rb),
         mpu_last_error());
  RCHECK(first(x) == 2 && first(y) == 4, "sums %g %g", first(x), first(y));
  mpu_comm_barrier(world);
  RCHECK(double_count("split_shared") == shared, "a split shared the parent's resources");
  mpu_comm_destroy(b), mpu_comm_destroy(a), mpu_comm_destroy(nc);
  cudaFree(x), cudaFree(y);
  return MPU_SUCCESS;
}

/* One group over two communicators on one stream, their calls issued in
 * opposite orders on the two ranks: NCCL launches a group's communicators
 * in ascending commHash (include/group.h), the same order on every rank, so
 * it completes (in issue order it would wait forever: switch "group_order"). */
static mpu_result_t group_in_hash_order(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm_rank(world, &me);
  mpu_comm *nc = NULL, *a = NULL, *b = NULL;
  ROK(bare(world, 5, 0, &nc));
  ROK(mpu_comm_split(nc, 0, me, &a));
  ROK(mpu_comm_split(nc, 0, me, &b));
  cudaStream_t s = NULL;
  RCHECK(!cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  ROK(mpu_comm_set_stream(a, s));
  ROK(mpu_comm_set_stream(b, s));
  float *x = device_floats(4, 1), *y = device_floats(4, 2);
  RCHECK(x && y, "cudaMalloc");
  cudaDeviceSynchronize();
  ROK(mpu_group_start());
  mpu_result_t r1 = me == 0 ? mpu_comm_all_reduce(a, x, x, 4, MPU_FLOAT32, MPU_SUM)
                            : mpu_comm_all_reduce(b, y, y, 4, MPU_FLOAT32, MPU_SUM);
  mpu_result_t r2 = me == 0 ? mpu_comm_all_reduce(b, y, y, 4, MPU_FLOAT32, MPU_SUM)
                            : mpu_comm_all_reduce(a, x, x, 4, MPU_FLOAT32, MPU_SUM);
  mpu_result_t r3 = mpu_group_end();
  RCHECK(!r1 && !r2 && !r3, "group: %s %s %s: %s", mpu_result_name(r1), mpu_result_name(r2),
         mpu_result_name(r3), mpu_last_error());
  RCHECK(first(x) == 2 && first(y) == 4, "sums %g %g", first(x), first(y));
  mpu_comm_barrier(world);
  mpu_comm_destroy(b), mpu_comm_destroy(a), mpu_comm_destroy(nc);
  cudaStreamDestroy(s);
  cudaFree(x), cudaFree(y);
  return MPU_SUCCESS;
}

/* options.share_resources: the splits share (NCCL's splitShare). Destroy of
 * a group whose stream is still busy waits for its work instead of
 * aborting it, which would raise the shared abort flag and stop the
 * sibling's work (NCCL's kernels quit without an error of their own). */
static mpu_result_t shared_destroy_busy(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm_rank(world, &me);
  mpu_comm *nc = NULL, *a = NULL, *b = NULL;
  long shared = double_count("split_shared");
  ROK(bare(world, 5, 1, &nc));
  ROK(mpu_comm_split(nc, 0, me, &a));
  ROK(mpu_comm_split(nc, 0, me, &b));
  RCHECK(double_count("split_shared") > shared, "share_resources: no split shared");
  float *x = device_floats(4, 1), *y = device_floats(4, (float)(me + 1)), *z = device_floats(4, 0);
  RCHECK(x && y && z, "cudaMalloc");
  if (me == 0) {
    mpu_request *q = NULL;
    ROK(mpu_comm_iall_reduce(a, x, x, 4, MPU_FLOAT32, MPU_SUM, &q));
    mpu_request_free(q);
    mpu_comm_destroy(a); /* rank 1 has not come yet: the stream is busy */
  } else {
    sleep_ms(300);
    ROK(mpu_comm_all_reduce(a, x, x, 4, MPU_FLOAT32, MPU_SUM));
    mpu_comm_destroy(a);
  }
  ROK(mpu_comm_all_reduce(b, y, z, 4, MPU_FLOAT32, MPU_SUM));
  RCHECK(first(z) == 3, "the sibling's sum after destroy: %g", first(z));
  mpu_comm_barrier(world);
  mpu_comm_destroy(b), mpu_comm_destroy(nc);
  cudaFree(x), cudaFree(y), cudaFree(z);
  return MPU_SUCCESS;
}

/* A communicator NCCL failed (here: a raw send/recv pair of mismatched
 * sizes on its handle, which the "p2p_size" switch fails at once instead of
 * hanging until a watchdog, so the error is there before destroy looks) is
 * ended by ncclCommAbort: NCCL 2.28's ncclCommDestroy of it would return
 * early inside its own group, and every later call of the thread, on any
 * communicator, would be held and answer success unwritten. */
static mpu_result_t destroy_failed(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm_rank(world, &me);
  mpu_comm *a = NULL, *b = NULL;
  ROK(bare(world, 5, 0, &a));
  ROK(bare(world, 5, 0, &b));
  float *x = device_floats(8, 1), *y = device_floats(4, (float)(me + 1)), *z = device_floats(4, 0);
  RCHECK(x && y && z, "cudaMalloc");
  void *h = NULL, *stream = NULL;
  ROK(mpu_comm_nccl_handle(a, &h));
  ROK(mpu_comm_stream(a, &stream));
  cudaDeviceSynchronize();
  ncclResult_t q = me == 0 ? ncclSend(x, 4, ncclFloat32, 1, h, stream)
                           : ncclRecv(x, 8, ncclFloat32, 0, h, stream);
  RCHECK(q == ncclSuccess || q == ncclInProgress, "raw call: %d", (int)q);
  cudaStreamSynchronize(stream);
  ncclResult_t async = ncclInProgress;
  for (double t0 = test_now(); async == ncclInProgress && test_now() - t0 < 5;) {
    ncclCommGetAsyncError(h, &async);
    cudaStreamSynchronize(stream);
  }
  RCHECK(async == ncclInvalidUsage, "the pair did not fail: %d", (int)async);
  mpu_comm_destroy(a);
  ROK(mpu_comm_all_reduce(b, y, z, 4, MPU_FLOAT32, MPU_SUM));
  RCHECK(first(z) == 3, "another communicator's sum after destroy: %g", first(z));
  mpu_comm_barrier(world);
  mpu_comm_destroy(b);
  cudaFree(x), cudaFree(y), cudaFree(z);
  return MPU_SUCCESS;
}

/* ---- the watchdog thread ----------------------------------------------------------- */

/* Rank 0 starts an all-reduce rank 1 never joins and blocks the host in
 * cudaStreamSynchronize (after mpu_request_stream_wait, which does not
 * block). The watchdog releases it by the timeout + 1 s (how = 0), or
 * mpu_comm_abort from a helper thread does within a second (how = 1). If
 * neither does, rank 1 joins after 8 s so the test ends (and fails). */
static void *abort_later(void *p) {
  sleep_ms(200);
  mpu_comm_abort(p);
  return NULL;
}

static mpu_result_t host_released(mpu_comm *world, void *arg) {
  int how = *(const int *)arg;
  int me;
  mpu_comm_rank(world, &me);
  mpu_comm *nc = NULL;
  ROK(bare(world, how ? 30 : 1, 0, &nc));
  float *d = device_floats(4, 1);
  RCHECK(d, "cudaMalloc");
  void *stream = NULL;
  ROK(mpu_comm_stream(nc, &stream));
  if (me == 1) {
    void *h = NULL;
    ROK(mpu_comm_nccl_handle(nc, &h));
    cudaDeviceSynchronize(); /* d is written: the raw call needs no ordering of mpu's */
    double t0 = test_now();
    while (!atomic_load(&flag) && test_now() - t0 < 8) sleep_ms(5);
    if (!atomic_load(&flag)) /* the rescue, past mpu (which may know of the abort) */
      ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, h, stream);
  } else {
    cudaStream_t mine = NULL;
    RCHECK(!cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking), "stream");
    mpu_request *q = NULL;
    ROK(mpu_comm_iall_reduce(nc, d, d, 4, MPU_FLOAT32, MPU_SUM, &q));
    ROK(mpu_request_stream_wait(q, mine));
    pthread_t helper;
    if (how) RCHECK(!pthread_create(&helper, NULL, abort_later, nc), "helper thread");
    double t0 = test_now();
    cudaStreamSynchronize(mine);
    double took = test_now() - t0;
    atomic_store(&flag, 1);
    if (how) pthread_join(helper, NULL);
    mpu_result_t r = mpu_request_wait(q);
    cudaStreamDestroy(mine);
    RCHECK(took < (how ? 1.2 : 2.0), "the host stayed blocked %.3f s", took);
    RCHECK(r == (how ? MPU_ERR_ABORTED : MPU_ERR_TIMEOUT), "the request: %s (%s)",
           mpu_result_name(r), mpu_last_error());
  }
  mpu_comm_barrier(world);
  mpu_comm_destroy(nc);
  cudaFree(d);
  return MPU_SUCCESS;
}

/* ---- the raw handle ------------------------------------------------------------------ */

/* llm.c's ncclCheck treats anything but ncclSuccess as fatal: the handle mpu
 * hands out is blocking, so a raw ncclAllReduce on it answers ncclSuccess. */
static mpu_result_t raw_handle(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm_rank(world, &me);
  mpu_comm *nc = NULL, *sub = NULL;
  ROK(test_nccl_timed(world, 10, &nc));
  ROK(mpu_comm_split(nc, 0, me, &sub));
  mpu_comm *comms[2] = {nc, sub};
  for (int i = 0; i < 2; i++) {
    void *h = NULL, *stream = NULL;
    ROK(mpu_comm_nccl_handle(comms[i], &h));
    ROK(mpu_comm_stream(comms[i], &stream));
    float *d = device_floats(4, (float)(me + 1));
    RCHECK(d, "cudaMalloc");
    cudaDeviceSynchronize(); /* the raw call is ordered by the caller, not by mpu */
    ncclResult_t q = ncclAllReduce(d, d, 4, ncclFloat32, ncclSum, h, stream);
    RCHECK(q == ncclSuccess, "%s: raw ncclAllReduce answered %d (%s)", i ? "split" : "created",
           (int)q, ncclGetErrorString(q));
    cudaStreamSynchronize(stream);
    RCHECK(first(d) == 3, "raw sum %g", first(d));
    cudaFree(d);
  }
  mpu_comm_destroy(sub), mpu_comm_destroy(nc);
  return MPU_SUCCESS;
}

/* ---- a group of one ------------------------------------------------------------------- */

/* With options.one_rank_through_nccl (or MPU_NCCL_ONE_RANK=1) a
 * communicator of one rank, and its splits, call NCCL; without, a group of
 * one is answered by mpu (a copy). */
static mpu_result_t one_rank(mpu_comm *world, void *arg) {
  int through = *(const int *)arg;
  int me = 0;
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.one_rank_through_nccl = through;
  mpu_comm *nc = NULL, *sub = NULL;
  ROK(mpu_comm_nccl_create(world, &o, &nc));
  ROK(mpu_comm_split(nc, 0, 0, &sub));
  const char *env = getenv("MPU_NCCL_ONE_RANK");
  long want = through || (env && atoi(env));
  float *x = device_floats(4, 2), *y = device_floats(4, 0);
  RCHECK(x && y, "cudaMalloc");
  mpu_comm *comms[2] = {nc, sub};
  for (int i = 0; i < 2; i++) {
    long before = double_call_count("ncclAllReduce");
    ROK(mpu_comm_all_reduce(comms[i], x, y, 4, MPU_FLOAT32, MPU_SUM));
    long calls = double_call_count("ncclAllReduce") - before;
    RCHECK(calls == want && first(y) == 2, "%s: %ld NCCL calls (want %ld), sum %g",
           i ? "split" : "created", calls, want, first(y));
  }
  mpu_comm_destroy(sub), mpu_comm_destroy(nc);
  cudaFree(x), cudaFree(y);
  return MPU_SUCCESS;
}

/* ---- the double: pageable copies ------------------------------------------------------- */

/* An async copy from pageable host memory reads it when it is called, as
 * CUDA stages it: changing the source afterwards, while the stream is still
 * busy, does not change what arrives. */
static mpu_result_t pageable_staged(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm_rank(world, &me);
  mpu_comm *nc = NULL;
  ROK(bare(world, 10, 0, &nc));
  float *d = device_floats(4, 1), *to = device_floats(4, 0);
  RCHECK(d && to, "cudaMalloc");
  if (me == 0) {
    void *stream = NULL;
    ROK(mpu_comm_stream(nc, &stream));
    mpu_request *q = NULL;
    ROK(mpu_comm_iall_reduce(nc, d, d, 4, MPU_FLOAT32, MPU_SUM, &q)); /* busy until rank 1 */
    float *host = malloc(4 * sizeof *host);
    RCHECK(host, "malloc");
    host[0] = 7;
    RCHECK(!cudaMemcpyAsync(to, host, 4 * sizeof *host, cudaMemcpyHostToDevice, stream), "copy");
    host[0] = 8;
    atomic_store(&flag, 1);
    ROK(mpu_request_wait(q));
    cudaStreamSynchronize(stream);
    free(host);
    RCHECK(first(to) == 7, "the copy read %g (the source at the call was 7)", first(to));
  } else {
    while (!atomic_load(&flag)) sleep_ms(2);
    ROK(mpu_comm_all_reduce(nc, d, d, 4, MPU_FLOAT32, MPU_SUM));
  }
  mpu_comm_barrier(world);
  mpu_comm_destroy(nc);
  cudaFree(d), cudaFree(to);
  return MPU_SUCCESS;
}

static void run_n(int n, mpu_rank_fn fn, void *arg) {
  memset(messages, 0, sizeof messages);
  atomic_store(&flag, 0);
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 60;
  mpu_result_t r = mpu_launch(n, fn, arg, NULL, &o);
  if (r) {
    for (int k = 0; k < n; k++)
      if (messages[k][0]) print_error("rank %d: %s\n", k, messages[k]);
    fail_msg("%s", mpu_last_error());
  }
}

static void test_split_past_deadline(void **state) { (void)state; run_n(2, split_past_deadline, NULL); }
static void test_split_meets_all_reduce(void **state) { (void)state; run_n(2, split_meets_all_reduce, NULL); }
static void test_groups_overlap(void **state) { (void)state; run_n(2, groups_overlap, NULL); }
static void test_group_in_hash_order(void **state) { (void)state; run_n(2, group_in_hash_order, NULL); }
static void test_shared_destroy_busy(void **state) { (void)state; run_n(2, shared_destroy_busy, NULL); }
static void test_destroy_failed(void **state) {
  (void)state;
  double_forgive("p2p_size", 1);
  run_n(2, destroy_failed, NULL);
  double_forgive("p2p_size", 0);
}
static void test_watchdog_releases_host(void **state) {
  (void)state;
  int how = 0;
  run_n(2, host_released, &how);
}
static void test_abort_from_thread_releases_host(void **state) {
  (void)state;
  int how = 1;
  run_n(2, host_released, &how);
}
static void test_raw_handle_blocking(void **state) { (void)state; run_n(2, raw_handle, NULL); }
static void test_one_rank(void **state) {
  (void)state;
  for (int through = 0; through < 2; through++) run_n(1, one_rank, &through);
}
static void test_pageable_staged(void **state) { (void)state; run_n(2, pageable_staged, NULL); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split_past_deadline),
      cmocka_unit_test(test_split_meets_all_reduce),
      cmocka_unit_test(test_groups_overlap),
      cmocka_unit_test(test_group_in_hash_order),
      cmocka_unit_test(test_shared_destroy_busy),
      cmocka_unit_test(test_destroy_failed),
      cmocka_unit_test(test_watchdog_releases_host),
      cmocka_unit_test(test_abort_from_thread_releases_host),
      cmocka_unit_test(test_raw_handle_blocking),
      cmocka_unit_test(test_one_rank),
      cmocka_unit_test(test_pageable_staged),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
