/*
 * test_nccl_order.c - stream ordering on the NCCL backend, on the test
 * double with its stream-order checker (nccl_double/order.h):
 *   - the checker itself: a write on one stream then NCCL on another is
 *     refused naming both streams; an event and cudaStreamWaitEvent, or a
 *     host synchronisation, order them; reads after NCCL's writes and writes
 *     after its reads; the legacy default stream against blocking and
 *     non-blocking streams; a blocking cudaMemcpy from pageable memory; the
 *     "order" switch;
 *   - mpu's calls are ordered after the caller's work on the legacy default
 *     stream by default, and their results are visible to the caller's
 *     later kernels on any stream after a blocking call;
 *   - mpu_comm_set_stream runs the calls on the caller's stream (no wait
 *     needed, and the blocking call never polls that stream), NULL goes back
 *     to the default;
 *   - mpu_request_stream_wait orders the caller's later work on a stream
 *     after a non-blocking call without a host wait; on a host backend it
 *     waits on the host.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"
#include "nccl_double/order.h"
#include "nccl_double/switches.h"

#define TEST_RANK me
#include "test_helpers.h"

enum { N = 16 };

/* ---- the checker, on raw CUDA and NCCL calls (one rank) ------------------------- */

typedef struct raw {
  ncclComm_t nc;
  float *buf;
  cudaStream_t user, ns, blocking;
} raw;

static void raw_open(raw *r) {
  ncclUniqueId id;
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
  assert_int_equal(ncclCommInitRank(&r->nc, 1, id, 0), ncclSuccess);
  assert_int_equal(cudaMalloc((void **)&r->buf, N * sizeof(float)), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&r->user, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&r->ns, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(cudaStreamCreate(&r->blocking), cudaSuccess);
  assert_int_equal(double_order_violations(), 0);
}

static void raw_close(raw *r) {
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  cudaStreamDestroy(r->user);
  cudaStreamDestroy(r->ns);
  cudaStreamDestroy(r->blocking);
  cudaFree(r->buf);
  ncclCommDestroy(r->nc);
}

static ncclResult_t sum(raw *r, cudaStream_t s) {
  return ncclAllReduce(r->buf, r->buf, N, ncclFloat32, ncclSum, r->nc, s);
}

/* a deliberate race is caught, named, and an event + wait makes it pass */
static void test_checker_race(void **state) {
  (void)state;
  raw r;
  raw_open(&r);
  assert_int_equal(cudaMemsetAsync(r.buf, 0, N * sizeof(float), r.user), cudaSuccess);
  assert_int_equal(sum(&r, r.ns), ncclInvalidUsage);
  const char *why = ncclGetLastError(r.nc);
  assert_non_null(strstr(why, "ncclAllReduce on stream"));
  assert_non_null(strstr(why, "that cudaMemsetAsync on stream"));
  assert_int_equal(double_order_violations(), 1);
  assert_non_null(strstr(double_order_message(), "cudaStreamWaitEvent"));
  cudaEvent_t ev;
  assert_int_equal(cudaEventCreate(&ev), cudaSuccess);
  assert_int_equal(cudaEventRecord(ev, r.user), cudaSuccess);
  assert_int_equal(cudaStreamWaitEvent(r.ns, ev, 0), cudaSuccess);
  assert_int_equal(cudaEventDestroy(ev), cudaSuccess); /* the wait keeps what it waits for */
  assert_int_equal(sum(&r, r.ns), ncclSuccess);
  assert_int_equal(double_order_take_violations(), 1);
  raw_close(&r);
}

/* the caller's work after NCCL's: reads of its output and writes of its input */
static void test_checker_after_nccl(void **state) {
  (void)state;
  raw r;
  float host[N];
  raw_open(&r);
  assert_int_equal(cudaMemsetAsync(r.buf, 0, N * sizeof(float), r.ns), cudaSuccess);
  assert_int_equal(sum(&r, r.ns), ncclSuccess); /* one stream: in order */
  assert_int_equal(cudaMemcpyAsync(host, r.buf, sizeof host, cudaMemcpyDeviceToHost, r.user),
                   cudaErrorIllegalState);
  assert_non_null(strstr(double_order_message(), "cudaMemcpyAsync on stream"));
  assert_non_null(strstr(double_order_message(), "that ncclAllReduce on stream"));
  assert_int_equal(cudaStreamSynchronize(r.ns), cudaSuccess); /* the host saw it end */
  assert_int_equal(cudaMemcpyAsync(host, r.buf, sizeof host, cudaMemcpyDeviceToHost, r.user),
                   cudaSuccess);
  /* NCCL overwriting what a kernel may still read */
  assert_int_equal(sum(&r, r.ns), ncclInvalidUsage);
  assert_non_null(strstr(double_order_message(), "that cudaMemcpyAsync on stream"));
  assert_non_null(strstr(double_order_message(), " reads,"));
  /* a completed query orders the host as well */
  while (cudaStreamQuery(r.user) == cudaErrorNotReady) {
  }
  assert_int_equal(sum(&r, r.ns), ncclSuccess);
  /* a host write (managed memory) after NCCL's, and NCCL after it */
  assert_int_equal(double_order_host_write(r.buf, 4), -1);
  cudaEvent_t ev;
  assert_int_equal(cudaEventCreate(&ev), cudaSuccess);
  assert_int_equal(cudaEventRecord(ev, r.ns), cudaSuccess);
  assert_int_equal(cudaEventSynchronize(ev), cudaSuccess);
  assert_int_equal(double_order_host_write(r.buf, 4), 0);
  assert_int_equal(sum(&r, r.user), ncclSuccess); /* enqueued after the host's write */
  cudaEventDestroy(ev);
  assert_int_equal(double_order_take_violations(), 3);
  raw_close(&r);
}

/* the legacy default stream waits for blocking streams and they for it, but
 * not cudaStreamNonBlocking ones: the race a communicator's own stream has */
static void test_checker_legacy_stream(void **state) {
  (void)state;
  raw r;
  unsigned flags = 7;
  raw_open(&r);
  assert_int_equal(cudaStreamGetFlags(r.blocking, &flags), cudaSuccess);
  assert_int_equal(flags, cudaStreamDefault);
  assert_int_equal(cudaStreamGetFlags(r.ns, &flags), cudaSuccess);
  assert_int_equal(flags, cudaStreamNonBlocking);
  assert_int_equal(cudaStreamGetFlags(NULL, &flags), cudaSuccess);
  assert_int_equal(flags, cudaStreamDefault);
  assert_int_equal(cudaMemsetAsync(r.buf, 0, N * sizeof(float), NULL), cudaSuccess);
  assert_int_equal(sum(&r, r.blocking), ncclSuccess);
  assert_int_equal(cudaMemsetAsync(r.buf, 0, N * sizeof(float), cudaStreamLegacy), cudaSuccess);
  assert_int_equal(sum(&r, r.ns), ncclInvalidUsage);
  assert_non_null(strstr(double_order_message(), "the legacy default stream of device 0"));
  assert_non_null(strstr(double_order_message(), "non-blocking"));
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  /* a blocking cudaMemcpy from pageable memory returns before the device's
   * write is known to be done: only streams after the legacy one see it */
  float host[N] = {0};
  assert_int_equal(cudaMemcpy(r.buf, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
  assert_int_equal(sum(&r, r.ns), ncclInvalidUsage);
  assert_int_equal(sum(&r, r.blocking), ncclSuccess);
  /* the per-thread default stream is a blocking one: the legacy stream
   * waits for it (two blocking streams do not wait for each other) */
  assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
  assert_int_equal(cudaMemsetAsync(r.buf, 0, sizeof host, cudaStreamPerThread), cudaSuccess);
  assert_int_equal(sum(&r, NULL), ncclSuccess);
  assert_int_equal(double_order_take_violations(), 2);
  raw_close(&r);
}

/* the forgiving switch turns the checker off */
static void test_checker_switch(void **state) {
  (void)state;
  raw r;
  raw_open(&r);
  assert_int_equal(double_forgive("order", 1), 0);
  /* a store the host only claims: a race for the checker, none in memory */
  assert_int_equal(sum(&r, r.ns), ncclSuccess);
  assert_int_equal(double_order_host_write(r.buf, 4), 0);
  assert_int_equal(double_forgive("order", 0), 0);
  assert_int_equal(double_order_violations(), 0);
  raw_close(&r);
}

/* ---- mpu's calls on two thread ranks ---------------------------------------------- */

/* Every element of a device buffer, read back on the host. */
static mpu_result_t expect(int me, const float *dev, float want) {
  float host[N];
  RCHECK(cudaMemcpy(host, dev, sizeof host, cudaMemcpyDeviceToHost) == cudaSuccess, "read back");
  for (int i = 0; i < N; i++) RCHECK(host[i] == want, "element %d: %g, want %g", i, host[i], want);
  return MPU_SUCCESS;
}

/* The caller's kernels run on the legacy default stream: mpu orders after them. */
static mpu_result_t default_order(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm *nc = NULL;
  float *dev = NULL, host[N];
  cudaStream_t other;
  mpu_comm_rank(world, &me);
  ROK(test_nccl_timed(world, 30, &nc));
  ROK(mpu_comm_mem_alloc(nc, sizeof host, (void **)&dev));
  RCHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking) == cudaSuccess, "stream");
  for (int i = 0; i < N; i++) host[i] = (float)(me + 1);
  RCHECK(cudaMemcpyAsync(dev, host, sizeof host, cudaMemcpyHostToDevice, NULL) == cudaSuccess, "fill");
  ROK(mpu_comm_all_reduce(nc, dev, dev, N, MPU_FLOAT32, MPU_SUM));
  /* the host waited: a kernel on any stream may read the result now */
  RCHECK(cudaMemcpyAsync(host, dev, sizeof host, cudaMemcpyDeviceToHost, other) == cudaSuccess,
         "read on another stream: %s", double_order_message());
  RCHECK(cudaStreamSynchronize(other) == cudaSuccess && host[0] == 3, "result %g", host[0]);
  /* a blocking cudaMemcpy, then a non-blocking call */
  for (int i = 0; i < N; i++) host[i] = (float)(10 * me + 1);
  RCHECK(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice) == cudaSuccess, "fill");
  mpu_request *req = NULL;
  ROK(mpu_comm_iall_reduce(nc, dev, dev, N, MPU_FLOAT32, MPU_SUM, &req));
  ROK(mpu_request_wait(req));
  if (expect(me, dev, 12)) return MPU_ERR_INTERNAL;
  /* a memset on the legacy stream, then point to point */
  RCHECK(cudaMemsetAsync(dev, 0, sizeof host, NULL) == cudaSuccess, "memset");
  ROK(mpu_comm_sendrecv(nc, dev, N / 2, 1 - me, dev + N / 2, N / 2, 1 - me, MPU_FLOAT32));
  cudaStreamDestroy(other);
  ROK(mpu_comm_mem_free(nc, dev));
  ROK(mpu_comm_destroy(nc));
  return MPU_SUCCESS;
}

/* set_stream: mpu's work on the caller's stream, in its order */
static mpu_result_t own_stream(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm *nc = NULL;
  float *dev = NULL, host[N];
  cudaStream_t user;
  void *got = NULL;
  mpu_comm_rank(world, &me);
  ROK(test_nccl_timed(world, 30, &nc));
  ROK(mpu_comm_mem_alloc(nc, sizeof host, (void **)&dev));
  RCHECK(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking) == cudaSuccess, "stream");
  ROK(mpu_comm_set_stream(nc, user));
  ROK(mpu_comm_stream(nc, &got));
  RCHECK(got == (void *)user, "mpu_comm_stream: %p, set %p", got, (void *)user);
  for (int i = 0; i < N; i++) host[i] = (float)(me + 1);
  RCHECK(cudaMemcpyAsync(dev, host, sizeof host, cudaMemcpyHostToDevice, user) == cudaSuccess, "fill");
  long polls = double_stream_queries(user);
  ROK(mpu_comm_all_reduce(nc, dev, dev, N, MPU_FLOAT32, MPU_SUM));
  ROK(mpu_comm_sendrecv(nc, dev, N / 2, 1 - me, dev + N / 2, N / 2, 1 - me, MPU_FLOAT32));
  ROK(mpu_comm_copy2d(nc, dev + N / 2, sizeof(float), dev, sizeof(float), sizeof(float), N / 2));
  RCHECK(double_stream_queries(user) == polls,
         "the blocking call polled the caller's stream %ld times (it may hold the caller's "
         "later kernels: wait for an event)", double_stream_queries(user) - polls);
  mpu_request *req = NULL;
  ROK(mpu_comm_iall_reduce(nc, dev, dev, N, MPU_FLOAT32, MPU_SUM, &req));
  /* the next kernel on the same stream sees the result: no wait needed */
  RCHECK(cudaMemcpyAsync(host, dev, sizeof host, cudaMemcpyDeviceToHost, user) == cudaSuccess,
         "read on the stream: %s", double_order_message());
  RCHECK(cudaStreamSynchronize(user) == cudaSuccess && host[N - 1] == 6, "result %g", host[N - 1]);
  ROK(mpu_request_wait(req));
  /* NULL: back to a stream of the communicator's own, after the legacy one */
  ROK(mpu_comm_set_stream(nc, NULL));
  ROK(mpu_comm_stream(nc, &got));
  RCHECK(got && got != (void *)user, "stream after set_stream(NULL): %p", got);
  RCHECK(cudaMemsetAsync(dev, 0, sizeof host, NULL) == cudaSuccess, "memset");
  ROK(mpu_comm_all_reduce(nc, dev, dev, N, MPU_FLOAT32, MPU_SUM));
  if (expect(me, dev, 0)) return MPU_ERR_INTERNAL;
  ROK(mpu_comm_mem_free(nc, dev));
  ROK(mpu_comm_destroy(nc));
  cudaStreamDestroy(user);
  return MPU_SUCCESS;
}

/* request_stream_wait: the caller's stream, not the host, waits */
static mpu_result_t stream_wait(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm *nc = NULL;
  float *in = NULL, *out = NULL, host[N];
  cudaStream_t user;
  mpu_comm_rank(world, &me);
  ROK(test_nccl_timed(world, 30, &nc));
  ROK(mpu_comm_mem_alloc(nc, sizeof host, (void **)&in));
  ROK(mpu_comm_mem_alloc(nc, sizeof host, (void **)&out));
  RCHECK(cudaStreamCreateWithFlags(&user, cudaStreamNonBlocking) == cudaSuccess, "stream");
  for (int i = 0; i < N; i++) host[i] = (float)(me + 2);
  RCHECK(cudaMemcpy(in, host, sizeof host, cudaMemcpyHostToDevice) == cudaSuccess, "fill");
  mpu_request *req = NULL;
  ROK(mpu_comm_iall_reduce(nc, in, out, N, MPU_FLOAT32, MPU_SUM, &req));
  /* without the wait, a kernel reading the output races with NCCL */
  RCHECK(cudaMemcpyAsync(host, out, sizeof host, cudaMemcpyDeviceToHost, user) ==
             cudaErrorIllegalState,
         "the race was not caught");
  RCHECK(mpu_request_stream_wait(NULL, user) == MPU_ERR_INVALID_ARGUMENT, "NULL request");
  ROK(mpu_request_stream_wait(req, user));
  RCHECK(cudaMemcpyAsync(host, out, sizeof host, cudaMemcpyDeviceToHost, user) == cudaSuccess,
         "read after the stream waited: %s", double_order_message());
  RCHECK(cudaStreamSynchronize(user) == cudaSuccess && host[0] == 5, "result %g", host[0]);
  ROK(mpu_request_wait(req));
  RCHECK(mpu_request_stream_wait(req, user) == MPU_ERR_INVALID_USAGE, "completed request");
  ROK(mpu_comm_mem_free(nc, in));
  ROK(mpu_comm_mem_free(nc, out));
  ROK(mpu_comm_destroy(nc));
  cudaStreamDestroy(user);
  return MPU_SUCCESS;
}

/* a host backend has no stream: the host waits, the request stays pending */
static mpu_result_t host_stream_wait(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  float x[N], y[N];
  mpu_comm_rank(world, &me);
  for (int i = 0; i < N; i++) x[i] = (float)(me + 1), y[i] = 0;
  mpu_request *req = NULL;
  ROK(mpu_comm_iall_reduce(world, x, y, N, MPU_FLOAT32, MPU_SUM, &req));
  ROK(mpu_request_stream_wait(req, NULL));
  RCHECK(y[0] == 3 && y[N - 1] == 3, "result after the host wait: %g", y[0]);
  int done = 0;
  ROK(mpu_request_test(req, &done));
  RCHECK(done, "the request completes at the next test");
  return MPU_SUCCESS;
}

static void run(mpu_rank_fn fn, long violations) {
  memset(messages, 0, sizeof messages);
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 60;
  mpu_result_t r = mpu_launch(2, fn, NULL, NULL, &o);
  if (r) {
    for (int k = 0; k < 2; k++)
      if (messages[k][0]) print_error("rank %d: %s\n", k, messages[k]);
    fail_msg("%s", mpu_last_error());
  }
  assert_int_equal(double_order_take_violations(), violations);
}

static void test_default_order(void **state) { (void)state; run(default_order, 0); }
static void test_set_stream(void **state) { (void)state; run(own_stream, 0); }
static void test_request_stream_wait(void **state) { (void)state; run(stream_wait, 2); }
static void test_request_stream_wait_host(void **state) { (void)state; run(host_stream_wait, 0); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_checker_race),
      cmocka_unit_test(test_checker_after_nccl),
      cmocka_unit_test(test_checker_legacy_stream),
      cmocka_unit_test(test_checker_switch),
      cmocka_unit_test(test_default_order),
      cmocka_unit_test(test_set_stream),
      cmocka_unit_test(test_request_stream_wait),
      cmocka_unit_test(test_request_stream_wait_host),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
