/*
 * test_mpi_clock.c - a checked MPI call without a timeout reads no clock,
 * under mpirun with 2 processes.
 *
 * On shared memory an 8-byte checked all_reduce is one exchange of 40-byte
 * blocks (about 0.5 us on Open MPI 4.1), and one clock read costs about a
 * twentieth of that: a communicator without a timeout has nothing to measure
 * a wait against, so its calls must not pay for reads. The test counts the
 * backend's MPI_Wtime calls (this executable's MPI_Wtime preempts Open MPI's
 * for the backend module, and calls PMPI_Wtime) over blocking calls on
 * untimed communicators, checked and unchecked, small and staged, and checks
 * that a communicator with a timeout still reads it (so the counter sees the
 * backend's reads at all) and that every result is right.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "mpu.h"
#include "test_helpers.h"

static int rank, size, failures;
static long wtime_calls;

#define CHECK MCHECK

double MPI_Wtime(void) {
  wtime_calls++;
  return PMPI_Wtime();
}

/* MPI_Wtime calls over `calls` all_reduces of n floats on c; each result checked. */
static long reads_over(mpu_comm *c, size_t n, int calls) {
  float *in = malloc(n * sizeof *in), *out = malloc(n * sizeof *out);
  if (!in || !out) {
    free(in), free(out);
    CHECK(0, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < n; i++) in[i] = (float)(rank + 1) * (float)(i % 7 + 1);
  long before = wtime_calls;
  int wrong = 0;
  for (int k = 0; k < calls; k++) {
    mpu_result_t r = mpu_comm_all_reduce(c, in, out, n, MPU_FLOAT32, MPU_SUM);
    CHECK(r == MPU_SUCCESS, "all_reduce of %zu -> %s", n, mpu_result_name(r));
    for (size_t i = 0; i < n; i++) /* sum of (p + 1) * v over p */
      wrong += out[i] != (float)(size * (size + 1) / 2) * (float)(i % 7 + 1);
  }
  long reads = wtime_calls - before;
  CHECK(!wrong, "%d wrong elements over %d all_reduces of %zu", wrong, calls, n);
  free(in), free(out);
  return reads;
}

int main(int argc, char **argv) {
  mpu_comm *world = NULL;
  unsetenv("MPU_TIMEOUT"); /* the untimed communicators below must be untimed */
  if (mpu_comm_mpi_world(&argc, &argv, &world)) {
    fprintf(stderr, "mpu_comm_mpi_world: %s\n", mpu_last_error());
    return 1;
  }
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &size);
  enum { CALLS = 200 };
  static const size_t sizes[] = {2, 100000}; /* riding with the signature; staged */
  for (int checks = 0; checks < 2; checks++) {
    mpu_comm *c = MFRESH(0, checks ? MPU_CHECKS_ON : MPU_CHECKS_OFF);
    if (!c) break;
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
      long reads = reads_over(c, sizes[s], CALLS);
      CHECK(reads == 0, "%s, no timeout, %zu floats: %ld MPI_Wtime reads over %d all_reduces (want 0)",
            checks ? "checked" : "unchecked", sizes[s], reads, CALLS);
    }
    mpu_comm_destroy(c);
  }
  /* with a timeout the waits are measured: the counter sees those reads */
  mpu_comm *timed = MFRESH(60, MPU_CHECKS_ON);
  if (timed) {
    long reads = reads_over(timed, 2, CALLS);
    CHECK(reads >= CALLS, "checked, 60 s timeout: %ld MPI_Wtime reads over %d all_reduces (want "
          "at least one a call)", reads, CALLS);
    mpu_comm_destroy(timed);
  }
  int total = 0;
  mpu_comm_all_reduce(world, &failures, &total, 1, MPU_INT32, MPU_SUM);
  if (rank == 0) printf("test_mpi_clock: %d failures over %d ranks\n", total, size);
  mpu_comm_destroy(world);
  mpu_mpi_finalize();
  return total != 0;
}
