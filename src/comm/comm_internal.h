/*
 * comm_internal.h - what a backend implements: the communicator base struct
 * and its table of operations.
 *
 * The public entry points in comm.c check every argument (handle, dtype, op,
 * counts, buffers, ranks) before calling into the table, so a backend sees
 * only valid calls and writes no argument checks of its own.
 */
#ifndef MPU_COMM_INTERNAL_H
#define MPU_COMM_INTERNAL_H

#include <stdint.h>

#include "comm/base/signature.h"
#include "mpu/comm.h"

#define MPU_COMM_MAGIC UINT64_C(0x6d70752d636f6d6d) /* "mpu-comm" */
#define MPU_COMM_FREED UINT64_C(0x6d70752d66726565) /* "mpu-free" */

typedef struct mpu__comm_ops {
  const char *name;
  mpu_result_t (*all_reduce)(mpu_comm *c, const void *send, void *recv, size_t count,
                             mpu_dtype dt, mpu_op op);
  mpu_result_t (*all_gather)(mpu_comm *c, const void *send, void *recv, size_t count,
                             mpu_dtype dt);
  mpu_result_t (*reduce_scatter)(mpu_comm *c, const void *send, void *recv, size_t count,
                                 mpu_dtype dt, mpu_op op);
  mpu_result_t (*broadcast)(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, int root);
  mpu_result_t (*reduce)(mpu_comm *c, const void *send, void *recv, size_t count, mpu_dtype dt,
                         mpu_op op, int root);
  mpu_result_t (*all_to_all)(mpu_comm *c, const void *send, void *recv, size_t count,
                             mpu_dtype dt);
  mpu_result_t (*barrier)(mpu_comm *c);
  mpu_result_t (*send)(mpu_comm *c, const void *buf, size_t count, mpu_dtype dt, int peer);
  mpu_result_t (*recv)(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, int peer);
  /* Optional: both at once (NULL: send, then recv) */
  mpu_result_t (*sendrecv)(mpu_comm *c, const void *sbuf, size_t scount, int dst, void *rbuf,
                           size_t rcount, int src, mpu_dtype dt);
  /* members: n distinct valid ranks of c including c's own rank */
  mpu_result_t (*create_group)(mpu_comm *c, const int *members, int n, mpu_comm **out);
  /* NULL: comm.c's generic split (all_gather of colors, then create_group) */
  mpu_result_t (*split)(mpu_comm *c, int color, int key, mpu_comm **out);
  mpu_result_t (*abort)(mpu_comm *c);
  /* Optional: the backend library's own call for a collective (MPI_Allreduce,
   * ...) on the same arguments, which mpu bench times next to mpu's call.
   * MPU_ERR_UNSUPPORTED where the library has no such call (16-bit sums). */
  mpu_result_t (*native)(mpu_comm *c, int kind, const void *send, void *recv, size_t count,
                         mpu_dtype dt, mpu_op op, int root);
  /* Optional: native non-blocking calls (NCCL: enqueue on the stream). Without
   * them base queues the call and runs it at wait (docs/api.md). istart runs
   * checked arguments; iwait waits up to timeout_s (< 0: the communicator's
   * own) and may return MPU_ERR_TIMEOUT leaving the handle pending. */
  mpu_result_t (*istart)(mpu_comm *c, const mpu__call *call, void **handle);
  mpu_result_t (*itest)(mpu_comm *c, void *handle, int *done);
  mpu_result_t (*iwait)(mpu_comm *c, void *handle, double timeout_s);
  void (*ifree)(mpu_comm *c, void *handle);
  /* Optional, for device backends (NULL: host memory, no stream). caps fills
   * the backend's fields of a zeroed struct; copy2d has checked arguments. */
  void (*caps)(const mpu_comm *c, mpu_comm_caps *caps);
  void *(*get_stream)(const mpu_comm *c);
  mpu_result_t (*set_stream)(mpu_comm *c, void *stream);
  mpu_result_t (*mem_alloc)(mpu_comm *c, size_t bytes, void **out);
  mpu_result_t (*mem_free)(mpu_comm *c, void *p);
  mpu_result_t (*copy2d)(mpu_comm *c, void *dst, size_t dpitch, const void *src, size_t spitch,
                         size_t width, size_t height);
  void (*destroy)(mpu_comm *c); /* free impl; comm.c frees the base */
  /* optional: a communicator made from a description (the fake backend's
   * groups of a huge layout) lists its members' world ranks on first need */
  mpu_result_t (*list_members)(const mpu_comm *c, int *world_ranks);
} mpu__comm_ops;

struct mpu_comm {
  uint64_t magic;
  const mpu__comm_ops *ops;
  int rank;
  int size;
  int *world_ranks;      /* world rank of each member; NULL when member i is world rank i,
                            or (lazy_members) not listed yet */
  int lazy_members;      /* ops->list_members lists world_ranks on first need */
  int owned_by_launcher; /* the threads world communicator: only the launcher frees it */
  void *impl;            /* the backend's state */
  mpu_comm *next_live;   /* comm.c's registry of live handles (catches double destroy) */
  mpu_request *queue_head, *queue_tail; /* requests not yet run (request.c) */
};

/* A new base communicator. world_ranks (size entries, or NULL for the
 * identity) is copied. Returns NULL when out of memory. */
mpu_comm *mpu__comm_new(const mpu__comm_ops *ops, int rank, int size, const int *world_ranks,
                        void *impl);

/* Free the base (not impl); the handle is poisoned against reuse. */
void mpu__comm_free(mpu_comm *c);

/* MPU_SUCCESS if a message of got_count x got answers a recv of count x dt;
 * else MPU_ERR_MISMATCH naming both shapes (the one rule of every backend). */
mpu_result_t mpu__recv_mismatch(size_t count, mpu_dtype dt, size_t got_count, mpu_dtype got,
                                int peer);

/* Hand a received message (data, got_count x got) to a recv that asked for
 * count x dt: copies it, or fails with MPU_ERR_MISMATCH naming both shapes
 * (the message is dropped either way; the caller frees it). */
mpu_result_t mpu__deliver(void *buf, size_t count, mpu_dtype dt, const void *data,
                          size_t got_count, mpu_dtype got, int peer);

/* The backend library's own call for collective `kind` (an mpu__kind), for
 * benchmarks; MPU_ERR_UNSUPPORTED where there is none. Arguments unchecked
 * beyond the handle: the benchmark passes ones it checked with mpu's call. */
mpu_result_t mpu__comm_native(mpu_comm *comm, int kind, const void *send, void *recv,
                              size_t count, mpu_dtype dt, mpu_op op, int root);

/* ---- request.c ---- */

/* Run a checked call now (req == NULL: after the queued ones, in order), or
 * hand back a request for it. */
mpu_result_t mpu__submit(const char *fn, mpu_comm *comm, const mpu__call *call,
                         mpu_request **req);

/* Run every queued request of comm, in order (before any blocking call). */
mpu_result_t mpu__flush(mpu_comm *comm);

/* The calling thread's communication clock (mpu_comm_clock): stamp before a
 * call that communicates, add after it. */
double mpu__clock_start(void);
mpu_result_t mpu__clock_add(double start, mpu_result_t result);

/* comm is going away: its queued requests fail when waited for. */
void mpu__detach_requests(mpu_comm *comm);

/* Run one call through the backend's blocking operations. */
mpu_result_t mpu__run_call(mpu_comm *comm, const mpu__call *call);

/* The CUDA device an NCCL communicator runs on (MPU_ERR_INVALID_ARGUMENT for
 * another backend). */
mpu_result_t mpu__nccl_device(const mpu_comm *comm, int *device);

/* Make c->world_ranks real where the backend listed them lazily. */
mpu_result_t mpu__comm_members(mpu_comm *c);

/* The fake backend: a group of `size` with this rank at `pos`, its members
 * listed by list(ctx, out) only when someone asks (O(1) to create, however
 * big the group). free_ctx(ctx) at destroy; on failure the caller keeps
 * ctx. MPU_ERR_UNSUPPORTED unless world is a fake communicator. */
mpu_result_t mpu__fake_group_described(mpu_comm *world, int pos, int size,
                                       mpu_result_t (*list)(const void *ctx, int *out, int size),
                                       void *ctx, void (*free_ctx)(void *ctx), mpu_comm **out);

/* Whether c is a fake-backend communicator. */
int mpu__comm_is_fake(const mpu_comm *c);

/* World rank of member r of c (no checks; mpu__comm_members first where the
 * backend lists members lazily). */
static inline int mpu__comm_world_rank(const mpu_comm *c, int r) {
  return c->world_ranks ? c->world_ranks[r] : r;
}

#endif
