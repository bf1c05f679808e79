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
#include "core/error.h"
#include "mpu/comm.h"

#define MPU_COMM_MAGIC UINT64_C(0x6d70752d636f6d6d) /* "mpu-comm" */
#define MPU_COMM_FREED UINT64_C(0x6d70752d66726565) /* "mpu-free" */

typedef struct mpu__comm_ops {
  const char *name;
  /* A checked collective on a group of two or more (comm.c answers a group of
   * one itself). A backend without native non-blocking calls runs it to the
   * end here and sets *handle = NULL; one with them (NCCL) enqueues it and
   * hands back a handle for test, wait and release. Blocking calls are start,
   * then wait, in comm.c. */
  mpu_result_t (*start)(mpu_comm *c, const mpu__call *call, void **handle);
  mpu_result_t (*test)(mpu_comm *c, void *handle, int *done);
  /* waits up to timeout_s (< 0: the communicator's own) and may return
   * MPU_ERR_TIMEOUT leaving the handle pending */
  mpu_result_t (*wait)(mpu_comm *c, void *handle, double timeout_s);
  void (*release)(mpu_comm *c, void *handle);
  /* A checked send (MPU__CALL_SEND: k->send, sig.count x sig.dtype to k->peer)
   * or recv (MPU__CALL_RECV: into k->recv from k->peer), a group of one
   * included (a message to oneself). */
  mpu_result_t (*send)(mpu_comm *c, const mpu__call *k);
  mpu_result_t (*recv)(mpu_comm *c, const mpu__call *k);
  /* Optional: both at once (NULL: send, then recv) */
  mpu_result_t (*sendrecv)(mpu_comm *c, const mpu__call *send, const mpu__call *recv);
  /* members: n distinct valid ranks of c including c's own rank */
  mpu_result_t (*create_group)(mpu_comm *c, const int *members, int n, mpu_comm **out);
  /* NULL: comm.c's generic split (all_gather of colors, then create_group) */
  mpu_result_t (*split)(mpu_comm *c, int color, int key, mpu_comm **out);
  /* Optional: a group of `size` with this rank at `pos` whose members are
   * listed by list(ctx, ...) only when someone asks (caps.described_groups) */
  mpu_result_t (*group_described)(mpu_comm *c, int pos, int size,
                                  mpu_result_t (*list)(const void *ctx, int *out, int size),
                                  void *ctx, void (*free_ctx)(void *ctx), mpu_comm **out);
  /* Optional: the host twin of a device communicator */
  mpu_result_t (*host_twin)(const mpu_comm *c, mpu_comm **host);
  mpu_result_t (*abort)(mpu_comm *c);
  /* Optional: the backend library's own call (MPI_Allreduce, ...) for the
   * same checked call, which mpu bench times next to mpu's call.
   * MPU_ERR_UNSUPPORTED where the library has no such call (16-bit sums). */
  mpu_result_t (*native)(mpu_comm *c, const mpu__call *call);
  /* Optional, for device backends (NULL: host memory, no stream). caps fills
   * the backend's fields of a struct holding base's defaults; copy2d has
   * checked arguments. */
  void (*caps)(const mpu_comm *c, mpu_comm_caps *caps);
  void *(*get_stream)(const mpu_comm *c);
  mpu_result_t (*set_stream)(mpu_comm *c, void *stream);
  mpu_result_t (*mem_alloc)(mpu_comm *c, size_t bytes, void **out);
  mpu_result_t (*mem_free)(mpu_comm *c, void *p);
  /* Optional, for device backends (NULL: host memory by malloc/free): the
   * communicator's scratch buffer (mpu__comm_scratch) grown from old to
   * bytes (old NULL: none yet; bytes 0: free old only, at destroy), in the
   * order of the communicator's work, without waiting for the device. On
   * failure *out is what is still held: old, or NULL once old was released. */
  mpu_result_t (*scratch_resize)(mpu_comm *c, void *old, size_t bytes, void **out);
  mpu_result_t (*copy2d)(mpu_comm *c, void *dst, size_t dpitch, const void *src, size_t spitch,
                         size_t width, size_t height);
  /* Optional, for device backends (both or neither): copy2d enqueued on the
   * communicator's stream without the host waiting; and the caller's later
   * work (the legacy default stream) ordered after everything enqueued so
   * far, under the watchdog, the host not waiting (mpu__comm_ordered). */
  mpu_result_t (*copy2d_enqueue)(mpu_comm *c, void *dst, size_t dpitch, const void *src,
                                 size_t spitch, size_t width, size_t height);
  mpu_result_t (*order_caller)(mpu_comm *c);
  /* Optional, for device backends (NULL: host memory, scaled by the host):
   * buf[0..count) of a float dtype times num / den in place (one of them 1),
   * on this rank alone, the host waiting (mpu__comm_scale) */
  mpu_result_t (*scale)(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, int64_t num,
                        int64_t den);
  void (*destroy)(mpu_comm *c); /* free impl; comm.c frees the base */
  /* optional: a communicator made from a description lists its members'
   * world ranks on first need */
  mpu_result_t (*list_members)(const mpu_comm *c, int *world_ranks);
  /* Optional, for device backends (NULL: any host memory will do): whether
   * the bytes at p may be handed to the backend's calls; 0 with what the
   * memory is and what the communicator takes written to why. */
  int (*check_buffer)(const mpu_comm *c, const void *p, size_t bytes, char *why, size_t why_size);
  /* Optional, backends with their own groups (NCCL; group.c): open and close
   * the library's group on this thread; inside one, start and p2p_start only
   * enqueue (the work launches at group_end) and hand back a handle for
   * wait/release. */
  mpu_result_t (*group_start)(void);
  mpu_result_t (*group_end)(void);
  mpu_result_t (*p2p_start)(mpu_comm *c, const mpu__call *k, void **handle);
  /* Optional: the library's own communicator (an ncclComm_t) */
  mpu_result_t (*native_handle)(const mpu_comm *c, void **out);
  /* Optional: start a non-blocking call that then progresses without a wait
   * (handle for test, wait and release; NULL: it completed already). NULL:
   * non-blocking calls use start (native where wait is set, else queued). */
  mpu_result_t (*start_nb)(mpu_comm *c, const mpu__call *call, void **handle);
  /* optional, with wait: make `stream` wait for a started handle and return
   * at once (NULL: request.c waits on the host instead) */
  mpu_result_t (*stream_wait)(mpu_comm *c, void *handle, void *stream);
  /* Optional, for host backends that span processes: an out-of-band channel
   * on which a device communicator made over c tells its peers it aborted.
   * oob_open is collective over c (every member calls it, once, when the
   * device communicator is made); post(ctx, rank, why) never blocks and may
   * run on any thread; poll returns at once: 1 with the first poster's rank
   * and reason once a peer posted, else 0; close never blocks and leaves
   * nothing pending (late messages are drained by the backend). NULL: the
   * members share a process (the NCCL backend's in-process board). */
  mpu_result_t (*oob_open)(mpu_comm *c, void **ctx);
  void (*oob_post)(void *ctx, int rank, const char *why);
  int (*oob_poll)(void *ctx, int *who, char *why, size_t len);
  void (*oob_close)(void *ctx);
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
  mpu_request *freed_head, *freed_tail; /* mpu_request_free'd, not yet complete (request.c) */
  void *scratch;         /* mpu__comm_scratch's buffer, scratch_bytes long; freed at destroy */
  size_t scratch_bytes;
  int one_through_backend; /* a group of one calls the backend anyway (NCCL's kernels on one GPU) */
};

/* Whether comm.c answers a call itself, as a group of one (copies at most):
 * the one rule for every backend. */
static inline int mpu__comm_answers_alone(const mpu_comm *c) {
  return c->size == 1 && !c->one_through_backend;
}

/* A new base communicator. world_ranks (size entries, or NULL for the
 * identity) is copied. Returns NULL when out of memory. */
MPU_SIBLING_API mpu_comm *mpu__comm_new(const mpu__comm_ops *ops, int rank, int size, const int *world_ranks,
                        void *impl);

/* Free the base (not impl); the handle is poisoned against reuse. */
void mpu__comm_free(mpu_comm *c);

/* MPU_SUCCESS if a message of got_count x got answers a recv of count x dt;
 * else MPU_ERR_MISMATCH naming both shapes (the one rule of every backend). */
MPU_SIBLING_API mpu_result_t mpu__recv_mismatch(size_t count, mpu_dtype dt, size_t got_count, mpu_dtype got,
                                int peer);

/* Hand a received message (data, got_count x got) to a recv that asked for
 * count x dt: copies it, or fails with MPU_ERR_MISMATCH naming both shapes
 * (the message is dropped either way; the caller frees it). */
MPU_SIBLING_API mpu_result_t mpu__deliver(void *buf, size_t count, mpu_dtype dt, const void *data,
                          size_t got_count, mpu_dtype got, int peer);

/* comm.c: MPU_SUCCESS if c is a live communicator; else an error naming fn
 * (NULL: MPU_ERR_INVALID_ARGUMENT; destroyed or never made: _INVALID_USAGE). */
mpu_result_t mpu__comm_check(const char *fn, const mpu_comm *c);

/* calls.c: MPU_SUCCESS if r is a rank of c; else MPU_ERR_INVALID_ARGUMENT
 * naming fn, what r is ("root", "dst") and the range. */
mpu_result_t mpu__comm_check_rank(const char *fn, const char *what, const mpu_comm *c, int r);

/* calls.c: the description of a call of `kind` (collective.h): op, and root
 * or peer (`rank`), only where the kind's row has them. */
mpu__call mpu__call_describe(int kind, size_t count, mpu_dtype dtype, mpu_op op, int rank,
                             const void *send, void *recv);

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
/* The same, adding the time but not a call (a non-blocking start). */
mpu_result_t mpu__clock_add_time(double start, mpu_result_t result);

/* comm is going away: its queued requests fail when waited for. */
void mpu__detach_requests(mpu_comm *comm);

/* Run one checked call to its end: a group of one answered here, the
 * others by the backend's start and wait. */
mpu_result_t mpu__run_call(mpu_comm *comm, const mpu__call *call);

/* Requests allocated and not yet freed, in the whole process (tests). */
long mpu__request_count(void);

/* Make c->world_ranks real where the backend listed them lazily. */
mpu_result_t mpu__comm_members(mpu_comm *c);

/* World rank of member r of c (no checks; mpu__comm_members first where the
 * backend lists members lazily). */
static inline int mpu__comm_world_rank(const mpu_comm *c, int r) {
  return c->world_ranks ? c->world_ranks[r] : r;
}

#endif
