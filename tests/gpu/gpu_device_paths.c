/*
 * gpu_device_paths.c - the trainer's device paths that the test double
 * proves and a GPU has not yet, run by scripts/gpu-test.sh (and on the
 * double by ctest's gpu_programs_double, so it keeps building and running):
 *   scale     NCCL's pre-multiplying sum at one rank (ncclRedOpCreatePreMulSum
 *             on a one-rank communicator: the oneRankReduce kernel), which
 *             mpu's redistribute scales device buffers with: the whole buffer
 *             in one call (reported: before NCCL 2.29.7 its tail stays
 *             unwritten) and in the pieces mpu issues (src/comm/nccl/calls.c:
 *             512 KiB, then at most 16 KiB), which must be x * scalar exactly
 *   dtensor   mpu_redistribute on cudaMalloc buffers over one thread rank per
 *             GPU (a power of two, at most 4): Replicate -> Partial(sum) (a
 *             division on the device), Partial(sum) -> Partial(avg) (a
 *             multiplication), Shard(1) -> Replicate (all_gather and box
 *             copies), Partial(sum) -> Shard(0) (reduce_scatter), each against
 *             values computed here; with one GPU only the copies run
 *   pipeline  mpu_pipeline_run_tensors over one rank per GPU (at most 4) with
 *             bfloat16, int8 and float64 boundaries of odd shapes: each stage
 *             reads, by copies, the bytes the stage before wrote
 * Lines: "PASS|FAIL|INFO <check>: <what>". Exit 1 if a check failed.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_report.h"
#include "mpu.h"


/* ---- scale: NCCL's one-rank pre-multiplying sum ------------------------------------ */

static void check_scale(void) {
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  enum { N = 20001 };
  float *host = malloc(N * sizeof *host), *back = malloc(N * sizeof *back);
  void *buf = NULL;
  if (!host || !back || cudaSetDevice(0) || ncclGetUniqueId(&id) || ncclCommInitRank(&comm, 1, id, 0) ||
      cudaMalloc(&buf, N * sizeof(float))) {
    say(0, "scale", "set-up failed");
    goto done;
  }
  static const float scalars[] = {4.0f, 0.25f};
  for (int whole = 1; whole >= 0; whole--)
    for (int s = 0; s < 2; s++) {
      float k = scalars[s];
      for (int i = 0; i < N; i++) host[i] = (float)(i % 13 + 1); /* never 0: an unwritten x * k shows */
      ncclRedOp_t op;
      cudaMemcpy(buf, host, N * sizeof(float), cudaMemcpyHostToDevice);
      ncclResult_t r = ncclRedOpCreatePreMulSum(&op, &k, ncclFloat32, ncclScalarHostImmediate, comm);
      size_t big = (512u << 10) / sizeof(float), small = (16u << 10) / sizeof(float);
      for (size_t done = 0, n; done < N && !r; done += n) {
        n = whole ? N - done : N - done >= big ? big : N - done < small ? N - done : small;
        r = ncclAllReduce((float *)buf + done, (float *)buf + done, n, ncclFloat32, op, comm, 0);
      }
      if (!r) r = ncclRedOpDestroy(op, comm);
      cudaDeviceSynchronize();
      cudaMemcpy(back, buf, N * sizeof(float), cudaMemcpyDeviceToHost);
      int wrong = 0, first = -1;
      for (int i = 0; i < N; i++)
        if (back[i] != host[i] * k && !wrong++) first = i;
      say(whole ? -1 : r == ncclSuccess && !wrong, "scale",
          "%s: x * %g of %d float32 at one rank, %s: %s, %d element(s) wrong (first %d)",
          whole ? "raw NCCL" : "mpu's pieces", (double)k, N, whole ? "one call" : "512 KiB then 16 KiB pieces",
          ncclGetErrorString(r), wrong, first);
    }
done:
  if (buf) cudaFree(buf);
  if (comm) ncclCommDestroy(comm);
  free(host);
  free(back);
}

/* ---- dtensor: redistribute on cudaMalloc buffers ---------------------------------- */

enum { T0 = 3, T1 = 6667 }; /* 20001 elements: past the one-rank kernel's blocks */

static float x_of(int64_t i) { return (float)(i % 13 - 6); }

static mpu_result_t move(mpu_device_mesh *dm, mpu_comm *nc, mpu_placement from, mpu_placement to,
                         const float *in, float *out, size_t *nout) {
  mpu_dtensor_spec s = {.ndim = 2, .shape = {T0, T1}, .dtype = MPU_FLOAT32}, d = s;
  s.placements[0] = from, d.placements[0] = to;
  size_t nin = 0, n = 0;
  int rank = mpu_device_mesh_rank(dm);
  void *din = NULL, *dout = NULL;
  mpu_result_t r = mpu_dtensor_local_numel(mpu_device_mesh_mesh(dm), rank, &s, &nin);
  if (!r) r = mpu_dtensor_local_numel(mpu_device_mesh_mesh(dm), rank, &d, &n);
  if (!r) r = mpu_comm_mem_alloc(nc, T0 * T1 * sizeof(float), &din);
  if (!r) r = mpu_comm_mem_alloc(nc, T0 * T1 * sizeof(float), &dout);
  if (!r) r = mpu_comm_copy2d(nc, din, nin * 4, in, nin * 4, nin * 4, 1);
  if (!r) r = mpu_redistribute(dm, &s, din, &d, dout);
  if (!r && n) r = mpu_comm_copy2d(nc, out, n * 4, dout, n * 4, n * 4, 1);
  if (din) mpu_comm_mem_free(nc, din);
  if (dout) mpu_comm_mem_free(nc, dout);
  *nout = r ? 0 : n;
  return r;
}

typedef struct dt_arg {
  char why[4][256];
} dt_arg;

static mpu_result_t dtensor_rank(mpu_comm *world, void *arg) {
  dt_arg *a = arg;
  int me, n;
  mpu_comm_rank(world, &me);
  mpu_comm_size(world, &n);
  mpu_comm *nc = NULL;
  mpu_device_mesh *dm = NULL;
  float *x = malloc(T0 * T1 * sizeof *x), *y = malloc(T0 * T1 * sizeof *y), *z = malloc(T0 * T1 * sizeof *z);
  const char *step = "set-up";
  int64_t mshape[1] = {n}, lo[2], len[2];
  size_t got = 0;
  mpu_result_t r = x && y && z ? mpu_comm_nccl_create(world, NULL, &nc) : MPU_ERR_OUT_OF_MEMORY;
  if (!r) r = mpu_device_mesh_init(nc, 1, mshape, NULL, MPU_MESH_EAGER, &dm);
  for (int64_t i = 0; i < T0 * T1 && !r; i++) x[i] = x_of(i);
  if (!r) { /* Replicate -> Partial(sum): x / n on every rank */
    step = "Replicate -> Partial(sum)";
    r = move(dm, nc, MPU_REPLICATE, MPU_PARTIAL(MPU_SUM), x, y, &got);
    for (size_t i = 0; i < got && !r; i++)
      if (y[i] != x[i] / (float)n) r = mpu_fail(MPU_ERR_INTERNAL, "[%zu] %g, want %g", i, y[i], x[i] / (float)n);
  }
  if (!r) { /* Partial(sum) -> Partial(avg): times n, back to x */
    step = "Partial(sum) -> Partial(avg)";
    r = move(dm, nc, MPU_PARTIAL(MPU_SUM), MPU_PARTIAL(MPU_AVG), y, z, &got);
    for (size_t i = 0; i < got && !r; i++)
      if (z[i] != x[i]) r = mpu_fail(MPU_ERR_INTERNAL, "[%zu] %g, want %g", i, z[i], x[i]);
  }
  if (!r) { /* Shard(1) -> Replicate: this rank's columns of x, gathered */
    step = "Shard(1) -> Replicate";
    mpu_dtensor_spec s = {.ndim = 2, .shape = {T0, T1}, .dtype = MPU_FLOAT32};
    s.placements[0] = MPU_SHARD(1);
    r = mpu_dtensor_local_shape(mpu_device_mesh_mesh(dm), me, &s, len, lo);
    for (int64_t i = 0; i < len[0] * len[1] && !r; i++) y[i] = x[(i / len[1]) * T1 + lo[1] + i % len[1]];
    if (!r) r = move(dm, nc, MPU_SHARD(1), MPU_REPLICATE, y, z, &got);
    for (size_t i = 0; i < got && !r; i++)
      if (z[i] != x[i]) r = mpu_fail(MPU_ERR_INTERNAL, "[%zu] %g, want %g", i, z[i], x[i]);
  }
  if (!r) { /* Partial(sum) of x on every rank -> Shard(0): n x this rank's rows */
    step = "Partial(sum) -> Shard(0)";
    mpu_dtensor_spec s = {.ndim = 2, .shape = {T0, T1}, .dtype = MPU_FLOAT32};
    s.placements[0] = MPU_SHARD(0);
    r = mpu_dtensor_local_shape(mpu_device_mesh_mesh(dm), me, &s, len, lo);
    if (!r) r = move(dm, nc, MPU_PARTIAL(MPU_SUM), MPU_SHARD(0), x, z, &got);
    for (size_t i = 0; i < got && !r; i++)
      if (z[i] != (float)n * x[lo[0] * T1 + (int64_t)i])
        r = mpu_fail(MPU_ERR_INTERNAL, "[%zu] %g, want %g", i, z[i], (float)n * x[lo[0] * T1 + (int64_t)i]);
  }
  if (r) snprintf(a->why[me], sizeof a->why[me], "rank %d, %s: %s", me, step, mpu_last_error());
  mpu_device_mesh_free(dm);
  if (nc) mpu_comm_destroy(nc);
  free(x), free(y), free(z);
  return r;
}

/* ---- pipeline: boundaries of several dtypes and odd shapes ------------------------ */

typedef struct pp_arg {
  mpu_comm *nc[4];
  int pp;
  char why[4][256];
} pp_arg;

typedef struct pp_stage {
  mpu_comm *nc;
  int rank, pp, bad;
} pp_stage;

static void pp_bytes(int mb, int b, int g, unsigned char *out, size_t n) {
  for (size_t j = 0; j < n; j++) out[j] = (unsigned char)(mb * 31 + b * 17 + (int)j * 7 + g * 101);
}

/* read boundary bin's bytes from in, write boundary bout's to out (g: gradients) */
static mpu_result_t pp_step(pp_stage *s, int mb, int g, const mpu_tensor *in, int bin,
                            const mpu_tensor *out, int bout) {
  unsigned char host[1024], want[1024];
  mpu_result_t r;
  if (in) {
    size_t n = mpu_tensor_nbytes(in);
    if ((r = mpu_comm_copy2d(s->nc, host, n, in->data, n, n, 1))) return r;
    pp_bytes(mb, bin, g, want, n);
    if (memcmp(host, want, n)) s->bad++;
  }
  if (out) {
    size_t n = mpu_tensor_nbytes(out);
    pp_bytes(mb, bout, g, host, n);
    if ((r = mpu_comm_copy2d(s->nc, out->data, n, host, n, n, 1))) return r;
  }
  return MPU_SUCCESS;
}

static mpu_result_t pp_fwd(void *u, int mb, int chunk, const mpu_tensor *in, const mpu_tensor *out) {
  pp_stage *s = u;
  (void)chunk;
  return pp_step(s, mb, 0, in, s->rank - 1, out, s->rank);
}

static mpu_result_t pp_bwd(void *u, int mb, int chunk, const mpu_tensor *gout, const mpu_tensor *gin) {
  pp_stage *s = u;
  (void)chunk;
  return pp_step(s, mb, 1, gout, s->rank, gin, s->rank - 1);
}

static mpu_result_t pipeline_rank(mpu_comm *world, void *arg) {
  pp_arg *a = arg;
  pp_stage s = {NULL, 0, 0, 0};
  mpu_comm_rank(world, &s.rank);
  mpu_comm_size(world, &s.pp);
  mpu_tensor b[3] = {{.dtype = MPU_BFLOAT16, .ndim = 3, .shape = {3, 5, 7}},
                     {.dtype = MPU_INT8, .ndim = 2, .shape = {13, 3}},
                     {.dtype = MPU_FLOAT64, .ndim = 1, .shape = {11}}};
  mpu_pipeline_config pc = MPU_PIPELINE_CONFIG_INIT;
  pc.nboundaries = s.pp - 1, pc.boundaries = b;
  if (s.pp == 1) pc.nboundaries = 0, pc.dtype = MPU_BFLOAT16, pc.ndim = 1, pc.shape[0] = 9;
  mpu_schedule_config c = MPU_SCHEDULE_CONFIG_INIT;
  c.pp = s.pp, c.microbatches = 4, c.kind = s.pp > 1 ? MPU_SCHEDULE_1F1B : MPU_SCHEDULE_NO_PIPELINING;
  mpu_pipeline *p = NULL;
  mpu_pipeline_tensor_callbacks cb = {pp_fwd, pp_bwd, &s};
  mpu_result_t r = mpu_comm_nccl_create(world, NULL, &s.nc);
  if (!r) r = mpu_pipeline_create_ex(s.nc, &pc, &p);
  if (!r) r = mpu_pipeline_run_tensors(p, &c, &cb, NULL);
  if (!r && s.bad) r = mpu_fail(MPU_ERR_INTERNAL, "%d boundaries arrived with other bytes", s.bad);
  if (r) snprintf(a->why[s.rank], sizeof a->why[s.rank], "rank %d: %s", s.rank, mpu_last_error());
  mpu_pipeline_free(p);
  if (s.nc) mpu_comm_destroy(s.nc);
  return r;
}

int main(int argc, char **argv) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) {
    fprintf(stderr, "gpu_device_paths: no CUDA device\n");
    return 2;
  }
  const char *only = argc > 1 ? argv[1] : "";
  setvbuf(stdout, NULL, _IOLBF, 0);
  int n = 1;
  while (n * 2 <= gpus && n * 2 <= 4) n *= 2;
  if (!*only || !strcmp(only, "scale")) check_scale();
  if (!*only || !strcmp(only, "dtensor")) {
    dt_arg a;
    memset(&a, 0, sizeof a);
    mpu_result_t r = mpu_launch(n, dtensor_rank, &a, NULL, NULL);
    for (int k = 0; k < n; k++)
      if (a.why[k][0]) say(0, "dtensor", "%s", a.why[k]);
    say(!r, "dtensor", "mpu_redistribute on cudaMalloc buffers, a mesh of %d GPU(s), float32 [%d, %d]: %s%s", n,
        T0, T1, r ? mpu_result_name(r) : "equal to the host's values",
        n == 1 ? " (one GPU: the copies only; scaling and collectives need 2)" : "");
  }
  if (!*only || !strcmp(only, "pipeline")) {
    int pp = n > 4 ? 4 : n;
    pp_arg a;
    memset(&a, 0, sizeof a);
    mpu_result_t r = mpu_launch(pp, pipeline_rank, &a, NULL, NULL);
    for (int k = 0; k < pp; k++)
      if (a.why[k][0]) say(0, "pipeline", "%s", a.why[k]);
    say(!r, "pipeline", "mpu_pipeline_run_tensors over %d GPU(s), bfloat16/int8/float64 boundaries: %s", pp,
        r ? mpu_result_name(r) : "every boundary's bytes arrived");
  }
  return gpu_failed;
}
