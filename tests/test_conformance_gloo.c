/*
 * test_conformance_gloo.c - the conformance suite on the gloo backend: every
 * process (started with torchrun's variables by gloo_run.sh or torchrun)
 * runs every case on the world from mpu_comm_gloo_from_env. The first failed
 * check prints its message and exits 1; the peers then fail too (their
 * connections to it close) instead of hanging.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance/conformance.h"

int main(void) {
  mpu_comm *world = NULL;
  if (mpu_comm_gloo_from_env(NULL, &world)) {
    fprintf(stderr, "test_conformance_gloo: %s\n", mpu_last_error());
    return 1;
  }
  int rank, size, passed = 0;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &size);
  static conf_suite suite;
  for (const conf_case *c = conf_cases; c->name; c++) {
    memset(&suite, 0, sizeof suite);
    mpu_result_t r = c->fn(world, &suite);
    if (!r) r = mpu_comm_barrier(world);
    if (r) {
      fprintf(stderr, "FAILED %s on rank %d of %d processes: %s %s\n", c->name, rank, size,
              suite.message[rank][0] ? suite.message[rank] : mpu_result_name(r), mpu_last_error());
      mpu_comm_abort(world);
      return 1;
    }
    passed++;
    if (rank == 0) printf("[       OK ] %s (%d processes)\n", c->name, size);
  }
  if (mpu_comm_destroy(world)) {
    fprintf(stderr, "test_conformance_gloo: destroy: %s\n", mpu_last_error());
    return 1;
  }
  if (rank == 0) printf("%d passed, 0 failed\n", passed);
  return 0;
}
