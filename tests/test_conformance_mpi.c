/*
 * test_conformance_mpi.c - the conformance suite on the MPI backend: every
 * process runs every case on the MPI world. MPI cannot recover a job whose
 * ranks disagree, so the first failed check prints its message and aborts
 * the job (the test fails instead of hanging). Run under mpirun by ctest
 * with 1, 2, 3, 4 and 8 processes, over shared memory and over TCP. With
 * the argument "gloo", the cases run on the MPI world's gloo twin
 * (mpu_comm_gloo_create) instead.
 */
#include <stdio.h>
#include <string.h>

#include "conformance/conformance.h"
#include "mpu/comm_mpi.h"

int main(int argc, char **argv) {
  mpu_comm *world = NULL;
  if (mpu_comm_mpi_world(&argc, &argv, &world)) {
    fprintf(stderr, "test_conformance_mpi: %s\n", mpu_last_error());
    return 1;
  }
  mpu_comm *mpi = world;
  if (argc > 1 && !strcmp(argv[1], "gloo") && mpu_comm_gloo_create(mpi, NULL, &world)) {
    fprintf(stderr, "test_conformance_mpi: mpu_comm_gloo_create: %s\n", mpu_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rank, size, passed = 0;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &size);
  static conf_suite suite;
  for (const conf_case *c = conf_cases; c->name; c++) {
    memset(&suite, 0, sizeof suite);
    mpu_result_t r = c->fn(world, &suite);
    if (r) {
      fprintf(stderr, "FAILED %s with %d processes: %s %s\n", c->name, size,
              suite.message[rank][0] ? suite.message[rank] : mpu_result_name(r), mpu_last_error());
      fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    passed++;
    if (rank == 0) printf("[       OK ] %s (%d processes)\n", c->name, size);
  }
  if (world != mpi) mpu_comm_destroy(world);
  mpu_comm_destroy(mpi);
  if (rank == 0) printf("%d passed, 0 failed%s\n", passed, world != mpi ? " (the gloo twin)" : "");
  mpu_mpi_finalize();
  return 0;
}
