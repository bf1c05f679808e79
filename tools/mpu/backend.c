/*
 * backend.c - the demos' ways of running ranks: threads, or the processes of
 * an MPI or gloo job.
 */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static mpu_comm *mpi_world, *mpi_unchecked; /* the job's world (MPI or gloo) */
static tool_backend world_kind;
/* this process is not MPI rank 0 and the job has the wrong size: rank 0 says so */
static int size_error_elsewhere;

tool_backend tool_parse_backend(const char *cmd, const char *name) {
  if (!strcmp(name, "threads")) return TOOL_THREADS;
  if (!strcmp(name, "mpi")) {
    if (!mpu_mpi_available()) cli_usage_error(cmd, "%s", mpu_last_error());
    return TOOL_MPI;
  }
  if (!strcmp(name, "gloo")) {
    if (!mpu_gloo_available()) cli_usage_error(cmd, "%s", mpu_last_error());
    if (!getenv("RANK") || !getenv("WORLD_SIZE"))
      cli_usage_error(cmd, "--backend gloo runs as a process of a torchrun job, but RANK and "
                           "WORLD_SIZE are not set (torchrun --standalone --nproc_per_node N "
                           "--no-python $(which mpu) %s ..., or set RANK, WORLD_SIZE, "
                           "MASTER_ADDR and MASTER_PORT by hand)", cmd);
    return TOOL_GLOO;
  }
  cli_usage_error(cmd, "--backend wants threads, mpi, gloo or nccl, not '%s'", name);
}

/* the job's world: MPI's, or gloo's from torchrun's variables */
static mpu_result_t make_world(tool_backend b, int checks, mpu_comm **out) {
  if (b == TOOL_GLOO) {
    mpu_gloo_options o = MPU_GLOO_OPTIONS_INIT;
    o.check_calls = checks;
    return mpu_comm_gloo_from_env(&o, out);
  }
  mpu_mpi_options o = MPU_MPI_OPTIONS_INIT;
  o.check_calls = checks;
  return mpu_comm_mpi_world_ex(NULL, NULL, &o, out);
}

/* MPI, gloo: the world, and whether the job has the size the command wants */
static mpu_result_t mpi_world_of_size(tool_backend b, int nranks, int *printer) {
  mpu_result_t r = MPU_SUCCESS;
  int rank = 0, size = 0;
  if (!mpi_world) r = make_world(b, MPU_CHECKS_DEFAULT, &mpi_world), world_kind = b;
  if (!r) r = mpu_comm_rank(mpi_world, &rank);
  if (!r) r = mpu_comm_size(mpi_world, &size);
  *printer = rank == 0;
  if (r) return r;
  if (rank != 0) cli_progress_mute(); /* one process reports */
  size_error_elsewhere = size != nranks && rank != 0;
  if (size != nranks && b == TOOL_GLOO)
    return mpu_fail(MPU_ERR_INVALID_ARGUMENT,
                    "the job has %d process%s (WORLD_SIZE), the command wants %d (torchrun "
                    "--nproc_per_node %d)", size, size == 1 ? "" : "es", nranks, nranks);
  if (size != nranks)
    return mpu_fail(MPU_ERR_INVALID_ARGUMENT,
                    "the MPI job has %d process%s, the command wants %d (mpirun -n %d)", size,
                    size == 1 ? "" : "es", nranks, nranks);
  return MPU_SUCCESS;
}

mpu_result_t tool_launch(tool_backend b, int nranks, mpu_rank_fn fn, void *arg, int *printer) {
  if (b == TOOL_THREADS) {
    *printer = 1;
    return mpu_launch(nranks, fn, arg, NULL, NULL);
  }
  mpu_result_t r = mpi_world_of_size(b, nranks, printer);
  return r ? r : fn(mpi_world, arg);
}

mpu_result_t tool_check_size(tool_backend b, int nranks) {
  int printer;
  return tool_is_process(b) ? mpi_world_of_size(b, nranks, &printer) : MPU_SUCCESS;
}

void tool_report(const char *cmd, mpu_result_t r) {
  if (r && !size_error_elsewhere)
    fprintf(stderr, "mpu %s: %s: %s\n", cmd, mpu_result_name(r), mpu_last_error());
}

const char *tool_ranks_phrase(tool_backend b, long n, char *buf, size_t len) {
  if (b == TOOL_MPI) snprintf(buf, len, "%ld MPI process%s", n, n == 1 ? "" : "es");
  else if (b == TOOL_GLOO) snprintf(buf, len, "%ld gloo process%s", n, n == 1 ? "" : "es");
  else snprintf(buf, len, "%ld thread rank%s", n, n == 1 ? "" : "s");
  return buf;
}

mpu_result_t tool_run(tool_backend b, int nranks, const mpu_layout_config *cfg, uint64_t seed,
                      mpu_state_fn fn, void *arg, int *printer) {
  if (b == TOOL_THREADS) {
    *printer = 1;
    return mpu_with_state(nranks, cfg, seed, fn, arg, NULL, NULL);
  }
  mpu_result_t r = mpi_world_of_size(b, nranks, printer);
  if (r) return r;
  mpu_layout_config c = *cfg;
  c.world_size = nranks;
  return mpu_with_state_on(mpi_world, &c, seed, fn, arg);
}

mpu_comm *tool_process_world(tool_backend b) {
  if (!mpi_world && make_world(b, MPU_CHECKS_DEFAULT, &mpi_world)) {
    fprintf(stderr, "mpu: %s: %s\n", b == TOOL_GLOO ? "gloo" : "MPI", mpu_last_error());
    return NULL;
  }
  world_kind = b;
  return mpi_world;
}

mpu_comm *tool_process_world_unchecked(tool_backend b) {
  if (!tool_process_world(b)) return NULL;
  if (!mpi_unchecked && make_world(b, MPU_CHECKS_OFF, &mpi_unchecked)) {
    fprintf(stderr, "mpu: %s: %s\n", b == TOOL_GLOO ? "gloo" : "MPI", mpu_last_error());
    return NULL;
  }
  return mpi_unchecked;
}

int tool_share_status(tool_backend b, int status) {
  if (b == TOOL_THREADS || !mpi_world) return status;
  int32_t s = status;
  mpu_comm_broadcast(mpi_world, &s, 1, MPU_INT32, 0);
  return s;
}

void tool_backend_done(tool_backend b) {
  if (tool_is_process(b) && mpi_world) {
    mpu_comm_destroy(mpi_unchecked);
    mpu_comm_destroy(mpi_world);
    mpi_world = mpi_unchecked = NULL;
    if (world_kind == TOOL_MPI) mpu_mpi_finalize();
  }
}
