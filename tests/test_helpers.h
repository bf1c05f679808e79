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

#include <stdio.h>
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

/* monotonic seconds */
static inline __attribute__((unused)) double test_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
