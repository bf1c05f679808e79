/*
 * runtime.c - the libnccl.so.2 the backend runs on, which need not be the one
 * its nccl.h came from (PyTorch's wheel ships its own). Once, at the first
 * use of the backend: ncclGetVersion against the floor (backend.h), and the
 * entry points newer than the floor looked up by name in that library, so
 * that the backend loads and runs on any libnccl.so.2 from the floor up.
 *
 * The entry points the backend calls directly and that older NCCLs lack are
 * weak references (backend.h), so dlopen(RTLD_NOW) of libmpu_nccl succeeds
 * on those too and the version check below can refuse them in one line.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "comm/nccl/backend.h"
#include "core/error.h"

static const int floor_parts[3] = {MPU_NCCL_FLOOR};

static struct {
  int code;             /* ncclGetVersion's */
  char version[32];     /* "2.27.7" */
  char path[384];       /* the library that answered */
  mpu__nccl_alltoall_fn alltoall;
  char refusal[768];    /* "" when usable */
} rt;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* NCCL_VERSION_CODE's two layouts: X*1000+Y*100+Z before 2.9, X*10000+Y*100+Z since */
static void split_code(int code, int *x, int *y, int *z) {
  if (code < 10000) *x = code / 1000, *y = code % 1000 / 100, *z = code % 100;
  else *x = code / 10000, *y = code % 10000 / 100, *z = code % 100;
}

static int code_of(int x, int y, int z) { return x * 10000 + y * 100 + z; }

static void probe(void) {
  int v = 0, x, y, z;
  ncclResult_t r = ncclGetVersion(&v);
  split_code(v, &x, &y, &z);
  snprintf(rt.version, sizeof rt.version, "%d.%d.%d", x, y, z);
  rt.code = code_of(x, y, z);
  Dl_info info;
  void *h = NULL;
  snprintf(rt.path, sizeof rt.path, "libnccl.so.2");
  if (dladdr((void *)ncclGetVersion, &info) && info.dli_fname) {
    snprintf(rt.path, sizeof rt.path, "%s", info.dli_fname);
    h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD); /* loaded already: no new load */
  }
  /* optional: NULL where the library has none (grouped ncclSend/ncclRecv instead) */
  if (h) rt.alltoall = (mpu__nccl_alltoall_fn)dlsym(h, "ncclAlltoAll");
  if (h) dlclose(h); /* drops only the reference dlopen added */
  if (r != ncclSuccess)
    snprintf(rt.refusal, sizeof rt.refusal, "ncclGetVersion of %s failed (%s)", rt.path,
             ncclGetErrorString(r));
  else if (rt.code < code_of(floor_parts[0], floor_parts[1], floor_parts[2]))
    snprintf(rt.refusal, sizeof rt.refusal,
             "%s is NCCL %s; mpu's NCCL backend needs NCCL %d.%d.%d or newer (ncclCommSplit "
             "with its config) and was built against nccl.h %d.%d.%d: put a newer libnccl.so.2 "
             "first on LD_LIBRARY_PATH",
             rt.path, rt.version, floor_parts[0], floor_parts[1], floor_parts[2], NCCL_MAJOR,
             NCCL_MINOR, NCCL_PATCH);
}

mpu_result_t mpu__nccl_runtime_check(const char *fn) {
  pthread_once(&once, probe);
  if (rt.refusal[0])
    return mpu__error(MPU_ERR_UNSUPPORTED, "%s: the nccl backend is not available: %s", fn,
                      rt.refusal);
  return MPU_SUCCESS;
}

mpu__nccl_alltoall_fn mpu__nccl_alltoall(void) {
  pthread_once(&once, probe);
  return rt.alltoall;
}

/* ---- the driver's allocation ranges ----------------------------------------------- */

/* cuMemGetAddressRange through the runtime (libmpu_nccl links no libcuda),
 * looked up at the first buffer check, not at load: it starts CUDA. */
typedef CUresult (*range_fn)(CUdeviceptr *base, size_t *size, CUdeviceptr p);
static range_fn range;
static pthread_once_t range_once = PTHREAD_ONCE_INIT;

static void find_range(void) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t e = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                   cudaEnableDefault, &found);
#else
  cudaError_t e = cudaGetDriverEntryPoint("cuMemGetAddressRange", &fn, cudaEnableDefault, &found);
#endif
  if (e != cudaSuccess) cudaGetLastError(); /* not sticky: the check falls back */
  if (e == cudaSuccess && found == cudaDriverEntryPointSuccess) range = (range_fn)fn;
}

int mpu__nccl_allocation(const void *p, uintptr_t *base, size_t *bytes) {
  pthread_once(&range_once, find_range);
  if (!range) return -1;
  CUdeviceptr b = 0;
  size_t n = 0;
  CUresult r = range(&b, &n, (CUdeviceptr)(uintptr_t)p);
  if (r == CUDA_ERROR_NOT_FOUND || r == CUDA_ERROR_INVALID_VALUE) return 0;
  if (r != CUDA_SUCCESS) return -1;
  *base = (uintptr_t)b;
  *bytes = n;
  return 1;
}
