/*
 * memory.c - the test double's memory (memory.h): allocations by address
 * range and kind, cudaPointerGetAttributes, and sticky faults per device.
 */
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#include "nccl_double/double.h"
#include "nccl_double/memory.h"
#include "nccl_double/runtime.h"

/* ---- the registry: a list under one lock (tests make few allocations) ------ */

typedef struct entry {
  struct entry *next;
  double_alloc a;
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry *allocs;

static int holds(const double_alloc *a, const char *p, size_t bytes) {
  if (p < a->base || p >= a->base + a->bytes) return 0;
  return (size_t)(a->base + a->bytes - p) >= bytes;
}

int double_mem_find(const void *p, size_t bytes, double_alloc *out) {
  int found = 0;
  pthread_mutex_lock(&lock);
  for (entry *e = allocs; e && !found; e = e->next)
    if (holds(&e->a, p, bytes)) found = 1, *out = e->a;
  pthread_mutex_unlock(&lock);
  return found;
}

void *double_mem_view(const void *p) {
  double_alloc a;
  if (!p || !double_mem_find(p, 0, &a)) return (void *)(uintptr_t)p;
  return a.view + ((const char *)p - a.base);
}

int double_mem_usable(const void *p, size_t bytes) {
  double_alloc a;
  if (!bytes || double_forgives(DOUBLE_FORGIVE_POINTERS)) return 1;
  return double_mem_find(p, bytes, &a);
}

static cudaError_t add(void *base, size_t bytes, enum cudaMemoryType type, int registered,
                       void *view, size_t mapped) {
  entry *e = calloc(1, sizeof *e);
  if (!e) return cudaErrorMemoryAllocation;
  e->a = (double_alloc){base, bytes, type, double_current_device(), registered, view, mapped};
  pthread_mutex_lock(&lock);
  e->next = allocs;
  allocs = e;
  pthread_mutex_unlock(&lock);
  return cudaSuccess;
}

/* Take the allocation that starts at p and is of one of the kinds asked for
 * (mask of 1 << cudaMemoryType); 1, or 0 when there is none. */
static int take(const void *p, unsigned kinds, int registered, double_alloc *out) {
  int found = 0;
  pthread_mutex_lock(&lock);
  for (entry **e = &allocs; *e; e = &(*e)->next)
    if ((*e)->a.base == p && (kinds >> (*e)->a.type & 1u) && (*e)->a.registered == registered) {
      entry *gone = *e;
      *e = gone->next;
      *out = gone->a;
      free(gone);
      found = 1;
      break;
    }
  pthread_mutex_unlock(&lock);
  return found;
}

/* ---- sticky faults ------------------------------------------------------------- */

#define MAX_DEVICES 1024
static atomic_int faulted[MAX_DEVICES];
static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;
static char first_fault[256];

void double_fault(int device, const char *what) {
  if (device < 0 || device >= MAX_DEVICES) device = 0;
  pthread_mutex_lock(&fault_lock);
  if (!first_fault[0])
    snprintf(first_fault, sizeof first_fault, "device %d: %s", device, what);
  pthread_mutex_unlock(&fault_lock);
  atomic_store(&faulted[device], 1);
}

cudaError_t double_sticky(int device) {
  if (device < 0 || device >= MAX_DEVICES) return cudaSuccess;
  return atomic_load(&faulted[device]) ? cudaErrorIllegalAddress : cudaSuccess;
}

const char *double_fault_message(void) { return first_fault; }

void double_clear_faults(void) {
  pthread_mutex_lock(&fault_lock);
  first_fault[0] = 0;
  pthread_mutex_unlock(&fault_lock);
  for (int d = 0; d < MAX_DEVICES; d++) atomic_store(&faulted[d], 0);
}

/* ---- the runtime's allocation calls ------------------------------------------ */

/* Device memory the host cannot touch: a memory file mapped twice, once with
 * no access (the address CUDA hands out) and once readable and writable
 * (the double's view). 0, or -1 when the system refuses. */
static int map_twice(size_t bytes, char **base, char **view, size_t *mapped) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), len = bytes ? bytes : 1;
  if (len > SIZE_MAX - page) return -1;
  len = (len + page - 1) / page * page;
  int fd = memfd_create("mpu-double-device", MFD_CLOEXEC);
  if (fd < 0) return -1;
  void *b = MAP_FAILED, *v = MAP_FAILED;
  if (!ftruncate(fd, (off_t)len)) {
    b = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
    v = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  close(fd); /* the mappings keep the file */
  if (b == MAP_FAILED || v == MAP_FAILED) {
    if (b != MAP_FAILED) munmap(b, len);
    if (v != MAP_FAILED) munmap(v, len);
    return -1;
  }
  *base = b, *view = v, *mapped = len;
  return 0;
}

static void unmap(const double_alloc *a) {
  if (!a->mapped) {
    free(a->base);
    return;
  }
  munmap(a->base, a->mapped);
  munmap(a->view, a->mapped);
}

static cudaError_t alloc(void **p, size_t bytes, enum cudaMemoryType type) {
  cudaError_t e = double_sticky(double_current_device());
  if (e) return e;
  if (!p) return cudaErrorInvalidValue;
  char *base = NULL, *view = NULL;
  size_t mapped = 0;
  if (type == cudaMemoryTypeDevice && !double_forgives(DOUBLE_FORGIVE_HOST_ACCESS)) {
    if (map_twice(bytes, &base, &view, &mapped)) return cudaErrorMemoryAllocation;
  } else if (!(base = view = calloc(bytes ? bytes : 1, 1))) {
    return cudaErrorMemoryAllocation;
  }
  double_alloc a = {base, bytes, type, 0, 0, view, mapped};
  if ((e = add(base, bytes ? bytes : 1, type, 0, view, mapped))) {
    unmap(&a);
    *p = NULL;
    return e;
  }
  *p = base;
  if (type != cudaMemoryTypeHost) double_order_alloc(*p, bytes); /* order.c */
  return e;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
  double_cuda_tally("cudaMalloc");
  return alloc(p, bytes, cudaMemoryTypeDevice);
}

cudaError_t double_mem_alloc_device(void **p, size_t bytes) {
  return alloc(p, bytes, cudaMemoryTypeDevice);
}

cudaError_t cudaMallocManaged(void **p, size_t bytes, unsigned int flags) {
  (void)flags;
  return alloc(p, bytes, cudaMemoryTypeManaged);
}

cudaError_t cudaMallocHost(void **p, size_t bytes) { return alloc(p, bytes, cudaMemoryTypeHost); }

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
  (void)flags;
  return alloc(p, bytes, cudaMemoryTypeHost);
}

/* Freeing after a fault reports the fault but still frees: a broken
 * context's memory is gone either way, and the sanitizers see no leak. */
static cudaError_t release(void *p, unsigned kinds) {
  double_alloc a;
  cudaError_t e = double_sticky(double_current_device());
  if (!p) return e;
  /* cudaFree synchronises the device: it returns once every stream of it is
   * idle, the allocation still in place for them (switch "free_nowait": at once) */
  if (!e && !double_forgives(DOUBLE_FORGIVE_FREE_NOWAIT)) cudaDeviceSynchronize();
  else double_order_host_after_device(double_current_device());
  if (!take(p, kinds, 0, &a)) return e ? e : cudaErrorInvalidValue;
  double_order_free(p);
  unmap(&a);
  return e;
}

/* cudaFreeAsync's task (runtime.c): the stream reached it, no device-wide wait */
int double_mem_release_now(void *p) {
  double_alloc a;
  if (!take(p, 1u << cudaMemoryTypeDevice, 0, &a)) return -1;
  double_order_free(p);
  unmap(&a);
  return 0;
}

cudaError_t cudaFree(void *p) {
  double_cuda_tally("cudaFree");
  return release(p, 1u << cudaMemoryTypeDevice | 1u << cudaMemoryTypeManaged);
}

cudaError_t cudaFreeHost(void *p) { return release(p, 1u << cudaMemoryTypeHost); }

cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned int flags) {
  (void)flags;
  double_alloc a;
  cudaError_t e = double_sticky(double_current_device());
  if (e) return e;
  if (!p || !bytes) return cudaErrorInvalidValue;
  for (size_t at = 0; at < bytes; at += 4096) /* any page already known */
    if (double_mem_find((char *)p + at, 1, &a)) return cudaErrorHostMemoryAlreadyRegistered;
  if (double_mem_find((char *)p + bytes - 1, 1, &a)) return cudaErrorHostMemoryAlreadyRegistered;
  return add(p, bytes, cudaMemoryTypeHost, 1, p, 0);
}

cudaError_t cudaHostUnregister(void *p) {
  double_alloc a;
  cudaError_t e = double_sticky(double_current_device());
  int known = take(p, 1u << cudaMemoryTypeHost, 1, &a);
  return e ? e : known ? cudaSuccess : cudaErrorHostMemoryNotRegistered;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *p) {
  double_alloc a;
  cudaError_t e = double_sticky(double_current_device());
  if (e) return e;
  if (!attr) return cudaErrorInvalidValue;
  memset(attr, 0, sizeof *attr);
  if (!double_mem_find(p, 0, &a) && double_forgives(DOUBLE_FORGIVE_POINTERS)) {
    a = (double_alloc){(char *)(uintptr_t)p, 1, cudaMemoryTypeDevice, double_current_device(), 0,
                       (char *)(uintptr_t)p, 0};
  } else if (!double_mem_find(p, 0, &a)) { /* CUDA 11 onwards: plain host memory is no error */
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    return cudaSuccess;
  }
  attr->type = a.type;
  attr->device = a.device;
  attr->devicePointer = (void *)(uintptr_t)p; /* unified addressing: one address */
  if (a.registered) attr->devicePointer = double_host_device_pointer((void *)(uintptr_t)p);
  attr->hostPointer = a.type == cudaMemoryTypeDevice ? NULL : (void *)(uintptr_t)p;
  return cudaSuccess;
}

/* Sticky errors stay; the double keeps no other last error to clear. */
cudaError_t cudaGetLastError(void) { return double_sticky(double_current_device()); }
