/*
 * env.c - the one table of environment knobs (NCCL keeps its ncclParam list
 * the same way), parsed once.
 */
#include "core/env.h"

#include "mpu/comm.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct knob {
  const char *name;
  const char *fallback; /* default, as text */
  const char *meaning;
} knob;

/* Keep in step with docs/api.md ("Environment"). */
static const knob knobs[] = {
    {"MPU_TIMEOUT", "300", "seconds a rank waits for its peers before the call fails"},
    {"MPU_CHECK_CALLS", "1", "1: every collective first checks that all ranks made the same call (0: off)"},
    {"MPU_SPIN", "-1", "busy-wait iterations before a waiting rank sleeps (-1: automatic)"},
    {"MPU_DEBUG", "0", "1: log the file:line path of every error to stderr"},
    {"MPU_STREAM_MIN_BYTES", "-1", "bytes a threads collective reads and writes before it uses "
                                   "streaming stores (-1: 3/4 of the last-level cache, counted at "
                                   "most 24 MiB per CPU sharing it; an all_to_all, or an in-place "
                                   "all_gather, also streams where what a core reads fits its L2, "
                                   "what it reads and writes does not and it writes no more than it "
                                   "reads; a value set here is the whole rule)"},
    {"MPU_MPI_P2P_CHECK_RANKS", "16", "the largest MPI communicator whose call checking exchanges "
                                      "point to point (larger: MPI_Iallgather; at most 64)"},
    {"MPU_NCCL_ONE_RANK", "0", "1: an NCCL communicator of one rank calls NCCL (its kernels run on "
                               "one GPU) instead of answering as a group of one"},
    {"MPU_BIND", "1", "1: mpu_launch binds each rank's thread to a CPU of its own when the ranks "
                      "fit in the CPUs it may use (0: the scheduler places them)"},
};

static mpu__env_values values;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static const char *raw(int i) {
  const char *v = getenv(knobs[i].name);
  return (v && *v) ? v : knobs[i].fallback;
}

static double as_double(int i) {
  const char *s = raw(i);
  char *end;
  errno = 0;
  double d = strtod(s, &end);
  if (errno || *end || !(d > 0) || !isfinite(d)) {
    fprintf(stderr, "mpu: ignoring %s=%s (want a positive finite number; %s)\n", knobs[i].name, s,
            knobs[i].meaning);
    d = strtod(knobs[i].fallback, NULL);
  }
  return d;
}

static long as_long(int i) {
  const char *s = raw(i);
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end) {
    fprintf(stderr, "mpu: ignoring %s=%s (want an integer; %s)\n", knobs[i].name, s,
            knobs[i].meaning);
    v = strtol(knobs[i].fallback, NULL, 10);
  }
  return v;
}

static void load(void) {
  values.timeout_s = as_double(0);
  values.timeout_given = raw(0) != knobs[0].fallback; /* set; a malformed value counts */
  values.check_calls = as_long(1) != 0;
  values.spin = as_long(2);
  values.debug = as_long(3) != 0;
  values.stream_min = as_long(4);
  values.mpi_p2p_check_ranks = as_long(5);
  values.nccl_one_rank = as_long(6) != 0;
  values.bind = as_long(7) != 0;
}

const mpu__env_values *mpu__env(void) {
  pthread_once(&once, load);
  return &values;
}

int mpu__env_check_calls(int mode) {
  if (mode == MPU_CHECKS_ON) return 1;
  if (mode == MPU_CHECKS_OFF) return 0;
  return mpu__env()->check_calls;
}

double mpu__env_timeout(double timeout_s) {
  return timeout_s > 0 && isfinite(timeout_s) ? timeout_s : mpu__env()->timeout_s;
}

int mpu__env_timeout_given(void) { return mpu__env()->timeout_given; }

long mpu__env_mpi_p2p_check_ranks(void) { return mpu__env()->mpi_p2p_check_ranks; }

int mpu__env_nccl_one_rank(void) { return mpu__env()->nccl_one_rank; }
