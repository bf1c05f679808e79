/*
 * test_helpers.h - what the cmocka tests share: a message slot per rank and
 * the checks that fill it from inside a rank function, float32 views, and a
 * monotonic clock.
 *
 * A rank function reports its first failed check in messages[TEST_RANK]
 * (define TEST_RANK before including: the expression naming the rank, `rank`
 * by default) and returns MPU_ERR_INTERNAL; the test prints the messages.
 */
#ifndef MPU_TEST_HELPERS_H
#define MPU_TEST_HELPERS_H

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "mpu.h"

#define TEST_MAX_RANKS 64

static __attribute__((unused)) char messages[TEST_MAX_RANKS][512];

#ifndef TEST_RANK
#define TEST_RANK rank
#endif

#define RCHECK(cond, ...)                                                    \
  do {                                                                       \
    if (!(cond)) {                                                           \
      int r_ = (TEST_RANK);                                                  \
      snprintf(messages[r_], sizeof messages[r_], __VA_ARGS__);              \
      return MPU_ERR_INTERNAL;                                               \
    }                                                                        \
  } while (0)

#define ROK(call)                                                            \
  do {                                                                       \
    mpu_result_t e_ = (call);                                                \
    RCHECK(!e_, "%s: %s", #call, mpu_last_error());                          \
  } while (0)

/* The MPI process tests' check: prints the failure with the process's
 * `rank` and counts it in `failures` (both in scope), and goes on. */
#define MCHECK(cond, ...)                                                    \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__);         \
      fprintf(stderr, __VA_ARGS__);                                          \
      fprintf(stderr, " (last error: %s)\n", mpu_last_error());              \
      failures++;                                                            \
    }                                                                        \
  } while (0)

/* The MPI process tests' fresh world communicator: MPI_COMM_WORLD's with this
 * timeout (0: MPU_TIMEOUT if set, else none) and call checking (MPU_CHECKS_ON/OFF); NULL, printed and
 * counted as MCHECK does, when it cannot be made. MFRESH passes the `rank` and
 * `failures` in scope. */
static inline __attribute__((unused)) mpu_comm *test_mpi_world(double timeout_s, int checks,
                                                              int rank, int *failures) {
  mpu_mpi_options o = MPU_MPI_OPTIONS_INIT;
  o.timeout_s = timeout_s;
  o.check_calls = checks;
  mpu_comm *c = NULL;
  mpu_result_t r = mpu_comm_mpi_world_ex(NULL, NULL, &o, &c);
  if (r != MPU_SUCCESS) {
    fprintf(stderr, "rank %d: mpu_comm_mpi_world_ex -> %s: %s\n", rank, mpu_result_name(r),
            mpu_last_error());
    ++*failures;
  }
  return c;
}
#define MFRESH(timeout_s, checks) test_mpi_world((timeout_s), (checks), rank, &failures)

/* float32 views of n elements and of rows x cols */
static inline __attribute__((unused)) mpu_tensor test_vec(float *d, int n) {
  mpu_tensor t;
  int64_t s[1] = {n};
  mpu_tensor_init(&t, d, MPU_FLOAT32, 1, s);
  return t;
}

static inline __attribute__((unused)) mpu_tensor test_mat(float *d, int rows, int cols) {
  mpu_tensor t;
  int64_t s[2] = {rows, cols};
  mpu_tensor_init(&t, d, MPU_FLOAT32, 2, s);
  return t;
}

/* ---- buffers as a GPU program keeps them ----------------------------------------
 * On a communicator whose memory is the device's (NCCL) the host cannot read
 * or write its buffers (on the NCCL test double either: a host dereference
 * faults), so a test holds its values on the host and moves them in and out
 * with mpu_comm_copy2d; on the host backends the buffers are the values. */

/* Whether c's buffers are device memory. */
static inline __attribute__((unused)) int test_on_device(mpu_comm *c) {
  mpu_comm_caps caps = {0};
  caps.size = sizeof caps;
  return !mpu_comm_capabilities(c, &caps) && caps.memory == MPU_MEMORY_DEVICE;
}

/* bytes of c's memory at *dev holding a copy of host (host NULL: zeros) */
static inline __attribute__((unused)) mpu_result_t test_dev_in(mpu_comm *c, const void *host,
                                                               size_t bytes, void **dev) {
  mpu_result_t r = mpu_comm_mem_alloc(c, bytes, dev);
  if (r || !bytes) return r;
  void *zeros = host ? NULL : calloc(1, bytes);
  if (!host && !zeros) r = MPU_ERR_OUT_OF_MEMORY;
  else r = mpu_comm_copy2d(c, *dev, bytes, host ? host : zeros, bytes, bytes, 1);
  free(zeros);
  if (r) mpu_comm_mem_free(c, *dev), *dev = NULL;
  return r;
}

/* Copy dev back into host (host NULL: no copy) and free it; the first error. */
static inline __attribute__((unused)) mpu_result_t test_dev_out(mpu_comm *c, void *dev, void *host,
                                                                size_t bytes) {
  mpu_result_t r = dev && host && bytes ? mpu_comm_copy2d(c, host, bytes, dev, bytes, bytes, 1)
                                        : MPU_SUCCESS;
  mpu_result_t f = dev ? mpu_comm_mem_free(c, dev) : MPU_SUCCESS;
  return r ? r : f;
}

/* mpu_comm_all_reduce (kind 'r') or mpu_comm_all_gather ('g') of host
 * values, through c's memory: one device buffer holding the output, then
 * the input (none for an in-place all-reduce), one copy in and one out. */
static inline __attribute__((unused)) mpu_result_t test_coll(mpu_comm *c, char kind, const void *in,
                                                             void *out, size_t count, mpu_dtype t,
                                                             mpu_op op) {
  int size = 1;
  mpu_comm_size(c, &size);
  if (!test_on_device(c))
    return kind == 'r' ? mpu_comm_all_reduce(c, in, out, count, t, op)
                       : mpu_comm_all_gather(c, in, out, count, t);
  int in_place = kind == 'r' && in == out;
  size_t ib = count * mpu_dtype_size(t), ob = kind == 'r' ? ib : ib * (size_t)size;
  char *dev = NULL;
  mpu_result_t r = mpu_comm_mem_alloc(c, ob + (in_place ? 0 : ib), (void **)&dev);
  if (r) return r;
  char *din = in_place ? dev : dev + ob;
  if (ib) r = mpu_comm_copy2d(c, din, ib, in, ib, ib, 1);
  if (!r)
    r = kind == 'r' ? mpu_comm_all_reduce(c, din, dev, count, t, op)
                    : mpu_comm_all_gather(c, din, dev, count, t);
  mpu_result_t o = test_dev_out(c, dev, r ? NULL : out, ob);
  return r ? r : o;
}

/* This thread rank's place in world and an NCCL communicator over it (world
 * its host twin; options may be NULL). */
static inline __attribute__((unused)) mpu_result_t test_nccl_over(mpu_comm *world,
                                                                  const mpu_nccl_options *options,
                                                                  int *rank, int *size,
                                                                  mpu_comm **nc) {
  mpu_comm_rank(world, rank);
  mpu_comm_size(world, size);
  return mpu_comm_nccl_create(world, options, nc);
}

/* An NCCL communicator over world whose calls fail after timeout_s. */
static inline __attribute__((unused)) mpu_result_t test_nccl_timed(mpu_comm *world,
                                                                   double timeout_s,
                                                                   mpu_comm **nc) {
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.timeout_s = timeout_s;
  return mpu_comm_nccl_create(world, &o, nc);
}

/* A rank's check in a threads-world test that gathers messages: on failure
 * the message goes to m->text[me], r becomes MPU_ERR_INTERNAL and the rank
 * goes to out (m, me, r and the label are the caller's). */
#define CHECK_OUT(cond, ...)                                                                  \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      snprintf(m->text[me], sizeof m->text[me], __VA_ARGS__);                                \
      r = MPU_ERR_INTERNAL;                                                                  \
      goto out;                                                                              \
    }                                                                                        \
  } while (0)

/* A gate that holds a stream as a long kernel would: gate_hold, given to
 * cudaLaunchHostFunc, runs until gate_open; gate_ran says whether it ended. */
typedef struct gate {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int open, ran;
} gate;

static inline __attribute__((unused)) void gate_hold(void *p) {
  gate *g = p;
  pthread_mutex_lock(&g->lock);
  while (!g->open) pthread_cond_wait(&g->cond, &g->lock);
  g->ran = 1;
  pthread_mutex_unlock(&g->lock);
}

static inline __attribute__((unused)) void gate_open(gate *g) {
  pthread_mutex_lock(&g->lock);
  g->open = 1;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->lock);
}

static inline __attribute__((unused)) int gate_ran(gate *g) {
  pthread_mutex_lock(&g->lock);
  int ran = g->ran;
  pthread_mutex_unlock(&g->lock);
  return ran;
}

/* monotonic seconds */
static inline __attribute__((unused)) double test_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
