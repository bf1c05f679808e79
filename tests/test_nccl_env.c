/*
 * test_nccl_env.c - mpu_comm_nccl_from_env end to end on the NCCL test
 * double: two ranks with torchrun's variables, rank 0 serving the store on
 * MASTER_PORT, both its clients; the NCCL id goes through the store, the
 * communicators all-reduce device buffers. The double's NCCL lives in one
 * process, so the ranks are two threads; the environment is per process, so
 * rank 1's RANK is set only once rank 0 has read its own (rank 0 has put
 * the job key in its store). Then an abort on one rank reaches the other's
 * wait as MPU_ERR_ABORTED within 1 s, on the world and on a split of it
 * (its own key on the store). A world of one needs no store at all.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <cuda_runtime.h>

#include "comm/store.h"
#include "core/clock.h"
#include "mpu.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* a copy on the communicator's stream, waited for */
static int copy(mpu_comm *c, void *dst, const void *src, size_t n, enum cudaMemcpyKind kind) {
  void *stream = NULL;
  if (mpu_comm_stream(c, &stream)) return -1;
  if (cudaMemcpy2DAsync(dst, n, src, n, n, 1, kind, (cudaStream_t)stream) != cudaSuccess)
    return -1;
  cudaError_t e;
  while ((e = cudaStreamQuery((cudaStream_t)stream)) == cudaErrorNotReady) sleep_ms(1);
  return e == cudaSuccess ? 0 : -1;
}

typedef struct rank_job {
  int rank, abort_test;
  mpu_comm *comm;
  mpu_result_t made, reduced, after;
  double waited;
  pthread_barrier_t *both;
  char msg[512];
} rank_job;

static void *run_rank(void *arg) {
  rank_job *j = arg;
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.device = j->rank;
  o.timeout_s = 20;
  j->made = mpu_comm_nccl_from_env(&o, &j->comm);
  if (j->made) {
    snprintf(j->msg, sizeof j->msg, "%s", mpu_last_error());
    pthread_barrier_wait(j->both);
    return NULL;
  }
  float *x = NULL, *y = NULL;
  mpu_comm_mem_alloc(j->comm, 4 * sizeof(float), (void **)&x);
  mpu_comm_mem_alloc(j->comm, 4 * sizeof(float), (void **)&y);
  float h[4] = {1.0f + (float)j->rank, 2, 3, 4};
  copy(j->comm, x, h, sizeof h, cudaMemcpyHostToDevice);
  j->reduced = mpu_comm_all_reduce(j->comm, x, y, 4, MPU_FLOAT32, MPU_SUM);
  copy(j->comm, h, y, sizeof h, cudaMemcpyDeviceToHost);
  if (!j->reduced && (h[0] != 3 || h[1] != 4 || h[3] != 8)) j->reduced = MPU_ERR_BACKEND;
  pthread_barrier_wait(j->both);
  mpu_comm *sub = NULL, *target = j->comm;
  if (j->abort_test == 2) { /* a split of the world */
    j->after = mpu_comm_split(j->comm, 0, j->rank, &sub);
    if (j->after) snprintf(j->msg, sizeof j->msg, "split: %s", mpu_last_error());
    target = sub;
  }
  if (j->abort_test && target) {
    if (j->rank == 1) {
      sleep_ms(300);
      mpu_comm_abort(target);
    } else { /* waits for a peer that gave up: the store tells */
      double t0 = mpu__now();
      j->after = mpu_comm_all_reduce(target, x, y, 4, MPU_FLOAT32, MPU_SUM);
      j->waited = mpu__now() - t0;
      snprintf(j->msg, sizeof j->msg, "%s", mpu_last_error());
    }
  }
  pthread_barrier_wait(j->both);
  mpu_comm_destroy(sub);
  mpu_comm_mem_free(j->comm, x);
  mpu_comm_mem_free(j->comm, y);
  mpu_comm_destroy(j->comm);
  return NULL;
}

static void set_env(int rank, int port) {
  char v[16];
  snprintf(v, sizeof v, "%d", rank);
  setenv("RANK", v, 1);
  setenv("LOCAL_RANK", v, 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "localhost", 1);
  snprintf(v, sizeof v, "%d", port);
  setenv("MASTER_PORT", v, 1);
}

static void two_ranks(int abort_test, rank_job *j) {
  int port = 20000 + (int)((getpid() * 13) % 12000) + abort_test; /* below the ephemeral range */
  pthread_barrier_t both;
  pthread_barrier_init(&both, NULL, 2);
  pthread_t t[2];
  for (int r = 0; r < 2; r++) j[r] = (rank_job){.rank = r, .abort_test = abort_test, .both = &both};
  set_env(0, port);
  assert_int_equal(pthread_create(&t[0], NULL, run_rank, &j[0]), 0);
  /* rank 0 has read the environment once its store holds the job key */
  mpu__store *s = NULL;
  assert_int_equal(mpu__store_connect("test", "127.0.0.1", port, "mpu", 20, &s), MPU_SUCCESS);
  assert_int_equal(mpu__store_wait(s, "job", 20), MPU_SUCCESS);
  mpu__store_close(s);
  set_env(1, port);
  assert_int_equal(pthread_create(&t[1], NULL, run_rank, &j[1]), 0);
  for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
  pthread_barrier_destroy(&both);
  for (int r = 0; r < 2; r++) {
    if (j[r].made) fprintf(stderr, "rank %d: %s\n", r, j[r].msg);
    assert_int_equal(j[r].made, MPU_SUCCESS);
    assert_int_equal(j[r].reduced, MPU_SUCCESS);
  }
}

static void test_from_env(void **state) {
  (void)state;
  rank_job j[2];
  two_ranks(0, j);
}

static void test_abort_through_store(void **state) {
  (void)state;
  rank_job j[2];
  two_ranks(1, j);
  fprintf(stderr, "rank 0: %s after %.3f s: %s\n", mpu_result_name(j[0].after), j[0].waited,
          j[0].msg);
  assert_int_equal(j[0].after, MPU_ERR_ABORTED);
  assert_true(j[0].waited < 0.3 + 1.0 + 0.5); /* the abort came 0.3 s in; 1 s to see it */
}

static void test_abort_through_store_on_split(void **state) {
  (void)state;
  rank_job j[2];
  two_ranks(2, j);
  fprintf(stderr, "rank 0 on the split: %s after %.3f s: %s\n", mpu_result_name(j[0].after),
          j[0].waited, j[0].msg);
  assert_int_equal(j[0].after, MPU_ERR_ABORTED);
  assert_true(j[0].waited < 0.3 + 1.5);
}

static void test_world_of_one(void **state) {
  (void)state;
  set_env(0, 1); /* nobody listens on port 1: a world of one never asks */
  setenv("WORLD_SIZE", "1", 1);
  mpu_comm *c = NULL;
  assert_int_equal(mpu_comm_nccl_from_env(NULL, &c), MPU_SUCCESS);
  mpu_comm_destroy(c);
  unsetenv("MASTER_ADDR");
  assert_int_equal(mpu_comm_nccl_from_env(NULL, &c), MPU_ERR_INVALID_USAGE);
  assert_non_null(strstr(mpu_last_error(), "MASTER_ADDR"));
}

int main(void) {
  setenv("MPU_DOUBLE_GPUS", "2", 0);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_from_env),
      cmocka_unit_test(test_abort_through_store),
      cmocka_unit_test(test_abort_through_store_on_split),
      cmocka_unit_test(test_world_of_one),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
