/*
 * bench_internal.h - what bench.c and roof.c share: the benchmark buffers,
 * the buffer layout of a collective's row, and a start line for threads that
 * begin each iteration together.
 */
#ifndef MPU_BENCH_INTERNAL_H
#define MPU_BENCH_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "mpu/bench.h"

/* 2 MiB aligned, huge pages where the kernel allows; NULL past the machine's
 * memory or on failure. free() it. */
void *mpu__bench_alloc(size_t bytes);

/* Fill `bytes` of a rank's benchmark buffer with its value in dtype dt:
 * what every timed buffer holds (the reason is at the definition). */
void mpu__bench_fill(void *buf, size_t bytes, mpu_dtype dt, int rank);

/* Where rank's call has its send and recv among its buffers send and recv:
 * those, or the collective's in-place form (collective.h) where cfg asks. */
void mpu__bench_place(const mpu_bench_config *cfg, char *send, char *recv, size_t count, int rank,
                      size_t es, char **s, char **r);

/* One rank's buffers for a config on n ranks, as nccl-tests lays them out. */
typedef struct bench_layout {
  size_t count;                  /* elements per rank, as passed to the call */
  size_t send_bytes, recv_bytes; /* one rank's buffers */
  size_t bytes;                  /* nccl-tests' size of what runs (a total where it is one) */
} bench_layout;

/* The layout of cfg on n ranks (every product checked, with 64 bytes of
 * slack). *full gets cfg with the fields of an older, shorter config at their
 * defaults. Refuses a bad config or n < 1 with MPU_ERR_INVALID_ARGUMENT. */
mpu_result_t mpu__bench_layout(const char *fn, const mpu_bench_config *cfg, int n,
                               mpu_bench_config *full, bench_layout *out);

/* A start line whose size can shrink if a thread fails to start (a pthread
 * barrier's cannot). With spin, waiters spin instead of sleeping, so that
 * each is running on its CPU, at its clock, when the line opens (threads
 * woken from a sleep start microseconds apart, on CPUs that idled). */
typedef struct start_line {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int needed, arrived;
  _Atomic unsigned long generation;
  int spin;
} start_line;

void mpu__bench_start_wait(start_line *l);
/* Only `needed` threads will come (one failed to start): let them run. */
void mpu__bench_start_shrink(start_line *l, int needed);

/* Tests: what a roof thread runs in place of its tasks (thread, iteration of
 * the round's way, 0 the untimed one; way 0 pulled, 1 pushed), to check how
 * the roof times what it runs. */
typedef void (*mpu__bench_roof_stub)(void *arg, int thread, int iteration, int way);
void mpu__bench_roof_set_stub(mpu_bench_roof_run *run, mpu__bench_roof_stub stub, void *arg);

/* The CPU the roof's thread k is placed on: the k-th (modulo their count)
 * of the CPUs the process may run on, whichever thread asks; -1 if unknown. */
int mpu__bench_roof_cpu(int k);

#endif
