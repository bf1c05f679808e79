/*
 * test_nccl_memory.c - device memory on the NCCL backend, on the faithful
 * test double (no "pointers" switch): the double's memory answers like CUDA
 * 13 and a kernel outside device memory breaks the device for good; mpu's
 * one argument check refuses host buffers on an NCCL communicator, naming
 * the buffer and its kind, before anything reaches NCCL; device, managed and
 * registered memory pass; the host cannot read or write device memory
 * (it faults, as on a GPU: switch "host_access" lets it) and cudaFree waits
 * for the device (switch "free_nowait"); the layers, the optimizer and broadcast_data given
 * an NCCL group compute through its host twin, or refuse without one.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "mpu.h"
#include "nccl_double/memory.h"
#include "nccl_double/switches.h"
#include "test_helpers.h"

/* ---- the double itself ------------------------------------------------------- */

static void double_answers_like_cuda(void **state) {
  (void)state;
  struct cudaPointerAttributes a;
  char *host = malloc(64);
  void *dev = NULL, *managed = NULL, *pinned = NULL;
  assert_non_null(host);
  assert_int_equal(cudaSetDevice(3), cudaSuccess);
  assert_int_equal(cudaPointerGetAttributes(&a, host), cudaSuccess); /* CUDA 11 on: no error */
  assert_int_equal(a.type, cudaMemoryTypeUnregistered);
  assert_int_equal(cudaMalloc(&dev, 256), cudaSuccess);
  assert_int_equal(cudaPointerGetAttributes(&a, (char *)dev + 255), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeDevice);
  assert_int_equal(a.device, 3);
  assert_int_equal(cudaPointerGetAttributes(&a, (char *)dev + 256), cudaSuccess);
  assert_int_not_equal(a.type, cudaMemoryTypeDevice); /* one past the end is not in it */
  assert_int_equal(cudaMallocManaged(&managed, 16, cudaMemAttachGlobal), cudaSuccess);
  assert_int_equal(cudaPointerGetAttributes(&a, managed), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeManaged);
  assert_int_equal(cudaMallocHost(&pinned, 16), cudaSuccess);
  assert_int_equal(cudaPointerGetAttributes(&a, pinned), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeHost);
  assert_int_equal(cudaHostRegister(host, 64, cudaHostRegisterDefault), cudaSuccess);
  assert_int_equal(cudaHostRegister(host + 8, 8, cudaHostRegisterDefault),
                   cudaErrorHostMemoryAlreadyRegistered);
  assert_int_equal(cudaPointerGetAttributes(&a, host + 63), cudaSuccess);
  assert_int_equal(a.type, cudaMemoryTypeHost);
  assert_int_equal(cudaHostUnregister(host), cudaSuccess);
  assert_int_equal(cudaHostUnregister(host), cudaErrorHostMemoryNotRegistered);
  assert_int_equal(cudaFree(host), cudaErrorInvalidValue); /* not cudaMalloc's */
  assert_int_equal(cudaFreeHost(pinned), cudaSuccess);
  assert_int_equal(cudaFree(managed), cudaSuccess);
  assert_int_equal(cudaFree(dev), cudaSuccess);
  free(host);
}

/* A raw NCCL call on host memory faults as an illegal address: the call
 * returns (NCCL checks no pointers), the stream and the device are broken,
 * every later runtime call on that device says so, the async error is set. */
static void kernel_outside_device_memory_is_sticky(void **state) {
  (void)state;
  ncclUniqueId id;
  ncclComm_t comm;
  cudaStream_t s;
  float host[4] = {1, 2, 3, 4};
  void *dev = NULL;
  assert_int_equal(cudaSetDevice(2), cudaSuccess);
  assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
  assert_int_equal(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  assert_int_equal(ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, comm, s), ncclSuccess);
  cudaError_t e;
  while ((e = cudaStreamQuery(s)) == cudaErrorNotReady) sched_yield();
  assert_int_equal(e, cudaErrorIllegalAddress);
  assert_int_equal(cudaMalloc(&dev, 16), cudaErrorIllegalAddress);
  ncclResult_t async = ncclSuccess;
  assert_int_equal(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  assert_int_equal(async, ncclUnhandledCudaError);
  assert_non_null(strstr(double_fault_message(), "device 2"));
  assert_int_equal(cudaSetDevice(1), cudaSuccess); /* another device is not touched */
  assert_int_equal(cudaMalloc(&dev, 16), cudaSuccess);
  assert_int_equal(cudaFree(dev), cudaSuccess);
  assert_int_equal(cudaSetDevice(2), cudaSuccess);
  ncclCommAbort(comm);
  cudaStreamDestroy(s);
  double_clear_faults(); /* tests only: CUDA needs a new process */
  assert_int_equal(cudaMalloc(&dev, 16), cudaSuccess);
  assert_int_equal(cudaFree(dev), cudaSuccess);
}

/* ---- device memory the host cannot touch --------------------------------------- */

static sigjmp_buf fault_jump;

static void on_fault(int sig) {
  (void)sig;
  siglongjmp(fault_jump, 1);
}

/* 1 when reading (write 0) or writing (write 1) the byte at p faults. */
static int host_access_faults(volatile char *p, int write) {
  struct sigaction sa, old_segv, old_bus;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fault;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
  volatile int faulted = 0;
  if (!sigsetjmp(fault_jump, 1)) {
    if (write) *p = 1;
    else (void)*p;
  } else {
    faulted = 1;
  }
  sigaction(SIGSEGV, &old_segv, NULL);
  sigaction(SIGBUS, &old_bus, NULL);
  return faulted;
}

/* cudaMalloc memory is the device's: a host read or write faults as on a
 * GPU, while copies, memsets and NCCL reach it; managed and page-locked host
 * memory stay host memory. "host_access" is the named way back. */
static void host_cannot_touch_device_memory(void **state) {
  (void)state;
  char *dev = NULL, *managed = NULL, *pinned = NULL, *async = NULL, out[64];
  char in[64];
  for (int i = 0; i < 64; i++) in[i] = (char)i;
  assert_int_equal(cudaSetDevice(0), cudaSuccess);
  assert_int_equal(cudaMalloc((void **)&dev, 64), cudaSuccess);
  assert_true(host_access_faults(dev, 0));
  assert_true(host_access_faults(dev + 63, 1));
  assert_int_equal(cudaMallocAsync((void **)&async, 16, NULL), cudaSuccess);
  assert_true(host_access_faults(async, 0));
  assert_int_equal(cudaMemcpy(dev, in, 64, cudaMemcpyHostToDevice), cudaSuccess);
  assert_int_equal(cudaMemset(dev, 9, 8), cudaSuccess);
  assert_int_equal(cudaMemcpy(out, dev, 64, cudaMemcpyDeviceToHost), cudaSuccess);
  assert_int_equal(out[7], 9);
  assert_int_equal(out[8], 8);
  assert_int_equal(out[63], 63);
  /* a copy that runs past its device allocation is refused, as CUDA's */
  assert_int_equal(cudaMemcpy(out, dev + 32, 64, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  /* an NCCL kernel reads and writes it */
  ncclUniqueId id;
  ncclComm_t comm;
  assert_int_equal(ncclGetUniqueId(&id), ncclSuccess);
  assert_int_equal(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  assert_int_equal(ncclAllReduce(dev, dev + 32, 32, ncclInt8, ncclSum, comm, NULL), ncclSuccess);
  assert_int_equal(cudaMemcpy(out, dev + 32, 32, cudaMemcpyDeviceToHost), cudaSuccess);
  assert_int_equal(out[0], 9);
  assert_int_equal(out[31], 31);
  assert_int_equal(ncclCommDestroy(comm), ncclSuccess);
  /* managed and page-locked host memory: the host's */
  assert_int_equal(cudaMallocManaged((void **)&managed, 16, cudaMemAttachGlobal), cudaSuccess);
  assert_int_equal(cudaMallocHost((void **)&pinned, 16), cudaSuccess);
  assert_false(host_access_faults(managed, 1));
  assert_false(host_access_faults(pinned, 1));
  assert_int_equal(cudaFree(managed), cudaSuccess);
  assert_int_equal(cudaFreeHost(pinned), cudaSuccess);
  assert_int_equal(cudaFreeAsync(async, NULL), cudaSuccess);
  assert_int_equal(cudaFree(dev), cudaSuccess);
  /* the switch: device memory the host may touch */
  assert_int_equal(double_forgive("host_access", 1), 0);
  assert_int_equal(cudaMalloc((void **)&dev, 64), cudaSuccess);
  assert_false(host_access_faults(dev, 1));
  assert_int_equal(cudaFree(dev), cudaSuccess);
  assert_int_equal(double_forgive("host_access", 0), 0);
  assert_int_equal(cudaStreamSynchronize(NULL), cudaSuccess);
}

/* ---- cudaFree waits for the device --------------------------------------------- */

static void *open_later(void *p) {
  struct timespec ts = {0, 200 * 1000 * 1000};
  nanosleep(&ts, NULL);
  gate_open(p);
  return NULL;
}

/* CUDA's cudaFree synchronises the device: it returns only once every
 * stream of the device, a non-blocking one of another's too, is idle. */
static void cuda_free_waits_for_the_device(void **state) {
  (void)state;
  cudaStream_t s;
  void *dev = NULL;
  assert_int_equal(cudaSetDevice(1), cudaSuccess);
  assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  pthread_t helper;
  assert_int_equal(cudaMalloc(&dev, 16), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(s, gate_hold, &g), cudaSuccess);
  assert_int_equal(pthread_create(&helper, NULL, open_later, &g), 0);
  assert_int_equal(cudaFree(dev), cudaSuccess);
  assert_true(gate_ran(&g)); /* the stream's work finished before cudaFree returned */
  pthread_join(helper, NULL);
  /* "free_nowait": it returns while the device is busy */
  gate h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
  assert_int_equal(double_forgive("free_nowait", 1), 0);
  assert_int_equal(cudaMalloc(&dev, 16), cudaSuccess);
  assert_int_equal(cudaLaunchHostFunc(s, gate_hold, &h), cudaSuccess);
  assert_int_equal(cudaFree(dev), cudaSuccess);
  assert_false(gate_ran(&h));
  gate_open(&h);
  assert_int_equal(double_forgive("free_nowait", 0), 0);
  assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
  assert_true(gate_ran(&h));
  assert_int_equal(cudaStreamDestroy(s), cudaSuccess);
}

/* ---- mpu's argument check --------------------------------------------------------- */

typedef struct rank_msg {
  char text[4][320];
} rank_msg;

#define REFUSED(call, words)                                                              \
  CHECK_OUT((call) == MPU_ERR_INVALID_ARGUMENT && strstr(mpu_last_error(), words),            \
         "%s: want a refusal naming '%s', got: %s", #call, words, mpu_last_error())

static int has_words(const char *a, const char *b) {
  return strstr(mpu_last_error(), a) && strstr(mpu_last_error(), b);
}

static mpu_result_t check_rank(mpu_comm *world, void *arg) {
  rank_msg *m = arg;
  int me = 0, n = 0;
  mpu_comm *nc = NULL;
  mpu_result_t r = test_nccl_over(world, NULL, &me, &n, &nc);
  if (r) return r;
  float *host = calloc(64, sizeof *host), *dev = NULL, *managed = NULL;
  void *other = NULL;
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  CHECK_OUT(host && !mpu_comm_capabilities(nc, &caps) && caps.memory == MPU_MEMORY_DEVICE,
         "caps.memory %d", (int)caps.memory);
  CHECK_OUT(!mpu_comm_mem_alloc(nc, 16 * sizeof *dev, (void **)&dev), "mem_alloc");
  /* host buffers: refused by name and kind, nothing reaches NCCL */
  REFUSED(mpu_comm_all_reduce(nc, host, dev, 16, MPU_FLOAT32, MPU_SUM), "send buffer");
  CHECK_OUT(has_words("host memory not registered", "NCCL on device"), "%s", mpu_last_error());
  REFUSED(mpu_comm_all_reduce(nc, dev, host, 16, MPU_FLOAT32, MPU_SUM), "recv buffer");
  REFUSED(mpu_comm_all_gather(nc, dev, host, 8, MPU_FLOAT32), "recv buffer");
  REFUSED(mpu_comm_broadcast(nc, host, 4, MPU_FLOAT32, 0), "data buffer");
  mpu_request *req = NULL;
  REFUSED(mpu_comm_iall_reduce(nc, host, host, 4, MPU_FLOAT32, MPU_SUM, &req), "buffer");
  REFUSED(mpu_comm_send(nc, host, 4, MPU_FLOAT32, (me + 1) % n), "send buffer");
  REFUSED(mpu_comm_recv(nc, host, 4, MPU_FLOAT32, (me + n - 1) % n), "recv buffer");
  /* a span that runs past its allocation */
  REFUSED(mpu_comm_all_reduce(nc, dev, dev, 32, MPU_FLOAT32, MPU_SUM), "runs past the end");
  /* memory of another device */
  int mine = -1;
  cudaGetDevice(&mine);
  cudaSetDevice(mine + n);
  cudaError_t e = cudaMalloc(&other, 64);
  cudaSetDevice(mine);
  CHECK_OUT(e == cudaSuccess, "cudaMalloc on another device");
  REFUSED(mpu_comm_all_reduce(nc, other, other, 4, MPU_FLOAT32, MPU_SUM), "device memory of device");
  /* nothing faulted, and the communicator works on device, managed and
   * registered host memory */
  CHECK_OUT(!double_fault_message()[0], "a fault: %s", double_fault_message());
  for (int i = 0; i < 16; i++) host[i] = (float)(me + i);
  CHECK_OUT(!mpu_comm_copy2d(nc, dev, 16 * sizeof *dev, host, 16 * sizeof *dev, 16 * sizeof *dev, 1),
         "copy in");
  CHECK_OUT(!mpu_comm_all_reduce(nc, dev, dev, 16, MPU_FLOAT32, MPU_SUM), "device: %s", mpu_last_error());
  CHECK_OUT(cudaMallocManaged((void **)&managed, 16 * sizeof *managed, cudaMemAttachGlobal) == 0, "managed");
  CHECK_OUT(!mpu_comm_copy2d(nc, managed, 64, dev, 64, 64, 1), "copy out");
  float want = (float)(n * (n - 1) / 2);
  CHECK_OUT(managed[0] == want && managed[15] == want + 15.0f * (float)n, "sum %g, want %g", managed[0], want);
  CHECK_OUT(!mpu_comm_all_reduce(nc, managed, managed, 16, MPU_FLOAT32, MPU_MAX), "managed: %s",
         mpu_last_error());
  CHECK_OUT(cudaHostRegister(host, 64 * sizeof *host, cudaHostRegisterDefault) == cudaSuccess, "register");
  host[0] = 1;
  r = mpu_comm_all_reduce(nc, host, host, 1, MPU_FLOAT32, MPU_SUM);
  cudaHostUnregister(host);
  CHECK_OUT(!r && host[0] == (float)n, "registered: %s, %g", mpu_last_error(), host[0]);
out:
  cudaFree(other);
  cudaFree(managed);
  mpu_comm_mem_free(nc, dev);
  free(host);
  mpu_result_t d = mpu_comm_destroy(nc);
  return r ? r : d;
}

static void run_ranks(int n, mpu_result_t (*fn)(mpu_comm *, void *)) {
  rank_msg m;
  memset(&m, 0, sizeof m);
  mpu_result_t r = mpu_launch(n, fn, &m, NULL, NULL);
  for (int k = 0; k < n; k++)
    if (m.text[k][0]) print_error("rank %d: %s\n", k, m.text[k]);
  if (r) fail_msg("%d ranks: %s: %s", n, mpu_result_name(r), mpu_last_error());
}

static void host_buffers_refused(void **state) {
  (void)state;
  run_ranks(2, check_rank);
  run_ranks(4, check_rank);
}

/* ---- the layers, the optimizer, broadcast_data on an NCCL group ------------------ */

static mpu_result_t layers_rank(mpu_comm *world, void *arg) {
  rank_msg *m = arg;
  int me = 0, n = 0;
  mpu_comm *nc = NULL, *bare = NULL;
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.keep_host = 0;
  mpu_result_t r = test_nccl_over(world, NULL, &me, &n, &nc);
  if (!r) r = mpu_comm_nccl_create(world, &o, &bare);
  if (r) {
    mpu_comm_destroy(nc);
    return r;
  }
  /* broadcast_data: host tensors through the twin */
  int64_t src[3] = {7, 8, 9};
  int64_t shape[1] = {3};
  mpu_tensor t;
  memset(&t, 0, sizeof t);
  const char *keys[1] = {"tokens"};
  if (me == 0) CHECK_OUT(!mpu_tensor_init(&t, src, MPU_INT64, 1, shape), "tensor");
  CHECK_OUT(!mpu_broadcast_data(nc, 1, keys, &t), "broadcast_data on NCCL: %s", mpu_last_error());
  CHECK_OUT(t.ndim == 1 && t.shape[0] == 3 && ((int64_t *)t.data)[2] == 9, "broadcast_data result");
  if (me) mpu_tensor_free(&t);
  /* a column-parallel layer keeps the host twin for its host activations */
  mpu_column_linear l;
  CHECK_OUT(!mpu_column_linear_init(&l, nc, 4, 2 * n, 0, 1, 0, 1, 0.02f), "column linear: %s",
         mpu_last_error());
  CHECK_OUT(l.tp != nc && !strcmp(mpu_comm_backend(l.tp), "threads"), "layer on %s",
         mpu_comm_backend(l.tp));
  mpu_column_linear_free(&l);
  /* without a twin: a clear refusal, not a fault */
  memset(&t, 0, sizeof t);
  if (me == 0) mpu_tensor_init(&t, src, MPU_INT64, 1, shape);
  REFUSED(mpu_broadcast_data(bare, 1, keys, &t), "no host twin");
  REFUSED(mpu_column_linear_init(&l, bare, 4, 2 * n, 0, 1, 0, 1, 0.02f), "no host twin");
  CHECK_OUT(!double_fault_message()[0], "a fault: %s", double_fault_message());
out:
  mpu_comm_destroy(bare);
  mpu_comm_destroy(nc);
  return r;
}

static void layers_use_the_twin(void **state) {
  (void)state;
  run_ranks(2, layers_rank);
}

int main(void) {
  if (!mpu_nccl_available()) {
    printf("no NCCL backend in this build\n");
    return 0;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(double_answers_like_cuda),
      cmocka_unit_test(kernel_outside_device_memory_is_sticky),
      cmocka_unit_test(host_cannot_touch_device_memory),
      cmocka_unit_test(cuda_free_waits_for_the_device),
      cmocka_unit_test(host_buffers_refused),
      cmocka_unit_test(layers_use_the_twin),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
