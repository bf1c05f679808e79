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

typedef struct conf_case {
  const char *name;
  conf_case_fn fn;
} conf_case;

/* Every case, ending with {NULL, NULL}. */
extern const conf_case conf_cases[];

/* Rank counts every case runs with. */
extern const int conf_rank_counts[];
extern const int conf_rank_counts_len;

#endif
