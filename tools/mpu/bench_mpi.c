/*
 * bench_mpi.c - the raw MPI call behind each row of `mpu bench --backend mpi`,
 * timed the same way (slowest rank per iteration, median), so the table can
 * show mpu's overhead against MPI itself.
 */
#include "bench_mpi.h"

#ifdef MPU_TOOL_MPI
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_raw_mpi(mpu_collective c, mpu_dtype dt, mpu_op op, size_t bytes, int iters,
                     int warmup) {
  MPI_Datatype t = dt == MPU_FLOAT32 ? MPI_FLOAT : dt == MPU_FLOAT64 ? MPI_DOUBLE
                   : dt == MPU_INT32 ? MPI_INT32_T : dt == MPU_INT64 ? MPI_INT64_T
                   : dt == MPU_UINT8 ? MPI_UINT8_T : MPI_DATATYPE_NULL;
  MPI_Op o = op == MPU_PROD ? MPI_PROD : op == MPU_MIN ? MPI_MIN : op == MPU_MAX ? MPI_MAX : MPI_SUM;
  if (t == MPI_DATATYPE_NULL) return -1; /* 16-bit floats: MPI cannot reduce them itself */
  int n, rank;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  size_t es = mpu_dtype_size(dt);
  int per_total = c == MPU_COLL_ALL_GATHER || c == MPU_COLL_REDUCE_SCATTER || c == MPU_COLL_ALL_TO_ALL;
  int count = (int)(bytes / es / (per_total ? (size_t)n : 1));
  size_t big = (size_t)count * es * (size_t)n + 64;
  char *s = calloc(big, 1), *r = calloc(big, 1);
  double *times = malloc((size_t)iters * sizeof(double)), med = -1;
  if (s && r && times) {
    for (int i = -warmup; i < iters; i++) {
      double t0 = MPI_Wtime();
      switch (c) {
      case MPU_COLL_ALL_REDUCE: MPI_Allreduce(s, r, count, t, o, MPI_COMM_WORLD); break;
      case MPU_COLL_ALL_GATHER: MPI_Allgather(s, count, t, r, count, t, MPI_COMM_WORLD); break;
      case MPU_COLL_REDUCE_SCATTER: MPI_Reduce_scatter_block(s, r, count, t, o, MPI_COMM_WORLD); break;
      case MPU_COLL_BROADCAST: MPI_Bcast(s, count, t, 0, MPI_COMM_WORLD); break;
      case MPU_COLL_REDUCE: MPI_Reduce(s, r, count, t, o, 0, MPI_COMM_WORLD); break;
      default: MPI_Alltoall(s, count, t, r, count, t, MPI_COMM_WORLD); break;
      }
      if (i >= 0) times[i] = (MPI_Wtime() - t0) * 1e6;
    }
    MPI_Allreduce(MPI_IN_PLACE, times, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    qsort(times, (size_t)iters, sizeof(double), cmp);
    med = iters % 2 ? times[iters / 2] : 0.5 * (times[iters / 2 - 1] + times[iters / 2]);
  }
  free(s), free(r), free(times);
  return med;
}

#else

double bench_raw_mpi(mpu_collective c, mpu_dtype dt, mpu_op op, size_t bytes, int iters,
                     int warmup) {
  (void)c, (void)dt, (void)op, (void)bytes, (void)iters, (void)warmup;
  return -1;
}

#endif
