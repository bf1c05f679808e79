/*
 * calls.c - the NCCL backend's calls. Every call is enqueued on the
 * communicator's stream, after the caller's work (below); the blocking forms
 * then wait for an event recorded after the call, the non-blocking ones
 * record an event that their request waits for (watch.c).
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

#include "comm/nccl/backend.h"
#include "core/clock.h"
#include "core/error.h"

/* ncclBfloat16 is 9 in every NCCL since 2.10, but nccl.h below 2.21 hides
 * it from C behind cuda_bf16.h's C++ types: use the number there. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 21, 0)
#define NCCL_BF16 ncclBfloat16
#else
#define NCCL_BF16 ((ncclDataType_t)9)
#endif

static ncclDataType_t type_of(mpu_dtype dt) {
  switch (dt) {
  case MPU_FLOAT32: return ncclFloat32;
  case MPU_FLOAT64: return ncclFloat64;
  case MPU_FLOAT16: return ncclFloat16;
  case MPU_BFLOAT16: return NCCL_BF16;
  case MPU_INT32: return ncclInt32;
  case MPU_INT64: return ncclInt64;
  case MPU_INT8: return ncclInt8;
  case MPU_UINT32: return ncclUint32;
  case MPU_UINT64: return ncclUint64;
  default: return ncclUint8;
  }
}

ncclDataType_t mpu__nccl_type(mpu_dtype dt) { return type_of(dt); }

/* The average of one rank is its value, a copy: ncclSum there. At one rank
 * NCCL runs ncclAvg through its oneRankReduce kernel (enqueue.cc,
 * ncclLaunchOneRank), which on an H200 with NCCL 2.28.3 left the last
 * element of odd counts of several 16 KiB blocks unwritten (docs/gpu.md);
 * ncclSum there is a cudaMemcpyAsync. */
static ncclRedOp_t op_of(mpu_op op, int ranks) {
  switch (op) {
  case MPU_PROD: return ncclProd;
  case MPU_MIN: return ncclMin;
  case MPU_MAX: return ncclMax;
  case MPU_AVG: return ranks == 1 ? ncclSum : ncclAvg;
  default: return ncclSum;
  }
}

/* ---- enqueueing calls --------------------------------------------------------- */

/* The uneven collectives, which NCCL has not: one group of sends and
 * receives (all_gather_v, all_to_all_v) or of reduces, one per block
 * (reduce_scatter_v). This rank's own block is a copy on the stream. */

/* Close the group opened, then this rank's own block (bytes from `from`
 * to `to`), a copy on the stream. */
static mpu_result_t uneven_end(mpu_comm *c, ncclResult_t r, const void *from, void *to,
                               size_t bytes, const char *fn) {
  ncclResult_t e = ncclGroupEnd(); /* always closes the group it opened */
  MPU_CHECK(mpu__nccl_issued(c, r ? r : e, fn));
  if (!bytes || from == to) return MPU_SUCCESS;
  return mpu__nccl_cuda_error(cudaMemcpy2DAsync(to, bytes, from, bytes, bytes, 1,
                                                cudaMemcpyDefault, impl_of(c)->stream),
                              fn);
}

static mpu_result_t enqueue_all_gather_v(mpu_comm *c, const mpu__call *k, const char *fn) {
  nccl_impl *m = impl_of(c);
  ncclDataType_t t = type_of((mpu_dtype)k->sig.dtype);
  size_t es = mpu_dtype_size((mpu_dtype)k->sig.dtype);
  int n = c->size, me = c->rank;
  char *recv = k->recv;
  ncclResult_t r = ncclGroupStart();
  for (int p = 0; p < n && r == ncclSuccess; p++) {
    if (p != me && k->counts[me]) r = ncclSend(k->send, k->counts[me], t, p, m->comm, m->stream);
    if (p != me && !r && k->counts[p])
      r = ncclRecv(recv + k->displs[p] * es, k->counts[p], t, p, m->comm, m->stream);
  }
  return uneven_end(c, r, k->send, recv + k->displs[me] * es, k->counts[me] * es, fn);
}

static mpu_result_t enqueue_reduce_scatter_v(mpu_comm *c, const mpu__call *k, const char *fn) {
  nccl_impl *m = impl_of(c);
  ncclDataType_t t = type_of((mpu_dtype)k->sig.dtype);
  size_t es = mpu_dtype_size((mpu_dtype)k->sig.dtype), off = 0;
  const char *send = k->send;
  ncclResult_t r = ncclGroupStart();
  for (int p = 0; p < c->size && r == ncclSuccess; p++) {
    if (k->counts[p])
      r = ncclReduce(send + off * es,
                     p == c->rank ? k->recv : (void *)(uintptr_t)(send + off * es), k->counts[p],
                     t, op_of((mpu_op)k->sig.op, c->size), p, m->comm, m->stream);
    off += k->counts[p];
  }
  return uneven_end(c, r, NULL, NULL, 0, fn);
}

static mpu_result_t enqueue_all_to_all_v(mpu_comm *c, const mpu__call *k, const char *fn) {
  nccl_impl *m = impl_of(c);
  ncclDataType_t t = type_of((mpu_dtype)k->sig.dtype);
  size_t es = mpu_dtype_size((mpu_dtype)k->sig.dtype);
  int n = c->size, me = c->rank;
  const char *send = k->send;
  char *recv = k->recv;
  ncclResult_t r = ncclGroupStart();
  for (int p = 0; p < n && r == ncclSuccess; p++) {
    if (p != me && k->counts[p])
      r = ncclSend(send + k->displs[p] * es, k->counts[p], t, p, m->comm, m->stream);
    if (p != me && !r && k->rcounts[p])
      r = ncclRecv(recv + k->rdispls[p] * es, k->rcounts[p], t, p, m->comm, m->stream);
  }
  return uneven_end(c, r, send + k->displs[me] * es, recv + k->rdispls[me] * es,
                    k->counts[me] * es, fn);
}

/* all_to_all as one group where the library has no ncclAlltoAll (before
 * NCCL 2.28.3; runtime.c looks it up): block p of send to rank p, block p of
 * recv from it; this rank's own block too (NCCL copies a send to self in a
 * group), which is what ncclAlltoAll does inside. */
static mpu_result_t enqueue_all_to_all(mpu_comm *c, const mpu__call *k, const char *fn) {
  nccl_impl *m = impl_of(c);
  ncclDataType_t t = type_of((mpu_dtype)k->sig.dtype);
  size_t count = (size_t)k->sig.count, block = count * mpu_dtype_size((mpu_dtype)k->sig.dtype);
  const char *send = k->send;
  char *recv = k->recv;
  ncclResult_t r = ncclGroupStart(), e;
  for (int p = 0; p < c->size && r == ncclSuccess && count; p++) {
    r = ncclSend(send + (size_t)p * block, count, t, p, m->comm, m->stream);
    if (!r) r = ncclRecv(recv + (size_t)p * block, count, t, p, m->comm, m->stream);
  }
  e = ncclGroupEnd(); /* always closes the group it opened */
  return mpu__nccl_issued(c, r ? r : e, fn);
}

static mpu_result_t enqueue_locked(mpu_comm *c, const mpu__call *k, const char *fn) {
  nccl_impl *m = impl_of(c);
  const mpu__sig *s = &k->sig;
  size_t n = (size_t)s->count;
  ncclDataType_t t = type_of((mpu_dtype)s->dtype);
  ncclRedOp_t op = op_of((mpu_op)s->op, c->size);
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
  case MPU_COLL_ALL_TO_ALL: {
    mpu__nccl_alltoall_fn alltoall = mpu__nccl_alltoall();
    if (!alltoall) return enqueue_all_to_all(c, k, fn);
    r = alltoall(k->send, k->recv, n, t, m->comm, m->stream);
    break;
  }
  case MPU_COLL_BARRIER: /* NCCL has no barrier: a one-int all-reduce is one */
    r = ncclAllReduce(m->one, m->one, 1, ncclInt32, ncclSum, m->comm, m->stream);
    break;
  case MPU_COLL_ALL_GATHER_V: return enqueue_all_gather_v(c, k, fn);
  case MPU_COLL_REDUCE_SCATTER_V: return enqueue_reduce_scatter_v(c, k, fn);
  default: return enqueue_all_to_all_v(c, k, fn);
  }
  return mpu__nccl_issued(c, r, fn);
}

/* Enqueue k with the handle held (the watchdog does not end it meanwhile). */
static mpu_result_t enqueue(mpu_comm *c, const mpu__call *k, const char *fn) {
  MPU_CHECK(mpu__nccl_enter(c, fn));
  mpu_result_t r = enqueue_locked(c, k, fn);
  mpu__nccl_leave(c);
  return r;
}

/* ---- ordering against the caller's work ----------------------------------------- */

/* By default the communicator's own stream (non-blocking, so the legacy
 * default stream does not wait for NCCL's work) is ordered after the
 * caller's: before each call an event recorded on the legacy default stream,
 * where a plain C/CUDA program's kernels run, is waited for on the
 * communicator's stream (ProcessGroupNCCL's syncStream). On the caller's own
 * stream (mpu_comm_set_stream) stream order does it. */
static mpu_result_t after_caller(mpu_comm *c, const char *fn) {
  nccl_impl *m = impl_of(c);
  if (m->on_user_stream) return MPU_SUCCESS;
  if (!m->ordered)
    MPU_CHECK(mpu__nccl_cuda_error(cudaEventCreateWithFlags(&m->ordered, cudaEventDisableTiming), fn));
  MPU_CHECK(mpu__nccl_cuda_error(cudaEventRecord(m->ordered, cudaStreamLegacy), fn));
  return mpu__nccl_cuda_error(cudaStreamWaitEvent(m->stream, m->ordered, 0), fn);
}

/* The host waits for what was enqueued so far: an event recorded now, not
 * the stream, which may hold the caller's later kernels (set_stream). Under
 * graph capture there is nothing to wait for: the call runs with each launch
 * of the graph, in its stream order. */
static mpu_result_t wait_enqueued(mpu_comm *c, const char *fn) {
  nccl_impl *m = impl_of(c);
  if (mpu__nccl_capturing(m)) return MPU_SUCCESS;
  if (!m->done)
    MPU_CHECK(mpu__nccl_cuda_error(cudaEventCreateWithFlags(&m->done, cudaEventDisableTiming), fn));
  MPU_CHECK(mpu__nccl_cuda_error(cudaEventRecord(m->done, m->stream), fn));
  MPU_CHECK(mpu__nccl_track(m, fn));
  return mpu__nccl_watch(c, m->done, -1, 0, fn);
}

void mpu__nccl_stream_free(nccl_impl *m) {
  if (m->ordered) cudaEventDestroy(m->ordered);
  if (m->done) cudaEventDestroy(m->done);
  m->ordered = m->done = NULL;
}

/* A call can be issued: not broken, on the rank's device, after the caller's work. */
mpu_result_t mpu__nccl_begin(mpu_comm *c, const char *fn) {
  MPU_CHECK(mpu__nccl_usable(c, fn));
  return after_caller(c, fn);
}

/* A blocking call: enqueue, then wait for it under the watchdog. */
static mpu_result_t run(mpu_comm *c, const mpu__call *k, const char *fn) {
  MPU_CHECK(mpu__nccl_begin(c, fn));
  MPU_CHECK(enqueue(c, k, fn));
  return wait_enqueued(c, fn);
}

/* Point to point is NCCL's: a send completes when the peer receives (no
 * eager copy), so the blocking send waits for the matching recv. */
/* The NCCL call of a send or recv description, enqueued. */
ncclResult_t mpu__nccl_p2p(const nccl_impl *m, const mpu__call *k) {
  size_t count = (size_t)k->sig.count;
  ncclDataType_t t = type_of((mpu_dtype)k->sig.dtype);
  if (mpu__coll_of(k->sig.kind)->p2p == MPU__CALL_SEND)
    return ncclSend(k->send, count, t, k->peer, m->comm, m->stream);
  return ncclRecv(k->recv, count, t, k->peer, m->comm, m->stream);
}

static mpu_result_t nccl_p2p(mpu_comm *c, const mpu__call *k) {
  const char *fn = mpu__coll_fn(k->sig.kind);
  MPU_CHECK(mpu__nccl_begin(c, fn));
  MPU_CHECK(mpu__nccl_enter(c, fn));
  mpu_result_t r = mpu__nccl_issued(c, mpu__nccl_p2p(impl_of(c), k), fn);
  mpu__nccl_leave(c);
  return r ? r : wait_enqueued(c, fn);
}

static mpu_result_t nccl_sendrecv(mpu_comm *c, const mpu__call *send, const mpu__call *recv) {
  static const char fn[] = "mpu_comm_sendrecv";
  nccl_impl *m = impl_of(c);
  MPU_CHECK(mpu__nccl_begin(c, fn));
  MPU_CHECK(mpu__nccl_enter(c, fn));
  ncclResult_t r = ncclGroupStart();
  ncclResult_t s = r ? r : mpu__nccl_p2p(m, send);
  ncclResult_t v = r || s ? ncclSuccess : mpu__nccl_p2p(m, recv);
  ncclResult_t e = r ? ncclSuccess : ncclGroupEnd(); /* always closes the group it opened */
  mpu_result_t res = mpu__nccl_issued(c, r ? r : s ? s : v ? v : e, fn);
  mpu__nccl_leave(c);
  return res ? res : wait_enqueued(c, fn);
}

/* ---- non-blocking: requests are events -------------------------------------------- */

static mpu_result_t nccl_start(mpu_comm *c, const mpu__call *k, void **handle) {
  const char *fn = mpu_collective_name((mpu_collective)k->sig.kind);
  nccl_request *q = NULL;
  MPU_CHECK(mpu__nccl_begin(c, fn));
  MPU_CHECK(mpu__nccl_request_new(fn, &q));
  mpu_result_t r = enqueue(c, k, fn);
  if (!r) r = mpu__nccl_event_record(c, q->event, fn); /* after ncclGroupEnd inside a group */
  q->captured = mpu__nccl_capturing(impl_of(c));
  if (r) {
    mpu__nccl_request_free(q);
    return r;
  }
  *handle = q;
  return MPU_SUCCESS;
}

static mpu_result_t nccl_test(mpu_comm *c, void *handle, int *done) {
  return mpu__nccl_test(c, handle, done);
}

static mpu_result_t nccl_wait(mpu_comm *c, void *handle, double timeout_s) {
  static const char fn[] = "mpu_request_wait";
  const nccl_request *q = handle;
  MPU_CHECK(mpu__nccl_usable(c, fn));
  if (q->captured) return MPU_SUCCESS; /* it runs when the graph does: nothing to wait for here */
  return mpu__nccl_watch(c, q->event, timeout_s, timeout_s >= 0, fn);
}

static void nccl_release(mpu_comm *c, void *handle) {
  (void)c;
  mpu__nccl_request_free(handle);
}

/* The caller's stream waits for the request's event; the host does not. */
static mpu_result_t nccl_stream_wait(mpu_comm *c, void *handle, void *stream) {
  static const char fn[] = "mpu_request_stream_wait";
  MPU_CHECK(mpu__nccl_usable(c, fn));
  return mpu__nccl_cuda_error(cudaStreamWaitEvent((cudaStream_t)stream, ((const nccl_request *)handle)->event, 0), fn);
}

/* ---- memory and streams ---------------------------------------------------------- */

/* What the memory at p is, for a message; 1 when this rank's NCCL kernels
 * may touch it at this address: device memory of its device, managed
 * memory, or page-locked host memory (cudaMallocHost, cudaHostRegister)
 * that the device maps at the host's own address. A device without
 * cudaDevAttrCanUseHostPointerForRegisteredMem maps registered memory
 * elsewhere: NCCL would be handed an address the GPU cannot use. */
static int usable_at(const void *p, int device, char *what, size_t n) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    /* a broken context: the call goes on and reports the context's error */
    cudaGetLastError();
    return 1;
  }
  switch (a.type) {
  case cudaMemoryTypeDevice:
    if (a.device == device) return 1;
    snprintf(what, n, "is device memory of device %d", a.device);
    return 0;
  case cudaMemoryTypeManaged: return 1;
  case cudaMemoryTypeHost:
    if (a.devicePointer == p) return 1;
    if (!a.devicePointer)
      snprintf(what, n, "is page-locked host memory that device %d cannot address", device);
    else
      snprintf(what, n,
               "is page-locked host memory that device %d maps at another address (%p: "
               "cudaHostGetDevicePointer)",
               device, a.devicePointer);
    return 0;
  default: snprintf(what, n, "is host memory not registered with CUDA"); return 0;
  }
}

/* NCCL checks no pointers (NCCL_CHECK_POINTERS=0): a host buffer would fault
 * the GPU and leave its context broken, so mpu asks CUDA first what the
 * memory at the start of the span is, then the driver where that allocation
 * ends: the whole span must lie in it (cudaMalloc's small blocks are often
 * adjacent, so a span running into the next one would pass a check of its
 * last byte). Where the driver has no answer (no entry point, or memory it
 * does not list, such as some host registrations), both ends are checked. */
static int nccl_check_buffer(const mpu_comm *c, const void *p, size_t bytes, char *why, size_t n) {
  int device = impl_of(c)->device;
  char what[224], last[160];
  uintptr_t base = 0;
  size_t size = 0;
  int ok = usable_at(p, device, what, sizeof what);
  if (ok) {
    int known = mpu__nccl_allocation(p, &base, &size);
    size_t off = (uintptr_t)p - base;
    if (known > 0 && (off > size || bytes > size - off)) {
      snprintf(what, sizeof what, "runs past the end of its allocation (%zu bytes at %p) by %zu bytes",
               size, (void *)base, bytes - (off > size ? 0 : size - off));
      ok = 0;
    } else if (known <= 0 && !usable_at((const char *)p + bytes - 1, device, last, sizeof last)) {
      snprintf(what, sizeof what, "runs past the end of its allocation: its last byte %s", last);
      ok = 0;
    }
  }
  if (ok) return 1;
  snprintf(why, n,
           "%s; NCCL on device %d takes device memory (mpu_comm_mem_alloc), managed or "
           "registered host memory",
           what, device);
  return 0;
}

static void nccl_caps(const mpu_comm *c, mpu_comm_caps *caps) {
  caps->device = impl_of(c)->device;
  caps->groups_by_split = !impl_of(c)->host; /* no twin to make groups among members */
  caps->memory = MPU_MEMORY_DEVICE;
  caps->streams = 1;
  caps->native_nonblocking = 1;
  caps->fault_detection = 1; /* the watchdog and asynchronous errors */
  caps->call_checking = 0;   /* NCCL cannot compare calls across ranks */
  caps->exact_reductions = 0;
  caps->nan_propagates = 0; /* NCCL's min/max are fminf/fmaxf */
  caps->exact_int_avg = 0;  /* NCCL's integer avg divides the sum wrapped in the element type */
}

static void *nccl_get_stream(const mpu_comm *c) { return impl_of(c)->stream; }

int mpu__nccl_capturing(const nccl_impl *m) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(m->stream, &st) != cudaSuccess) {
    cudaGetLastError(); /* not sticky; the call's own CUDA work reports what is wrong */
    return 0;
  }
  return st != cudaStreamCaptureStatusNone;
}

/* A stream: run the communicator's work on it, in its order, with no event
 * of mpu's in between. NULL: back to the default, a stream of the
 * communicator's own ordered after the legacy default stream. */
static mpu_result_t nccl_set_stream(mpu_comm *c, void *stream) {
  static const char fn[] = "mpu_comm_set_stream";
  nccl_impl *m = impl_of(c);
  MPU_CHECK(mpu__nccl_usable(c, fn));
  MPU_CHECK(wait_enqueued(c, fn)); /* the work issued so far ends on the old stream */
  if (!stream && !m->on_user_stream) return MPU_SUCCESS;
  cudaStream_t own = NULL;
  if (!stream) MPU_CHECK(mpu__nccl_cuda_error(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), fn));
  if (m->own_stream) cudaStreamDestroy(m->stream);
  m->stream = stream ? (cudaStream_t)stream : own;
  m->own_stream = !stream;
  m->on_user_stream = stream != NULL;
  return MPU_SUCCESS;
}

static mpu_result_t nccl_mem_alloc(mpu_comm *c, size_t bytes, void **out) {
  MPU_CHECK(mpu__nccl_cuda_error(cudaSetDevice(impl_of(c)->device), "mpu_comm_mem_alloc"));
  return mpu__nccl_cuda_error(cudaMalloc(out, bytes ? bytes : 1), "mpu_comm_mem_alloc");
}

static mpu_result_t nccl_mem_free(mpu_comm *c, void *p) {
  MPU_CHECK(mpu__nccl_cuda_error(cudaSetDevice(impl_of(c)->device), "mpu_comm_mem_free"));
  return mpu__nccl_cuda_error(cudaFree(p), "mpu_comm_mem_free");
}

/* The scratch buffer from CUDA's stream-ordered allocator on the
 * communicator's stream: the old one is released after the work that used
 * it, the new one is ready for the work after it, and neither waits for the
 * device as cudaFree may. */
static mpu_result_t nccl_scratch_resize(mpu_comm *c, void *old, size_t bytes, void **out) {
  static const char fn[] = "scratch buffer";
  nccl_impl *m = impl_of(c);
  *out = old; /* what the communicator still holds if this fails */
  MPU_CHECK(mpu__nccl_cuda_error(cudaSetDevice(m->device), fn));
  if (old) MPU_CHECK(mpu__nccl_cuda_error(cudaFreeAsync(old, m->stream), fn));
  *out = NULL;
  if (!bytes) return MPU_SUCCESS;
  return mpu__nccl_cuda_error(cudaMallocAsync(out, bytes, m->stream), fn);
}

static mpu_result_t nccl_copy2d_enqueue(mpu_comm *c, void *dst, size_t dpitch, const void *src,
                                        size_t spitch, size_t width, size_t height) {
  static const char fn[] = "mpu_comm_copy2d";
  nccl_impl *m = impl_of(c);
  MPU_CHECK(mpu__nccl_begin(c, fn));
  return mpu__nccl_cuda_error(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height,
                                                cudaMemcpyDefault, m->stream),
                              fn);
}

static mpu_result_t nccl_copy2d(mpu_comm *c, void *dst, size_t dpitch, const void *src,
                                size_t spitch, size_t width, size_t height) {
  MPU_CHECK(nccl_copy2d_enqueue(c, dst, dpitch, src, spitch, width, height));
  return wait_enqueued(c, "mpu_comm_copy2d");
}

/* The caller's later kernels (on the legacy default stream) wait for what
 * was enqueued so far, the host does not; the watchdog follows it. On the
 * caller's own stream (set_stream) stream order does it already. */
static mpu_result_t nccl_order_caller(mpu_comm *c) {
  static const char fn[] = "stream-ordered region";
  nccl_impl *m = impl_of(c);
  MPU_CHECK(mpu__nccl_usable(c, fn));
  if (!m->done)
    MPU_CHECK(mpu__nccl_cuda_error(cudaEventCreateWithFlags(&m->done, cudaEventDisableTiming), fn));
  MPU_CHECK(mpu__nccl_cuda_error(cudaEventRecord(m->done, m->stream), fn));
  MPU_CHECK(mpu__nccl_track(m, fn));
  if (m->on_user_stream) return MPU_SUCCESS;
  return mpu__nccl_cuda_error(cudaStreamWaitEvent(cudaStreamLegacy, m->done, 0), fn);
}

/* ---- scaling on the device --------------------------------------------------------- */

/* buf *= num / den on the rank's device (mpu__comm_scale) with NCCL's own
 * kernel: a pre-multiplying sum (ncclRedOpCreatePreMulSum) over a
 * communicator of this rank alone, which NCCL runs as its oneRankReduce
 * kernel, x * scalar in the dtype (enqueue.cc, ncclLaunchOneRank;
 * reduce_kernel.h, FuncPreMulSum). The one-rank communicator needs no peer
 * (ncclCommInitRank of one rank); it is made on first use and ends with c.
 * Before NCCL 2.29.7 that kernel leaves an odd tail unwritten (its blocks
 * of 16 KiB split the count rounding down: src/device/onerank.cu), so the
 * buffer goes in pieces it writes whole at every version: 512 KiB (32
 * blocks, a count each divides), then at most 16 KiB (one block). */
static mpu_result_t nccl_scale(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, int64_t num,
                               int64_t den) {
  static const char fn[] = "scaling on the device";
  nccl_impl *m = impl_of(c);
  union {
    uint16_t h;
    float f;
    double d;
  } k;
  double v = den == 1 ? (double)num : 1.0 / (double)den; /* as ncclAvg's float(1.0 / nRanks) */
  switch (dt) {
  case MPU_FLOAT16: k.h = mpu_float_to_half((float)v); break;
  case MPU_BFLOAT16: k.h = mpu_float_to_bfloat16((float)v); break;
  case MPU_FLOAT32: k.f = (float)v; break;
  default: k.d = v; break;
  }
  ncclDataType_t t = type_of(dt);
  size_t es = mpu_dtype_size(dt), big = ((size_t)512 << 10) / es, small = ((size_t)16 << 10) / es;
  MPU_CHECK(mpu__nccl_begin(c, fn));
  MPU_CHECK(mpu__nccl_enter(c, fn));
  ncclResult_t r = ncclSuccess;
  if (!m->local) {
    ncclUniqueId id;
    ncclComm_t made = NULL;
    r = ncclGetUniqueId(&id);
    if (!r) r = ncclCommInitRank(&made, 1, id, 0);
    m->local = r ? NULL : made;
  }
  ncclRedOp_t op = ncclSum;
  if (!r) r = ncclRedOpCreatePreMulSum(&op, &k, t, ncclScalarHostImmediate, m->local);
  if (!r) {
    char *p = buf;
    for (size_t done = 0, n; done < count && !r; done += n) {
      n = count - done >= big ? big : count - done < small ? count - done : small;
      r = ncclAllReduce(p + done * es, p + done * es, n, t, op, m->local, m->stream);
    }
    ncclResult_t d = ncclRedOpDestroy(op, m->local);
    if (!r) r = d;
  }
  mpu_result_t res = mpu__nccl_error(r, m->local, fn);
  mpu__nccl_leave(c);
  return res ? res : wait_enqueued(c, fn);
}

static mpu_result_t nccl_native(mpu_comm *c, const mpu__call *k) {
  /* mpu's calls are NCCL's: the raw call is the same enqueue, timed alike */
  return run(c, k, "raw NCCL call");
}

const mpu__comm_ops mpu__nccl_ops = {
    .name = "nccl",
    .start = nccl_start,
    .test = nccl_test,
    .wait = nccl_wait,
    .release = nccl_release,
    .send = nccl_p2p,
    .recv = nccl_p2p,
    .sendrecv = nccl_sendrecv,
    .create_group = mpu__nccl_create_group,
    .split = mpu__nccl_split,
    .abort = mpu__nccl_abort,
    .native = nccl_native,
    .host_twin = mpu__nccl_host_twin,
    .caps = nccl_caps,
    .get_stream = nccl_get_stream,
    .set_stream = nccl_set_stream,
    .mem_alloc = nccl_mem_alloc,
    .mem_free = nccl_mem_free,
    .scratch_resize = nccl_scratch_resize,
    .copy2d = nccl_copy2d,
    .copy2d_enqueue = nccl_copy2d_enqueue,
    .order_caller = nccl_order_caller,
    .scale = nccl_scale,
    .destroy = mpu__nccl_destroy,
    .check_buffer = nccl_check_buffer,
    .group_start = mpu__nccl_group_start,
    .group_end = mpu__nccl_group_end,
    .p2p_start = mpu__nccl_p2p_start,
    .native_handle = mpu__nccl_native_handle,
    .stream_wait = nccl_stream_wait,
};
