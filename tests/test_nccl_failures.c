/*
 * test_nccl_failures.c - the NCCL backend's watchdog and abort, on the test
 * double: a peer that never comes ends its peers' waits in MPU_ERR_TIMEOUT
 * within the timeout (NCCL aborted, the communicator broken, later calls
 * failing at once); a peer that aborts ends them in an error, not a hang; a
 * request's wait_timeout leaves it pending and a later wait completes it;
 * NCCL errors come back as mpu's codes with NCCL's message; capabilities.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "mpu.h"

#define TEST_RANK me
#include "test_helpers.h"


static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static mpu_result_t make(mpu_comm *world, double timeout, mpu_comm **nc) {
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.timeout_s = timeout;
  return mpu_comm_nccl_create(world, &o, nc);
}

/* rank 1 never makes the call */
static mpu_result_t absent(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm *nc = NULL;
  mpu_comm_rank(world, &me);
  RCHECK(!make(world, 0.5, &nc), "create: %s", mpu_last_error());
  float x[4] = {1, 2, 3, 4}, y[4];
  if (me == 0) {
    double t0 = test_now();
    mpu_result_t r = mpu_comm_all_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM);
    double took = test_now() - t0;
    RCHECK(r == MPU_ERR_TIMEOUT, "absent peer: %s", mpu_result_name(r));
    RCHECK(took >= 0.5 && took < 1.5, "failed after %.3f s", took);
    RCHECK(strstr(mpu_last_error(), "NCCL aborted"), "message: %s", mpu_last_error());
    t0 = test_now();
    r = mpu_comm_barrier(nc);
    RCHECK(r == MPU_ERR_TIMEOUT && test_now() - t0 < 0.1, "broken: %s", mpu_result_name(r));
  }
  mpu_comm_barrier(world); /* rank 1 leaves only after rank 0 gave up */
  mpu_comm_destroy(nc);
  return MPU_SUCCESS;
}

/* rank 1 aborts while rank 0 waits */
static mpu_result_t aborted(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm *nc = NULL;
  mpu_comm_rank(world, &me);
  RCHECK(!make(world, 30, &nc), "create: %s", mpu_last_error());
  float x[4] = {1, 2, 3, 4}, y[4];
  if (me == 1) {
    sleep_ms(100);
    RCHECK(!mpu_comm_abort(nc), "abort");
    RCHECK(mpu_comm_all_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM) == MPU_ERR_ABORTED,
           "after abort: %s", mpu_last_error());
  } else {
    double t0 = test_now();
    mpu_result_t r = mpu_comm_all_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM);
    RCHECK(r == MPU_ERR_ABORTED && test_now() - t0 < 5, "peer aborted: %s after %.3f s (%s)",
           mpu_result_name(r), test_now() - t0, mpu_last_error());
    RCHECK(strstr(mpu_last_error(), "NCCL error 6"), "message: %s", mpu_last_error());
  }
  mpu_comm_barrier(world);
  mpu_comm_destroy(nc);
  return MPU_SUCCESS;
}

/* a request outlives a wait_timeout */
static mpu_result_t late(mpu_comm *world, void *arg) {
  (void)arg;
  int me;
  mpu_comm *nc = NULL;
  mpu_comm_rank(world, &me);
  RCHECK(!make(world, 30, &nc), "create: %s", mpu_last_error());
  float x[4] = {1, 2, 3, 4}, y[4] = {0};
  mpu_request *req = NULL;
  if (me == 0) {
    RCHECK(!mpu_comm_iall_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM, &req), "start");
    int done = 1;
    RCHECK(!mpu_request_test(req, &done) && !done, "test before the peer came");
    RCHECK(mpu_request_wait_timeout(req, 0.2) == MPU_ERR_TIMEOUT, "wait_timeout");
  }
  mpu_comm_barrier(world); /* now rank 1 joins */
  if (me == 1) RCHECK(!mpu_comm_all_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM), "late call");
  else RCHECK(!mpu_request_wait(req), "wait after the timeout: %s", mpu_last_error());
  RCHECK(y[3] == 8, "result %g", y[3]);
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  RCHECK(!mpu_comm_capabilities(nc, &caps) && caps.memory == MPU_MEMORY_DEVICE && caps.streams &&
             caps.native_nonblocking && caps.fault_detection && !caps.exact_reductions,
         "capabilities");
  void *stream = NULL;
  RCHECK(!mpu_comm_stream(nc, &stream) && stream, "stream");
  RCHECK(mpu_comm_destroy(nc) == MPU_SUCCESS, "destroy");
  mpu_comm *host = NULL;
  RCHECK(mpu_comm_host_twin(world, &host) == MPU_ERR_INVALID_ARGUMENT, "twin of a host comm");
  return MPU_SUCCESS;
}

static void run(mpu_rank_fn fn) {
  memset(messages, 0, sizeof messages);
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 60;
  mpu_result_t r = mpu_launch(2, fn, NULL, NULL, &o);
  if (r) {
    for (int k = 0; k < 2; k++)
      if (messages[k][0]) print_error("rank %d: %s\n", k, messages[k]);
    fail_msg("%s", mpu_last_error());
  }
}

static void test_absent(void **state) { (void)state; run(absent); }
static void test_aborted(void **state) { (void)state; run(aborted); }
static void test_late(void **state) { (void)state; run(late); }

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_absent),
      cmocka_unit_test(test_aborted),
      cmocka_unit_test(test_late),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
