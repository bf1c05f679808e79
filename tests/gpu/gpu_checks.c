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
 *   share     two splits of one world, each on its own stream, the first held
 *             300 ms by a host function: does the second's send to itself
 *             wait for it (NCCL's shared device stream) or not, and does
 *             aborting the first end the second (one abort flag)? Unshared
 *             (mpu's default) must do neither; shared is reported.
 *   graph     an mpu all_reduce captured into a CUDA graph (thread-local and
 *             global capture), the graph replayed, the result and the
 *             communicator's health after it
 *   avg       NCCL's own ncclAvg at one rank (raw NCCL), counts of several
 *             blocks with an odd tail
 *   deadline  (only when named, under torchrun's variables as rank 0 of 2
 *             while a peer joins the store and never calls NCCL) creation
 *             from the environment fails by its deadline, and this process
 *             can still make a communicator afterwards
 * Lines: "PASS|FAIL|INFO <check>: <what>". Exit 1 if a check failed.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_report.h"
#include "mpu.h"


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

/* ---- share ---------------------------------------------------------------------- */

typedef struct timed_send {
  mpu_comm *c;
  int *buf;   /* device: [0] sent, [1] received */
  double s;   /* how long the call held the host */
  mpu_result_t r;
  char err[200]; /* mpu_last_error is per thread */
} timed_send;

static void *send_to_self(void *p) {
  timed_send *t = p;
  /* the set-up's copies came through the legacy stream; a new thread is
   * ordered after them only through it (the test double cannot see
   * pthread_create), and the held non-blocking stream is not waited for */
  cudaStreamSynchronize(cudaStreamLegacy);
  double t0 = now();
  /* to itself: at one rank NCCL runs a send/recv through its kernel and its
   * device stream, where a collective would be a plain copy (enqueue.cc) */
  t->r = mpu_comm_sendrecv(t->c, t->buf, 1, 0, t->buf + 1, 1, 0, MPU_INT32);
  t->s = now() - t0;
  snprintf(t->err, sizeof t->err, "%s", t->r ? mpu_last_error() : "");
  return NULL;
}

/* A stream held on the device until the host writes a flag: the driver's
 * cuStreamWaitValue32, looked up (the test double has none: 0). */
typedef struct hold {
  volatile int *flag; /* page-locked, mapped at its own address */
  int held;
} hold;
typedef int (*wait_value_fn)(cudaStream_t, unsigned long long, unsigned int, unsigned int);

static int hold_stream(cudaStream_t s, hold *h) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault, &q) ||
      q != cudaDriverEntryPointSuccess || !fn) {
    cudaGetLastError();
    return 0;
  }
  *h->flag = 0;
  /* CU_STREAM_WAIT_VALUE_GEQ (0): until *flag >= 1 */
  h->held = ((wait_value_fn)fn)(s, (unsigned long long)(uintptr_t)h->flag, 1, 0) == 0;
  return h->held;
}

static void release_stream(hold *h) { __atomic_store_n(h->flag, 1, __ATOMIC_RELEASE); }

static void *release_later(void *p) { /* 300 ms, as the host functions would */
  usleep(300 * 1000);
  release_stream(p);
  return NULL;
}

static int raw_waited = -1; /* the baseline: 1 if even raw NCCL waited, -1 if not measured */

static mpu_result_t share_rank(mpu_comm *world, void *arg) {
  int share = *(const int *)arg;
  const char *how = share ? "shared (share_resources=1)" : "unshared (default)";
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.share_resources = share;
  o.one_rank_through_nccl = 1;
  o.timeout_s = 20;
  mpu_comm *nc = NULL, *a = NULL, *b = NULL;
  int *bufs = NULL, *pinned = NULL;
  cudaStream_t sa = NULL, sb = NULL;
  mpu_result_t r = mpu_comm_nccl_create(world, &o, &nc);
  if (!r) r = mpu_comm_split(nc, 0, 0, &a);
  if (!r) r = mpu_comm_split(nc, 0, 0, &b);
  if (r) {
    say(0, "share", "%s: set-up: %s", how, mpu_last_error());
    goto done;
  }
  if (cudaMalloc((void **)&bufs, 4 * sizeof(int)) || cudaMallocHost((void **)&pinned, sizeof(int)) ||
      cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking) ||
      cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking) || mpu_comm_set_stream(a, sa) ||
      mpu_comm_set_stream(b, sb)) {
    say(0, "share", "%s: CUDA set-up: %s", how, cudaGetErrorString(cudaGetLastError()));
    goto done;
  }
  int init[4] = {11, 0, 22, 0};
  cudaMemcpy(bufs, init, sizeof init, cudaMemcpyHostToDevice);
  cudaDeviceSynchronize(); /* a pageable copy may land after cudaMemcpy returns */
  timed_send ta = {a, bufs, 0, 0, ""}, tb = {b, bufs + 2, 0, 0, ""};
  /* each group's first send to itself sets up its NCCL connection (host
   * work that may wait for the device, as raw NCCL's did): not timed */
  send_to_self(&ta);
  send_to_self(&tb);
  cudaMemcpy(bufs, init, sizeof init, cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();
  /* Hold a's stream 300 ms. On a GPU with a device-side wait on a host flag
   * (cuStreamWaitValue32), not with host functions: CUDA runs every host
   * function of the process on one thread, and NCCL queues its own on its
   * host stream, so a held host function would hold any group's work. */
  hold h = {pinned, 0};
  int device_hold = hold_stream(sa, &h);
  slow_write w = {pinned, 7}, w2 = {pinned, 8}, w3 = {pinned, 9};
  if (!device_hold) {
    cudaLaunchHostFunc(sa, slow, &w);
    cudaLaunchHostFunc(sa, slow, &w2);
    cudaLaunchHostFunc(sa, slow, &w3);
  }
  pthread_t th, releaser;
  if (device_hold && pthread_create(&releaser, NULL, release_later, &h)) {
    release_stream(&h);
    device_hold = 0;
  }
  if (pthread_create(&th, NULL, send_to_self, &ta)) goto done;
  usleep(50 * 1000); /* a's work is enqueued behind the hold */
  send_to_self(&tb);
  if (device_hold) pthread_join(releaser, NULL);
  pthread_join(th, NULL);
  cudaStreamSynchronize(sa); /* done already (blocking calls): the double's order model */
  cudaStreamSynchronize(sb);
  int got[4] = {0};
  cudaMemcpy(got, bufs, sizeof got, cudaMemcpyDeviceToHost);
  int right = !ta.r && !tb.r && got[1] == 11 && got[3] == 22;
  int waited = tb.s > 0.2;
  /* unshared must not wait, unless raw NCCL's own pair waits here too */
  int verdict = share || raw_waited == 1 ? (right ? -1 : 0) : right && !waited;
  say(verdict, "share",
      "%s: the second group's call held the host %.0f ms while the first's stream was held 300 ms "
      "by %s (%s); results %s",
      how, 1e3 * tb.s, device_hold ? "cuStreamWaitValue32" : "host functions", waited ? "it waited: one device stream" : "it did not wait",
      right ? "right" : ta.r ? ta.err : tb.r ? tb.err : "wrong");
  /* one abort flag? abort a, then use b */
  mpu_result_t ra = mpu_comm_abort(a);
  a = NULL;
  int again[2] = {33, 0};
  cudaMemcpy(bufs + 2, again, sizeof again, cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();
  tb.r = 0;
  send_to_self(&tb);
  cudaStreamSynchronize(sb);
  cudaMemcpy(got, bufs, sizeof got, cudaMemcpyDeviceToHost);
  int b_ok = !tb.r && got[3] == 33;
  /* shared: one abort flag, so the second is broken too and must say so,
   * never answer success with its output unwritten */
  say(share ? tb.r == MPU_ERR_ABORTED : b_ok, "share", "%s: after aborting the first group (%s), the second's call %s",
      how, mpu_result_name(ra), b_ok ? "still works" : tb.r ? tb.err : "answered success and left its output unwritten");
done:
  if (a) mpu_comm_abort(a);
  if (b) mpu_comm_destroy(b);
  cudaFree(bufs);
  cudaFreeHost(pinned);
  if (sa) cudaStreamDestroy(sa);
  if (sb) cudaStreamDestroy(sb);
  return nc ? mpu_comm_destroy(nc) : r;
}

/* The same with raw NCCL and two communicators made apart (nothing shared by
 * construction): the second's send to itself on its own stream, timed by
 * cudaStreamSynchronize, while the first's stream is held. The baseline of
 * what CUDA and NCCL serialise whatever mpu does. */
static void check_share_raw(void) {
  ncclComm_t c[2] = {NULL, NULL};
  cudaStream_t s[2] = {NULL, NULL};
  int *buf = NULL, *flag = NULL;
  for (int i = 0; i < 2; i++) {
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) || ncclCommInitRank(&c[i], 1, id, 0) ||
        cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking)) {
      say(0, "share", "raw set-up failed");
      goto done;
    }
  }
  if (cudaMalloc((void **)&buf, 4 * sizeof(int)) || cudaMallocHost((void **)&flag, sizeof(int))) goto done;
  /* each communicator's first send to itself sets up its connection (host
   * work that may wait for the device): done before the hold */
  for (int i = 0; i < 2; i++) {
    ncclGroupStart();
    ncclSend(buf + 2 * i, 1, ncclInt32, 0, c[i], s[i]);
    ncclRecv(buf + 2 * i + 1, 1, ncclInt32, 0, c[i], s[i]);
    ncclGroupEnd();
    cudaStreamSynchronize(s[i]);
  }
  hold h = {flag, 0};
  if (!hold_stream(s[0], &h)) {
    say(-1, "share", "raw NCCL, two communicators made apart: no device-side hold here (the test double)");
    goto done;
  }
  /* released 300 ms from now whatever the enqueueing below does */
  pthread_t releaser;
  int threaded = !pthread_create(&releaser, NULL, release_later, &h);
  if (!threaded) release_stream(&h);
  double t0 = now();
  for (int i = 0; i < 2; i++) {
    ncclGroupStart();
    ncclSend(buf + 2 * i, 1, ncclInt32, 0, c[i], s[i]);
    ncclRecv(buf + 2 * i + 1, 1, ncclInt32, 0, c[i], s[i]);
    ncclGroupEnd();
  }
  cudaStreamSynchronize(s[1]);
  double took = now() - t0;
  if (threaded) pthread_join(releaser, NULL);
  cudaStreamSynchronize(s[0]);
  raw_waited = took > 0.2;
  say(-1, "share", "raw NCCL, two communicators made apart: the second's send to itself took %.0f ms while "
      "the first's stream was held 300 ms by cuStreamWaitValue32 (%s)",
      1e3 * took, took > 0.2 ? "it waited: CUDA or NCCL serialises them, not mpu" : "it did not wait");
done:
  for (int i = 0; i < 2; i++) {
    if (c[i]) ncclCommDestroy(c[i]);
    if (s[i]) cudaStreamDestroy(s[i]);
  }
  cudaFree(buf);
  cudaFreeHost(flag);
}

/* ---- graph ---------------------------------------------------------------------- */

static void capture_probe(void);

/* looked up, not linked: the test double has no graphs (it says so, INFO) */
typedef cudaError_t (*begin_fn)(cudaStream_t, enum cudaStreamCaptureMode);
typedef cudaError_t (*end_fn)(cudaStream_t, cudaGraph_t *);
typedef cudaError_t (*inst_fn)(cudaGraphExec_t *, cudaGraph_t, unsigned long long);
typedef cudaError_t (*launch_fn)(cudaGraphExec_t, cudaStream_t);
typedef cudaError_t (*exec_free_fn)(cudaGraphExec_t);
typedef cudaError_t (*graph_free_fn)(cudaGraph_t);

static void graph_case(mpu_comm *nc, enum cudaStreamCaptureMode mode, const char *mode_name) {
  begin_fn begin = (begin_fn)dlsym(RTLD_DEFAULT, "cudaStreamBeginCapture");
  end_fn end = (end_fn)dlsym(RTLD_DEFAULT, "cudaStreamEndCapture");
  inst_fn inst = (inst_fn)dlsym(RTLD_DEFAULT, "cudaGraphInstantiateWithFlags");
  launch_fn launch = (launch_fn)dlsym(RTLD_DEFAULT, "cudaGraphLaunch");
  exec_free_fn exec_free = (exec_free_fn)dlsym(RTLD_DEFAULT, "cudaGraphExecDestroy");
  graph_free_fn graph_free = (graph_free_fn)dlsym(RTLD_DEFAULT, "cudaGraphDestroy");
  if (!begin || !end || !inst || !launch || !exec_free || !graph_free) {
    say(-1, "graph", "this CUDA runtime has no graph API (the test double)");
    return;
  }
  cudaStream_t s = NULL;
  float *x = NULL, *y = NULL;
  cudaGraph_t g = NULL;
  cudaGraphExec_t ge = NULL;
  mpu_request *req = NULL;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) || cudaMalloc((void **)&x, 4 * sizeof(float)) ||
      cudaMalloc((void **)&y, 4 * sizeof(float)) || mpu_comm_set_stream(nc, s)) {
    say(0, "graph", "%s: set-up: %s / %s", mode_name, cudaGetErrorString(cudaGetLastError()), mpu_last_error());
    goto done;
  }
  cudaError_t e = begin(s, mode);
  mpu_result_t r = e ? MPU_SUCCESS : mpu_comm_iall_reduce(nc, x, y, 4, MPU_FLOAT32, MPU_SUM, &req);
  const char *call_err = r ? mpu_last_error() : "";
  cudaError_t e_end = e ? cudaSuccess : end(s, &g);
  if (e || r || e_end || !g) {
    say(0, "graph", "%s capture of mpu_comm_iall_reduce: begin %s, the call %s%s%s, end %s", mode_name,
        cudaGetErrorString(e), mpu_result_name(r), r ? ": " : "", call_err, cudaGetErrorString(e_end));
    cudaGetLastError();
    goto after;
  }
  int right = 1;
  cudaError_t le = inst(&ge, g, 0);
  for (int round = 1; !le && round <= 3; round++) {
    float in[4] = {1.0f * (float)round, 2, 3, 4}, out[4] = {0};
    cudaMemcpyAsync(x, in, sizeof in, cudaMemcpyHostToDevice, s); /* pageable: staged at enqueue */
    le = launch(ge, s);
    if (!le) le = cudaStreamSynchronize(s);
    if (!le) le = cudaMemcpy(out, y, sizeof out, cudaMemcpyDeviceToHost);
    right = right && !le && out[0] == in[0] && out[3] == 4.0f;
  }
  say(!le && right, "graph", "%s capture of mpu_comm_iall_reduce, 3 replays: %s", mode_name,
      le ? cudaGetErrorString(le) : right ? "right" : "wrong values");
after:
  if (req) {
    mpu_result_t w = mpu_request_wait(req);
    say(-1, "graph", "%s: waiting the captured call's request afterwards: %s%s%s", mode_name,
        mpu_result_name(w), w ? ": " : "", w ? mpu_last_error() : "");
  }
  {
    float one = 5, sum = 0;
    mpu_comm_set_stream(nc, NULL);
    cudaMemcpy(x, &one, sizeof one, cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();
    r = mpu_comm_all_reduce(nc, x, y, 1, MPU_FLOAT32, MPU_SUM);
    if (!r) cudaMemcpy(&sum, y, sizeof sum, cudaMemcpyDeviceToHost);
    say(!r && sum == 5.0f, "graph", "%s: the communicator afterwards: %s", mode_name,
        r ? mpu_last_error() : sum == 5.0f ? "works" : "wrong value");
  }
done:
  if (ge) exec_free(ge);
  if (g) graph_free(g);
  cudaFree(x);
  cudaFree(y);
  if (s) cudaStreamDestroy(s);
}

static mpu_result_t graph_rank(mpu_comm *world, void *arg) {
  (void)arg;
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.one_rank_through_nccl = 1;
  o.timeout_s = 20;
  mpu_comm *nc = NULL;
  mpu_result_t r = mpu_comm_nccl_create(world, &o, &nc);
  if (r) return r;
  capture_probe();
  graph_case(nc, cudaStreamCaptureModeThreadLocal, "thread-local");
  graph_case(nc, cudaStreamCaptureModeGlobal, "global");
  return mpu_comm_destroy(nc);
}

/* What each CUDA call mpu makes does to a thread-local capture: the call's
 * answer and whether the capture survives it (INFO lines: CUDA's rules). */
typedef cudaError_t (*is_capturing_fn)(cudaStream_t, enum cudaStreamCaptureStatus *);
typedef int (*range_fn)(unsigned long long *, size_t *, unsigned long long);

typedef struct probe_ctx {
  void *dev;
  cudaEvent_t idle;     /* recorded and completed before the capture */
  cudaEvent_t captured; /* recorded inside it */
  cudaStream_t s, other;
  cudaError_t other_thread;
} probe_ctx;

static void *query_captured(void *p) {
  probe_ctx *x = p;
  x->other_thread = cudaEventQuery(x->captured);
  return NULL;
}

static void *query_idle(void *p) { /* as a watchdog thread does */
  probe_ctx *x = p;
  x->other_thread = cudaEventQuery(x->idle);
  return NULL;
}

static void *query_idle_relaxed(void *p) { /* as mpu's watchdog thread does */
  enum cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&relaxed);
  return query_idle(p);
}

static cudaError_t probe_op(int op, probe_ctx *x, const char **name) {
  struct cudaPointerAttributes a;
  cudaEvent_t e = NULL;
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  switch (op) {
  case 0: *name = "cudaPointerGetAttributes"; return cudaPointerGetAttributes(&a, x->dev);
  case 1: {
    *name = "cuMemGetAddressRange";
    cudaError_t r = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q);
    if (r || !fn) return r ? r : cudaErrorSymbolNotFound;
    unsigned long long base = 0;
    size_t size = 0;
    return ((range_fn)fn)(&base, &size, (unsigned long long)(uintptr_t)x->dev) ? cudaErrorUnknown : cudaSuccess;
  }
  case 2: {
    *name = "cudaEventCreateWithFlags";
    cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (e) cudaEventDestroy(e);
    return r;
  }
  case 3: *name = "cudaEventRecord on the capturing stream"; return cudaEventRecord(x->captured, x->s);
  case 4: *name = "cudaEventQuery of an event from before"; return cudaEventQuery(x->idle);
  case 5: *name = "cudaStreamQuery of another stream"; return cudaStreamQuery(x->other);
  case 6:
    *name = "cudaEventQuery of a captured event, this thread";
    cudaEventRecord(x->captured, x->s);
    return cudaEventQuery(x->captured);
  case 7: {
    *name = "cudaEventQuery of a captured event, another thread";
    cudaEventRecord(x->captured, x->s);
    pthread_t t;
    if (pthread_create(&t, NULL, query_captured, x)) return cudaErrorUnknown;
    pthread_join(t, NULL);
    return x->other_thread;
  }
  case 8: *name = "cudaGetLastError"; return cudaGetLastError();
  case 9:
  case 10: {
    *name = op == 9 ? "cudaEventQuery of an event from before, another thread"
                    : "cudaEventQuery of an event from before, another thread in relaxed mode";
    pthread_t t;
    if (pthread_create(&t, NULL, op == 9 ? query_idle : query_idle_relaxed, x)) return cudaErrorUnknown;
    pthread_join(t, NULL);
    return x->other_thread;
  }
  default: return cudaErrorInvalidValue;
  }
}

static void capture_probe(void) {
  begin_fn begin = (begin_fn)dlsym(RTLD_DEFAULT, "cudaStreamBeginCapture");
  end_fn end = (end_fn)dlsym(RTLD_DEFAULT, "cudaStreamEndCapture");
  graph_free_fn graph_free = (graph_free_fn)dlsym(RTLD_DEFAULT, "cudaGraphDestroy");
  is_capturing_fn is_capturing = (is_capturing_fn)dlsym(RTLD_DEFAULT, "cudaStreamIsCapturing");
  if (!begin || !end || !graph_free || !is_capturing) return; /* said by graph_case */
  probe_ctx x = {0};
  if (cudaMalloc(&x.dev, 256) || cudaStreamCreateWithFlags(&x.s, cudaStreamNonBlocking) ||
      cudaStreamCreateWithFlags(&x.other, cudaStreamNonBlocking) ||
      cudaEventCreateWithFlags(&x.idle, cudaEventDisableTiming) ||
      cudaEventCreateWithFlags(&x.captured, cudaEventDisableTiming) || cudaEventRecord(x.idle, x.other) ||
      cudaDeviceSynchronize()) {
    say(0, "graph", "probe set-up: %s", cudaGetErrorString(cudaGetLastError()));
    return;
  }
  for (int op = 0; op < 13; op++) {
    const char *name = "";
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaGraph_t g = NULL;
    int global = op >= 11; /* 11, 12: ops 9, 10 under a global capture */
    cudaError_t b = begin(x.s, global ? cudaStreamCaptureModeGlobal : cudaStreamCaptureModeThreadLocal);
    cudaMemsetAsync(x.dev, 0, 256, x.s); /* something to capture */
    cudaError_t r = probe_op(global ? op - 2 : op, &x, &name);
    cudaError_t c = is_capturing(x.s, &st);
    cudaError_t e = end(x.s, &g);
    if (g) graph_free(g);
    cudaGetLastError();
    say(-1, "graph", "during a %s capture, %s: %s; the capture then %s (end: %s)",
        global ? "global" : "thread-local", name,
        b ? cudaGetErrorString(b) : cudaGetErrorString(r),
        c ? cudaGetErrorString(c) : st == cudaStreamCaptureStatusActive ? "active" : st == cudaStreamCaptureStatusInvalidated ? "INVALIDATED" : "none",
        cudaGetErrorString(e));
  }
  cudaFree(x.dev);
  cudaStreamDestroy(x.s);
  cudaStreamDestroy(x.other);
  cudaEventDestroy(x.idle);
  cudaEventDestroy(x.captured);
}

/* ---- NCCL's own average at one rank --------------------------------------------- */

/* ncclAvg on a communicator of one rank runs NCCL's oneRankReduce kernel
 * (enqueue.cc, ncclLaunchOneRank; src/device/onerank.cu), split in blocks
 * of 16 KiB; ncclSum there is a copy. Counts that give several blocks and
 * an odd tail, out of place, with the output poisoned first. */
static void check_avg_raw(void) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  if (cudaSetDevice(0) || ncclGetUniqueId(&id) || ncclCommInitRank(&comm, 1, id, 0)) {
    say(0, "avg", "set-up failed");
    return;
  }
  static const struct { ncclDataType_t t; size_t es; size_t count; const char *name; } cases[] = {
      {ncclFloat32, 4, 7, "float32"},    {ncclFloat32, 4, 20001, "float32"}, {ncclFloat32, 4, 20000, "float32"},
      {ncclFloat64, 8, 3001, "float64"}, {ncclInt32, 4, 20001, "int32"}};
  size_t most = 20001 * 8;
  unsigned char *host = malloc(most), *back = malloc(most);
  void *send = NULL, *recv = NULL;
  if (!host || !back || cudaMalloc(&send, most) || cudaMalloc(&recv, most)) {
    say(0, "avg", "set-up failed");
    goto done;
  }
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
    for (int avg = 0; avg <= 1; avg++) {
      size_t n = cases[k].count, es = cases[k].es;
      for (size_t i = 0; i < n; i++) { /* every element 1 */
        float f = 1;
        double d = 1;
        int32_t v = 1;
        memcpy(host + i * es, es == 8 ? (void *)&d : cases[k].t == ncclInt32 ? (void *)&v : (void *)&f, es);
      }
      cudaMemcpy(send, host, n * es, cudaMemcpyHostToDevice);
      cudaMemset(recv, 0x5a, n * es);
      cudaDeviceSynchronize();
      ncclResult_t r = ncclAllReduce(send, recv, n, cases[k].t, avg ? ncclAvg : ncclSum, comm, 0);
      cudaDeviceSynchronize();
      cudaMemcpy(back, recv, n * es, cudaMemcpyDeviceToHost);
      size_t wrong = 0, first = 0;
      for (size_t i = 0; i < n; i++)
        if (memcmp(back + i * es, host + i * es, es) && !wrong++) first = i;
      char where[48] = "";
      if (wrong) snprintf(where, sizeof where, ", the first at index %zu", first);
      say(r == ncclSuccess ? -1 : 0, "avg", "raw ncclAllReduce %s %s count %zu at one rank: %s, %zu element(s) wrong%s",
          avg ? "avg" : "sum", cases[k].name, n, ncclGetErrorString(r), wrong, where);
    }
done:
  cudaFree(send);
  cudaFree(recv);
  free(host);
  free(back);
  ncclCommDestroy(comm);
}

/* ---- deadline ------------------------------------------------------------------- */

static mpu_result_t one_rank_works(mpu_comm *world, void *arg) {
  (void)arg;
  mpu_comm *nc = NULL;
  mpu_result_t r = mpu_comm_nccl_create(world, NULL, &nc);
  return r ? r : mpu_comm_destroy(nc);
}

static void check_deadline(void) {
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.timeout_s = 5;
  mpu_comm *c = NULL;
  double t0 = now();
  mpu_result_t r = mpu_comm_nccl_from_env(&o, &c);
  double took = now() - t0;
  say(r == MPU_ERR_TIMEOUT && took < o.timeout_s + 2, "deadline",
      "rank 0 of 2, the peer in the store but never in NCCL: %s after %.1f s (limit 5 s)%s%s",
      mpu_result_name(r), took, r ? ": " : "", r ? mpu_last_error() : "");
  if (!r) mpu_comm_abort(c);
  sleep(2); /* anything NCCL's init job would still write, it writes now */
  r = mpu_launch(1, one_rank_works, NULL, NULL, NULL);
  say(!r, "deadline", "a new communicator afterwards: %s", r ? mpu_last_error() : "made and destroyed");
}

int main(int argc, char **argv) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    fprintf(stderr, "gpu_checks: no CUDA device\n");
    return 2;
  }
  /* [--unordered] [pointers|order|split|share|graph|avg|deadline]; deadline only when named */
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
  if (!*only || !strcmp(only, "share")) check_share_raw();
  for (int share = 0; share <= 1; share++)
    if (!*only || !strcmp(only, "share"))
      if ((r = mpu_launch(1, share_rank, &share, NULL, NULL))) say(0, "share", "%s", mpu_last_error());
  if (!*only || !strcmp(only, "graph"))
    if ((r = mpu_launch(1, graph_rank, NULL, NULL, NULL))) say(0, "graph", "%s", mpu_last_error());
  if (!*only || !strcmp(only, "avg")) check_avg_raw();
  if (!strcmp(only, "deadline")) check_deadline();
  return gpu_failed;
}
