/*
 * rendezvous.h - torchrun-style bootstrap without MPI: rank 0 serves a small
 * blob (an NCCL unique id) on MASTER_ADDR:MASTER_PORT, the others fetch it.
 */
#ifndef MPU_COMM_RENDEZVOUS_H
#define MPU_COMM_RENDEZVOUS_H

#include <stddef.h>

#include "mpu/result.h"

typedef struct mpu__rendezvous_env {
  int rank, world_size, local_rank, port;
  char addr[256];
} mpu__rendezvous_env;

/* RANK, WORLD_SIZE, LOCAL_RANK (default 0), MASTER_ADDR (default 127.0.0.1)
 * and MASTER_PORT, each checked; a missing or malformed one is an error
 * naming it. */
mpu_result_t mpu__rendezvous_read_env(mpu__rendezvous_env *env);

/* Rank 0 sends blob (len bytes) to every other rank; the others receive it
 * into blob. Fails after timeout_s seconds. */
mpu_result_t mpu__rendezvous_share(const mpu__rendezvous_env *env, void *blob, size_t len,
                                   double timeout_s);

#endif
