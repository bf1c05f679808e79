/*
 * native.c - the raw MPI call for a checked call (MPI_Allreduce, ...), which
 * mpu bench times beside mpu's: MPI's own datatypes and operators, none of
 * the backend's checking or rank-order reductions.
 */
#include "comm/mpi/backend.h"
#include "core/error.h"

static MPI_Datatype native_type(mpu_dtype dt) {
  switch (dt) {
  case MPU_FLOAT32: return MPI_FLOAT;
  case MPU_FLOAT64: return MPI_DOUBLE;
  case MPU_INT32: return MPI_INT32_T;
  case MPU_INT64: return MPI_INT64_T;
  case MPU_UINT8: return MPI_UINT8_T;
  case MPU_INT8: return MPI_INT8_T;
  case MPU_UINT32: return MPI_UINT32_T;
  case MPU_UINT64: return MPI_UINT64_T;
  default: return MPI_DATATYPE_NULL; /* MPI cannot reduce 16-bit floats */
  }
}

static MPI_Op native_op(mpu_op op) {
  switch (op) {
  case MPU_PROD: return MPI_PROD;
  case MPU_MIN: return MPI_MIN;
  case MPU_MAX: return MPI_MAX;
  default: return MPI_SUM; /* MPI has no average: the sum is the nearest call */
  }
}

mpu_result_t mpu__mpi_native(mpu_comm *c, const mpu__call *call) {
  static const char fn[] = "raw MPI call";
  MPU__CALL_ARGS(call);
  int kind = call->sig.kind;
  int n = c->size, reducing = mpu__coll_of(kind)->has_op;
  MPI_Datatype t = reducing ? native_type(dt) : bits_of(dt);
  if (t == MPI_DATATYPE_NULL)
    return mpu__error(MPU_ERR_UNSUPPORTED, "%s: MPI has no %s reduction", fn, mpu_dtype_name(dt));
  MPU_CHECK(mpu__mpi_fits(fn, count, n));
  int k = (int)count;
  size_t bytes = count * mpu_dtype_size(dt);
  MPI_Comm w = comm_of(c);
  switch (kind) {
  case MPU_COLL_ALL_REDUCE:
    return mpu__mpi_check(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, k, t, native_op(op), w), fn);
  case MPU_COLL_ALL_GATHER: {
    const void *s = send == (const char *)recv + (size_t)c->rank * bytes ? MPI_IN_PLACE : send;
    return mpu__mpi_check(MPI_Allgather(s, k, t, recv, k, t, w), fn);
  }
  case MPU_COLL_REDUCE_SCATTER:
    if ((const char *)recv == (const char *)send + (size_t)c->rank * bytes)
      return mpu__error(MPU_ERR_UNSUPPORTED, "%s: MPI's in-place reduce_scatter differs", fn);
    return mpu__mpi_check(MPI_Reduce_scatter_block(send, recv, k, t, native_op(op), w), fn);
  case MPU_COLL_BROADCAST: return mpu__mpi_check(MPI_Bcast(recv, k, t, root, w), fn);
  case MPU_COLL_REDUCE: {
    const void *s = c->rank == root && send == recv ? MPI_IN_PLACE : send;
    return mpu__mpi_check(MPI_Reduce(s, recv, k, t, native_op(op), root, w), fn);
  }
  case MPU_COLL_ALL_TO_ALL: return mpu__mpi_check(MPI_Alltoall(send, k, t, recv, k, t, w), fn);
  default: return mpu__mpi_check(MPI_Barrier(w), fn);
  }
}
