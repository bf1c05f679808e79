/*
 * cuda.c - the CUDA runtime of the test double (double.h): devices, memory,
 * streams that run their work in order on a worker thread each, events.
 */
#include "nccl_double/double.h"

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

void double_push(cudaStream_t s, task *t) {
  pthread_mutex_lock(&s->lock);
  t->next = NULL;
  if (s->tail) s->tail->next = t;
  else s->head = t;
  s->tail = t;
  pthread_cond_broadcast(&s->cond);
  pthread_mutex_unlock(&s->lock);
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
  default: return "error in the CUDA test double";
  }
}

/* memory: memory.c */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
  (void)flags;
  cudaError_t e = double_sticky(double_current_device());
  if (e) return e;
  cudaStream_t s = calloc(1, sizeof *s);
  if (!s) return cudaErrorMemoryAllocation;
  s->device = double_current_device();
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
  cudaError_t e = double_sticky(s->device);
  if (e) return e;
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
  cudaError_t e = double_sticky(s->device);
  if (e) return e;
  event_task *t = calloc(1, sizeof *t);
  if (!t) return cudaErrorMemoryAllocation;
  pthread_mutex_lock(&s->lock);
  ev->stream = s;
  ev->pending++;
  pthread_mutex_unlock(&s->lock);
  t->t.run = event_run;
  t->ev = ev;
  double_push(s, &t->t);
  return cudaSuccess;
}

static int event_pending(cudaEvent_t ev) {
  if (!ev->stream) return 0;
  pthread_mutex_lock(&ev->stream->lock);
  int pending = ev->pending;
  pthread_mutex_unlock(&ev->stream->lock);
  return pending;
}

cudaError_t cudaEventQuery(cudaEvent_t ev) {
  cudaError_t e = ev->stream ? double_sticky(ev->stream->device) : cudaSuccess;
  if (e) return e;
  return event_pending(ev) ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  /* CUDA lets an event be destroyed while recorded work is pending; wait
   * here so the worker never touches freed memory */
  while (event_pending(ev)) sched_yield();
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
  cudaError_t e = double_sticky(s->device);
  if (e) return e;
  if (dpitch < width || spitch < width) return cudaErrorInvalidValue;
  copy_task *t = calloc(1, sizeof *t);
  if (!t) return cudaErrorMemoryAllocation;
  *t = (copy_task){{NULL, copy_run, NULL, NULL}, dst, src, dpitch, spitch, width, height};
  double_push(s, &t->t);
  return cudaSuccess;
}

