/*
 * gpu_checks.c - what one GPU can tell of the NCCL backend that the test
 * double cannot, run by scripts/gpu-test.sh (and on the double by ctest's
 * gpu_programs_double, so it keeps building and running):
 *   runtime   the libnccl.so.2 loaded against the nccl.h mpu was built with,
 *             and whether mpu's backend takes it
 *   pointers  what CUDA says each kind of memory is, and whether mpu's
 *             buffer check takes or refuses it: stack, malloc, cudaMalloc,
 *             managed, cudaMallocHost, cudaHostRegister, cudaMallocAsync,
 *             one byte past an allocation, a span over two adjacent ones
 *   order     mpu's call ordered after the caller's work: a 100 ms host
 *             function (cudaLaunchHostFunc, which holds the stream as a long
 *             kernel would) then a copy on the legacy default stream, a
 *             blocking stream, a non-blocking one (not ordered by design:
 *             docs/gpu.md; only with --unordered), and a non-blocking one given
 *             to mpu_comm_set_stream
 *   split     what NCCL's non-blocking ncclCommSplit leaves in *newcomm
 *             before the split ends (one rank, raw NCCL)
 * Lines: "PASS|FAIL|INFO <check>: <what>". Exit 1 if a check failed.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpu.h"

static int failed;

static void say(int ok, const char *check, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(int ok, const char *check, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s %s: ", ok > 0 ? "PASS" : ok == 0 ? "FAIL" : "INFO", check);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  if (ok == 0) failed = 1;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- runtime ------------------------------------------------------------------ */

static int check_runtime(void) {
  int v = 0;
  ncclGetVersion(&v);
  int ok = mpu_nccl_available();
  say(ok, "runtime", "libnccl.so.2 says %d, nccl.h %d.%d.%d (%d); mpu's backend: %s", v, NCCL_MAJOR,
      NCCL_MINOR, NCCL_PATCH, NCCL_VERSION_CODE, ok ? "loaded" : mpu_last_error());
  return ok;
}

/* ---- pointers ------------------------------------------------------------------- */

static const char *kind_name(const void *p) {
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) return (cudaGetLastError(), "error");
  switch (a.type) {
  case cudaMemoryTypeDevice: return "device";
  case cudaMemoryTypeManaged: return "managed";
  case cudaMemoryTypeHost: return a.devicePointer == p ? "host (mapped at its address)" : "host (mapped elsewhere)";
  default: return "unregistered";
  }
}

/* take: 1 when mpu should take the span, 0 when it should refuse it */
static void pointer_case(mpu_comm *nc, const char *name, void *p, size_t bytes, int take) {
  mpu_result_t r = mpu_comm_all_reduce(nc, p, p, bytes, MPU_UINT8, MPU_MAX);
  int took = r == MPU_SUCCESS, refused = r == MPU_ERR_INVALID_ARGUMENT;
  say(take ? took : refused, "pointers", "%-34s %-28s %s%s%s", name, kind_name(p),
      took ? "taken" : refused ? "refused" : mpu_result_name(r), took ? "" : ": ",
      took ? "" : mpu_last_error());
}

static mpu_result_t pointers_rank(mpu_comm *world, void *arg) {
  (void)arg;
  mpu_comm *nc = NULL;
  mpu_result_t r = mpu_comm_nccl_create(world, NULL, &nc);
  if (r) return r;
  char stack[256];
  memset(stack, 0, sizeof stack);
  void *heap = calloc(1, 256), *dev = NULL, *managed = NULL, *pinned = NULL, *async = NULL;
  void *registered = aligned_alloc(4096, 4096);
  pointer_case(nc, "stack", stack, sizeof stack, 0);
  pointer_case(nc, "malloc", heap, 256, 0);
  if (!cudaMalloc(&dev, 256)) {
    pointer_case(nc, "cudaMalloc", dev, 256, 1);
    pointer_case(nc, "cudaMalloc, one byte past its end", dev, 257, 0);
  }
  if (!cudaMallocManaged(&managed, 256, cudaMemAttachGlobal)) pointer_case(nc, "cudaMallocManaged", managed, 256, 1);
  if (!cudaMallocHost(&pinned, 256)) pointer_case(nc, "cudaMallocHost", pinned, 256, 1);
  if (registered && !cudaHostRegister(registered, 4096, cudaHostRegisterDefault)) {
    struct cudaPointerAttributes a;
    int same = !cudaPointerGetAttributes(&a, registered) && a.devicePointer == registered;
    pointer_case(nc, "cudaHostRegister", registered, 4096, same);
    cudaHostUnregister(registered);
  }
  if (!cudaMallocAsync(&async, 256, 0) && !cudaStreamSynchronize(0))
    pointer_case(nc, "cudaMallocAsync", async, 256, 1);
  /* two adjacent allocations: small cudaMalloc blocks often are */
  void *blocks[16] = {0};
  int found = 0;
  for (int i = 0; i < 16 && !found && !cudaMalloc(&blocks[i], 256); i++)
    for (int j = 0; j < i && !found; j++) {
      char *a = blocks[j], *b = blocks[i];
      char *lo = a < b ? a : b, *hi = a < b ? b : a;
      if (hi - lo <= 512) { /* CUDA rounds small blocks up to 512 bytes */
        pointer_case(nc, "span over two adjacent cudaMallocs", lo, (size_t)(hi - lo) + 256, 0);
        found = 1;
      }
    }
  if (!found) say(-1, "pointers", "no two adjacent cudaMalloc blocks among 16 (nothing to test)");
  for (int i = 0; i < 16; i++) cudaFree(blocks[i]);
  cudaFree(dev);
  cudaFree(managed);
  cudaFreeHost(pinned);
  if (async) cudaFreeAsync(async, 0);
  free(heap);
  free(registered);
  return mpu_comm_destroy(nc);
}

/* ---- order -------------------------------------------------------------------- */

typedef struct slow_write {
  volatile int *where;
  int value;
} slow_write;

static void CUDART_CB slow(void *p) { /* holds the stream 100 ms, then writes */
  slow_write *w = p;
  usleep(100 * 1000);
  *w->where = w->value;
}

/* The caller's work on `caller`: 100 ms, then a copy of 7 into dev. mpu's
 * all_reduce (one rank: dev to out) must see 7 if it is ordered after. */
static int ordered_after(mpu_comm *nc, cudaStream_t caller, int *pinned, int *dev, int *out,
                         double *host_s) {
  int seen = -1;
  slow_write w = {pinned, 7};
  *pinned = 0;
  cudaMemset(dev, 0, sizeof *dev);
  cudaDeviceSynchronize();
  cudaLaunchHostFunc(caller, slow, &w);
  cudaMemcpyAsync(dev, pinned, sizeof *dev, cudaMemcpyHostToDevice, caller);
  double t = now();
  mpu_result_t r = mpu_comm_all_reduce(nc, dev, out, 1, MPU_INT32, MPU_SUM);
  *host_s = now() - t;
  cudaDeviceSynchronize();
  if (!r) cudaMemcpy(&seen, out, sizeof seen, cudaMemcpyDeviceToHost);
  return r ? -2 : seen;
}

static mpu_result_t order_rank(mpu_comm *world, void *arg) {
  int unordered = *(const int *)arg;
  mpu_comm *nc = NULL;
  int *pinned = NULL, *dev = NULL, *out = NULL;
  cudaStream_t blocking = NULL, nonblocking = NULL;
  mpu_result_t r = mpu_comm_nccl_create(world, NULL, &nc);
  if (r) return r;
  if (cudaMallocHost((void **)&pinned, sizeof *pinned) || cudaMalloc((void **)&dev, sizeof *dev) ||
      cudaMalloc((void **)&out, sizeof *out) || cudaStreamCreate(&blocking) ||
      cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking)) {
    say(0, "order", "CUDA set-up failed: %s", cudaGetErrorString(cudaGetLastError()));
    goto done;
  }
  double s;
  int v = ordered_after(nc, cudaStreamLegacy, pinned, dev, out, &s);
  say(v == 7, "order", "legacy default stream: got %d (want 7), host blocked %.0f ms", v, 1e3 * s);
  v = ordered_after(nc, blocking, pinned, dev, out, &s);
  say(v == 7, "order", "blocking stream: got %d (want 7), host blocked %.0f ms", v, 1e3 * s);
  if (unordered) { /* on a GPU only: the test double's order checker refuses the race */
    v = ordered_after(nc, nonblocking, pinned, dev, out, &s);
    say(-1, "order", "non-blocking stream, no set_stream: got %d (7 only by chance: not ordered, by design)", v);
  }
  if (mpu_comm_set_stream(nc, nonblocking)) {
    say(0, "order", "mpu_comm_set_stream: %s", mpu_last_error());
  } else {
    v = ordered_after(nc, nonblocking, pinned, dev, out, &s);
    say(v == 7, "order", "mpu_comm_set_stream(non-blocking): got %d (want 7), host blocked %.0f ms", v, 1e3 * s);
    mpu_comm_set_stream(nc, NULL);
  }
done:
  cudaFreeHost(pinned);
  cudaFree(dev);
  cudaFree(out);
  if (blocking) cudaStreamDestroy(blocking);
  if (nonblocking) cudaStreamDestroy(nonblocking);
  return mpu_comm_destroy(nc);
}

/* ---- split ---------------------------------------------------------------------- */

static ncclResult_t settle(ncclComm_t c, double limit_s) {
  ncclResult_t st = ncclInProgress;
  double t = now();
  while (c && !ncclCommGetAsyncError(c, &st) && st == ncclInProgress && now() - t < limit_s)
    usleep(1000);
  return st;
}

static void check_split(void) {
  ncclUniqueId id;
  ncclComm_t parent = NULL, child = NULL;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  if (cudaSetDevice(0) || ncclGetUniqueId(&id)) {
    say(0, "split", "set-up failed");
    return;
  }
  ncclResult_t r = ncclCommInitRankConfig(&parent, 1, id, 0, &cfg);
  ncclResult_t st = (r == ncclSuccess || r == ncclInProgress) ? settle(parent, 30) : r;
  if (st != ncclSuccess) {
    say(0, "split", "non-blocking init: %s", ncclGetErrorString(st));
    if (parent) ncclCommAbort(parent);
    return;
  }
  ncclConfig_t scfg = NCCL_CONFIG_INITIALIZER;
  scfg.blocking = 0;
  r = ncclCommSplit(parent, 0, 0, &child, &scfg);
  /* NCCL's split job writes *newcomm from its own thread: read it as it may be written */
  int null_at_return = __atomic_load_n(&child, __ATOMIC_ACQUIRE) == NULL;
  ncclResult_t pst = settle(parent, 30);
  child = __atomic_load_n(&child, __ATOMIC_ACQUIRE); /* the parent settled: the job has ended */
  ncclResult_t cst = child ? settle(child, 30) : ncclInProgress;
  say(pst == ncclSuccess && child && cst == ncclSuccess ? 1 : 0, "split",
      "non-blocking ncclCommSplit returned %s with *newcomm %s; the parent then said %s, the child %s",
      ncclGetErrorString(r), null_at_return ? "NULL (handed out when the split ends)" : "set at once",
      ncclGetErrorString(pst), child ? ncclGetErrorString(cst) : "(none)");
  if (child) ncclCommDestroy(child);
  ncclCommDestroy(parent);
}

int main(int argc, char **argv) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    fprintf(stderr, "gpu_checks: no CUDA device\n");
    return 2;
  }
  /* [--unordered] [pointers|order|split] */
  int unordered = argc > 1 && !strcmp(argv[1], "--unordered");
  const char *only = argc > 1 + unordered ? argv[1 + unordered] : "";
  setvbuf(stdout, NULL, _IOLBF, 0); /* every line in the log, even if the process dies */
  if (!check_runtime()) return 1;
  mpu_result_t r;
  if (!*only || !strcmp(only, "pointers"))
    if ((r = mpu_launch(1, pointers_rank, NULL, NULL, NULL))) say(0, "pointers", "%s", mpu_last_error());
  if (!*only || !strcmp(only, "order"))
    if ((r = mpu_launch(1, order_rank, &unordered, NULL, NULL))) say(0, "order", "%s", mpu_last_error());
  if (!*only || !strcmp(only, "split")) check_split();
  return failed;
}
