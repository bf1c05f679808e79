/*
 * cuda.c - the CUDA runtime of the test double (double.h): devices, memory,
 * streams that run their work in order on a worker thread each, events.
 */
#include "nccl_double/double.h"

static pthread_mutex_t streams_lock = PTHREAD_MUTEX_INITIALIZER; /* the list, legacy streams */
static cudaStream_t all_streams;
static pthread_mutex_t mark_lock = PTHREAD_MUTEX_INITIALIZER; /* every event and mark */
static pthread_cond_t mark_cond = PTHREAD_COND_INITIALIZER;

static void *worker_main(void *p) {
  cudaStream_t s = p;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->cond, &s->lock);
    if (!s->head && s->stop) break;
    task *t = s->head;
    s->head = t->next;
    if (!s->head) s->tail = NULL;
    s->busy = 1;
    pthread_mutex_unlock(&s->lock);
    t->run(t);
    free(t);
    pthread_mutex_lock(&s->lock);
    s->busy = 0;
    pthread_cond_broadcast(&s->cond);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

static void push_raw(cudaStream_t s, task *t) {
  pthread_mutex_lock(&s->lock);
  t->next = NULL;
  if (s->tail) s->tail->next = t;
  else s->head = t;
  s->tail = t;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

static int pending(cudaStream_t s) {
  pthread_mutex_lock(&s->lock);
  int p = s->head || s->busy;
  pthread_mutex_unlock(&s->lock);
  return p;
}

/* ---- marks: what a recorded event is, and what streams wait for ------------------ */

static void mark_unref(double_mark *m) { /* under mark_lock */
  if (m && --m->refs == 0) free(m);
}

typedef struct mark_task {
  task t;
  double_mark *m;
} mark_task;

static void mark_run(task *t) { /* the stream reached the record */
  double_mark *m = ((mark_task *)t)->m;
  pthread_mutex_lock(&mark_lock);
  m->done = 1;
  pthread_cond_broadcast(&mark_cond);
  mark_unref(m);
  pthread_mutex_unlock(&mark_lock);
}

static void wait_run(task *t) { /* the stream waits for another's record */
  double_mark *m = ((mark_task *)t)->m;
  pthread_mutex_lock(&mark_lock);
  while (!m->done) pthread_cond_wait(&mark_cond, &mark_lock);
  mark_unref(m);
  pthread_mutex_unlock(&mark_lock);
}

/* A record on `from` that `to` waits for (implicit legacy-stream ordering). */
static int link_streams(cudaStream_t from, cudaStream_t to) {
  mark_task *rec = calloc(1, sizeof *rec), *wait = calloc(1, sizeof *wait);
  double_mark *m = calloc(1, sizeof *m);
  if (!rec || !wait || !m) {
    free(rec), free(wait), free(m);
    return -1;
  }
  m->refs = 2;
  rec->t.run = mark_run, rec->m = m;
  wait->t.run = wait_run, wait->m = m;
  push_raw(from, &rec->t);
  push_raw(to, &wait->t);
  return 0;
}

/* Work on the legacy default stream waits for the blocking streams of its
 * device, and work on a blocking stream for the legacy one; non-blocking
 * streams wait for neither (CUDA's stream semantics). */
void double_push(cudaStream_t s, task *t) {
  if (!(s->flags & cudaStreamNonBlocking)) {
    pthread_mutex_lock(&streams_lock);
    for (cudaStream_t b = all_streams; b; b = b->next)
      if (b != s && b->device == s->device && !(b->flags & cudaStreamNonBlocking) &&
          b->legacy != s->legacy && pending(b))
        link_streams(b, s);
    pthread_mutex_unlock(&streams_lock);
  }
  push_raw(s, t);
}

static __thread int current_device;

int double_current_device(void) { return current_device; }

cudaError_t cudaGetDeviceCount(int *count) {
  const char *e = getenv("MPU_DOUBLE_GPUS");
  *count = e ? atoi(e) : 8;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  int n;
  cudaGetDeviceCount(&n);
  if (device < 0 || device >= n) return cudaErrorInvalidDevice;
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  *device = current_device;
  return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
  case cudaErrorHostMemoryAlreadyRegistered: return "part or all of the requested memory range is already mapped";
  case cudaErrorHostMemoryNotRegistered: return "pointer does not correspond to a registered memory region";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorIllegalState:
    return "the test double's stream-order checker refused the work (double_order_message)";
  default: return "error in the CUDA test double";
  }
}

/* memory: memory.c */

/* ---- streams ------------------------------------------------------------------ */

#define MAX_DEVICES 256
static cudaStream_t legacy_streams[MAX_DEVICES]; /* made on first use, kept to the end */
static pthread_key_t per_thread_key;
static pthread_once_t per_thread_once = PTHREAD_ONCE_INIT;
static __thread cudaStream_t *per_thread; /* [MAX_DEVICES] */

static cudaStream_t stream_new(unsigned flags, int device, int legacy) {
  cudaStream_t s = calloc(1, sizeof *s);
  if (!s) return NULL;
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, NULL);
  s->flags = flags, s->device = device, s->legacy = legacy;
  s->order = double_order_stream_new(device, !(flags & cudaStreamNonBlocking), legacy);
  if (!s->order || pthread_create(&s->worker, NULL, worker_main, s)) {
    double_order_stream_gone(s->order);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
    return NULL;
  }
  return s;
}

static void stream_end(cudaStream_t s) {
  pthread_mutex_lock(&streams_lock);
  for (cudaStream_t *p = &all_streams; *p; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      break;
    }
  pthread_mutex_unlock(&streams_lock);
  pthread_mutex_lock(&s->lock);
  s->stop = 1; /* as CUDA: the queued work finishes, then the stream goes */
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->worker, NULL);
  double_order_stream_gone(s->order);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  free(s);
}

static void per_thread_end(void *p) {
  cudaStream_t *streams = p;
  for (int d = 0; d < MAX_DEVICES; d++)
    if (streams[d]) stream_end(streams[d]);
  free(streams);
}

static void per_thread_key_make(void) { pthread_key_create(&per_thread_key, per_thread_end); }

cudaStream_t double_stream(cudaStream_t s) {
  int d = current_device;
  if (s && s != cudaStreamLegacy && s != cudaStreamPerThread) return s;
  if (d < 0 || d >= MAX_DEVICES) return NULL;
  if (s == cudaStreamPerThread) { /* a blocking stream of the thread's own */
    pthread_once(&per_thread_once, per_thread_key_make);
    if (!per_thread) {
      per_thread = calloc(MAX_DEVICES, sizeof *per_thread);
      if (!per_thread) return NULL;
      pthread_setspecific(per_thread_key, per_thread);
    }
    if (!per_thread[d] && (per_thread[d] = stream_new(0, d, 0))) {
      pthread_mutex_lock(&streams_lock);
      per_thread[d]->next = all_streams, all_streams = per_thread[d];
      pthread_mutex_unlock(&streams_lock);
    }
    return per_thread[d];
  }
  pthread_mutex_lock(&streams_lock); /* NULL, cudaStreamLegacy: the device's legacy stream */
  if (!legacy_streams[d] && (legacy_streams[d] = stream_new(0, d, 1)))
    legacy_streams[d]->next = all_streams, all_streams = legacy_streams[d];
  cudaStream_t l = legacy_streams[d];
  pthread_mutex_unlock(&streams_lock);
  return l;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
  if (!out || (flags & ~(unsigned)cudaStreamNonBlocking)) return cudaErrorInvalidValue;
  cudaError_t e = double_sticky(double_current_device());
  if (e) return e;
  cudaStream_t s = stream_new(flags, current_device, 0);
  if (!s) return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&streams_lock);
  s->next = all_streams, all_streams = s;
  pthread_mutex_unlock(&streams_lock);
  *out = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, 0); }

cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int *flags) {
  s = double_stream(s);
  if (!s || !flags) return cudaErrorInvalidValue;
  *flags = s->flags;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) return cudaErrorInvalidResourceHandle;
  stream_end(s);
  return cudaSuccess;
}

/* No graphs, so no capture mode to exchange; the old mode is "global". */
cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  if (!mode) return cudaErrorInvalidValue;
  *mode = cudaStreamCaptureModeGlobal;
  return cudaSuccess;
}

/* The double has no graphs: no stream is ever capturing (graph capture is
 * proven on a GPU: scripts/gpu-test.sh, gpu_checks graph). */
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status) {
  if (!status) return cudaErrorInvalidValue;
  if (!double_stream(s)) return cudaErrorInvalidResourceHandle;
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  s = double_stream(s);
  if (!s) return cudaErrorInvalidResourceHandle;
  cudaError_t e = double_sticky(s->device);
  if (e) return e;
  pthread_mutex_lock(&s->lock);
  s->queries++;
  int idle = !s->head && !s->busy;
  if (idle) double_order_host_after(s->order); /* the host saw it finish */
  pthread_mutex_unlock(&s->lock);
  return idle ? cudaSuccess : cudaErrorNotReady;
}

/* How many times cudaStreamQuery asked about s: a test checks that mpu
 * never polls a stream that may hold the caller's kernels. */
long double_stream_queries(cudaStream_t s) {
  s = double_stream(s);
  if (!s) return -1;
  pthread_mutex_lock(&s->lock);
  long n = s->queries;
  pthread_mutex_unlock(&s->lock);
  return n;
}

static void drain(cudaStream_t s, int host_after) {
  pthread_mutex_lock(&s->lock);
  while (s->head || s->busy) pthread_cond_wait(&s->cond, &s->lock);
  if (host_after) double_order_host_after(s->order);
  pthread_mutex_unlock(&s->lock);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  s = double_stream(s);
  if (!s) return cudaErrorInvalidResourceHandle;
  drain(s, 1);
  return cudaSuccess;
}

/* Every stream of the device idle. The list's lock is not held while
 * waiting (other threads enqueue meanwhile): a mark on a busy stream is
 * waited for, then the list looked at again. */
cudaError_t cudaDeviceSynchronize(void) {
  int d = current_device;
  for (;;) {
    mark_task *t = calloc(1, sizeof *t);
    double_mark *m = calloc(1, sizeof *m);
    if (!t || !m) {
      free(t), free(m);
      return cudaErrorMemoryAllocation;
    }
    m->refs = 2;
    t->t.run = mark_run, t->m = m;
    pthread_mutex_lock(&streams_lock);
    cudaStream_t busy = all_streams;
    while (busy && (busy->device != d || !pending(busy))) busy = busy->next;
    if (busy) push_raw(busy, &t->t);
    else double_order_host_after_device(d); /* all of them seen idle */
    pthread_mutex_unlock(&streams_lock);
    if (!busy) {
      free(t), free(m);
      return cudaSuccess;
    }
    pthread_mutex_lock(&mark_lock);
    while (!m->done) pthread_cond_wait(&mark_cond, &mark_lock);
    mark_unref(m);
    pthread_mutex_unlock(&mark_lock);
  }
}

/* ---- events ----------------------------------------------------------------------- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags) {
  (void)flags;
  if (!out) return cudaErrorInvalidValue;
  *out = calloc(1, sizeof **out);
  return *out ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventCreate(cudaEvent_t *out) { return cudaEventCreateWithFlags(out, 0); }

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  s = double_stream(s);
  if (!ev || !s) return cudaErrorInvalidResourceHandle;
  cudaError_t e = double_sticky(s->device);
  if (e) return e;
  mark_task *t = calloc(1, sizeof *t);
  double_mark *m = calloc(1, sizeof *m);
  if (!t || !m) {
    free(t), free(m);
    return cudaErrorMemoryAllocation;
  }
  m->refs = 2; /* the event's and the task's */
  t->t.run = mark_run, t->m = m;
  pthread_mutex_lock(&mark_lock);
  mark_unref(ev->mark);
  ev->mark = m;
  double_order_record(s->order, &ev->order);
  pthread_mutex_unlock(&mark_lock);
  double_push(s, &t->t);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
  if (!ev) return cudaErrorInvalidResourceHandle;
  cudaError_t e = double_sticky(double_current_device());
  if (e) return e;
  pthread_mutex_lock(&mark_lock);
  int done = !ev->mark || ev->mark->done; /* never recorded: complete, as CUDA */
  if (done) double_order_host_after_clock(ev->order);
  pthread_mutex_unlock(&mark_lock);
  return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  if (!ev) return cudaErrorInvalidResourceHandle;
  pthread_mutex_lock(&mark_lock);
  double_mark *m = ev->mark;
  if (m) {
    m->refs++;
    while (!m->done) pthread_cond_wait(&mark_cond, &mark_lock);
    mark_unref(m);
  }
  double_order_host_after_clock(ev->order);
  pthread_mutex_unlock(&mark_lock);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags) {
  (void)flags;
  s = double_stream(s);
  if (!s || !ev) return cudaErrorInvalidResourceHandle;
  mark_task *t = calloc(1, sizeof *t);
  if (!t) return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&mark_lock);
  double_mark *m = ev->mark; /* the state at the call, as CUDA: a later record does not count */
  if (m) m->refs++;
  double_order_wait(s->order, ev->order);
  pthread_mutex_unlock(&mark_lock);
  if (!m) { /* never recorded: nothing to wait for */
    free(t);
    return cudaSuccess;
  }
  t->t.run = wait_run, t->m = m;
  double_push(s, &t->t);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  if (!ev) return cudaErrorInvalidResourceHandle;
  pthread_mutex_lock(&mark_lock); /* streams waiting for it keep its mark */
  mark_unref(ev->mark);
  double_order_clock_free(ev->order);
  pthread_mutex_unlock(&mark_lock);
  free(ev);
  return cudaSuccess;
}

/* ---- copies and memsets: the double's kernels ------------------------------------- */

typedef struct copy_task {
  task t;
  void *dst;
  const void *src;
  size_t dpitch, spitch, width, height;
  int value; /* memset: src is NULL */
  char *staged; /* the source as it was at the call (pageable memory), or NULL */
} copy_task;

static void copy_run(task *t) {
  copy_task *c = (copy_task *)t;
  char *dst = double_mem_view(c->dst); /* device memory: the double's mapping of it */
  const char *src = c->src ? double_mem_view(c->src) : NULL;
  for (size_t i = 0; i < c->height; i++)
    if (src) memmove(dst + i * c->dpitch, src + i * c->spitch, c->width);
    else memset(dst + i * c->dpitch, c->value, c->width);
  free(c->staged);
}

/* A copy that starts in device memory and runs past its allocation is
 * cudaErrorInvalidValue, as CUDA's (the double would touch unmapped pages). */
static int outside_device_allocation(const double_span *r) {
  double_alloc a;
  if (!r->bytes || !double_mem_find(r->p, 0, &a) || a.type != cudaMemoryTypeDevice) return 0;
  return !double_mem_find(r->p, r->bytes, &a);
}

/* An async copy from pageable host memory (neither allocated nor registered
 * with CUDA) is staged through a pinned buffer when it is called: the source
 * is read then, not when the stream reaches the copy (the runtime API's
 * synchronisation notes; switch "pageable": read late). 0, or -1 when out
 * of memory. */
static int stage_pageable(copy_task *t, const double_span *r) {
  double_alloc a;
  if (!t->src || !r->bytes || double_forgives(DOUBLE_FORGIVE_PAGEABLE) ||
      double_mem_find(t->src, r->bytes, &a))
    return 0;
  t->staged = malloc(r->bytes);
  if (!t->staged) return -1;
  memcpy(t->staged, t->src, r->bytes);
  t->src = t->staged;
  return 0;
}

/* The bytes a 2D region spans; 0 if it does not fit in the address space. */
static int span_of(const void *p, size_t pitch, size_t width, size_t height, double_span *out) {
  out->p = p;
  out->bytes = 0;
  if (!width || !height) return 0;
  if (pitch < width || (height - 1) > (SIZE_MAX - width) / pitch) return -1;
  out->bytes = (height - 1) * pitch + width;
  return 0;
}

static cudaError_t enqueue_copy(cudaStream_t s, const char *what, void *dst, size_t dpitch,
                                const void *src, size_t spitch, size_t width, size_t height,
                                int value) {
  double_span r = {NULL, 0}, w;
  if (!s) return cudaErrorInvalidResourceHandle;
  cudaError_t e = double_sticky(s->device);
  if (e) return e;
  if (span_of(dst, dpitch, width, height, &w) || (src && span_of(src, spitch, width, height, &r)))
    return cudaErrorInvalidValue;
  if (outside_device_allocation(&w) || outside_device_allocation(&r)) return cudaErrorInvalidValue;
  if (double_order_access(s->order, what, &r, src ? 1 : 0, &w, 1)) return cudaErrorIllegalState;
  copy_task *t = calloc(1, sizeof *t);
  if (!t) return cudaErrorMemoryAllocation;
  *t = (copy_task){{NULL, copy_run, NULL, NULL}, dst, src, dpitch, spitch, width, height, value, NULL};
  if (stage_pageable(t, &r)) {
    free(t);
    return cudaErrorMemoryAllocation;
  }
  double_push(s, &t->t);
  return cudaSuccess;
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s) {
  (void)kind;
  return enqueue_copy(double_stream(s), "cudaMemcpy2DAsync", dst, dpitch, src, spitch, width,
                      height, 0);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t s) {
  (void)kind;
  return enqueue_copy(double_stream(s), "cudaMemcpyAsync", dst, count, src, count, count, 1, 0);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t count, cudaStream_t s) {
  return enqueue_copy(double_stream(s), "cudaMemsetAsync", dst, count, NULL, count, count, 1,
                      value);
}

/* As CUDA's: on the legacy default stream, and asynchronous to the host
 * unless the target is host memory. */
cudaError_t cudaMemset(void *dst, int value, size_t count) {
  return cudaMemsetAsync(dst, value, count, NULL);
}

/* As CUDA's: on the legacy default stream, after the work before it there.
 * From pageable host memory to the device it returns once the source is
 * staged, "but the DMA to final destination may not have completed" (the
 * CUDA runtime's API synchronisation notes): the host is not ordered after
 * the write. Every other direction returns when the copy is complete. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  cudaStream_t l = double_stream(NULL);
  if (!l) return cudaErrorInvalidResourceHandle;
  int from_host = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost ||
                  (kind == cudaMemcpyDefault && !double_order_tracked(src));
  int to_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice ||
                  (kind == cudaMemcpyDefault && double_order_tracked(dst));
  drain(l, 1);
  cudaError_t e = enqueue_copy(l, "cudaMemcpy", dst, count, src, count, count, 1, 0);
  if (e) return e;
  drain(l, !(from_host && to_device)); /* the double completes it anyway */
  return cudaSuccess;
}
