/*
 * env.h - the library's environment knobs, read once into one struct.
 *
 * Every knob is declared in the table in env.c with its default and meaning;
 * docs/api.md lists the same table for users.
 */
#ifndef MPU_CORE_ENV_H
#define MPU_CORE_ENV_H

#include "core/error.h"

typedef struct mpu__env_values {
  double timeout_s; /* MPU_TIMEOUT: seconds any wait may last before it fails */
  int timeout_given; /* MPU_TIMEOUT is set (valid) in the environment */
  int check_calls;  /* MPU_CHECK_CALLS: agree on each collective's signature first */
  long spin;        /* MPU_SPIN: busy-wait iterations before sleeping; -1 = automatic */
  int debug;        /* MPU_DEBUG: log each error's path (file:line) to stderr */
  long stream_min;  /* MPU_STREAM_MIN_BYTES: streaming-store threshold; -1 = from the cache */
  long mpi_p2p_check_ranks; /* MPU_MPI_P2P_CHECK_RANKS: point-to-point signature exchange up to */
  int nccl_one_rank; /* MPU_NCCL_ONE_RANK: an NCCL communicator of one rank calls NCCL */
  int bind;          /* MPU_BIND: mpu_launch binds each rank's thread to a CPU of its own */
} mpu__env_values;

/* The knobs, parsed on first use (thread-safe). A malformed value falls back
 * to the default and, with MPU_DEBUG=1, says so on stderr. */
const mpu__env_values *mpu__env(void);

/* A communicator's settings from its options and the knobs, the same rule on
 * every backend: an option given wins, else the knob, else the default.
 * mode is MPU_CHECKS_DEFAULT, _ON or _OFF; timeout_s <= 0 means "not given". */
MPU_SIBLING_API int mpu__env_check_calls(int mode);
MPU_SIBLING_API double mpu__env_timeout(double timeout_s);
/* Whether MPU_TIMEOUT is set (the MPI backend has a timeout only when asked). */
MPU_SIBLING_API int mpu__env_timeout_given(void);
/* MPU_MPI_P2P_CHECK_RANKS (the MPI backend's signature exchange). */
MPU_SIBLING_API long mpu__env_mpi_p2p_check_ranks(void);
/* MPU_NCCL_ONE_RANK (the NCCL backend's groups of one). */
MPU_SIBLING_API int mpu__env_nccl_one_rank(void);

#endif
