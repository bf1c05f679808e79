/*
 * multihost_faults.c - the rank program of scripts/multihost.sh's fault
 * runs, under mpirun across hosts (network namespaces there).
 *
 *   multihost_faults DIR ITERATIONS COUNT [KILL_AT]
 *
 * Every rank runs ITERATIONS all_reduce calls of COUNT floats over the
 * world, each result checked exactly (every input is a small whole number,
 * so any order of sums is exact); after the first call it writes the wall
 * clock to DIR/ready.R (and the killed rank to DIR/killed.R before it dies).
 * Each rank ends by writing one line to DIR/rank.R:
 *
 *   RANK HOST RESULT ITERATIONS_DONE WALL_CLOCK_AT_END CALL_SECONDS MESSAGE
 *
 * RESULT is mpu's result name (MPU_SUCCESS, MPU_ERR_TIMEOUT, ...) or WRONG
 * when a result differed. After an error the rank waits 2 s (so that every
 * rank that is still running reports its own error before the job ends) and
 * calls mpu_comm_abort, as docs/mpi.md advises. With KILL_AT, the world's
 * last rank kills itself (SIGKILL) after KILL_AT calls: a rank that dies.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpu.h"

static double clock_of(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* DIR/WHAT.RANK holding the wall clock now */
static void mark(const char *dir, const char *what, int rank) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.%d", dir, what, rank);
  FILE *f = fopen(path, "w");
  if (f) fprintf(f, "%.3f\n", clock_of(CLOCK_REALTIME)), fclose(f);
}

int main(int argc, char **argv) {
  mpu_comm *world = NULL;
  if (mpu_comm_mpi_world(&argc, &argv, &world)) {
    fprintf(stderr, "multihost_faults: %s\n", mpu_last_error());
    return 1;
  }
  if (argc < 4) {
    fprintf(stderr, "usage: multihost_faults DIR ITERATIONS COUNT [KILL_AT]\n");
    mpu_comm_abort(world);
    return 2;
  }
  const char *dir = argv[1];
  long iterations = atol(argv[2]), count = atol(argv[3]), kill_at = argc > 4 ? atol(argv[4]) : -1;
  int rank = 0, size = 1;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &size);
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  float *in = malloc((size_t)count * sizeof *in), *out = malloc((size_t)count * sizeof *out);
  if (!in || !out) {
    fprintf(stderr, "multihost_faults: out of memory\n");
    mpu_comm_abort(world);
    return 1;
  }
  mpu_result_t r = MPU_SUCCESS;
  const char *result = "MPU_SUCCESS";
  long done = 0;
  double call = 0;
  for (; done < iterations; done++) {
    if (done == kill_at && rank == size - 1) {
      mark(dir, "killed", rank);
      raise(SIGKILL);
    }
    for (long i = 0; i < count; i++) in[i] = (float)((rank + 1) * ((i + done) % 13 + 1));
    double t0 = clock_of(CLOCK_MONOTONIC);
    r = mpu_comm_all_reduce(world, in, out, (size_t)count, MPU_FLOAT32, MPU_SUM);
    call = clock_of(CLOCK_MONOTONIC) - t0;
    if (r) {
      result = mpu_result_name(r);
      break;
    }
    long wrong = 0, ranks = (long)size * (size + 1) / 2;
    for (long i = 0; i < count; i++) wrong += out[i] != (float)(ranks * ((i + done) % 13 + 1));
    if (wrong) {
      result = "WRONG";
      break;
    }
    if (done == 0) mark(dir, "ready", rank);
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/rank.%d", dir, rank);
  FILE *f = fopen(path, "w");
  if (f) {
    fprintf(f, "%d %s %s %ld %.3f %.3f %s\n", rank, host, result, done, clock_of(CLOCK_REALTIME),
            call, r ? mpu_last_error() : "-");
    fclose(f);
  }
  int ok = !strcmp(result, "MPU_SUCCESS");
  if (!ok) {
    sleep(2);
    mpu_comm_abort(world);
  }
  free(in), free(out);
  mpu_comm_destroy(world);
  mpu_mpi_finalize();
  return ok ? 0 : 1;
}
