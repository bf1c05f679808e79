/*
 * test_edge_bytes.c - write every rank's outputs of the dtype edge cases to
 * PREFIX.<rank>, so test_edge_bytes.sh can compare backends byte for byte.
 *
 *   test_edge_bytes threads N PREFIX   N thread ranks
 *   test_edge_bytes mpi PREFIX         this process is one rank (under mpirun)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance/conformance.h"

#define CAP ((size_t)16 << 20)

static const char *prefix;

static mpu_result_t dump(mpu_comm *world, void *arg) {
  (void)arg;
  int rank;
  size_t used = 0;
  mpu_comm_rank(world, &rank);
  char *buf = malloc(CAP);
  if (!buf) return MPU_ERR_OUT_OF_MEMORY;
  mpu_result_t r = conf_edge_outputs(world, buf, CAP, &used);
  if (!r && used == CAP) r = MPU_ERR_INTERNAL; /* would have been cut */
  char path[4096];
  snprintf(path, sizeof path, "%s.%d", prefix, rank);
  FILE *f = r ? NULL : fopen(path, "wb");
  if (!r && (!f || fwrite(buf, 1, used, f) != used)) r = MPU_ERR_SYSTEM;
  if (f && fclose(f)) r = MPU_ERR_SYSTEM;
  free(buf);
  return r;
}

int main(int argc, char **argv) {
  mpu_result_t r;
  if (argc == 4 && !strcmp(argv[1], "threads")) {
    prefix = argv[3];
    r = mpu_launch(atoi(argv[2]), dump, NULL, NULL, NULL);
  } else if (argc == 3 && !strcmp(argv[1], "mpi")) {
    mpu_comm *world = NULL;
    prefix = argv[2];
    r = mpu_comm_mpi_world(&argc, &argv, &world);
    if (!r) r = dump(world, NULL);
    mpu_comm_destroy(world);
    if (mpu_mpi_available()) mpu_mpi_finalize();
  } else {
    fprintf(stderr, "usage: test_edge_bytes threads N PREFIX | mpi PREFIX\n");
    return 2;
  }
  if (r) fprintf(stderr, "test_edge_bytes: %s: %s\n", mpu_result_name(r), mpu_last_error());
  return r ? 1 : 0;
}
