/*
 * bench.c - timing collectives (nccl-tests' definitions) and the memcpy
 * reference they are compared with.
 *
 * Each rank times every iteration of its own call; an all_reduce(max) of the
 * per-iteration times then gives every rank the slowest rank's time per
 * iteration, whose median is the reported median. Iterations are not
 * separated by barriers: as in nccl-tests, ranks stay in step through the
 * collective, and the mean is the slowest rank's time for the whole timed
 * loop over the iterations (nccl-tests times a batch the same way), less
 * the config's pauses. Several
 * variants interleaved start each call at a barrier, and their mean is that
 * of the per-iteration times.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_internal.h"
#include "comm/base/collective.h"
#include "comm/base/copy.h"
#include "comm/services.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/options.h"
#include "mpu/bench.h"

double mpu_bench_bus_factor(mpu_collective c, int n) {
  const mpu__coll *k = mpu__coll_of(c);
  if (n <= 0 || !k || (unsigned)c >= MPU_COLL_KINDS) return 0;
  return k->bus_ring ? k->bus_scale * (n - 1) / n : k->bus_scale;
}

double mpu_bench_traffic(mpu_collective c, int n, size_t bytes) {
  const mpu__coll *k = mpu__coll_of(c);
  if (n <= 0 || !k || (unsigned)c >= MPU_COLL_KINDS) return 0;
  return (k->traffic_n * n + k->traffic_1) * (double)bytes;
}

static double now_us(void) { return mpu__now() * 1e6; }

/* Benchmark buffers: 2 MiB aligned and backed by huge pages where the kernel
 * allows, so that large sizes measure memory bandwidth, not TLB misses. The
 * memcpy reference uses the same buffers, so the comparison stays fair. */
void *mpu__bench_alloc(size_t bytes) {
  const size_t huge = (size_t)2 << 20;
  /* more than the machine's memory is out of memory, not a request to malloc */
  double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  if (!bytes || bytes > (size_t)PTRDIFF_MAX / 2 || (phys > 0 && (double)bytes > phys)) return NULL;
  size_t rounded = (bytes + huge - 1) & ~(huge - 1);
  void *p = NULL;
  if (posix_memalign(&p, huge, rounded)) return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, rounded, MADV_HUGEPAGE); /* advice only: failure changes nothing */
#endif
  return p;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

mpu_result_t mpu__bench_layout(const char *fn, const mpu_bench_config *in, int n,
                               mpu_bench_config *full, bench_layout *out) {
  if (!in) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: config is NULL", fn);
  if (n < 1) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d ranks", fn, n);
  *full = (mpu_bench_config)MPU_BENCH_CONFIG_INIT;
  /* the first version ended before `native` */
  MPU_CHECK(mpu__take_options(fn, "config", "MPU_BENCH_CONFIG_INIT",
                              in, sizeof *full, offsetof(mpu_bench_config, native),
                              full));
  const mpu_bench_config *cfg = full;
  if ((unsigned)cfg->collective >= MPU_COLL_COUNT || !mpu_dtype_size(cfg->dtype) ||
      (unsigned)cfg->op >= MPU_OP_COUNT || cfg->iters < 1 || cfg->iters > 100000 ||
      cfg->warmup < 0 || cfg->warmup > 100000 || cfg->average < MPU_BENCH_SLOWEST ||
      cfg->average > MPU_BENCH_MAX || cfg->pauses < 0 || cfg->pauses > cfg->iters ||
      (cfg->pauses && !cfg->pause))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: collective %d, dtype %d, op %d, %d iterations, %d warm-up, %d "
                      "pauses (0..iterations, with a pause function)", fn,
                      (int)cfg->collective, (int)cfg->dtype, (int)cfg->op, cfg->iters,
                      cfg->warmup, cfg->pauses);
  size_t es = mpu_dtype_size(cfg->dtype);
  /* per-rank count: the buffer of nccl-tests' size is split over ranks for
   * the collectives whose size is a total */
  const mpu__coll *row = mpu__coll_of(cfg->collective);
  int send_blocks = row->send_blocks == MPU__BLOCKS_PER_RANK;
  int recv_blocks = row->recv_blocks == MPU__BLOCKS_PER_RANK;
  int per_total = send_blocks || recv_blocks;
  size_t count = cfg->bytes / es / (per_total ? (size_t)n : 1);
  if (count == 0) count = 1; /* as nccl-tests: at least one element per rank */
  /* send: n blocks for reduce_scatter and all_to_all; recv: n for all_gather
   * and all_to_all (the table's rows); every product and the +64 slack checked */
  size_t per = 0, send_bytes = 0, recv_bytes = 0, bytes = 0, slack;
  if (__builtin_mul_overflow(count, es, &per) ||
      __builtin_mul_overflow(per, send_blocks ? (size_t)n : 1, &send_bytes) ||
      __builtin_mul_overflow(per, recv_blocks ? (size_t)n : 1, &recv_bytes) ||
      __builtin_mul_overflow(per, per_total ? (size_t)n : 1, &bytes) ||
      __builtin_add_overflow(send_bytes, (size_t)64, &slack) ||
      __builtin_add_overflow(recv_bytes, (size_t)64, &slack) || send_bytes > (size_t)PTRDIFF_MAX ||
      recv_bytes > (size_t)PTRDIFF_MAX)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %zu bytes over %d ranks overflow the address space",
                      fn, cfg->bytes, n);
  *out = (bench_layout){count, send_bytes, recv_bytes, bytes};
  return MPU_SUCCESS;
}

void mpu__bench_place(const mpu_bench_config *cfg, char *send, char *recv, size_t count, int rank,
                      size_t es, char **s, char **r) {
  const mpu__coll *row = mpu__coll_of(cfg->collective);
  size_t mine = (size_t)rank * count * es;
  int ip = cfg->in_place;
  *s = send, *r = recv;
  if (row->in_place == MPU__IN_PLACE_ONE_BUFFER || (ip && row->in_place == MPU__IN_PLACE_SAME))
    *r = send;
  else if (ip && row->in_place == MPU__IN_PLACE_SEND_IN_RECV) *s = recv + mine;
  else if (ip && row->in_place == MPU__IN_PLACE_RECV_IN_SEND) *r = send + mine;
}

/* One call of the collective on the bench's buffers (root 0): mpu's, or the
 * backend library's own (mpu bench's reference). */
static mpu_result_t call_as(mpu_comm *c, const mpu_bench_config *cfg, void *send, void *recv,
                            size_t count, int rank, size_t es, int native) {
  char *s, *r;
  mpu__bench_place(cfg, send, recv, count, rank, es, &s, &r);
  return (native ? mpu__comm_native : mpu__comm_call)(c, cfg->collective, s, r, count, cfg->dtype,
                                                       cfg->op, 0);
}

static mpu_result_t call(mpu_comm *c, const mpu_bench_config *cfg, void *send, void *recv,
                         size_t count, int rank, size_t es) {
  return call_as(c, cfg, send, recv, count, rank, es, 0);
}

static mpu_result_t call_native(mpu_comm *c, const mpu_bench_config *cfg, void *send, void *recv,
                                size_t count, int rank, size_t es) {
  return call_as(c, cfg, send, recv, count, rank, es, 1);
}

/* ---- checking results --------------------------------------------------------------
 * The inputs are small integers, so every sum and product is exact in every
 * dtype and the expected output does not depend on the reduction's order:
 * rank r's input element j is ((7r + 3j) mod 16), or for prod 2 where
 * (r + j) is a multiple of 3, else 1. The expected values go through the same
 * conversions the reduction rule prescribes (docs/api.md). */

static int input_value(mpu_op op, int rank, size_t j) {
  if (op == MPU_PROD) return (rank + j) % 3 == 0 ? 2 : 1;
  return (int)(((size_t)rank * 7 + j * 3) % 16);
}

/* Store element i of a buffer of dtype dt: floats from a double (already
 * rounded as the rule wants), integers from their low bits. */
static void store_float(mpu_dtype dt, void *buf, size_t i, double v) {
  switch (dt) {
  case MPU_FLOAT32: ((float *)buf)[i] = (float)v; break;
  case MPU_FLOAT64: ((double *)buf)[i] = v; break;
  case MPU_FLOAT16: ((uint16_t *)buf)[i] = mpu_float_to_half((float)v); break;
  default: ((uint16_t *)buf)[i] = mpu_float_to_bfloat16((float)v); break;
  }
}

static void store_int(mpu_dtype dt, void *buf, size_t i, uint64_t u) {
  switch (dt) {
  case MPU_INT32:
  case MPU_UINT32: ((uint32_t *)buf)[i] = (uint32_t)u; break;
  case MPU_INT64:
  case MPU_UINT64: ((uint64_t *)buf)[i] = u; break;
  default: ((uint8_t *)buf)[i] = (uint8_t)u; break; /* uint8, int8 */
  }
}

/* The timed buffers hold rank % 3 + 1 in the dtype, never zeros: on the
 * machines measured, 64 MiB of zeros copied twice as fast as any other bytes
 * (8 thread ranks' broadcast: 10.5 against 21 ms), so zero buffers timed the
 * memory system's zero path, not a training job's. In place, sums grow to
 * infinity and stay there (no denormals: no slow path either). */
void mpu__bench_fill(void *buf, size_t bytes, mpu_dtype dt, int rank) {
  int is_float = mpu_dtype_is_float(dt), v = rank % 3 + 1;
  size_t count = bytes / mpu_dtype_size(dt);
  for (size_t i = 0; i < count; i++) {
    if (is_float) store_float(dt, buf, i, v);
    else store_int(dt, buf, i, (uint64_t)v);
  }
}

static void store_input(mpu_dtype dt, void *buf, size_t i, int v) {
  if (mpu_dtype_is_float(dt)) store_float(dt, buf, i, v);
  else store_int(dt, buf, i, (uint64_t)v);
}

/* op over every rank's element j, stored at out[i] */
static void store_reduced(mpu_dtype dt, mpu_op op, int n, size_t j, void *out, size_t i) {
  long long sum = 0, lo = 16, hi = -1, twos = 0;
  for (int r = 0; r < n; r++) {
    int v = input_value(op, r, j);
    sum += v, lo = v < lo ? v : lo, hi = v > hi ? v : hi, twos += v == 2;
  }
  if (mpu_dtype_is_float(dt)) {
    double v = op == MPU_MIN ? (double)lo : op == MPU_MAX ? (double)hi : (double)sum;
    if (op == MPU_PROD) v = ldexp(1.0, (int)twos);
    if (op == MPU_PROD && dt != MPU_FLOAT64) v = (float)v; /* float32 accumulator: inf past 2^127 */
    if (op == MPU_AVG) v = dt == MPU_FLOAT64 ? (double)sum / n : (double)((float)sum / (float)n);
    store_float(dt, out, i, v);
    return;
  }
  uint64_t u = op == MPU_MIN ? (uint64_t)lo : op == MPU_MAX ? (uint64_t)hi : (uint64_t)sum;
  if (op == MPU_PROD) u = twos >= 64 ? 0 : (uint64_t)1 << twos;
  if (op == MPU_AVG) u = (uint64_t)(sum / n);
  store_int(dt, out, i, u);
}

typedef struct check_bufs {
  char *send, *recv;          /* the call's buffers (device or host) */
  char *host_send, *host_recv; /* host copies to fill and read (== send, recv on the host) */
  size_t send_bytes, recv_bytes;
  int device;
} check_bufs;

/* The bench's own numbers (flags, times, error counts) live in host memory:
 * on a device communicator they go through its host twin, or, without one
 * (NCCL from torchrun's variables), through device memory and back. root
 * >= 0: a broadcast from it; otherwise an all-reduce with op. */
static mpu_result_t host_numbers(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, mpu_op op,
                                 int root) {
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  MPU_CHECK(mpu_comm_capabilities(c, &caps));
  mpu_comm *twin = NULL;
  if (caps.memory == MPU_MEMORY_HOST || mpu_comm_host_twin(c, &twin) == MPU_SUCCESS) {
    mpu_comm *h = twin ? twin : c;
    return root >= 0 ? mpu_comm_broadcast(h, buf, count, dt, root)
                     : mpu_comm_all_reduce(h, buf, buf, count, dt, op);
  }
  size_t bytes = count * mpu_dtype_size(dt); /* the caller's own buffer: no overflow */
  void *dev = NULL;
  MPU_CHECK(mpu_comm_mem_alloc(c, bytes, &dev));
  mpu_result_t r = mpu_comm_copy2d(c, dev, bytes, buf, bytes, bytes, 1);
  if (!r) r = root >= 0 ? mpu_comm_broadcast(c, dev, count, dt, root)
                        : mpu_comm_all_reduce(c, dev, dev, count, dt, op);
  if (!r) r = mpu_comm_copy2d(c, buf, bytes, dev, bytes, bytes, 1);
  mpu_result_t f = mpu_comm_mem_free(c, dev);
  return r ? r : f;
}

/* Run the call once on known inputs; *wrong = wrong output elements on every
 * rank together (collective over c). */
static mpu_result_t check_once(mpu_comm *c, const mpu_bench_config *cfg, int native,
                               const check_bufs *b, size_t count, int rank, int n,
                               long long *wrong) {
  size_t es = mpu_dtype_size(cfg->dtype);
  mpu_dtype dt = cfg->dtype;
  mpu_op op = cfg->op;
  mpu_collective k = cfg->collective;
  const mpu__coll *row = mpu__coll_of(k);
  size_t ninput = count * mpu__coll_blocks(row->send_blocks, n);
  memset(b->host_recv, 0xff, b->recv_bytes); /* NaN or -1: nothing to mistake for a result */
  /* where this rank's input and output are (on the host), as the call has them */
  char *in, *out, want[16];
  mpu__bench_place(cfg, b->host_send, b->host_recv, count, rank, es, &in, &out);
  for (size_t j = 0; j < ninput; j++) store_input(dt, in, j, input_value(op, rank, j));
  if (b->device) {
    MPU_CHECK(mpu_comm_copy2d(c, b->send, b->send_bytes, b->host_send, b->send_bytes,
                              b->send_bytes, 1));
    MPU_CHECK(mpu_comm_copy2d(c, b->recv, b->recv_bytes, b->host_recv, b->recv_bytes,
                              b->recv_bytes, 1));
  }
  MPU_CHECK(native ? call_native(c, cfg, b->send, b->recv, count, rank, es)
                   : call(c, cfg, b->send, b->recv, count, rank, es));
  if (b->device) {
    MPU_CHECK(mpu_comm_copy2d(c, b->host_send, b->send_bytes, b->send, b->send_bytes,
                              b->send_bytes, 1));
    MPU_CHECK(mpu_comm_copy2d(c, b->host_recv, b->recv_bytes, b->recv, b->recv_bytes,
                              b->recv_bytes, 1));
  }
  /* what this rank's output element i should be (only the root's where
   * the output is the root's alone) */
  size_t nout = row->recv_at_root && rank != 0 ? 0 : count * mpu__coll_blocks(row->recv_blocks, n);
  int64_t mine = 0;
  for (size_t i = 0; i < nout; i++) {
    switch (k) {
    case MPU_COLL_ALL_REDUCE:
    case MPU_COLL_REDUCE: store_reduced(dt, op, n, i, want, 0); break;
    case MPU_COLL_REDUCE_SCATTER: store_reduced(dt, op, n, (size_t)rank * count + i, want, 0); break;
    case MPU_COLL_BROADCAST: store_input(dt, want, 0, input_value(op, 0, i)); break;
    case MPU_COLL_ALL_GATHER: store_input(dt, want, 0, input_value(op, (int)(i / count), i % count)); break;
    default: /* all_to_all: block b came from rank b, its elements for this rank */
      store_input(dt, want, 0, input_value(op, (int)(i / count), (size_t)rank * count + i % count));
    }
    mine += memcmp(out + i * es, want, es) != 0;
  }
  MPU_CHECK(host_numbers(c, &mine, 1, MPU_INT64, MPU_SUM, -1));
  *wrong = mine;
  return MPU_SUCCESS;
}

static double median_of(double *t, int n) {
  qsort(t, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

mpu_result_t mpu_bench_collective(mpu_comm *comm, const mpu_bench_config *cfg,
                                  mpu_bench_result *out) {
  return mpu_bench_collectives(&comm, 1, cfg, out);
}

#define MAX_VARIANTS 8

/* One call of every variant (ncomms communicators, then the native call),
 * interleaved, a different variant first each iteration, so drift in the
 * machine's speed (another job, clocks, caches) touches all the same way;
 * with times, iteration i's times go to times[v * iters + i]. */
static mpu_result_t bench_round(mpu_comm *const *comms, int ncomms, int variants,
                                const mpu_bench_config *cfg, void *send, void *recv, size_t count,
                                int rank, size_t es, int i, double *times) {
  for (int k = 0; k < variants; k++) {
    int v = (k + (i < 0 ? 0 : i)) % variants;
    /* start every timed call together: reduce and broadcast let ranks
     * leave at different times, and the next call would pay their lag */
    if (variants > 1 || cfg->barrier) MPU_CHECK(mpu_comm_barrier(comms[0]));
    double t0 = now_us();
    if (v == ncomms) MPU_CHECK(call_native(comms[0], cfg, send, recv, count, rank, es));
    else MPU_CHECK(call(comms[v], cfg, send, recv, count, rank, es));
    if (times) times[(size_t)v * (size_t)cfg->iters + (size_t)i] = now_us() - t0;
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_bench_collectives(mpu_comm *const *comms, int ncomms, const mpu_bench_config *cfg,
                                   mpu_bench_result *out) {
  static const char fn[] = "mpu_bench_collective";
  int n, rank;
  if (!comms || ncomms < 1 || ncomms >= MAX_VARIANTS)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d communicators (want 1..%d)", fn, ncomms,
                      MAX_VARIANTS - 1);
  MPU_CHECK(mpu_comm_size(comms[0], &n));
  MPU_CHECK(mpu_comm_rank(comms[0], &rank));
  for (int v = 1; v < ncomms; v++) {
    int nv = -1, rv = -1;
    MPU_CHECK(mpu_comm_size(comms[v], &nv));
    MPU_CHECK(mpu_comm_rank(comms[v], &rv));
    if (nv != n || rv != rank)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: communicator %d is rank %d of %d, communicator 0 rank %d of %d (want "
                        "the same ranks)",
                        fn, v, rv, nv, rank, n);
  }
  if (!cfg || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  for (int v = 0; v < ncomms; v++) /* refuse a bad result size before any work */
    MPU_CHECK(mpu__check_size(fn, "result", "MPU_BENCH_RESULT_INIT", out[v].size,
                              MPU_BENCH_RESULT_MIN_SIZE, sizeof out[v]));
  mpu_bench_config full;
  bench_layout lay;
  MPU_CHECK(mpu__bench_layout(fn, cfg, n, &full, &lay));
  cfg = &full;
  size_t es = mpu_dtype_size(cfg->dtype), count = lay.count, bytes = lay.bytes;
  size_t send_bytes = lay.send_bytes, recv_bytes = lay.recv_bytes;

  mpu_result_t r = MPU_SUCCESS;
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  MPU_CHECK(mpu_comm_capabilities(comms[0], &caps));
  int device = caps.memory == MPU_MEMORY_DEVICE;
  char *send = NULL, *recv = NULL, *fill = NULL;
  /* times[v * iters + i]: variant v (comms[0..ncomms), then the native call) */
  double *times = malloc((size_t)(ncomms + 1) * (size_t)cfg->iters * sizeof(double));
  /* filled by mpu__bench_fill; device buffers by a copy from a host buffer
   * filled so */
  size_t most = send_bytes > recv_bytes ? send_bytes : recv_bytes;
  if (device) {
    void *a = NULL, *b = NULL;
    r = mpu_comm_mem_alloc(comms[0], send_bytes + 64, &a);
    if (!r) r = mpu_comm_mem_alloc(comms[0], recv_bytes + 64, &b);
    send = a, recv = b;
    if (r) goto out;
    fill = mpu__bench_alloc(most);
    if (fill) {
      mpu__bench_fill(fill, most, cfg->dtype, rank);
      r = mpu_comm_copy2d(comms[0], send, send_bytes, fill, send_bytes, send_bytes, 1);
      if (!r) r = mpu_comm_copy2d(comms[0], recv, recv_bytes, fill, recv_bytes, recv_bytes, 1);
      if (r) goto out;
    }
  } else {
    send = mpu__bench_alloc(send_bytes + 64);
    recv = mpu__bench_alloc(recv_bytes + 64);
  }
  if (!send || !recv || !times || (device && !fill)) {
    r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu + %zu bytes", fn, send_bytes, recv_bytes);
    goto out;
  }
  if (!device) {
    mpu__bench_fill(send, send_bytes, cfg->dtype, rank);
    mpu__bench_fill(recv, recv_bytes, cfg->dtype, rank);
    if (cfg->lend) cfg->lend(cfg->pause_arg, rank, send, recv);
  }
  /* native only if every rank's backend can (all ranks agree, or none runs it) */
  int32_t native = 0;
  if (cfg->native) {
    native = call_native(comms[0], cfg, send, recv, count, rank, es) == MPU_SUCCESS;
    MPU_CHECK_GOTO(host_numbers(comms[0], &native, 1, MPU_INT32, MPU_MIN, -1), r, out);
  }
  int variants = ncomms + native;
  /* one variant without barriers: its time is the loop's, as nccl-tests
   * times a batch of iterations: where ranks outnumber cores each rank
   * spends much of an iteration waiting for a CPU outside its own call, so
   * per-call times summed short (8 thread ranks on 2 cores: 10.3 ms per
   * 64 MiB broadcast against 21-26 ms of wall clock per call) */
  int batch = variants == 1 && !cfg->barrier;
  double loop_t0 = 0, loop_s = 0;
  int paused = 0; /* pauses made */
  for (int i = -cfg->warmup; i < cfg->iters; i++) {
    /* pause k of P before timed iteration k * iters / P: outside the timing
     * (a batch's loop is timed in the stretches between pauses), then
     * MPU_BENCH_SETTLE untimed rounds, so the next timed call finds the
     * caches as calls leave them, not as the pause did (after a round of
     * the roof, an 8 MiB all_gather's first two calls took 850-930 us and
     * the third 430-450, on 2 ranks of a 2-CPU Xeon) */
    int pause = i >= 0 && paused < cfg->pauses &&
                i == (int)((long long)paused * cfg->iters / cfg->pauses);
    if (pause) {
      if (batch && i > 0) loop_s += now_us() - loop_t0;
      paused++;
      MPU_CHECK_GOTO(cfg->pause(cfg->pause_arg), r, out);
      for (int u = 0; u < MPU_BENCH_SETTLE; u++)
        MPU_CHECK_GOTO(bench_round(comms, ncomms, variants, cfg, send, recv, count, rank, es, 0,
                                   NULL), r, out);
    }
    if (batch && (i == 0 || pause)) {
      MPU_CHECK_GOTO(mpu_comm_barrier(comms[0]), r, out);
      loop_t0 = now_us();
    }
    MPU_CHECK_GOTO(bench_round(comms, ncomms, variants, cfg, send, recv, count, rank, es, i,
                               i >= 0 ? times : NULL), r, out);
  }
  if (batch) loop_s += now_us() - loop_t0;
  /* nccl-tests -a: each rank's own mean, then rank 0's, their average, least or largest */
  double means[MAX_VARIANTS];
  for (int v = 0; v < variants; v++) {
    double sum = 0;
    for (int i = 0; i < cfg->iters; i++) sum += times[(size_t)v * (size_t)cfg->iters + (size_t)i];
    means[v] = (batch ? loop_s : sum) / cfg->iters;
  }
  if (batch && cfg->average == MPU_BENCH_SLOWEST) /* the slowest rank's loop */
    MPU_CHECK_GOTO(host_numbers(comms[0], means, 1, MPU_FLOAT64, MPU_MAX, -1), r, out);
  if (cfg->average == MPU_BENCH_RANK0)
    MPU_CHECK_GOTO(host_numbers(comms[0], means, (size_t)variants, MPU_FLOAT64, MPU_SUM, 0), r, out);
  else if (cfg->average != MPU_BENCH_SLOWEST)
    MPU_CHECK_GOTO(host_numbers(comms[0], means, (size_t)variants, MPU_FLOAT64,
                                cfg->average == MPU_BENCH_AVG   ? MPU_AVG
                                : cfg->average == MPU_BENCH_MIN ? MPU_MIN
                                                                : MPU_MAX,
                                -1),
                   r, out);
  MPU_CHECK_GOTO(host_numbers(comms[0], times, (size_t)variants * (size_t)cfg->iters, MPU_FLOAT64,
                              MPU_MAX, -1),
                 r, out);
  /* the results, checked after the timing on every variant (nccl-tests -c 1) */
  long long wrong[MAX_VARIANTS];
  for (int v = 0; v < MAX_VARIANTS; v++) wrong[v] = -1;
  if (cfg->check) {
    check_bufs cb = {send, recv, send, recv, send_bytes, recv_bytes, device};
    if (device) {
      cb.host_send = malloc(send_bytes + 1);
      cb.host_recv = malloc(recv_bytes + 1);
    }
    if (!cb.host_send || !cb.host_recv) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: check buffers", fn);
    for (int v = 0; v < variants && !r; v++)
      r = check_once(v == ncomms ? comms[0] : comms[v], cfg, v == ncomms, &cb, count, rank, n,
                     &wrong[v]);
    if (device) {
      free(cb.host_send);
      free(cb.host_recv);
    }
    if (r) goto out;
  }
  double native_us = -1, native_mean = -1;
  if (native) {
    double *t = times + (size_t)ncomms * (size_t)cfg->iters, sum = 0;
    for (int i = 0; i < cfg->iters; i++) sum += t[i];
    native_mean = cfg->average == MPU_BENCH_SLOWEST ? sum / cfg->iters : means[ncomms];
    native_us = median_of(t, cfg->iters);
  }
  for (int v = 0; v < ncomms; v++) {
    double *t = times + (size_t)v * (size_t)cfg->iters, sum = 0;
    for (int i = 0; i < cfg->iters; i++) sum += t[i];
    double median = median_of(t, cfg->iters); /* sorts t: t[0] is the minimum */
    double mean = cfg->average == MPU_BENCH_SLOWEST && !batch ? sum / cfg->iters : means[v];
    mpu_bench_result res = {sizeof res, bytes, count, median, mean, t[0], 0, 0, native_us,
                            native_mean, wrong[v], native ? wrong[ncomms] : -1};
    res.algbw_gbps = median > 0 ? (double)bytes / (median * 1e3) : 0;
    res.busbw_gbps = res.algbw_gbps * mpu_bench_bus_factor(cfg->collective, n);
    MPU_CHECK_GOTO(mpu__give_out(fn, "result", "MPU_BENCH_RESULT_INIT", &out[v], &res, sizeof res,
                                 MPU_BENCH_RESULT_MIN_SIZE),
                   r, out);
  }
out:
  if (device) {
    if (send) mpu_comm_mem_free(comms[0], send);
    if (recv) mpu_comm_mem_free(comms[0], recv);
  } else {
    free(send);
    free(recv);
  }
  free(fill);
  free(times);
  return r;
}

void mpu__bench_start_wait(start_line *l) {
  pthread_mutex_lock(&l->lock);
  unsigned long gen = atomic_load_explicit(&l->generation, memory_order_relaxed);
  if (++l->arrived >= l->needed) {
    l->arrived = 0;
    atomic_fetch_add_explicit(&l->generation, 1, memory_order_release);
    pthread_cond_broadcast(&l->cond);
  } else if (!l->spin) {
    while (gen == atomic_load_explicit(&l->generation, memory_order_relaxed))
      pthread_cond_wait(&l->cond, &l->lock);
  } else { /* awake, and on the CPU, when the line opens */
    pthread_mutex_unlock(&l->lock);
    for (unsigned long k = 1; gen == atomic_load_explicit(&l->generation, memory_order_acquire); k++)
      if (k % 4096 == 0) sched_yield(); /* a CPU shared after all: let the others on */
    return;
  }
  pthread_mutex_unlock(&l->lock);
}

void mpu__bench_start_shrink(start_line *l, int needed) {
  pthread_mutex_lock(&l->lock);
  l->needed = needed;
  if (needed && l->arrived >= needed) {
    l->arrived = 0;
    atomic_fetch_add_explicit(&l->generation, 1, memory_order_release);
    pthread_cond_broadcast(&l->cond);
  }
  pthread_mutex_unlock(&l->lock);
}

typedef struct copier {
  size_t bytes;
  int iters;
  int stream; /* the threads backend's choice for this footprint */
  start_line *start; /* NULL when copying alone */
  double median_us, best_us;
  int failed;
} copier;

/* One thread's copies: median time of `iters` copies of `bytes`, each copy
 * started together with the other copiers'. */
static void *copy_loop(void *arg) {
  copier *c = arg;
  char *a = mpu__bench_alloc(c->bytes), *b = mpu__bench_alloc(c->bytes);
  double *t = malloc((size_t)c->iters * sizeof(double));
  c->failed = !a || !b || !t;
  if (!c->failed) {
    memset(a, 1, c->bytes);
    memset(b, 2, c->bytes);
    memcpy(b, a, c->bytes); /* warm the pages and caches */
  }
  for (int i = 0; i < c->iters; i++) {
    if (c->start) mpu__bench_start_wait(c->start); /* even after a failure, so no one waits forever */
    if (c->failed) continue;
    /* small copies take less than the clock resolves: time enough of them
     * (at least 256 KiB in all) and divide */
    int reps = c->bytes >= ((size_t)256 << 10) ? 1 : (int)(((size_t)256 << 10) / c->bytes);
    double t0 = now_us();
    for (int k = 0; k < reps; k++)
      mpu__copy((i + k) % 2 ? a : b, (i + k) % 2 ? b : a, c->bytes, c->stream);
    if (c->stream) mpu__copy_fence();
    t[i] = (now_us() - t0) / reps;
  }
  if (!c->failed) {
    qsort(t, (size_t)c->iters, sizeof(double), cmp_double);
    c->median_us = t[c->iters / 2];
    c->best_us = t[0];
  }
  free(a);
  free(b);
  free(t);
  return NULL;
}

mpu_result_t mpu_bench_memcpy(size_t bytes, int iters, double *gbps) {
  return mpu_bench_memcpy_concurrent(bytes, iters, 1, gbps);
}

/* threads copiers of bytes each; stream -1: the threads backend's choice for
 * the footprint, else forced; *us: the slowest thread's median (best 0) or
 * best (best 1) time of one copy */
static mpu_result_t copy_run(size_t bytes, int iters, int threads, int stream, int best,
                             double *us) {
  copier *c = calloc((size_t)threads, sizeof *c);
  pthread_t *tid = calloc((size_t)threads, sizeof *tid);
  start_line line = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, threads, 0, 0, 0};
  int started = 0;
  mpu_result_t r = MPU_SUCCESS;
  if (!c || !tid) {
    r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_bench_memcpy: %d threads", threads);
    goto out;
  }
  for (; started < threads; started++) {
    size_t footprint = bytes > SIZE_MAX / 2 / (size_t)threads ? SIZE_MAX : 2 * bytes * (size_t)threads;
    c[started] = (copier){bytes, iters, stream >= 0 ? stream : mpu__streams(footprint),
                          threads > 1 ? &line : NULL, 0, 0, 0};
    if (threads == 1) {
      copy_loop(&c[0]);
    } else if (pthread_create(&tid[started], NULL, copy_loop, &c[started])) {
      r = mpu__error(MPU_ERR_SYSTEM, "mpu_bench_memcpy: cannot start thread %d", started);
      mpu__bench_start_shrink(&line, started); /* the started ones run without it */
      break;
    }
  }
  for (int i = 0; threads > 1 && i < started; i++) pthread_join(tid[i], NULL);
  if (r == MPU_SUCCESS) {
    double worst = 0;
    for (int i = 0; i < threads; i++) {
      if (c[i].failed) {
        r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_bench_memcpy: 2 x %zu bytes", bytes);
        break;
      }
      double t = best ? c[i].best_us : c[i].median_us;
      if (t > worst) worst = t;
    }
    if (r == MPU_SUCCESS && !(worst > 0))
      r = mpu__error(MPU_ERR_SYSTEM, "mpu_bench_memcpy: copies of %zu bytes took no measurable time",
                     bytes);
    if (r == MPU_SUCCESS) *us = worst;
  }
out:
  pthread_mutex_destroy(&line.lock);
  pthread_cond_destroy(&line.cond);
  free(c);
  free(tid);
  return r;
}

static mpu_result_t check_copy_args(const char *fn, size_t bytes, int iters, int threads,
                                    const double *gbps) {
  if (!gbps || !bytes || iters < 1 || iters > 100000 || threads < 1 || threads > 1024)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %zu bytes, %d iterations, %d threads", fn,
                      bytes, iters, threads);
  return MPU_SUCCESS;
}

mpu_result_t mpu_bench_memcpy_concurrent(size_t bytes, int iters, int threads, double *gbps) {
  MPU_CHECK(check_copy_args("mpu_bench_memcpy", bytes, iters, threads, gbps));
  double us = 0;
  MPU_CHECK(copy_run(bytes, iters, threads, -1, 0, &us));
  *gbps = (double)bytes / (us * 1e3);
  return MPU_SUCCESS;
}

mpu_result_t mpu_bench_copy_ceiling(size_t bytes, int iters, int threads, double *gbps) {
  MPU_CHECK(check_copy_args("mpu_bench_copy_ceiling", bytes, iters, threads, gbps));
  if (bytes > SIZE_MAX / (size_t)threads)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_bench_copy_ceiling: %d x %zu bytes", threads,
                      bytes);
  double most = 0;
  /* the same footprint four ways: every thread its share, or one thread all of it; cached
   * stores (whose read-for-ownership costs traffic) and streaming ones (which skip it but
   * leave the cache cold); the best iteration of each, so a busy machine only lowers a way */
  for (int way = 0; way < 4; way++) {
    int t = way < 2 ? threads : 1, stream = way % 2;
    size_t each = way < 2 ? bytes : bytes * (size_t)threads;
    double us = 0;
    if (way >= 2 && threads == 1) break; /* the same as the first two */
    MPU_CHECK(copy_run(each, iters, t, stream, 1, &us));
    double rate = (double)each * t / (us * 1e3);
    if (rate > most) most = rate;
  }
  *gbps = most;
  return MPU_SUCCESS;
}
