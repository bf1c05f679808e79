/*
 * test_dtensor_nccl.c - mpu_redistribute on device buffers: a device mesh
 * over NCCL communicators of the test double, whose device memory faults
 * the host as a GPU's would, gives every rank the bytes the threads backend
 * gives on host buffers, for placement pairs of Shard(0), Shard(1),
 * Replicate and Partial(sum|avg|max) on meshes (4), (2, 2) and (2, 4),
 * float32, bfloat16, float16, float64 and int32, tensors of odd shapes.
 * Inputs are small integers, so NCCL's reductions (its own order, avg as a
 * multiply by 1 / n) and mpu's agree exactly, and the meshes' dims are
 * powers of two, where the device's division by a dim's size (a multiply by
 * its reciprocal, NCCL's pre-multiplying sum at one rank) is exact too.
 * A tensor of 20001 float32 elements scaled by the device crosses the tail
 * NCCL 2.28's one-rank kernel leaves unwritten (the double models it).
 * The steps go through NCCL: the double counts its collectives.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"
#include "nccl_double/double.h"

enum { MAXR = 8 };

typedef struct dcase {
  int mdim;
  int64_t mshape[2];
  int ndim;
  int64_t shape[2];
  mpu_dtype dtype;
  int every; /* of the placement pairs, every k-th (1: all) */
  char text[MAXR][512];
  int pairs;
} dcase;

static const mpu_placement kinds[] = {
    {MPU_PLACE_SHARD, 0, MPU_SUM},          {MPU_PLACE_SHARD, 1, MPU_SUM},
    {MPU_PLACE_REPLICATE, -1, MPU_SUM},     {MPU_PLACE_PARTIAL, -1, MPU_SUM},
    {MPU_PLACE_PARTIAL, -1, MPU_AVG},       {MPU_PLACE_PARTIAL, -1, MPU_MAX}};
enum { NKINDS = sizeof kinds / sizeof *kinds };

/* element i of rank r's input: a small integer, in the dtype */
static void fill(mpu_dtype dt, void *p, size_t n, int r) {
  for (size_t i = 0; i < n; i++) {
    int v = (int)((i * 7 + (size_t)r * 5) % 13) - 6;
    switch (dt) {
    case MPU_FLOAT32: ((float *)p)[i] = (float)v; break;
    case MPU_FLOAT64: ((double *)p)[i] = v; break;
    case MPU_FLOAT16: ((uint16_t *)p)[i] = mpu_float_to_half((float)v); break;
    case MPU_BFLOAT16: ((uint16_t *)p)[i] = mpu_float_to_bfloat16((float)v); break;
    default: ((int32_t *)p)[i] = v; break;
    }
  }
}

/* spec k of the mesh's dims (k's digits in base NKINDS) */
static mpu_dtensor_spec spec_of(const dcase *c, int k) {
  mpu_dtensor_spec s;
  memset(&s, 0, sizeof s);
  s.ndim = c->ndim, s.dtype = c->dtype;
  memcpy(s.shape, c->shape, sizeof c->shape);
  for (int d = 0; d < c->mdim; d++, k /= NKINDS) s.placements[d] = kinds[k % NKINDS];
  return s;
}

#define FAILR(...)                                                       \
  do {                                                                   \
    snprintf(c->text[me], sizeof c->text[me], __VA_ARGS__);              \
    r = MPU_ERR_INTERNAL;                                                \
    goto out;                                                            \
  } while (0)

static mpu_result_t rank_fn(mpu_comm *world, void *arg) {
  dcase *c = arg;
  int me = 0, nspecs = 1;
  mpu_comm_rank(world, &me);
  for (int d = 0; d < c->mdim; d++) nspecs *= NKINDS;
  mpu_comm *nc = NULL;
  mpu_device_mesh *host = NULL, *dev = NULL;
  unsigned char *in = NULL, *want = NULL, *got = NULL;
  void *din = NULL, *dout = NULL;
  size_t es = mpu_dtype_size(c->dtype), total = (size_t)(c->shape[0] * c->shape[1]);
  mpu_result_t r = mpu_comm_nccl_create(world, NULL, &nc);
  if (!r) r = mpu_device_mesh_init(world, c->mdim, c->mshape, NULL, MPU_MESH_EAGER, &host);
  if (!r) r = mpu_device_mesh_init(nc, c->mdim, c->mshape, NULL, MPU_MESH_EAGER, &dev);
  in = malloc(total * es), want = malloc(total * es), got = malloc(total * es);
  if (!r && (!in || !want || !got)) r = MPU_ERR_OUT_OF_MEMORY;
  if (!r) r = mpu_comm_mem_alloc(nc, total * es, &din);
  if (!r) r = mpu_comm_mem_alloc(nc, total * es, &dout);
  if (r) goto out;
  int k = 0;
  for (int a = 0; a < nspecs; a++)
    for (int b = 0; b < nspecs; b++, k++) {
      if (k % c->every) continue;
      mpu_dtensor_spec src = spec_of(c, a), dst = spec_of(c, b);
      size_t nin = 0, nout = 0;
      if (mpu_redistribute_plan(host, &src, &dst, NULL, 0, NULL)) continue; /* mixes max and sum */
      char sa[32], sb[32], pa[32], pb[32];
      snprintf(pa, sizeof pa, "%s,%s", mpu_placement_describe(src.placements[0], sa, sizeof sa),
               c->mdim > 1 ? mpu_placement_describe(src.placements[1], sb, sizeof sb) : "");
      snprintf(pb, sizeof pb, "%s,%s", mpu_placement_describe(dst.placements[0], sa, sizeof sa),
               c->mdim > 1 ? mpu_placement_describe(dst.placements[1], sb, sizeof sb) : "");
      if ((r = mpu_dtensor_local_numel(mpu_device_mesh_mesh(host), me, &src, &nin))) goto out;
      if ((r = mpu_dtensor_local_numel(mpu_device_mesh_mesh(host), me, &dst, &nout))) goto out;
      fill(c->dtype, in, nin, me);
      memset(want, 0x5a, total * es), memset(got, 0xa5, total * es);
      if ((r = mpu_redistribute(host, &src, in, &dst, want)))
        FAILR("threads %s -> %s: %s", pa, pb, mpu_last_error());
      /* the device's: input in by a copy, result out by a copy */
      if (nin && (r = mpu_comm_copy2d(nc, din, nin * es, in, nin * es, nin * es, 1))) goto out;
      if ((r = mpu_redistribute(dev, &src, din, &dst, dout)))
        FAILR("nccl %s -> %s: %s", pa, pb, mpu_last_error());
      if (nout && (r = mpu_comm_copy2d(nc, got, nout * es, dout, nout * es, nout * es, 1))) goto out;
      for (size_t i = 0; i < nout * es; i++)
        if (got[i] != want[i])
          FAILR("%s [%lld, %lld] on mesh (%lld%s) %s -> %s: byte %zu of %zu is %#x on NCCL, %#x on "
                "threads",
                mpu_dtype_name(c->dtype), (long long)c->shape[0], (long long)c->shape[1],
                (long long)c->mshape[0], c->mdim > 1 ? ", ..." : "", pa, pb, i, nout * es, got[i],
                want[i]);
      if (me == 0) c->pairs++;
    }
out:
  if (din) mpu_comm_mem_free(nc, din);
  if (dout) mpu_comm_mem_free(nc, dout);
  free(in), free(want), free(got);
  mpu_device_mesh_free(dev);
  mpu_device_mesh_free(host);
  mpu_result_t d = nc ? mpu_comm_destroy(nc) : MPU_SUCCESS;
  return r ? r : d;
}

static void run(int mdim, int64_t m0, int64_t m1, int64_t t0, int64_t t1, mpu_dtype dt, int every) {
  dcase *c = calloc(1, sizeof *c);
  assert_non_null(c);
  c->mdim = mdim, c->mshape[0] = m0, c->mshape[1] = m1;
  c->ndim = 2, c->shape[0] = t0, c->shape[1] = t1, c->dtype = dt, c->every = every;
  int n = (int)(mdim > 1 ? m0 * m1 : m0);
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 300;
  mpu_result_t r = mpu_launch(n, rank_fn, c, NULL, &o);
  for (int k = 0; k < n; k++)
    if (c->text[k][0]) print_error("rank %d: %s\n", k, c->text[k]);
  if (r) fail_msg("%s on %d ranks: %s: %s", mpu_dtype_name(dt), n, mpu_result_name(r), mpu_last_error());
  print_message("%s [%lld, %lld] on %d ranks: %d placement pairs equal\n", mpu_dtype_name(dt),
                (long long)t0, (long long)t1, n, c->pairs);
  assert_true(c->pairs > 0);
  free(c);
}

static void test_one_dim(void **state) {
  (void)state;
  static const mpu_dtype dts[] = {MPU_FLOAT32, MPU_BFLOAT16, MPU_FLOAT16, MPU_FLOAT64, MPU_INT32};
  long before[3] = {double_call_count("ncclAllGather"), double_call_count("ncclReduceScatter"),
                    double_call_count("ncclAllReduce")};
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) run(1, 4, 1, 5, 7, dts[i], 1);
  /* the steps are NCCL's collectives on the device buffers */
  assert_true(double_call_count("ncclAllGather") > before[0]);
  assert_true(double_call_count("ncclReduceScatter") > before[1]);
  assert_true(double_call_count("ncclAllReduce") > before[2]);
}

static void test_two_dims(void **state) {
  (void)state;
  run(2, 2, 2, 5, 7, MPU_FLOAT32, 3);
  run(2, 2, 2, 7, 3, MPU_BFLOAT16, 7);
  run(2, 2, 2, 6, 5, MPU_INT32, 7);
  run(2, 2, 4, 9, 6, MPU_FLOAT32, 11);
}

/* scaling 20001 float32 on the device: Replicate -> Partial(sum) divides,
 * Partial(sum) <-> Partial(avg) and Shard -> Partial(avg) multiply, past
 * the 16 KiB blocks of NCCL's one-rank kernel */
static void test_device_scaling_whole(void **state) {
  (void)state;
  run(1, 2, 1, 3, 6667, MPU_FLOAT32, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_dim),
      cmocka_unit_test(test_two_dims),
      cmocka_unit_test(test_device_scaling_whole),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
