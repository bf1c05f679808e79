/*
 * bench_mpi.h - raw MPI timings for `mpu bench --backend mpi`.
 */
#ifndef MPU_TOOLS_BENCH_MPI_H
#define MPU_TOOLS_BENCH_MPI_H

#include "mpu.h"

/* Median microseconds (slowest rank) of the raw MPI call on MPI_COMM_WORLD
 * for this row, or -1 where MPI has no counterpart (16-bit reductions) or
 * the build has no MPI. Collective over MPI_COMM_WORLD. */
double bench_raw_mpi(mpu_collective c, mpu_dtype dt, mpu_op op, size_t bytes, int iters,
                     int warmup);

#endif
