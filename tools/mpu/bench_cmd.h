/*
 * bench_cmd.h - `mpu bench`'s options and measured rows, shared by the
 * measuring (bench_cmd.c) and the tables (bench_print.c: mpu's columns,
 * nccl-tests' exactly, JSON, CSV).
 */
#ifndef MPU_TOOLS_BENCH_CMD_H
#define MPU_TOOLS_BENCH_CMD_H

#include <pthread.h>

#include "backend.h"
#include "cli.h"
#include "mpu.h"

#define MAX_ROWS 4096
#define MAX_SIZES 64
#define MAX_OPS 8

typedef enum bench_columns { COLUMNS_MPU = 0, COLUMNS_NCCL_TESTS = 1 } bench_columns;

typedef struct bench_opts {
  size_t min_bytes, max_bytes, step_bytes;
  long factor, warmup, iters, workers;
  long ranks[16];
  int nranks;
  int colls[MPU_COLL_COUNT], ncolls;
  mpu_dtype dtypes[MPU_DTYPE_COUNT]; /* -d: one, or all */
  int ndtypes;
  mpu_op ops[MAX_OPS];               /* -o: one, or all */
  int nops;
  int average;                       /* -a: MPU_BENCH_SLOWEST or nccl-tests' 0..3 */
  int blocking;                      /* -z */
  bench_columns columns;
  int check;
  cli_format format;
  const char *csv;
  tool_backend backend;
  int check_calls; /* threads: MPU_CHECKS_DEFAULT, _ON or _OFF */
} bench_opts;

typedef struct bench_row {
  int ranks;
  mpu_collective coll;
  mpu_dtype dtype;
  mpu_op op;
  mpu_bench_result res[2];     /* [in_place]; MPI: call checking off, raw MPI interleaved */
  mpu_bench_result checked[2]; /* MPI: the same call with call checking on */
  double roof_us[2];           /* [in_place]: the row's roof, timed in the row's pauses (see the
                                  top of bench_cmd.c); -1 where none was timed */
} bench_row;

/* The roof's pauses (mpu_bench_config's pause): where the ranks are threads
 * of this process, they sleep here while the last to arrive times a round
 * of the roof, so the roof's threads have the CPUs to themselves and no
 * rank's adaptive spin in a communicator learns from the wait. */
typedef struct roof_gate {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int arrived;
  unsigned long generation;
  int failed;                /* a rank left with an error: nobody waits for it */
  mpu_bench_roof_run *roof;  /* the row's (rank 0 begins and ends it) */
  mpu_result_t result;       /* the last round's */
} roof_gate;

typedef struct bench_run {
  const bench_opts *o;
  roof_gate gate;
  int ranks;         /* of the launch in progress */
  mpu_comm *checked; /* MPI: the world with call checking on (bench_rank gets the unchecked one) */
  size_t sizes[MAX_SIZES];
  int nsizes;
  bench_row rows[MAX_ROWS];
  int nrows, total_rows; /* done and planned (the progress line's time left) */
} bench_run;

/* nccl-tests' type names (src/common.cu's test_typenames) for mpu's dtypes: "float", ... */
const char *bench_type_name(mpu_dtype dt);

/* broadcast and reduce have a root; all_reduce, reduce_scatter and reduce an op */
int bench_rooted(mpu_collective c);
int bench_reducing(mpu_collective c);

/* The tables; each returns 1 if a result was wrong. */
int bench_print_text(const bench_run *run);
int bench_print_nccl_tests(const bench_run *run);
int bench_print_json(const bench_run *run);
/* -1 if the file cannot be written */
int bench_write_csv(const bench_run *run);

#endif
