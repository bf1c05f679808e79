/*
 * backend.h - what the files of the NCCL backend share (src/comm/nccl/): the
 * per-communicator state and the helpers each file calls. Not installed.
 *
 *   calls.c   every call: enqueued on the communicator's stream, requests
 *   watch.c   errors, waiting under the watchdog, breaking and aborting
 *   create.c  making communicators (from a host twin, from the environment,
 *             by split or group), ending them, the module registration
 */
#ifndef MPU_COMM_NCCL_BACKEND_H
#define MPU_COMM_NCCL_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/comm_internal.h"

/* The oldest NCCL the backend runs on: ncclCommSplit and its config's
 * splitShare are 2.18's. Configure reads it from here too
 * (cmake/MpuNcclVersion.cmake); runtime.c refuses an older libnccl.so.2. */
#define MPU_NCCL_FLOOR 2, 18, 0

/* Entry points called directly that NCCLs older than the floor lack: weak,
 * so that libmpu_nccl still loads there and runtime.c's version check can
 * refuse the library in one line before any of them is called. */
#pragma weak ncclCommSplit
#pragma weak ncclCommInitRankConfig
#pragma weak ncclGetLastError

/* Work the watchdog follows: an event recorded on the stream after a call,
 * and when the call was issued (its deadline counts from there). */
typedef struct nccl_pending {
  cudaEvent_t event;
  double start;
} nccl_pending;

/* Communicators whose NCCL handles share one abort flag (splits with
 * splitShare: init.cc, ncclCommInitChildComm: childComm->abortFlag =
 * comm->abortFlag). ncclCommAbort of any of them makes the others' kernels
 * return unfinished while NCCL reports no error on them, so each member
 * checks the family's mark instead. */
typedef struct nccl_family {
  atomic_int refs;
  atomic_int aborted;
} nccl_family;

typedef struct nccl_impl {
  /*
   * Two NCCL handles per communicator (docs/gpu.md, "Blocking handles"):
   * maker is non-blocking (config.blocking = 0) so making it, and every
   * split of it, runs under mpu's deadline; comm, a split of maker with
   * config.blocking = 1, runs every call and is the raw handle, so it never
   * answers ncclInProgress. NCCL 2.28 decides a split's mode by the parent's
   * config (group.cc, ncclAsyncLaunch: ncclGroupBlocking = comm->config.
   * blocking) and the child's from its own, so maker splits without
   * blocking into blocking children. Both end together (end_handle).
   */
  ncclComm_t comm;
  ncclComm_t maker;
  ncclComm_t split_out; /* *newcomm of a split of maker: written by NCCL's job when it ends,
                           so it lives here, not in a caller's frame */
  int share;          /* maker's splitShare: its splits share its resources */
  nccl_family *family; /* share: every communicator of the one abort flag; else NULL */
  int one_rank;       /* a group of one calls NCCL (handed on to splits and groups) */
  /* lock: held by this rank's thread while it is inside NCCL with the
   * handles, by whoever ends them, and over the watchdog's pending list and
   * grouped; recursive (a failing call ends its handles while holding it) */
  pthread_mutex_t lock;
  int grouped;        /* an open group of its owner holds calls of it: the watchdog waits */
  nccl_pending *pending; /* [npending] from pending_head, a ring of cap_pending */
  size_t pending_head, npending, cap_pending;
  struct nccl_impl *watch_next; /* the watchdog's list (watchdog.c) */
  mpu_comm *self;     /* the communicator, for the watchdog's messages */
  int device;
  cudaStream_t stream;
  int own_stream;
  mpu_comm *host;     /* the twin: same members, host memory; NULL from env */
  int own_host;
  double timeout_s;
  _Atomic mpu_result_t broken; /* set once (watch.c's mark_broken), read by any thread */
  char why[320];      /* written before broken is published */
  int *one;           /* a device int for barrier */
  /*
   * The out-of-band abort channel (watch.c). NCCL tells an aborted rank's
   * peers only on its socket and IB transports; on NVLink, P2P and SHM they
   * spin until their own watchdog. So a rank that breaks (mpu_comm_abort, a
   * timeout, an error) also posts it here, and every wait of every peer polls
   * it. oob_post_abort(ctx, rank, why): this rank gave up, with its reason;
   * it may run on any thread (mpu_comm_abort from a helper), so it must be
   * thread-safe. oob_poll_abort(ctx, &who, why, len): nonzero once a peer
   * posted, with its rank and reason; called from the waiting thread every
   * few hundred spins of the watch loop, it must return at once (one backed by
   * a network rate-limits itself). oob_free(ctx) when the communicator ends.
   * NULL hooks: no channel; waits then end by the watchdog only. Set by the
   * maker of the communicator: create.c through the host twin (ranks in one
   * process), the store for communicators from the environment.
   */
  void (*oob_post_abort)(void *ctx, int rank, const char *why);
  int (*oob_poll_abort)(void *ctx, int *who, char *why, size_t len);
  void (*oob_free)(void *ctx);
  void *oob_ctx;
  int on_user_stream; /* the work runs on the caller's stream (set_stream, options.stream) */
  cudaEvent_t ordered; /* default: recorded on the legacy default stream before each call */
  cudaEvent_t done;    /* recorded after a blocking call: what its wait polls */
  atomic_int breaking; /* claimed by the one who breaks it, so why is written once */
  int splits;         /* mpu_comm_split calls so far: names the children's boards */
  ncclComm_t local;   /* a communicator of this rank alone, for work of its own on the
                         device (calls.c, scaling); made on first use, ended with comm */
} nccl_impl;

/* A request of the NCCL backend: the event recorded after the call, and
 * when it started (mpu_request_test's deadline counts from there). */
typedef struct nccl_request {
  cudaEvent_t event;
  double start;
  int captured; /* issued into a CUDA graph capture: it runs when the graph does */
} nccl_request;

extern const mpu__comm_ops mpu__nccl_ops;

static inline nccl_impl *impl_of(const mpu_comm *c) { return c->impl; }

/* watch.c */
mpu_result_t mpu__nccl_error(ncclResult_t r, ncclComm_t comm, const char *what);
mpu_result_t mpu__nccl_cuda_error(cudaError_t e, const char *what);
mpu_result_t mpu__nccl_broken_error(const nccl_impl *m, const char *fn);
mpu_result_t mpu__nccl_watch(mpu_comm *c, cudaEvent_t event, double timeout_s, int keep,
                             const char *fn);
mpu_result_t mpu__nccl_usable(const mpu_comm *c, const char *fn);
mpu_result_t mpu__nccl_abort(mpu_comm *c);
mpu_result_t mpu__nccl_test(mpu_comm *c, const nccl_request *q, int *done);
/* Every NCCL call's result goes through this: communicators are made
 * non-blocking, so a call (or ncclGroupEnd) may return ncclInProgress while
 * NCCL still enqueues it; it waits until that is done, under the deadline. */
mpu_result_t mpu__nccl_issued(mpu_comm *c, ncclResult_t r, const char *fn);
mpu_result_t mpu__nccl_await(mpu_comm *c, ncclComm_t comm, ncclComm_t parent, double timeout_s,
                             const char *fn, const char *who);
void mpu__nccl_end_handle(nccl_impl *m);
/* The family of m's handles: aborted (an ncclCommAbort on a shared flag), and
 * whether it was; the first breaks m with a message if so. */
void mpu__nccl_family_abort(nccl_impl *m);
int mpu__nccl_family_broke(mpu_comm *c, const char *fn);
/* Break c once with a code and a reason (any thread); 1 if this call broke it. */
int mpu__nccl_mark_broken(mpu_comm *c, mpu_result_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Whether a peer posted an abort (1: this call broke c, -1: broken already, 0: none). */
int mpu__nccl_peer_aborted(mpu_comm *c, const char *fn);
/* ncclCommGetAsyncError of the work handle, under the lock (ncclSuccess once it is gone). */
ncclResult_t mpu__nccl_async(nccl_impl *m);

/* watchdog.c: one thread per process (ProcessGroupNCCL's watchdog) that
 * fails hung work by its deadline and ends the handles of a broken
 * communicator, even while its owner waits in CUDA. */
/* add m (its self set later, under its lock: skipped until then) */
mpu_result_t mpu__nccl_watchdog_add(nccl_impl *m);
void mpu__nccl_watchdog_remove(nccl_impl *m);
void mpu__nccl_watchdog_kick(void);
/* Follow the work enqueued on m's stream so far (after a call). */
mpu_result_t mpu__nccl_track(nccl_impl *m, const char *fn);
/* 1 while m's stream is being captured into a CUDA graph: nothing then waits
 * on the host or is watched (the work runs when the graph is launched) */
int mpu__nccl_capturing(const nccl_impl *m);
void mpu__nccl_pending_free(nccl_impl *m);

/* group.c: inside NCCL with c's handles (the watchdog leaves them alone);
 * MPU error if they are gone. Inside an mpu group the watchdog leaves them
 * alone to the group's end. */
mpu_result_t mpu__nccl_enter(mpu_comm *c, const char *fn);
void mpu__nccl_leave(mpu_comm *c);
mpu_result_t mpu__nccl_oob_join(nccl_impl *m, const ncclUniqueId *id);
void mpu__nccl_oob_leave(nccl_impl *m);
int mpu__nccl_oob_is_board(const nccl_impl *m);
uint64_t mpu__nccl_oob_board_serial(const nccl_impl *m);

/* calls.c */
void mpu__nccl_stream_free(nccl_impl *m);

/* create.c */
mpu_result_t mpu__nccl_host_twin(const mpu_comm *comm, mpu_comm **host);
mpu_result_t mpu__nccl_create_group(mpu_comm *c, const int *members, int n, mpu_comm **out);
mpu_result_t mpu__nccl_split(mpu_comm *c, int color, int key, mpu_comm **out);
void mpu__nccl_destroy(mpu_comm *c);

/* group.c: mpu_group_start/end's NCCL part, the handle; events of calls
 * made inside a group are recorded after ncclGroupEnd */
mpu_result_t mpu__nccl_group_start(void);
mpu_result_t mpu__nccl_group_end(void);
mpu_result_t mpu__nccl_p2p_start(mpu_comm *c, const mpu__call *k, void **handle);
/* calls.c: the NCCL call of a send or recv description (enqueued, not waited for) */
ncclResult_t mpu__nccl_p2p(const nccl_impl *m, const mpu__call *k);
mpu_result_t mpu__nccl_native_handle(const mpu_comm *c, void **out);
mpu_result_t mpu__nccl_request_new(const char *fn, nccl_request **out);
void mpu__nccl_request_free(nccl_request *q);
/* calls.c: a call may be issued (not broken, on the rank's device, after the caller's work) */
mpu_result_t mpu__nccl_begin(mpu_comm *c, const char *fn);
mpu_result_t mpu__nccl_event_record(mpu_comm *c, cudaEvent_t ev, const char *fn);

/* runtime.c: the libnccl.so.2 loaded. MPU_SUCCESS when its version is at
 * least the floor, else MPU_ERR_UNSUPPORTED naming both versions. */
mpu_result_t mpu__nccl_runtime_check(const char *fn);
/* ncclAlltoAll (NCCL 2.28.3+) of the library loaded, or NULL without it */
typedef ncclResult_t (*mpu__nccl_alltoall_fn)(const void *send, void *recv, size_t count,
                                              ncclDataType_t type, ncclComm_t comm,
                                              cudaStream_t stream);
mpu__nccl_alltoall_fn mpu__nccl_alltoall(void);
/* The allocation holding p, from the driver's cuMemGetAddressRange: 1 with
 * its base and size, 0 when p is in none, -1 when the driver cannot say. */
int mpu__nccl_allocation(const void *p, uintptr_t *base, size_t *bytes);

/* calls.c */
ncclDataType_t mpu__nccl_type(mpu_dtype dt);

#endif
