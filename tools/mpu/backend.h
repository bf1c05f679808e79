/*
 * backend.h - how the demos run their ranks: as threads of this process, or
 * as the processes of a job: an MPI job (under mpirun), or a gloo job
 * (torchrun's variables: torchrun, or set by hand).
 */
#ifndef MPU_TOOLS_BACKEND_H
#define MPU_TOOLS_BACKEND_H

#include "mpu.h"

typedef enum tool_backend {
  TOOL_THREADS = 0,
  TOOL_MPI = 1,
  TOOL_NCCL = 2, /* mpu bench only: thread ranks, one GPU and NCCL communicator each */
  TOOL_GLOO = 3, /* processes started by torchrun (mpu_comm_gloo_from_env) */
} tool_backend;

/* Whether each rank is a process of the job (MPI, gloo) rather than a thread. */
static inline int tool_is_process(tool_backend b) { return b == TOOL_MPI || b == TOOL_GLOO; }

/* "threads", "mpi" or "gloo" (exits 2 with a message if unknown or not built). */
tool_backend tool_parse_backend(const char *cmd, const char *name);

/*
 * Run fn in a fresh parallel state of cfg with nranks ranks: nranks threads
 * (mpu_with_state), or this process as one rank of the MPI job, whose size
 * must be nranks. *printer is set on the one rank that prints (the main
 * thread, or MPI rank 0). For MPI the job's world stays up until
 * tool_backend_done.
 */
mpu_result_t tool_run(tool_backend b, int nranks, const mpu_layout_config *cfg, uint64_t seed,
                      mpu_state_fn fn, void *arg, int *printer);

/*
 * Run fn(world, arg) on nranks ranks without a parallel state: nranks threads
 * (mpu_launch), or this process as one rank of the MPI job (whose size must
 * be nranks). *printer as for tool_run.
 */
mpu_result_t tool_launch(tool_backend b, int nranks, mpu_rank_fn fn, void *arg, int *printer);

/* MPI, gloo: whether the job has nranks processes (as tool_run checks it, so a
 * command can say so before its single-rank work); MPU_SUCCESS for threads.
 * Under MPI the progress line stays on rank 0 from here on. */
mpu_result_t tool_check_size(tool_backend b, int nranks);

/* "mpu CMD: NAME: message" on stderr for a failed run, once per job: a size
 * error is the same on every process, and only rank 0 says it. */
void tool_report(const char *cmd, mpu_result_t r);

/* "8 thread ranks", "1 MPI process": how many ranks and what they are. */
const char *tool_ranks_phrase(tool_backend b, long n, char *buf, size_t len);

/* MPI or gloo: the job's world communicator (made on first use); NULL with a
 * message on stderr if it cannot be had. */
mpu_comm *tool_process_world(tool_backend b);

/* MPI or gloo: a second world communicator with call checking off (the
 * library's raw speed). */
mpu_comm *tool_process_world_unchecked(tool_backend b);

/* MPI, gloo: share an int (e.g. the exit status) from rank 0 with every rank. */
int tool_share_status(tool_backend b, int status);

/* MPI, gloo: end the job's communicators (after the last collective). */
void tool_backend_done(tool_backend b);

#endif
