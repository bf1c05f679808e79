/*
 * services.h - what the library's other layers (the state, the bench) use of
 * the communicator layer beyond mpu/comm.h. Nothing here names a backend:
 * what differs between backends is in mpu_comm_caps.
 */
#ifndef MPU_COMM_SERVICES_H
#define MPU_COMM_SERVICES_H

#include "mpu/comm.h"

/* The backend library's own call (MPI_Allreduce, ncclAllReduce, ...) for a
 * collective of one count per rank, for benchmarks; MPU_ERR_UNSUPPORTED where
 * there is none. Arguments unchecked beyond the handle: the benchmark passes
 * ones it checked with mpu's call. */
mpu_result_t mpu__comm_native(mpu_comm *comm, mpu_collective kind, const void *send, void *recv,
                              size_t count, mpu_dtype dt, mpu_op op, int root);

/* A group of `size` with this rank at `pos`, its members listed by
 * list(ctx, out, size) only when someone asks (O(1) to create, however big
 * the group), where caps.described_groups says the backend can. free_ctx(ctx)
 * at destroy; on failure the caller keeps ctx. MPU_ERR_UNSUPPORTED elsewhere. */
mpu_result_t mpu__comm_group_described(mpu_comm *comm, int pos, int size,
                                       mpu_result_t (*list)(const void *ctx, int *out, int size),
                                       void *ctx, void (*free_ctx)(void *ctx), mpu_comm **out);

#endif
