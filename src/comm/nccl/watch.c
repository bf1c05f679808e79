/*
 * watch.c - the NCCL backend's errors and waiting: NCCL's and CUDA's codes
 * as mpu's, every wait polled together with ncclCommGetAsyncError under the
 * communicator's timeout, and the way out (ncclCommAbort) when a peer died
 * or never came. A broken communicator fails every later call at once.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>

#include "comm/nccl/backend.h"
#include "core/clock.h"
#include "core/error.h"

/* ---- errors: NCCL's and CUDA's codes as mpu's, with their messages -------- */

mpu_result_t mpu__nccl_error(ncclResult_t r, ncclComm_t comm, const char *what) {
  if (r == ncclSuccess) return MPU_SUCCESS;
  mpu_result_t code = r == ncclInvalidArgument ? MPU_ERR_INVALID_ARGUMENT
                      : r == ncclInvalidUsage  ? MPU_ERR_INVALID_USAGE
                      : r == ncclRemoteError   ? MPU_ERR_ABORTED
                      : r == ncclSystemError   ? MPU_ERR_SYSTEM
                                               : MPU_ERR_BACKEND;
  const char *last = ncclGetLastError(comm); /* comm may be NULL: the thread's last error */
  return mpu__error(code, "%s: NCCL error %d: %s%s%s", what, (int)r, ncclGetErrorString(r),
                    last && *last ? ": " : "", last ? last : "");
}

mpu_result_t mpu__nccl_cuda_error(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return MPU_SUCCESS;
  return mpu__error(e == cudaErrorMemoryAllocation ? MPU_ERR_OUT_OF_MEMORY : MPU_ERR_BACKEND,
                    "%s: CUDA error %d: %s", what, (int)e, cudaGetErrorString(e));
}

/* ---- waiting: polled, with the watchdog -------------------------------------- */

mpu_result_t mpu__nccl_broken_error(const nccl_impl *m, const char *fn) {
  return mpu__error(m->broken, "%s: communicator is broken: %s", fn, m->why);
}

/* Break the communicator: abort NCCL's work so the stream drains. */
static mpu_result_t break_comm(mpu_comm *c, mpu_result_t code, const char *fn, const char *fmt,
                               double seconds) {
  nccl_impl *m = impl_of(c);
  snprintf(m->why, sizeof m->why, fmt, fn, seconds, c->size);
  m->broken = code;
  ncclCommAbort(m->comm); /* the documented way out of a hung collective */
  m->comm = NULL;
  return mpu__error(code, "%s", m->why);
}

/* Wait until query() says done, watching NCCL's asynchronous errors, for at
 * most timeout_s (< 0: the communicator's). On timeout with `keep`, the work
 * stays pending (a request can be waited for again); otherwise the
 * communicator is aborted and broken. */
mpu_result_t mpu__nccl_watch(mpu_comm *c, cudaEvent_t event, double timeout_s, int keep,
                          const char *fn) {
  nccl_impl *m = impl_of(c);
  double limit = timeout_s < 0 ? m->timeout_s : timeout_s, start = mpu__now();
  for (long spins = 0;; spins++) {
    cudaError_t e = event ? cudaEventQuery(event) : cudaStreamQuery(m->stream);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) return mpu__nccl_cuda_error(e, fn);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(m->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      mpu_result_t r = mpu__nccl_error(async, m->comm, fn);
      snprintf(m->why, sizeof m->why, "%s", mpu_last_error());
      m->broken = r;
      ncclCommAbort(m->comm);
      m->comm = NULL;
      return r;
    }
    if ((spins & 255) == 255) {
      if (mpu__now() - start > limit) {
        if (keep) return mpu__error(MPU_ERR_TIMEOUT, "%s: not complete after %.3g s", fn, limit);
        return break_comm(c, MPU_ERR_TIMEOUT, fn,
                          "%s: timed out after %.3g s waiting for the peers of a communicator of "
                          "%d ranks (NCCL aborted)",
                          limit);
      }
      sched_yield();
    }
  }
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(m->comm, &async);
  return mpu__nccl_error(async, m->comm, fn);
}

mpu_result_t mpu__nccl_usable(const mpu_comm *c, const char *fn) {
  const nccl_impl *m = impl_of(c);
  if (m->broken) return mpu__nccl_broken_error(m, fn);
  return mpu__nccl_cuda_error(cudaSetDevice(m->device), fn); /* this thread's calls go to the rank's GPU */
}

mpu_result_t mpu__nccl_abort(mpu_comm *c) {
  nccl_impl *m = impl_of(c);
  if (!m->broken) {
    snprintf(m->why, sizeof m->why, "mpu_comm_abort was called on this rank");
    m->broken = MPU_ERR_ABORTED;
    if (m->comm) ncclCommAbort(m->comm); /* peers see a remote error, not a hang */
    m->comm = NULL;
  }
  return MPU_SUCCESS;
}
