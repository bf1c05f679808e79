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
