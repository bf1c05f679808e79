/*
 * services.h - what the library's other layers (the state, the bench) use of
 * the communicator layer beyond mpu/comm.h. Nothing here names a backend:
 * what differs between backends is in mpu_comm_caps.
 */
#ifndef MPU_COMM_SERVICES_H
#define MPU_COMM_SERVICES_H

#include "core/error.h"
#include "mpu/comm.h"

/* The backend library's own call (MPI_Allreduce, ncclAllReduce, ...) for a
 * collective of one count per rank, for benchmarks; MPU_ERR_UNSUPPORTED where
 * there is none. Arguments unchecked beyond the handle: the benchmark passes
 * ones it checked with mpu's call. */
mpu_result_t mpu__comm_native(mpu_comm *comm, mpu_collective kind, const void *send, void *recv,
                              size_t count, mpu_dtype dt, mpu_op op, int root);

/* The same collective through mpu's own checked call (mpu_comm_all_reduce,
 * ...), for benchmarks that pick the collective at run time: checked as
 * the public call, MPU_ERR_INVALID_ARGUMENT for a kind that is not one
 * count per rank. */
mpu_result_t mpu__comm_call(mpu_comm *comm, mpu_collective kind, const void *send, void *recv,
                            size_t count, mpu_dtype dt, mpu_op op, int root);

/* A group of `size` with this rank at `pos`, its members listed by
 * list(ctx, out, size) only when someone asks (O(1) to create, however big
 * the group), where caps.described_groups says the backend can. free_ctx(ctx)
 * at destroy; on failure the caller keeps ctx. MPU_ERR_UNSUPPORTED elsewhere. */
mpu_result_t mpu__comm_group_described(mpu_comm *comm, int pos, int size,
                                       mpu_result_t (*list)(const void *ctx, int *out, int size),
                                       void *ctx, void (*free_ctx)(void *ctx), mpu_comm **out);

/* The communicator for host buffers (layers, the optimizer, data broadcast
 * compute on the host): comm itself on a host backend, its host twin on a
 * device one (an NCCL group made over the threads or MPI backend). A device
 * communicator without a twin (NCCL from torchrun's variables) is
 * MPU_ERR_INVALID_ARGUMENT naming fn: host buffers would fault the GPU. */
MPU_SIBLING_API mpu_result_t mpu__comm_for_host(mpu_comm *comm, const char *fn, mpu_comm **out);

/* The communicator's scratch buffer, at least bytes long, in the memory its
 * calls take (device memory on NCCL): grown when too small (in the order of
 * the communicator's work, backend's scratch_resize), kept for the next
 * call, freed at mpu_comm_destroy, so a layer's staging needs no allocation
 * per call (cudaFree may synchronise the whole device). Its contents are
 * undefined; it is the caller's until its next call that may use it. */
mpu_result_t mpu__comm_scratch(mpu_comm *c, size_t bytes, void **out);

/* Stream-ordered work for layers that run on device buffers (the regions):
 * on a backend with streams (NCCL), 1, and the layer enqueues its calls
 * (non-blocking forms, their requests freed), copies them with
 * mpu__comm_copy2d_enqueue and ends with mpu__comm_order_caller, so the
 * host never waits for the device, as ProcessGroupNCCL's collectives with
 * async_op=False make the current stream wait, not the host; a failure then
 * shows on a later call (the watchdog breaks the communicator). 0 on host
 * backends, inside an open mpu_group_start/end, and when the output (out,
 * bytes) is plain host memory, which the host reads at return: the layer's
 * calls then run and wait. */
int mpu__comm_ordered(mpu_comm *c, const void *out, size_t bytes);
/* mpu_comm_copy2d's checks, then the copy enqueued without the host waiting
 * (host backends: done) */
mpu_result_t mpu__comm_copy2d_enqueue(mpu_comm *c, void *dst, size_t dpitch, const void *src,
                                      size_t spitch, size_t width, size_t height);
/* buf[0..count) of a float dtype (float32/64, float16, bfloat16) times
 * num / den in place, num or den 1, on this rank alone, in the memory c's
 * calls take; the host waits for it. On the host: (x * num) / den, the
 * 16-bit floats in float32 rounded once (what torch's CPU kernels give for
 * `x * n` and `x / n`). On a device backend on the device, without a kernel
 * of mpu's (NCCL: a pre-multiplying reduction of one rank, x * scalar in the
 * dtype with scalar num, or 1 / den rounded to the dtype as NCCL's own
 * ncclAvg rounds 1 / nRanks): the same bits for a multiplication and for a
 * division by a power of two, within one rounding of them otherwise. */
mpu_result_t mpu__comm_scale(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, int64_t num,
                             int64_t den);
/* the caller's later work on the legacy default stream ordered after c's (host backends: nothing) */
mpu_result_t mpu__comm_order_caller(mpu_comm *c);

#endif
