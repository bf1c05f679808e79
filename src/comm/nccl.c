/*
 * nccl.c - the NCCL backend: communicators over GPU buffers, one rank per GPU.
 *
 * An NCCL communicator is made among the members of a host communicator (its
 * "twin": threads in one process, one GPU per thread, or MPI processes, one
 * GPU per process): member 0 makes the unique id, the twin broadcasts it, each
 * member joins with ncclCommInitRank on its device. create_group does the same
 * on a group of the twin, so NCCL communicators are made among members only.
 * Without a host backend, mpu_comm_nccl_from_env bootstraps from torchrun's
 * variables through a small TCP rendezvous (rendezvous.c).
 *
 * Every call is enqueued on the communicator's stream. The blocking forms
 * then wait for the stream; the non-blocking ones record an event, and their
 * request waits for it. Every wait polls the stream (or event) together with
 * ncclCommGetAsyncError, and gives up after the timeout: a peer that died or
 * never came ends in MPU_ERR_TIMEOUT or MPU_ERR_ABORTED after ncclCommAbort,
 * not in a hang; the communicator is then broken (later calls fail at once).
 *
 * Reductions are NCCL's own (ring or tree order, its NaN rules; 16-bit floats
 * reduced natively): results equal mpu's rule for exactly representable sums
 * but not bit for bit in general, and the capabilities say so.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_internal.h"
#include "core/env.h"
#include "core/clock.h"
#include "core/error.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <time.h>

#include "comm/base/module.h"
#include "comm/rendezvous.h"
#include "mpu/version.h"

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
} nccl_impl;

static const mpu__comm_ops nccl_ops;

static nccl_impl *impl_of(const mpu_comm *c) { return c->impl; }


/* ---- errors: NCCL's and CUDA's codes as mpu's, with their messages -------- */

static mpu_result_t nccl_error(ncclResult_t r, ncclComm_t comm, const char *what) {
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

static mpu_result_t cuda_error(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return MPU_SUCCESS;
  return mpu__error(e == cudaErrorMemoryAllocation ? MPU_ERR_OUT_OF_MEMORY : MPU_ERR_BACKEND,
                    "%s: CUDA error %d: %s", what, (int)e, cudaGetErrorString(e));
}

static ncclDataType_t type_of(mpu_dtype dt) {
  switch (dt) {
  case MPU_FLOAT32: return ncclFloat32;
  case MPU_FLOAT64: return ncclFloat64;
  case MPU_FLOAT16: return ncclFloat16;
  case MPU_BFLOAT16: return ncclBfloat16;
  case MPU_INT32: return ncclInt32;
  case MPU_INT64: return ncclInt64;
  case MPU_INT8: return ncclInt8;
  case MPU_UINT32: return ncclUint32;
  case MPU_UINT64: return ncclUint64;
  default: return ncclUint8;
  }
}

static ncclRedOp_t op_of(mpu_op op) {
  switch (op) {
  case MPU_PROD: return ncclProd;
  case MPU_MIN: return ncclMin;
  case MPU_MAX: return ncclMax;
  case MPU_AVG: return ncclAvg;
  default: return ncclSum;
  }
}

/* ---- waiting: polled, with the watchdog -------------------------------------- */

static mpu_result_t broken_error(const nccl_impl *m, const char *fn) {
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
static mpu_result_t watch(mpu_comm *c, cudaEvent_t event, double timeout_s, int keep,
                          const char *fn) {
  nccl_impl *m = impl_of(c);
  double limit = timeout_s < 0 ? m->timeout_s : timeout_s, start = mpu__now();
  for (long spins = 0;; spins++) {
    cudaError_t e = event ? cudaEventQuery(event) : cudaStreamQuery(m->stream);
    if (e == cudaSuccess) break;
    if (e != cudaErrorNotReady) return cuda_error(e, fn);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(m->comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      mpu_result_t r = nccl_error(async, m->comm, fn);
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
  return nccl_error(async, m->comm, fn);
}

static mpu_result_t usable(const mpu_comm *c, const char *fn) {
  const nccl_impl *m = impl_of(c);
  if (m->broken) return broken_error(m, fn);
  return cuda_error(cudaSetDevice(m->device), fn); /* this thread's calls go to the rank's GPU */
}

/* ---- enqueueing calls --------------------------------------------------------- */

/* The uneven collectives, which NCCL has not: one group of sends and
 * receives (all_gather_v, all_to_all_v) or of reduces, one per block
 * (reduce_scatter_v). This rank's own block is a copy on the stream. */
static mpu_result_t enqueue_uneven(mpu_comm *c, const mpu__call *k, const char *fn) {
  nccl_impl *m = impl_of(c);
  ncclDataType_t t = type_of((mpu_dtype)k->sig.dtype);
  size_t es = mpu_dtype_size((mpu_dtype)k->sig.dtype);
  int n = c->size, me = c->rank;
  const char *send = k->send;
  char *recv = k->recv;
  ncclResult_t r = ncclGroupStart(), e = ncclSuccess;
  size_t off = 0;
  for (int p = 0; p < n && r == ncclSuccess; p++) {
    switch (k->sig.kind) {
    case MPU_COLL_ALL_GATHER_V:
      if (p != me && k->counts[me]) r = ncclSend(send, k->counts[me], t, p, m->comm, m->stream);
      if (p != me && !r && k->counts[p])
        r = ncclRecv(recv + k->displs[p] * es, k->counts[p], t, p, m->comm, m->stream);
      break;
    case MPU_COLL_REDUCE_SCATTER_V:
      if (k->counts[p])
        r = ncclReduce(send + off * es, p == me ? (void *)recv : (void *)(uintptr_t)(send + off * es),
                       k->counts[p], t, op_of((mpu_op)k->sig.op), p, m->comm, m->stream);
      off += k->counts[p];
      break;
    default:
      if (p != me && k->counts[p])
        r = ncclSend(send + k->displs[p] * es, k->counts[p], t, p, m->comm, m->stream);
      if (p != me && !r && k->rcounts[p])
        r = ncclRecv(recv + k->rdispls[p] * es, k->rcounts[p], t, p, m->comm, m->stream);
    }
  }
  e = ncclGroupEnd(); /* always closes the group it opened */
  MPU_CHECK(nccl_error(r ? r : e, m->comm, fn));
  /* the own block: a copy on the same stream */
  const void *from = NULL;
  void *to = NULL;
  size_t bytes = 0;
  if (k->sig.kind == MPU_COLL_ALL_GATHER_V)
    from = send, to = recv + k->displs[me] * es, bytes = k->counts[me] * es;
  else if (k->sig.kind == MPU_COLL_ALL_TO_ALL_V)
    from = send + k->displs[me] * es, to = recv + k->rdispls[me] * es, bytes = k->counts[me] * es;
  if (bytes && from != to)
    return cuda_error(cudaMemcpy2DAsync(to, bytes, from, bytes, bytes, 1, cudaMemcpyDefault,
                                        m->stream),
                      fn);
  return MPU_SUCCESS;
}

static mpu_result_t enqueue(mpu_comm *c, const mpu__call *k, const char *fn) {
  nccl_impl *m = impl_of(c);
  const mpu__sig *s = &k->sig;
  size_t n = (size_t)s->count;
  ncclDataType_t t = type_of((mpu_dtype)s->dtype);
  ncclRedOp_t op = op_of((mpu_op)s->op);
  ncclResult_t r;
  switch (s->kind) {
  case MPU_COLL_ALL_REDUCE: r = ncclAllReduce(k->send, k->recv, n, t, op, m->comm, m->stream); break;
  case MPU_COLL_ALL_GATHER: r = ncclAllGather(k->send, k->recv, n, t, m->comm, m->stream); break;
  case MPU_COLL_REDUCE_SCATTER:
    r = ncclReduceScatter(k->send, k->recv, n, t, op, m->comm, m->stream);
    break;
  case MPU_COLL_BROADCAST:
    r = ncclBroadcast(k->recv, k->recv, n, t, s->root, m->comm, m->stream);
    break;
  case MPU_COLL_REDUCE:
    r = ncclReduce(k->send, c->rank == s->root ? k->recv : (void *)(uintptr_t)k->send, n, t, op,
                   s->root, m->comm, m->stream);
    break;
  case MPU_COLL_ALL_TO_ALL: r = ncclAlltoAll(k->send, k->recv, n, t, m->comm, m->stream); break;
  case MPU_COLL_BARRIER: /* NCCL has no barrier: a one-int all-reduce is one */
    r = ncclAllReduce(m->one, m->one, 1, ncclInt32, ncclSum, m->comm, m->stream);
    break;
  default: return enqueue_uneven(c, k, fn);
  }
  return nccl_error(r, m->comm, fn);
}

/* A blocking call: enqueue, then wait for the stream under the watchdog. */
static mpu_result_t run(mpu_comm *c, const mpu__call *k, const char *fn) {
  MPU_CHECK(usable(c, fn));
  MPU_CHECK(enqueue(c, k, fn));
  return watch(c, NULL, -1, 0, fn);
}

/* Point to point is NCCL's: a send completes when the peer receives (no
 * eager copy), so the blocking send waits for the matching recv. */
static mpu_result_t nccl_send(mpu_comm *c, const void *buf, size_t count, mpu_dtype dt, int peer) {
  static const char fn[] = "mpu_comm_send";
  nccl_impl *m = impl_of(c);
  MPU_CHECK(usable(c, fn));
  MPU_CHECK(nccl_error(ncclSend(buf, count, type_of(dt), peer, m->comm, m->stream), m->comm, fn));
  return watch(c, NULL, -1, 0, fn);
}

static mpu_result_t nccl_recv(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, int peer) {
  static const char fn[] = "mpu_comm_recv";
  nccl_impl *m = impl_of(c);
  MPU_CHECK(usable(c, fn));
  MPU_CHECK(nccl_error(ncclRecv(buf, count, type_of(dt), peer, m->comm, m->stream), m->comm, fn));
  return watch(c, NULL, -1, 0, fn);
}

static mpu_result_t nccl_sendrecv(mpu_comm *c, const void *sbuf, size_t scount, int dst,
                                  void *rbuf, size_t rcount, int src, mpu_dtype dt) {
  static const char fn[] = "mpu_comm_sendrecv";
  nccl_impl *m = impl_of(c);
  MPU_CHECK(usable(c, fn));
  ncclResult_t r = ncclGroupStart();
  ncclResult_t s = r ? r : ncclSend(sbuf, scount, type_of(dt), dst, m->comm, m->stream);
  ncclResult_t v = r || s ? ncclSuccess : ncclRecv(rbuf, rcount, type_of(dt), src, m->comm, m->stream);
  ncclResult_t e = r ? ncclSuccess : ncclGroupEnd(); /* always closes the group it opened */
  MPU_CHECK(nccl_error(r ? r : s ? s : v ? v : e, m->comm, fn));
  return watch(c, NULL, -1, 0, fn);
}

/* ---- non-blocking: requests are events -------------------------------------------- */

static mpu_result_t nccl_start(mpu_comm *c, const mpu__call *k, void **handle) {
  const char *fn = mpu_collective_name((mpu_collective)k->sig.kind);
  nccl_impl *m = impl_of(c);
  cudaEvent_t ev;
  MPU_CHECK(usable(c, fn));
  MPU_CHECK(cuda_error(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), fn));
  mpu_result_t r = enqueue(c, k, fn);
  if (!r) r = cuda_error(cudaEventRecord(ev, m->stream), fn);
  if (r) {
    cudaEventDestroy(ev);
    return r;
  }
  *handle = ev;
  return MPU_SUCCESS;
}

static mpu_result_t nccl_test(mpu_comm *c, void *handle, int *done) {
  static const char fn[] = "mpu_request_test";
  nccl_impl *m = impl_of(c);
  if (m->broken) return broken_error(m, fn);
  cudaError_t e = cudaEventQuery((cudaEvent_t)handle);
  *done = e == cudaSuccess;
  if (e != cudaSuccess && e != cudaErrorNotReady) return cuda_error(e, fn);
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(m->comm, &async);
  if (async != ncclSuccess && async != ncclInProgress) return watch(c, handle, 0, 0, fn);
  return MPU_SUCCESS;
}

static mpu_result_t nccl_wait(mpu_comm *c, void *handle, double timeout_s) {
  static const char fn[] = "mpu_request_wait";
  nccl_impl *m = impl_of(c);
  if (m->broken) return broken_error(m, fn);
  return watch(c, (cudaEvent_t)handle, timeout_s, timeout_s >= 0, fn);
}

static void nccl_release(mpu_comm *c, void *handle) {
  (void)c;
  cudaEventDestroy((cudaEvent_t)handle);
}

/* ---- memory and streams ---------------------------------------------------------- */

static void nccl_caps(const mpu_comm *c, mpu_comm_caps *caps) {
  caps->device = impl_of(c)->device;
  caps->groups_by_split = !impl_of(c)->host; /* no twin to make groups among members */
  caps->memory = MPU_MEMORY_DEVICE;
  caps->streams = 1;
  caps->native_nonblocking = 1;
  caps->fault_detection = 1; /* the watchdog and asynchronous errors */
  caps->call_checking = 0;   /* NCCL cannot compare calls across ranks */
  caps->exact_reductions = 0;
}

static void *nccl_get_stream(const mpu_comm *c) { return impl_of(c)->stream; }

static mpu_result_t nccl_set_stream(mpu_comm *c, void *stream) {
  nccl_impl *m = impl_of(c);
  MPU_CHECK(usable(c, "mpu_comm_set_stream"));
  MPU_CHECK(watch(c, NULL, -1, 0, "mpu_comm_set_stream")); /* finish the old stream's work */
  if (m->own_stream) cudaStreamDestroy(m->stream);
  m->own_stream = 0;
  m->stream = stream;
  return MPU_SUCCESS;
}

static mpu_result_t nccl_mem_alloc(mpu_comm *c, size_t bytes, void **out) {
  MPU_CHECK(cuda_error(cudaSetDevice(impl_of(c)->device), "mpu_comm_mem_alloc"));
  return cuda_error(cudaMalloc(out, bytes ? bytes : 1), "mpu_comm_mem_alloc");
}

static mpu_result_t nccl_mem_free(mpu_comm *c, void *p) {
  MPU_CHECK(cuda_error(cudaSetDevice(impl_of(c)->device), "mpu_comm_mem_free"));
  return cuda_error(cudaFree(p), "mpu_comm_mem_free");
}

static mpu_result_t nccl_copy2d(mpu_comm *c, void *dst, size_t dpitch, const void *src,
                                size_t spitch, size_t width, size_t height) {
  static const char fn[] = "mpu_comm_copy2d";
  nccl_impl *m = impl_of(c);
  MPU_CHECK(usable(c, fn));
  MPU_CHECK(cuda_error(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                         cudaMemcpyDefault, m->stream),
                       fn));
  return watch(c, NULL, -1, 0, fn);
}

/* ---- making and ending communicators ---------------------------------------------- */

/* The local rank: how many members before this one run on the same host. */
static mpu_result_t local_rank_of(mpu_comm *host, int *local) {
  int n = host->size, me = host->rank;
  char *names = calloc((size_t)n, 64);
  char mine[64] = "";
  if (!names) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "nccl: %d host names", n);
  gethostname(mine, sizeof mine - 1);
  mpu_result_t r = mpu_comm_all_gather(host, mine, names, 64, MPU_UINT8);
  int count = 0;
  for (int k = 0; !r && k < me; k++) count += !strncmp(names + (size_t)k * 64, mine, 64);
  free(names);
  *local = count;
  return r;
}

static void impl_free(nccl_impl *m) {
  if (!m) return;
  if (m->comm) ncclCommDestroy(m->comm);
  if (m->one) cudaFree(m->one);
  if (m->own_stream && m->stream) cudaStreamDestroy(m->stream);
  if (m->own_host) mpu_comm_destroy(m->host);
  free(m);
}

/* Join an NCCL communicator of n ranks as `rank` with the given id. */
static mpu_result_t make(int rank, int n, const ncclUniqueId *id, int device, void *stream,
                         double timeout_s, mpu_comm *host, int own_host, const int *world,
                         mpu_comm **out) {
  static const char fn[] = "mpu_comm_nccl_create";
  nccl_impl *m = calloc(1, sizeof *m);
  if (!m) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  m->device = device;
  m->timeout_s = timeout_s;
  m->host = host;
  m->own_host = own_host;
  mpu_result_t r = cuda_error(cudaSetDevice(device), fn);
  if (!r && stream) m->stream = stream;
  if (!r && !stream) {
    r = cuda_error(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking), fn);
    m->own_stream = !r;
  }
  if (!r) r = cuda_error(cudaMalloc((void **)&m->one, sizeof(int)), fn);
  if (!r) r = nccl_error(ncclCommInitRank(&m->comm, n, *id, rank), NULL, fn);
  mpu_comm *c = r ? NULL : mpu__comm_new(&nccl_ops, rank, n, world, m);
  if (!r && !c) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  if (r) {
    impl_free(m);
    return r;
  }
  *out = c;
  return MPU_SUCCESS;
}

/* Member 0 of host makes the id, host broadcasts it, everyone joins. */
static mpu_result_t make_over(mpu_comm *host, int own_host, int device, void *stream,
                              double timeout_s, mpu_comm **out) {
  static const char fn[] = "mpu_comm_nccl_create";
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  int ok = 1;
  if (host->rank == 0) ok = ncclGetUniqueId(&id) == ncclSuccess;
  mpu_result_t r = mpu_comm_broadcast(host, &ok, 1, MPU_INT32, 0);
  if (!r) r = mpu_comm_broadcast(host, &id, sizeof id, MPU_UINT8, 0);
  if (!r && !ok) r = mpu__error(MPU_ERR_BACKEND, "%s: member 0 could not make an NCCL id", fn);
  int *world = NULL;
  if (!r) {
    world = malloc((size_t)host->size * sizeof(int));
    if (!world) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    for (int k = 0; !r && k < host->size; k++) world[k] = mpu__comm_world_rank(host, k);
  }
  if (!r) r = make(host->rank, host->size, &id, device, stream, timeout_s, host, own_host, world, out);
  free(world);
  if (r && own_host) mpu_comm_destroy(host);
  return r;
}

static mpu_result_t check_options(const char *fn, const mpu_nccl_options *o) {
  if (o && (o->size == 0 || o->size > sizeof *o))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: options.size is %zu (start from MPU_NCCL_OPTIONS_INIT)", fn, o->size);
  return MPU_SUCCESS;
}

/* The device of this rank: the option, else the local rank modulo the GPUs. */
static mpu_result_t pick_device(const char *fn, const mpu_nccl_options *o, int local, int *device) {
  int count = 0;
  MPU_CHECK(cuda_error(cudaGetDeviceCount(&count), fn));
  if (count < 1) return mpu__error(MPU_ERR_UNSUPPORTED, "%s: no CUDA device", fn);
  int want = o && o->device >= 0 ? o->device : local % count;
  if (want >= count)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: device %d, but there are %d", fn, want, count);
  *device = want;
  return MPU_SUCCESS;
}

static mpu_result_t nccl_create(mpu_comm *host, const mpu_nccl_options *options,
                                mpu_comm **out) {
  static const char fn[] = "mpu_comm_nccl_create";
  int local = 0, device = 0;
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  MPU_CHECK(check_options(fn, options));
  int rank, size;
  MPU_CHECK(mpu_comm_rank(host, &rank));
  MPU_CHECK(mpu_comm_size(host, &size));
  if (host->ops == &nccl_ops)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the host communicator is an NCCL one", fn);
  if (!options || options->device < 0) MPU_CHECK(local_rank_of(host, &local));
  mpu_result_t r = pick_device(fn, options, local, &device);
  /* every member must agree before anyone joins NCCL, or the others would hang */
  int32_t failed = r != MPU_SUCCESS, any = 0;
  MPU_CHECK(mpu_comm_all_reduce(host, &failed, &any, 1, MPU_INT32, MPU_MAX));
  if (r) return r;
  if (any) return mpu__error(MPU_ERR_ABORTED, "%s: another member could not pick a device", fn);
  int keep = !options || options->size < offsetof(mpu_nccl_options, keep_host) + sizeof(int) ||
             options->keep_host;
  MPU_CHECK(make_over(host, 0, device, options ? options->stream : NULL,
                      mpu__env_timeout(options ? options->timeout_s : 0), out));
  if (!keep) impl_of(*out)->host = NULL;
  return MPU_SUCCESS;
}

static mpu_result_t nccl_from_env(const mpu_nccl_options *options, mpu_comm **out) {
  static const char fn[] = "mpu_comm_nccl_from_env";
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  MPU_CHECK(check_options(fn, options));
  mpu__rendezvous_env env;
  MPU_CHECK(mpu__rendezvous_read_env(&env));
  int device = 0;
  MPU_CHECK(pick_device(fn, options, env.local_rank, &device));
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (env.rank == 0 && ncclGetUniqueId(&id) != ncclSuccess)
    return mpu__error(MPU_ERR_BACKEND, "%s: could not make an NCCL id", fn);
  double timeout = mpu__env_timeout(options ? options->timeout_s : 0);
  MPU_CHECK(mpu__rendezvous_share(&env, &id, sizeof id, timeout));
  return make(env.rank, env.world_size, &id, device, options ? options->stream : NULL, timeout,
              NULL, 0, NULL, out);
}

static mpu_result_t nccl_host_twin(const mpu_comm *comm, mpu_comm **host) {
  if (!impl_of(comm)->host)
    return mpu__error(MPU_ERR_UNSUPPORTED,
                      "mpu_comm_host_twin: made from the environment, this communicator has no "
                      "host twin");
  *host = impl_of(comm)->host;
  return MPU_SUCCESS;
}

static mpu_result_t nccl_create_group(mpu_comm *c, const int *members, int n, mpu_comm **out) {
  static const char fn[] = "mpu_comm_create_group";
  nccl_impl *m = impl_of(c);
  MPU_CHECK(usable(c, fn));
  if (!m->host)
    return mpu__error(MPU_ERR_UNSUPPORTED,
                      "%s: an NCCL communicator made from the environment has no host twin to "
                      "make groups with (use mpu_comm_split)",
                      fn);
  mpu_comm *twin = NULL;
  MPU_CHECK(mpu_comm_create_group(m->host, members, n, &twin));
  return make_over(twin, 1, m->device, NULL, m->timeout_s, out);
}

/* Collective over c, like ncclCommSplit: works without a host twin. */
static mpu_result_t nccl_split(mpu_comm *c, int color, int key, mpu_comm **out) {
  static const char fn[] = "mpu_comm_split";
  nccl_impl *m = impl_of(c);
  MPU_CHECK(usable(c, fn));
  if (m->host) { /* split the twin as well, so the new communicator has one */
    mpu_comm *twin = NULL;
    MPU_CHECK(mpu_comm_split(m->host, color, key, &twin));
    if (!twin) {
      *out = NULL;
      return MPU_SUCCESS;
    }
    return make_over(twin, 1, m->device, NULL, m->timeout_s, out);
  }
  nccl_impl *nm = calloc(1, sizeof *nm);
  if (!nm) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  ncclComm_t nc = NULL;
  mpu_result_t r = nccl_error(
      ncclCommSplit(m->comm, color == MPU_COMM_SPLIT_NOCOLOR ? NCCL_SPLIT_NOCOLOR : color, key, &nc,
                    NULL),
      m->comm, fn);
  if (!r && !nc) {
    free(nm);
    *out = NULL;
    return MPU_SUCCESS;
  }
  int rank = 0, size = 0;
  if (!r) r = nccl_error(ncclCommUserRank(nc, &rank), nc, fn);
  if (!r) r = nccl_error(ncclCommCount(nc, &size), nc, fn);
  *nm = (nccl_impl){nc, m->device, NULL, 0, NULL, 0, m->timeout_s, MPU_SUCCESS, "", NULL};
  if (!r) r = cuda_error(cudaStreamCreateWithFlags(&nm->stream, cudaStreamNonBlocking), fn);
  nm->own_stream = !r;
  if (!r) r = cuda_error(cudaMalloc((void **)&nm->one, sizeof(int)), fn);
  mpu_comm *nc_comm = r ? NULL : mpu__comm_new(&nccl_ops, rank, size, NULL, nm);
  if (!r && !nc_comm) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  if (r) {
    impl_free(nm);
    return r;
  }
  *out = nc_comm;
  return MPU_SUCCESS;
}

static mpu_result_t nccl_abort(mpu_comm *c) {
  nccl_impl *m = impl_of(c);
  if (!m->broken) {
    snprintf(m->why, sizeof m->why, "mpu_comm_abort was called on this rank");
    m->broken = MPU_ERR_ABORTED;
    if (m->comm) ncclCommAbort(m->comm); /* peers see a remote error, not a hang */
    m->comm = NULL;
  }
  return MPU_SUCCESS;
}

static void nccl_destroy(mpu_comm *c) {
  nccl_impl *m = c->impl;
  cudaSetDevice(m->device);
  if (m->comm && !m->broken && cudaStreamQuery(m->stream) == cudaSuccess) {
    ncclCommDestroy(m->comm); /* nothing pending: the orderly way */
  } else if (m->comm) {
    ncclCommAbort(m->comm); /* work still queued: do not wait for it */
  }
  m->comm = NULL;
  impl_free(m);
}

static mpu_result_t nccl_native(mpu_comm *c, const mpu__call *k) {
  /* mpu's calls are NCCL's: the raw call is the same enqueue, timed alike */
  return run(c, k, "raw NCCL call");
}

static const mpu__comm_ops nccl_ops = {
    .name = "nccl",
    .start = nccl_start,
    .test = nccl_test,
    .wait = nccl_wait,
    .release = nccl_release,
    .send = nccl_send,
    .recv = nccl_recv,
    .sendrecv = nccl_sendrecv,
    .create_group = nccl_create_group,
    .split = nccl_split,
    .abort = nccl_abort,
    .native = nccl_native,
    .host_twin = nccl_host_twin,
    .caps = nccl_caps,
    .get_stream = nccl_get_stream,
    .set_stream = nccl_set_stream,
    .mem_alloc = nccl_mem_alloc,
    .mem_free = nccl_mem_free,
    .copy2d = nccl_copy2d,
    .destroy = nccl_destroy,
};

/* libmpu reaches the backend through this, registered when the library loads */
static const mpu__module nccl_module = {
    .name = "nccl",
    .version = MPU_VERSION_STRING,
    .nccl_create = nccl_create,
    .nccl_from_env = nccl_from_env,
};

__attribute__((constructor)) static void nccl_module_load(void) {
  mpu__module_register(&nccl_module);
}
