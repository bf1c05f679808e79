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

#include <cuda_runtime.h>
#include <nccl.h>

#include "comm/comm_internal.h"

typedef struct nccl_impl {
  ncclComm_t comm;
  int device;
  cudaStream_t stream;
  int own_stream;
  mpu_comm *host;     /* the twin: same members, host memory; NULL from env */
  int own_host;
  double timeout_s;
  mpu_result_t broken;
  char why[320];
  int *one;           /* a device int for barrier */
  /* the out-of-band abort channel: a rank that breaks posts, every wait of a
   * peer polls (watch.c); for communicators from the environment, the store */
  void (*oob_post_abort)(void *ctx, int rank, const char *why);
  int (*oob_poll_abort)(void *ctx, int *who, char *why, size_t len);
  void (*oob_free)(void *ctx);
  void *oob_ctx;
  int on_user_stream; /* the work runs on the caller's stream (set_stream, options.stream) */
  cudaEvent_t ordered; /* default: recorded on the legacy default stream before each call */
  cudaEvent_t done;    /* recorded after a blocking call: what its wait polls */
} nccl_impl;

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
mpu_result_t mpu__nccl_p2p_start(mpu_comm *c, int is_send, void *buf, size_t count, mpu_dtype dt,
                                 int peer, void **handle);
mpu_result_t mpu__nccl_native_handle(const mpu_comm *c, void **out);
mpu_result_t mpu__nccl_event_new(const char *fn, cudaEvent_t *ev);
/* calls.c: a call may be issued (not broken, on the rank's device, after the caller's work) */
mpu_result_t mpu__nccl_begin(mpu_comm *c, const char *fn);
mpu_result_t mpu__nccl_event_record(mpu_comm *c, cudaEvent_t ev, const char *fn);

/* calls.c */
ncclDataType_t mpu__nccl_type(mpu_dtype dt);

#endif
