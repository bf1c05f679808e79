/*
 * test_conformance_gloo.c - the conformance suite on the gloo backend:
 *   (no argument)  every process (started with torchrun's variables by
 *                  gloo_run.sh or torchrun) runs every case on the world from
 *                  mpu_comm_gloo_from_env;
 *   threads N      N thread ranks of one process, each running every case on
 *                  the gloo twin of the threads world (mpu_comm_gloo_create).
 * The first failed check prints its message and aborts the communicator; the
 * peers then fail too (their connections to it close) instead of hanging.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance/conformance.h"

/* every case on gc, in order: 0, or 1 after the first failure (printed) */
static int run_suite(mpu_comm *gc, conf_suite *suite, const char *what) {
  int rank, size;
  mpu_comm_rank(gc, &rank);
  mpu_comm_size(gc, &size);
  for (const conf_case *c = conf_cases; c->name; c++) {
    memset(suite->message[rank], 0, sizeof suite->message[rank]);
    mpu_result_t r = c->fn(gc, suite);
    if (!r) r = mpu_comm_barrier(gc);
    if (r) {
      fprintf(stderr, "FAILED %s on rank %d of %d %s: %s %s\n", c->name, rank, size, what,
              suite->message[rank][0] ? suite->message[rank] : mpu_result_name(r),
              mpu_last_error());
      mpu_comm_abort(gc);
      return 1;
    }
    if (rank == 0) printf("[       OK ] %s (%d %s)\n", c->name, size, what);
  }
  return 0;
}

static conf_suite suite;

static mpu_result_t on_twin(mpu_comm *threads, void *arg) {
  (void)arg;
  mpu_comm *gc = NULL;
  mpu_result_t r = mpu_comm_gloo_create(threads, NULL, &gc);
  if (r) {
    fprintf(stderr, "test_conformance_gloo: mpu_comm_gloo_create: %s\n", mpu_last_error());
    return r;
  }
  if (strcmp(mpu_comm_backend(gc), "gloo")) {
    fprintf(stderr, "test_conformance_gloo: the twin's backend is %s\n", mpu_comm_backend(gc));
    r = MPU_ERR_INTERNAL;
  }
  if (!r && run_suite(gc, &suite, "gloo twins of thread ranks")) r = MPU_ERR_INTERNAL;
  mpu_result_t d = mpu_comm_destroy(gc);
  return r ? r : d;
}

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "threads")) {
    int n = atoi(argv[2]);
    mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
    o.timeout_s = 600;
    if (mpu_launch(n, on_twin, NULL, NULL, &o)) {
      fprintf(stderr, "test_conformance_gloo threads %d: %s\n", n, mpu_last_error());
      return 1;
    }
    printf("gloo twins of %d thread ranks: every case passed\n", n);
    return 0;
  }
  mpu_comm *world = NULL;
  if (mpu_comm_gloo_from_env(NULL, &world)) {
    fprintf(stderr, "test_conformance_gloo: %s\n", mpu_last_error());
    return 1;
  }
  int rank;
  mpu_comm_rank(world, &rank);
  if (run_suite(world, &suite, "processes")) return 1;
  if (mpu_comm_destroy(world)) {
    fprintf(stderr, "test_conformance_gloo: destroy: %s\n", mpu_last_error());
    return 1;
  }
  if (rank == 0) printf("every case passed\n");
  return 0;
}
