/*
 * double.c - a test double for the subset of the CUDA runtime and NCCL that
 * src/comm/nccl.c uses, over host memory, for ranks that are threads of one
 * process. Only tests link it (libmpu_nccl_double); it is never installed.
 * The NCCL backend is compiled once, against the real headers; linked with
 * this file instead of libcudart and libnccl it runs on any CPU.
 *
 * What it keeps of NCCL's and CUDA's documented behaviour:
 *   - device memory is memory the "device" owns (here: the heap);
 *   - a stream runs its work in order, asynchronously to the host: each
 *     stream has a worker thread; events complete when the worker reaches
 *     them; cudaStreamQuery says cudaErrorNotReady while work is queued;
 *   - ncclCommInitRank blocks until all ranks of the id have joined;
 *   - a collective completes when every rank's stream has reached it;
 *     in-place forms as NCCL defines them (recvbuff == sendbuff, and the
 *     rank's block for all_gather / reduce_scatter);
 *   - ncclSend/ncclRecv match per (peer, order); group calls may hold both;
 *   - ncclCommAbort stops the communicator's pending work, and its peers'
 *     pending collectives end with ncclRemoteError (their async error), so a
 *     watchdog can recover from a peer that never comes.
 * Reductions fold in rank order (NCCL's own order is a ring or tree; tests of
 * the backend use exactly representable values).
 */
#include <cuda_runtime.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- streams: a worker thread each -------------------------------------------- */

typedef struct task {
  struct task *next;
  void (*run)(struct task *);
  void (*drop)(struct task *); /* the communicator was aborted before it ran */
  struct ncclComm *comm;        /* NULL for copies and events */
} task;

struct CUstream_st {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  task *head, *tail;
  int busy, stop;
  pthread_t worker;
};

struct CUevent_st {
  int pending; /* atomics not needed: set under the stream lock, read under it */
  cudaStream_t stream;
};

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

static void push(cudaStream_t s, task *t) {
  pthread_mutex_lock(&s->lock);
  t->next = NULL;
  if (s->tail) s->tail->next = t;
  else s->head = t;
  s->tail = t;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
}

static __thread int current_device;

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
  default: return "error in the CUDA test double";
  }
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
  *p = calloc(bytes ? bytes : 1, 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaMallocManaged(void **p, size_t bytes, unsigned int flags) {
  (void)flags;
  return cudaMalloc(p, bytes);
}

cudaError_t cudaFree(void *p) {
  free(p);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
  (void)flags;
  cudaStream_t s = calloc(1, sizeof *s);
  if (!s) return cudaErrorMemoryAllocation;
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, NULL);
  if (pthread_create(&s->worker, NULL, worker_main, s)) {
    free(s);
    return cudaErrorMemoryAllocation;
  }
  *out = s;
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  pthread_mutex_lock(&s->lock);
  int idle = !s->head && !s->busy;
  pthread_mutex_unlock(&s->lock);
  return idle ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  pthread_mutex_lock(&s->lock);
  s->stop = 1; /* as CUDA: the queued work finishes, then the stream goes */
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->worker, NULL);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  free(s);
  return cudaSuccess;
}

typedef struct event_task {
  task t;
  cudaEvent_t ev;
} event_task;

static void event_run(task *t) {
  cudaEvent_t ev = ((event_task *)t)->ev;
  pthread_mutex_lock(&ev->stream->lock);
  ev->pending--;
  pthread_mutex_unlock(&ev->stream->lock);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags) {
  (void)flags;
  *out = calloc(1, sizeof **out);
  return *out ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  event_task *t = calloc(1, sizeof *t);
  if (!t) return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&s->lock);
  ev->stream = s;
  ev->pending++;
  pthread_mutex_unlock(&s->lock);
  t->t.run = event_run;
  t->ev = ev;
  push(s, &t->t);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
  if (!ev->stream) return cudaSuccess;
  pthread_mutex_lock(&ev->stream->lock);
  int pending = ev->pending;
  pthread_mutex_unlock(&ev->stream->lock);
  return pending ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  /* CUDA lets an event be destroyed while recorded work is pending; wait
   * here so the worker never touches freed memory */
  while (cudaEventQuery(ev) == cudaErrorNotReady) sched_yield();
  free(ev);
  return cudaSuccess;
}

typedef struct copy_task {
  task t;
  void *dst;
  const void *src;
  size_t dpitch, spitch, width, height;
} copy_task;

static void copy_run(task *t) {
  copy_task *c = (copy_task *)t;
  for (size_t i = 0; i < c->height; i++)
    memmove((char *)c->dst + i * c->dpitch, (const char *)c->src + i * c->spitch, c->width);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t s) {
  (void)kind;
  if (dpitch < width || spitch < width) return cudaErrorInvalidValue;
  copy_task *t = calloc(1, sizeof *t);
  if (!t) return cudaErrorMemoryAllocation;
  *t = (copy_task){{NULL, copy_run, NULL, NULL}, dst, src, dpitch, spitch, width, height};
  push(s, &t->t);
  return cudaSuccess;
}

/* ---- NCCL: cliques of ranks that share an id -------------------------------------- */

/* A send waiting for its recv: NCCL's point to point is a rendezvous (the
 * send completes when the peer receives), not an eager copy. */
typedef struct offer {
  struct offer *next;
  int src;
  size_t bytes;
  const void *data;
  int taken; /* 1: copied by the receiver; -1: the size differed */
} offer;

typedef struct slot {
  int kind;
  const void *send;
  void *recv;
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
  int root;
} slot;

typedef struct clique {
  struct clique *next;
  ncclUniqueId id;
  int n, joined, refs, aborted;
  int duplicate;   /* two ranks on one device: NCCL refuses the communicator */
  int *devices;    /* [n] */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  uint64_t generation;
  int arrived;
  slot *slots;
  offer **boxes; /* [n]: sends waiting for rank i to receive them */
} clique;

struct ncclComm {
  clique *q;
  int rank;
  int aborted;
  ncclResult_t async;
  int inflight; /* tasks queued or running, under q->lock */
};

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static clique *cliques;
static void release(ncclComm_t c);
static int meet(struct clique *q);
static __thread char last_error[256];

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return last_error;
}

ncclResult_t ncclGetVersion(int *version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  static uint64_t counter;
  pthread_mutex_lock(&registry_lock);
  uint64_t k = ++counter;
  pthread_mutex_unlock(&registry_lock);
  memset(id, 0, sizeof *id);
  uint64_t stamp[3] = {k, (uint64_t)getpid(), (uint64_t)time(NULL)};
  memcpy(id->internal, stamp, sizeof stamp);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    snprintf(last_error, sizeof last_error, "rank %d of %d", rank, nranks);
    return ncclInvalidArgument;
  }
  ncclComm_t c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  pthread_mutex_lock(&registry_lock);
  clique *q = cliques;
  while (q && memcmp(&q->id, &id, sizeof id)) q = q->next;
  if (!q) {
    q = calloc(1, sizeof *q);
    if (q) {
      q->slots = calloc((size_t)nranks, sizeof *q->slots);
      q->boxes = calloc((size_t)nranks, sizeof *q->boxes);
      q->devices = calloc((size_t)nranks, sizeof *q->devices);
    }
    if (!q || !q->slots || !q->boxes || !q->devices) {
      if (q) free(q->slots), free(q->boxes), free(q->devices);
      free(q);
      free(c);
      pthread_mutex_unlock(&registry_lock);
      return ncclSystemError;
    }
    q->id = id;
    q->n = nranks;
    for (int i = 0; i < nranks; i++) q->devices[i] = -1;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
    q->next = cliques;
    cliques = q;
  }
  if (q->n != nranks) {
    pthread_mutex_unlock(&registry_lock);
    free(c);
    snprintf(last_error, sizeof last_error, "nranks %d differs from the id's %d", nranks, q->n);
    return ncclInvalidUsage;
  }
  q->refs++;
  pthread_mutex_unlock(&registry_lock);
  c->q = q;
  c->rank = rank;
  pthread_mutex_lock(&q->lock); /* block until every rank has joined, as NCCL */
  for (int i = 0; i < q->n; i++)
    if (q->devices[i] == current_device) q->duplicate = 1;
  q->devices[rank] = current_device;
  q->joined++;
  pthread_cond_broadcast(&q->cond);
  while (q->joined < q->n) pthread_cond_wait(&q->cond, &q->lock);
  int dup = q->duplicate;
  pthread_mutex_unlock(&q->lock);
  if (dup) {
    snprintf(last_error, sizeof last_error,
             "Duplicate GPU detected: two ranks of one communicator on one device");
    release(c);
    return ncclInvalidUsage;
  }
  *out = c;
  return ncclSuccess;
}

static void release(ncclComm_t c) {
  clique *q = c->q;
  pthread_mutex_lock(&registry_lock);
  int last = --q->refs == 0;
  if (last)
    for (clique **p = &cliques; *p; p = &(*p)->next)
      if (*p == q) {
        *p = q->next;
        break;
      }
  pthread_mutex_unlock(&registry_lock);
  if (last) {
    free(q->boxes); /* offers live on their senders' stacks */
    free(q->devices);
    free(q->slots);
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->cond);
    free(q);
  }
  free(c);
}

/* Wait until this communicator's tasks have all run. */
static void drain(ncclComm_t c) {
  pthread_mutex_lock(&c->q->lock);
  while (c->inflight) pthread_cond_wait(&c->q->cond, &c->q->lock);
  pthread_mutex_unlock(&c->q->lock);
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  drain(c);
  release(c);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclSuccess;
  clique *q = c->q;
  pthread_mutex_lock(&q->lock);
  c->aborted = 1;
  q->aborted = 1; /* peers blocked on this rank give up with ncclRemoteError */
  pthread_cond_broadcast(&q->cond);
  pthread_mutex_unlock(&q->lock);
  drain(c);
  release(c);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
  if (!c || !err) return ncclInvalidArgument;
  pthread_mutex_lock(&c->q->lock);
  *err = c->async;
  pthread_mutex_unlock(&c->q->lock);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
  *count = c->q->n;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
  *rank = c->rank;
  return ncclSuccess;
}

/* Split: every rank of the parent calls it (collective, in order); ranks of
 * one color form a new clique ordered by key, then parent rank. */
ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *cfg) {
  (void)cfg;
  if (!c || !out) return ncclInvalidArgument;
  clique *q = c->q;
  int n = q->n, me = c->rank;
  /* the host thread meets its peers through the slots, as the workers do */
  q->slots[me] = (slot){-1, NULL, NULL, (size_t)(unsigned)color, ncclInt32, ncclSum, key};
  if (meet(q)) return ncclRemoteError;
  int *colors = malloc((size_t)n * sizeof(int)), *keys = malloc((size_t)n * sizeof(int));
  if (!colors || !keys) {
    free(colors), free(keys);
    return ncclSystemError;
  }
  for (int r = 0; r < n; r++) colors[r] = (int)(unsigned)q->slots[r].count, keys[r] = q->slots[r].root;
  uint64_t split_no = q->generation; /* the same on every rank: names the new cliques */
  if (meet(q)) {
    free(colors), free(keys);
    return ncclRemoteError;
  }
  *out = NULL;
  if (color == NCCL_SPLIT_NOCOLOR) {
    free(colors), free(keys);
    return ncclSuccess;
  }
  int size = 0, rank = 0;
  for (int r = 0; r < n; r++) {
    if (colors[r] != color) continue;
    size++;
    if (keys[r] < key || (keys[r] == key && r < me)) rank++;
  }
  free(colors), free(keys);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  uint64_t name[3] = {(uint64_t)(uintptr_t)q, split_no, (uint64_t)(unsigned)color};
  memcpy(id.internal, name, sizeof name);
  id.internal[sizeof name] = 1; /* never equal to an id from ncclGetUniqueId */
  return ncclCommInitRank(out, size, id, rank);
}

/* Group calls: point-to-point calls issued between ncclGroupStart and
 * ncclGroupEnd on one thread are held and go to the stream as one task. */
typedef struct coll_task coll_task;
static __thread int depth;
static __thread coll_task *held;
static __thread cudaStream_t held_stream;
static void submit(coll_task *k, cudaStream_t stream);

ncclResult_t ncclGroupStart(void) {
  depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (depth <= 0) return ncclInvalidUsage;
  if (--depth == 0 && held) {
    coll_task *k = held;
    held = NULL;
    submit(k, held_stream);
  }
  return ncclSuccess;
}

/* ---- running collectives on the workers ------------------------------------------ */

/* Meet every rank of the clique; 0, or -1 if the clique was aborted. */
static int meet(clique *q) {
  pthread_mutex_lock(&q->lock);
  uint64_t gen = q->generation;
  if (++q->arrived == q->n) {
    q->arrived = 0;
    q->generation++;
    pthread_cond_broadcast(&q->cond);
  } else {
    while (gen == q->generation && !q->aborted) pthread_cond_wait(&q->cond, &q->lock);
  }
  int bad = q->aborted && gen == q->generation;
  pthread_mutex_unlock(&q->lock);
  return bad ? -1 : 0;
}

static size_t type_size(ncclDataType_t t) {
  switch (t) {
  case ncclInt8: case ncclUint8: return 1;
  case ncclFloat16: case ncclBfloat16: return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
  default: return 8;
  }
}

static float half_in(uint16_t h) {
  int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(1024 + m), e - 25);
  return h & 0x8000 ? -v : v;
}

/* float -> binary16 or bfloat16, nearest even (the double's own rounding) */
static uint16_t narrow(float f, int bf) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  if (bf) {
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
  }
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  if (isnan(f)) return sign | 0x7e00;
  float a = fabsf(f);
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < ldexpf(1, -14)) { /* subnormal: units of 2^-24, nearest even */
    float u = a * 16777216.0f, r = nearbyintf(u);
    return sign | (uint16_t)r;
  }
  int e;
  float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  float scaled = nearbyintf(ldexpf(m, 11)); /* 11 bits of mantissa, nearest even */
  if (scaled >= 2048.0f) scaled /= 2, e++;
  return sign | (uint16_t)(((e + 14) << 10) | ((int)scaled - 1024));
}

static double load(ncclDataType_t t, const void *p, size_t i) {
  switch (t) {
  case ncclFloat32: return ((const float *)p)[i];
  case ncclFloat64: return ((const double *)p)[i];
  case ncclFloat16: return half_in(((const uint16_t *)p)[i]);
  case ncclBfloat16: {
    uint32_t x = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
  }
  default: return 0;
  }
}

/* out[i] = fold over ranks of src(k)[i] */
static void fold(ncclDataType_t t, ncclRedOp_t op, int n, const void *const *src, void *out,
                 size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (t == ncclUint64) { /* unsigned: compared and divided as such */
      uint64_t acc = 0, x;
      for (int k = 0; k < n; k++) {
        x = ((const uint64_t *)src[k])[i];
        if (!k) acc = x;
        else if (op == ncclSum || op == ncclAvg) acc += x;
        else if (op == ncclProd) acc *= x;
        else if (op == ncclMin) acc = x < acc ? x : acc;
        else acc = x > acc ? x : acc;
      }
      if (op == ncclAvg) acc /= (uint64_t)n;
      ((uint64_t *)out)[i] = acc;
      continue;
    }
    if (t == ncclInt8 || t == ncclUint8 || t == ncclInt32 || t == ncclUint32 || t == ncclInt64) {
      int64_t acc = 0, x;
      for (int k = 0; k < n; k++) {
        x = t == ncclInt8     ? ((const int8_t *)src[k])[i]
            : t == ncclUint8  ? ((const uint8_t *)src[k])[i]
            : t == ncclInt32  ? ((const int32_t *)src[k])[i]
            : t == ncclUint32 ? ((const uint32_t *)src[k])[i]
                              : ((const int64_t *)src[k])[i];
        if (!k) acc = x;
        else if (op == ncclSum || op == ncclAvg) acc = (int64_t)((uint64_t)acc + (uint64_t)x);
        else if (op == ncclProd) acc = (int64_t)((uint64_t)acc * (uint64_t)x);
        else if (op == ncclMin) acc = x < acc ? x : acc;
        else acc = x > acc ? x : acc;
      }
      if (op == ncclAvg) acc /= n;
      if (t == ncclInt32 || t == ncclUint32) ((uint32_t *)out)[i] = (uint32_t)(uint64_t)acc;
      else if (t == ncclInt64) ((int64_t *)out)[i] = acc;
      else ((uint8_t *)out)[i] = (uint8_t)(uint64_t)acc;
      continue;
    }
    double acc = 0;
    for (int k = 0; k < n; k++) {
      double x = load(t, src[k], i);
      if (!k) acc = x;
      else if (op == ncclSum || op == ncclAvg) acc = t == ncclFloat64 ? acc + x : (double)((float)acc + (float)x);
      else if (op == ncclProd) acc = t == ncclFloat64 ? acc * x : (double)((float)acc * (float)x);
      else if (op == ncclMin) acc = x < acc ? x : acc;
      else acc = x > acc ? x : acc;
    }
    if (op == ncclAvg) acc = t == ncclFloat64 ? acc / n : (double)((float)acc / (float)n);
    if (t == ncclFloat32) ((float *)out)[i] = (float)acc;
    else if (t == ncclFloat64) ((double *)out)[i] = acc;
    else ((uint16_t *)out)[i] = narrow((float)acc, t == ncclBfloat16);
  }
}

enum { K_ALL_REDUCE, K_ALL_GATHER, K_REDUCE_SCATTER, K_BROADCAST, K_REDUCE, K_ALL_TO_ALL, K_SEND, K_RECV };

typedef struct coll_task {
  task t;
  slot s;
  int peer;
  struct coll_task *more; /* a group: the calls issued between ncclGroupStart and End */
} coll_task;

static void fail(ncclComm_t c, ncclResult_t r) {
  pthread_mutex_lock(&c->q->lock);
  if (c->async == ncclSuccess) c->async = r;
  pthread_mutex_unlock(&c->q->lock);
}

static void done(ncclComm_t c) {
  pthread_mutex_lock(&c->q->lock);
  c->inflight--;
  pthread_cond_broadcast(&c->q->cond);
  pthread_mutex_unlock(&c->q->lock);
}

/* Post a send for the peer to take. */
static void post(ncclComm_t c, offer *o, int peer) {
  clique *q = c->q;
  pthread_mutex_lock(&q->lock);
  offer **p = &q->boxes[peer];
  while (*p) p = &(*p)->next;
  *p = o;
  pthread_cond_broadcast(&q->cond);
  pthread_mutex_unlock(&q->lock);
}

/* Wait until the peer took the send (or the clique was aborted). */
static void await_taken(ncclComm_t c, offer *o, int peer) {
  clique *q = c->q;
  pthread_mutex_lock(&q->lock);
  while (!o->taken && !q->aborted) pthread_cond_wait(&q->cond, &q->lock);
  if (!o->taken) { /* aborted: withdraw it */
    for (offer **p = &q->boxes[peer]; *p; p = &(*p)->next)
      if (*p == o) {
        *p = o->next;
        break;
      }
  }
  int taken = o->taken;
  pthread_mutex_unlock(&q->lock);
  if (taken <= 0) fail(c, taken < 0 ? ncclInvalidUsage : ncclRemoteError);
}

/* Take the oldest send from src into buf. */
static void take(ncclComm_t c, int src, void *buf, size_t bytes) {
  clique *q = c->q;
  pthread_mutex_lock(&q->lock);
  for (;;) {
    offer **p = &q->boxes[c->rank];
    while (*p && (*p)->src != src) p = &(*p)->next;
    if (*p) {
      offer *o = *p;
      *p = o->next;
      int ok = o->bytes == bytes; /* NCCL's behaviour is undefined; the double reports it */
      if (ok) memcpy(buf, o->data, bytes);
      o->taken = ok ? 1 : -1; /* the sender may free o as soon as the lock is dropped */
      pthread_cond_broadcast(&q->cond);
      pthread_mutex_unlock(&q->lock);
      if (!ok) fail(c, ncclInvalidUsage);
      return;
    }
    if (q->aborted) break;
    pthread_cond_wait(&q->cond, &q->lock);
  }
  pthread_mutex_unlock(&q->lock);
  fail(c, ncclRemoteError);
}

static void coll_run(task *t) {
  coll_task *k = (coll_task *)t;
  ncclComm_t c = t->comm;
  clique *q = c->q;
  int n = q->n, me = c->rank;
  if (c->aborted || c->async) { /* work after a failure is dropped, as NCCL's */
    done(c);
    return;
  }
  if (k->s.kind == K_SEND || k->s.kind == K_RECV || k->more) {
    /* point to point, alone or as a group: every send is offered first, then
     * every recv taken, then the sends wait to be taken, so the calls of a
     * group progress together as NCCL's do */
    int m = 0;
    for (coll_task *g = k; g; g = g->more) m++;
    offer *offers = calloc((size_t)m, sizeof *offers);
    if (!offers) {
      fail(c, ncclSystemError);
    } else {
      int i = 0;
      for (coll_task *g = k; g; g = g->more, i++)
        if (g->s.kind == K_SEND) {
          offers[i] = (offer){NULL, c->rank, g->s.count * type_size(g->s.type), g->s.send, 0};
          post(c, &offers[i], g->peer);
        }
      for (coll_task *g = k; g; g = g->more)
        if (g->s.kind == K_RECV) take(c, g->peer, g->s.recv, g->s.count * type_size(g->s.type));
      i = 0;
      for (coll_task *g = k; g; g = g->more, i++)
        if (g->s.kind == K_SEND) await_taken(c, &offers[i], g->peer);
      free(offers);
    }
    for (coll_task *g = k->more, *next; g; g = next) next = g->more, free(g);
    done(c);
    return;
  }
  q->slots[me] = k->s;
  if (meet(q)) {
    fail(c, ncclRemoteError);
    done(c);
    return;
  }
  const slot *s = &k->s;
  size_t es = type_size(s->type), bytes = s->count * es;
  size_t out_bytes = s->kind == K_ALL_GATHER || s->kind == K_ALL_TO_ALL ? bytes * (size_t)n : bytes;
  char *tmp = malloc(out_bytes ? out_bytes : 1);
  const void **src = malloc((size_t)n * sizeof *src);
  int write = tmp && src;
  if (write) {
    switch (s->kind) {
    case K_ALL_REDUCE:
    case K_REDUCE:
      for (int r = 0; r < n; r++) src[r] = q->slots[r].send;
      write = s->kind == K_ALL_REDUCE || me == s->root;
      if (write) fold(s->type, s->op, n, src, tmp, s->count);
      break;
    case K_REDUCE_SCATTER:
      for (int r = 0; r < n; r++) src[r] = (const char *)q->slots[r].send + (size_t)me * bytes;
      fold(s->type, s->op, n, src, tmp, s->count);
      break;
    case K_ALL_GATHER:
      for (int r = 0; r < n; r++) memcpy(tmp + (size_t)r * bytes, q->slots[r].send, bytes);
      break;
    case K_BROADCAST: memcpy(tmp, q->slots[s->root].send, bytes); break;
    default: /* all_to_all */
      for (int r = 0; r < n; r++)
        memcpy(tmp + (size_t)r * bytes, (const char *)q->slots[r].send + (size_t)me * bytes, bytes);
      break;
    }
  } else {
    fail(c, ncclSystemError);
  }
  int bad = meet(q); /* nobody writes before everyone has read (in-place forms) */
  if (write && !bad && out_bytes) memcpy(s->recv, tmp, out_bytes);
  if (bad) fail(c, ncclRemoteError);
  free(tmp);
  free(src);
  done(c);
}

static ncclResult_t enqueue(ncclComm_t c, cudaStream_t stream, slot s, int peer) {
  if (!c || !stream) return ncclInvalidArgument;
  if (s.count && ((!s.send && s.kind != K_RECV) || (!s.recv && s.kind != K_SEND && s.kind != K_REDUCE))) {
    snprintf(last_error, sizeof last_error, "NULL buffer");
    return ncclInvalidArgument;
  }
  coll_task *k = calloc(1, sizeof *k);
  if (!k) return ncclSystemError;
  k->t.run = coll_run;
  k->t.comm = c;
  k->s = s;
  k->peer = peer;
  if (depth > 0 && (s.kind == K_SEND || s.kind == K_RECV)) {
    if (held && (held->t.comm != c || held_stream != stream)) {
      free(k);
      snprintf(last_error, sizeof last_error, "the double groups one communicator and stream");
      return ncclInvalidUsage;
    }
    coll_task **p = &held;
    while (*p) p = &(*p)->more;
    *p = k;
    held_stream = stream;
    return ncclSuccess;
  }
  submit(k, stream);
  return ncclSuccess;
}

static void submit(coll_task *k, cudaStream_t stream) {
  ncclComm_t c = k->t.comm;
  pthread_mutex_lock(&c->q->lock);
  c->inflight++;
  pthread_mutex_unlock(&c->q->lock);
  push(stream, &k->t);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  return enqueue(c, s, (slot){K_ALL_REDUCE, sendbuff, recvbuff, count, t, op, 0}, 0);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                           ncclComm_t c, cudaStream_t s) {
  return enqueue(c, s, (slot){K_ALL_GATHER, sendbuff, recvbuff, count, t, ncclSum, 0}, 0);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t t, ncclRedOp_t op, ncclComm_t c, cudaStream_t s) {
  return enqueue(c, s, (slot){K_REDUCE_SCATTER, sendbuff, recvbuff, count, t, op, 0}, 0);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                           int root, ncclComm_t c, cudaStream_t s) {
  if (!c || root < 0 || root >= c->q->n) return ncclInvalidArgument;
  return enqueue(c, s, (slot){K_BROADCAST, sendbuff, recvbuff, count, t, ncclSum, root}, 0);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                        ncclRedOp_t op, int root, ncclComm_t c, cudaStream_t s) {
  if (!c || root < 0 || root >= c->q->n) return ncclInvalidArgument;
  return enqueue(c, s, (slot){K_REDUCE, sendbuff, recvbuff, count, t, op, root}, 0);
}

ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t t,
                          ncclComm_t c, cudaStream_t s) {
  return enqueue(c, s, (slot){K_ALL_TO_ALL, sendbuff, recvbuff, count, t, ncclSum, 0}, 0);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t t, int peer,
                      ncclComm_t c, cudaStream_t s) {
  if (!c || peer < 0 || peer >= c->q->n) return ncclInvalidArgument;
  return enqueue(c, s, (slot){K_SEND, sendbuff, NULL, count, t, ncclSum, 0}, peer);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t s) {
  if (!c || peer < 0 || peer >= c->q->n) return ncclInvalidArgument;
  return enqueue(c, s, (slot){K_RECV, NULL, recvbuff, count, t, ncclSum, 0}, peer);
}
