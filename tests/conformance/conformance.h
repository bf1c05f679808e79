/*
 * conformance.h - the collective conformance suite, written once against
 * mpu/comm.h and run by a driver per backend (threads: test_conformance_threads).
 *
 * Each case is a rank function: every rank of the world runs it and returns
 * MPU_SUCCESS, or an error after writing what went wrong into its slot of the
 * suite's messages. Cases check results against values computed here
 * independently of the library (exact small integers, expected rounding).
 */
#ifndef MPU_TESTS_CONFORMANCE_H
#define MPU_TESTS_CONFORMANCE_H

#include <stdio.h>

#include "mpu.h"

#define CONF_MAX_RANKS 64

typedef struct conf_suite {
  char message[CONF_MAX_RANKS][768]; /* per rank: first failed check */
} conf_suite;

typedef mpu_result_t (*conf_case_fn)(mpu_comm *world, void *suite);

enum {
  CONF_NEEDS_SPLIT = 1,     /* the fake backend has no split */
  CONF_NEEDS_EXACT = 2,     /* results bit for bit by mpu's rule (NCCL reduces its own way) */
  CONF_NEEDS_P2P_MATCH = 4, /* recv checks the sender's dtype and count (NCCL cannot) */
  CONF_NEEDS_EAGER_SEND = 8, /* send returns before the recv (NCCL's waits for it) */
};

typedef struct conf_case {
  const char *name;
  conf_case_fn fn;
  unsigned needs;
} conf_case;

/* Record "rank R: file:line: message" as this rank's failure; returns
 * MPU_ERR_INTERNAL. */
mpu_result_t conf_failf(void *suite, mpu_comm *world, const char *file, int line,
                        const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Cases keep their buffers in locals freed at `out:`, so a failed check
 * leaks nothing. */
#define FAIL(...)                                                    \
  do {                                                               \
    res = conf_failf(suite, world, __FILE__, __LINE__, __VA_ARGS__);  \
    goto out;                                                        \
  } while (0)
#define CHECK(cond, ...) \
  do {                   \
    if (!(cond)) FAIL(__VA_ARGS__); \
  } while (0)
#define CHECK_OK(call)                                                                   \
  do {                                                                                   \
    mpu_result_t r_ = (call);                                                            \
    if (r_ != MPU_SUCCESS) FAIL("%s -> %s: %s", #call, mpu_result_name(r_), mpu_last_error()); \
  } while (0)
#define CHECK_ERR(code, call)                                                            \
  do {                                                                                   \
    mpu_result_t r_ = (call);                                                            \
    if (r_ != (code))                                                                    \
      FAIL("%s -> %s, want %s (%s)", #call, mpu_result_name(r_), mpu_result_name(code),  \
           mpu_last_error());                                                            \
    if (!mpu_last_error()[0]) FAIL("%s failed without a message", #call);               \
  } while (0)

/* cases.c: element i of rank r's input for op (small integers, so sums are
 * exact in every dtype), what op over n ranks of them gives in dt, and the
 * element accessors the cases check with. */
double conf_value(mpu_op op, int r, size_t i);
double conf_expected(mpu_dtype dt, mpu_op op, int n, size_t i);
void conf_fill(mpu_dtype dt, void *p, size_t count, mpu_op op, int r, size_t offset);
void conf_set(mpu_dtype dt, void *p, size_t i, double v);
double conf_get(mpu_dtype dt, const void *p, size_t i);
double conf_rounded(mpu_dtype dt, double v); /* v stored in dt and read back */
void *conf_buf(size_t bytes);                /* from conf_alloc */
void conf_poison_fill(void *p, size_t bytes); /* bytes no result has */

/* sizes.c: every collective of one count per rank at the sizes per rank where
 * a backend changes how it moves them (a case of the suite). */
mpu_result_t conf_case_path_edges(mpu_comm *world, void *suite);

/* edge.c: the dtype edge cases (a case of the suite), and every rank's raw
 * outputs of them for comparing backends byte for byte. */
mpu_result_t conf_case_edge_values(mpu_comm *world, void *suite);
mpu_result_t conf_edge_outputs(mpu_comm *world, char *buf, size_t cap, size_t *used);

/* Where the cases' buffers come from (calloc and free unless a driver for
 * device memory sets them). */
extern void *(*conf_alloc)(size_t bytes);
extern void (*conf_free)(void *p);

/* managed.c (drivers on NCCL only): CUDA managed memory, zeroed. */
void *conf_managed_alloc(size_t bytes);
void conf_managed_free(void *p);

/* Every case, ending with {NULL, NULL}. */
extern const conf_case conf_cases[];

/* Rank counts every case runs with. */
extern const int conf_rank_counts[];
extern const int conf_rank_counts_len;

#endif
