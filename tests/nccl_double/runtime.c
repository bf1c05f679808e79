/*
 * runtime.c - what the test double pretends the libraries and the device
 * are (runtime.h): NCCL's version, the driver's cuMemGetAddressRange, the
 * stream-ordered allocator, allocation counts, registered host memory mapped
 * at another address.
 */
#include <cuda.h>

#include "nccl_double/double.h"
#include "nccl_double/runtime.h"

#ifndef DOUBLE_NCCL_CODE
#define DOUBLE_NCCL_CODE NCCL_VERSION_CODE
#endif

/* ---- NCCL's version ----------------------------------------------------------- */

ncclResult_t ncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument;
  int x, y, z;
  const char *e = getenv("MPU_DOUBLE_NCCL_VERSION");
  *version = DOUBLE_NCCL_CODE;
  if (e && sscanf(e, "%d.%d.%d", &x, &y, &z) == 3) *version = NCCL_VERSION(x, y, z);
  return ncclSuccess;
}

/* ---- counts ------------------------------------------------------------------- */

static const char *const counted[] = {"cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync"};
enum { COUNTED = sizeof counted / sizeof *counted };
static atomic_long counts[COUNTED];

static int counted_index(const char *function) {
  for (int i = 0; function && i < COUNTED; i++)
    if (!strcmp(function, counted[i])) return i;
  return -1;
}

void double_cuda_tally(const char *function) {
  int i = counted_index(function);
  if (i >= 0) atomic_fetch_add(&counts[i], 1);
}

long double_cuda_count(const char *function) {
  int i = counted_index(function);
  return i < 0 ? -1 : atomic_load(&counts[i]);
}

/* ---- registered host memory at another device address ------------------------- */

static atomic_int host_alias;

void double_pretend_host_alias(int on) { atomic_store(&host_alias, on); }

/* A distinct address the host never uses (the top bit flipped); never
 * dereferenced: mpu must refuse it before any work reaches it. */
void *double_host_device_pointer(void *p) {
  return atomic_load(&host_alias) ? (void *)((uintptr_t)p ^ ((uintptr_t)1 << 62)) : p;
}

/* ---- the driver's cuMemGetAddressRange ---------------------------------------- */

static CUresult address_range(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
  double_alloc a;
  if (double_sticky(double_current_device())) return CUDA_ERROR_ILLEGAL_ADDRESS;
  if (double_mem_find((const void *)(uintptr_t)p, 0, &a)) {
    if (base) *base = (CUdeviceptr)(uintptr_t)a.base;
    if (size) *size = a.bytes;
    return CUDA_SUCCESS;
  }
  if (!double_forgives(DOUBLE_FORGIVE_POINTERS)) return CUDA_ERROR_NOT_FOUND;
  /* "pointers": any address is device memory, to the end of the address space */
  if (base) *base = p;
  if (size) *size = (size_t)(UINTPTR_MAX - (uintptr_t)p) + 1;
  return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *status) {
  (void)flags;
  if (!symbol || !fn) return cudaErrorInvalidValue;
  *fn = NULL;
  if (!strcmp(symbol, "cuMemGetAddressRange") && version >= 3020) *fn = (void *)address_range;
  if (status) *status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}

/* ---- the stream-ordered allocator ---------------------------------------------- */

cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t s) {
  cudaStream_t st = double_stream(s);
  if (!st) return cudaErrorInvalidResourceHandle;
  cudaError_t e = double_mem_alloc_device(p, bytes); /* usable at once: the double's work is ordered anyway */
  if (!e) double_cuda_tally("cudaMallocAsync");
  return e;
}

typedef struct free_task {
  task t;
  void *p;
} free_task;

static void free_run(task *t) { double_mem_release_now(((free_task *)t)->p); }

cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  cudaStream_t st = double_stream(s);
  if (!st) return cudaErrorInvalidResourceHandle;
  cudaError_t e = double_sticky(st->device);
  if (e || !p) return e;
  double_alloc a;
  if (!double_mem_find(p, 0, &a) || a.base != p || a.type != cudaMemoryTypeDevice)
    return cudaErrorInvalidValue;
  free_task *t = calloc(1, sizeof *t);
  if (!t) return cudaErrorMemoryAllocation;
  *t = (free_task){{NULL, free_run, free_run, NULL}, p};
  double_cuda_tally("cudaFreeAsync");
  double_push(st, &t->t);
  return cudaSuccess;
}

/* ---- host functions on a stream ----------------------------------------------------- */

typedef struct host_task {
  task t;
  cudaHostFn_t fn;
  void *arg;
} host_task;

static void host_run(task *t) { ((host_task *)t)->fn(((host_task *)t)->arg); }

/* The stream runs fn when it reaches it, and waits for it (as CUDA does). */
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg) {
  cudaStream_t st = double_stream(s);
  if (!st || !fn) return cudaErrorInvalidValue;
  cudaError_t e = double_sticky(st->device);
  if (e) return e;
  host_task *t = calloc(1, sizeof *t);
  if (!t) return cudaErrorMemoryAllocation;
  *t = (host_task){{NULL, host_run, NULL, NULL}, fn, arg};
  double_push(st, &t->t);
  return cudaSuccess;
}
