/*
 * test_dtensor.c - placements and redistribute.
 *
 * On 4 thread ranks, meshes (4) and (2, 2), shapes that divide (4, 4) and
 * that do not (5, 3), in float32 and (the uneven shape) int32: every pair
 * of placements (Replicate, Shard(0), Shard(1), Partial(sum), Partial(avg)
 * per mesh dim) redistributes to the
 * piece that slicing the global tensor gives (the destination's partial
 * dims reduced here with plain all_reduce calls, since a partial piece is
 * not unique). The slicing is written here from torch.chunk's rule. The
 * plan names the collectives: one per 1-d change that needs one. Integer
 * Partials change exactly, near the top of their range too, on 2 ranks.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"

enum { NRANKS = 4, NPLACE = 5 };

static mpu_placement place(int k) {
  switch (k) {
  case 0: return MPU_REPLICATE;
  case 1: return MPU_SHARD(0);
  case 2: return MPU_SHARD(1);
  case 3: return MPU_PARTIAL(MPU_SUM);
  default: return MPU_PARTIAL(MPU_AVG);
  }
}

/* torch.chunk along each sharded dim, mesh dims in order; an empty piece
 * starts at the dim's global end (torch's compute_local_shape_and_global_offset) */
static void slice_of(const int64_t *gshape, int ndim, const mpu_placement *pl, int mdim,
                     const int64_t *msize, const int64_t *coord, int64_t *off, int64_t *len) {
  for (int d = 0; d < ndim; d++) {
    off[d] = 0, len[d] = gshape[d];
    for (int i = 0; i < mdim; i++)
      if (pl[i].kind == MPU_PLACE_SHARD && pl[i].dim == d) {
        int64_t c = (len[d] + msize[i] - 1) / msize[i];
        int64_t lo = coord[i] * c < len[d] ? coord[i] * c : len[d];
        int64_t hi = lo + c < len[d] ? lo + c : len[d];
        len[d] = hi - lo;
        off[d] = len[d] ? off[d] + lo : gshape[d];
      }
  }
}

/* placement combination k of up to three mesh dims, on a 2-d tensor */
static mpu_dtensor_spec spec_of(const int64_t *gshape, int k, mpu_dtype dt) {
  mpu_dtensor_spec s = {2, {gshape[0], gshape[1]}, {MPU_REPLICATE}, dt};
  for (int i = 0; i < 3; i++, k /= NPLACE) s.placements[i] = place(k % NPLACE);
  return s;
}

static float global_value(int64_t r, int64_t c) { return (float)(r * 10 + c + 1); }
static float noise(int64_t r, int64_t c, int i) { return (float)((r * 3 + c * 7 + i * 5) % 11 - 5); }

/* element k of a float32 or int32 buffer (the values are small integers) */
static void store(mpu_dtype dt, void *p, int64_t k, float v) {
  if (dt == MPU_INT32) ((int32_t *)p)[k] = (int32_t)v;
  else ((float *)p)[k] = v;
}
static float load(mpu_dtype dt, const void *p, int64_t k) {
  return dt == MPU_INT32 ? (float)((const int32_t *)p)[k] : ((const float *)p)[k];
}

typedef struct ctx {
  int failures[8], pairs;
} ctx;

static mpu_result_t run_mesh(mpu_comm *world, int mdim, const int64_t *mshape, const int64_t *gshape,
                             mpu_dtype dt, int *failures, int *pairs) {
  const char *names[] = {"dp", "tp", "cp"};
  mpu_device_mesh *dm;
  mpu_result_t r = mpu_device_mesh_init(world, mdim, mshape, names, MPU_MESH_EAGER, &dm);
  if (r) return r;
  int rank = mpu_device_mesh_rank(dm);
  int64_t coord[3];
  mpu_mesh_coords(mpu_device_mesh_mesh(dm), rank, coord);
  mpu_comm *comms[3];
  for (int i = 0; i < mdim; i++) mpu_device_mesh_comm(dm, i, &comms[i]);
  int ncombo = mdim == 1 ? NPLACE : mdim == 2 ? NPLACE * NPLACE : NPLACE * NPLACE * NPLACE;
  int stride = mdim == 3 ? 13 : 1; /* on (2, 2, 2): every source, every 13th destination */
  size_t cap = (size_t)(gshape[0] * gshape[1]);
  void *in = malloc(cap * sizeof(float)), *out = malloc(cap * sizeof(float));
  for (int a = 0; a < ncombo && !r; a++)
    for (int b = a % stride; b < ncombo && !r; b += stride) {
      mpu_dtensor_spec src = spec_of(gshape, a, dt), dst = spec_of(gshape, b, dt);
      int64_t off[2], len[2];
      /* the source piece: the slice, spread over the partial dims so that
       * their reduction gives it back exactly */
      slice_of(gshape, 2, src.placements, mdim, mshape, coord, off, len);
      for (int64_t y = 0; y < len[0]; y++)
        for (int64_t x = 0; x < len[1]; x++) {
          float v = global_value(off[0] + y, off[1] + x);
          for (int i = 0; i < mdim; i++) {
            mpu_placement p = src.placements[i];
            if (p.kind != MPU_PLACE_PARTIAL) continue;
            float n = (float)mshape[i], keep = p.op == MPU_SUM ? (coord[i] == 0 ? 1.0f : 0.0f) : 1.0f;
            v = v * keep + (coord[i] == 0 ? -(n - 1) : 1.0f) * noise(off[0] + y, off[1] + x, i);
          }
          store(dt, in, y * len[1] + x, v);
        }
      size_t want;
      int64_t lshape[2], loff[2];
      r = mpu_dtensor_local_shape(mpu_device_mesh_mesh(dm), rank, &src, lshape, loff);
      if (!r && (lshape[0] != len[0] || lshape[1] != len[1] || loff[0] != off[0] || loff[1] != off[1]))
        (*failures)++;
      if (!r) r = mpu_dtensor_local_numel(mpu_device_mesh_mesh(dm), rank, &dst, &want);
      if (!r) r = mpu_redistribute(dm, &src, in, &dst, out);
      /* reduce the destination's partial dims, then compare with the slice */
      for (int i = mdim - 1; i >= 0 && !r; i--)
        if (dst.placements[i].kind == MPU_PLACE_PARTIAL)
          r = mpu_comm_all_reduce(comms[i], out, out, want, dt, dst.placements[i].op);
      if (r) break;
      slice_of(gshape, 2, dst.placements, mdim, mshape, coord, off, len);
      if ((size_t)(len[0] * len[1]) != want) (*failures)++;
      int bad = 0;
      for (int64_t y = 0; y < len[0]; y++)
        for (int64_t x = 0; x < len[1]; x++)
          if (fabsf(load(dt, out, y * len[1] + x) - global_value(off[0] + y, off[1] + x)) > 1e-4f)
            bad = 1;
      if (bad) {
        char s0[32], s1[32], d0[32], d1[32];
        fprintf(stderr, "rank %d mesh %dd shape (%lld,%lld) %s: [%s,%s] -> [%s,%s] wrong\n", rank,
                mdim, (long long)gshape[0], (long long)gshape[1], mpu_dtype_name(dt),
                mpu_placement_describe(src.placements[0], s0, 32),
                mpu_placement_describe(src.placements[1], s1, 32),
                mpu_placement_describe(dst.placements[0], d0, 32),
                mpu_placement_describe(dst.placements[1], d1, 32));
        (*failures)++;
      }
      (*pairs)++;
    }
  free(in);
  free(out);
  mpu_device_mesh_free(dm);
  return r;
}

static mpu_result_t pairs_rank(mpu_comm *world, void *arg) {
  ctx *c = arg;
  static const int64_t one[1] = {4}, two[2] = {2, 2}, even[2] = {4, 4}, uneven[2] = {5, 3};
  int failures = 0, pairs = 0, rank;
  mpu_comm_rank(world, &rank);
  mpu_result_t r = MPU_SUCCESS;
  const int64_t *shapes[2] = {even, uneven};
  for (int s = 0; s < 2 && !r; s++) {
    r = run_mesh(world, 1, one, shapes[s], MPU_FLOAT32, &failures, &pairs);
    if (!r) r = run_mesh(world, 2, two, shapes[s], MPU_FLOAT32, &failures, &pairs);
  }
  /* int32: the changes a float scales in place go through Replicate, exactly */
  if (!r) r = run_mesh(world, 1, one, uneven, MPU_INT32, &failures, &pairs);
  if (!r) r = run_mesh(world, 2, two, uneven, MPU_INT32, &failures, &pairs);
  if (rank == 0) c->pairs = pairs;
  c->failures[rank] = failures; /* any rank's failure fails the test */
  return r;
}

static mpu_result_t three_dims_rank(mpu_comm *world, void *arg) {
  ctx *c = arg;
  static const int64_t three[3] = {2, 2, 2}, uneven[2] = {5, 3}, even[2] = {4, 8};
  int failures = 0, pairs = 0, rank;
  mpu_comm_rank(world, &rank);
  mpu_result_t r = run_mesh(world, 3, three, uneven, MPU_FLOAT32, &failures, &pairs);
  if (!r) r = run_mesh(world, 3, three, even, MPU_FLOAT32, &failures, &pairs);
  if (!r) r = run_mesh(world, 3, three, uneven, MPU_INT32, &failures, &pairs);
  if (rank == 0) c->pairs = pairs;
  c->failures[rank] = failures;
  return r;
}

/* A (2, 2, 2) mesh, where one tensor dim can be sharded three deep: every
 * source with every 13th destination. */
static void test_three_dim_mesh(void **state) {
  (void)state;
  ctx c = {{0}, 0};
  mpu_result_t r = mpu_launch(8, three_dims_rank, &c, NULL, NULL);
  if (r) fprintf(stderr, "%s\n", mpu_last_error());
  assert_int_equal(r, MPU_SUCCESS);
  assert_int_equal(c.pairs, 3 * 1205); /* sum over the sources of ceil((125 - a % 13) / 13) */
  for (int k = 0; k < 8; k++) assert_int_equal(c.failures[k], 0);
}

static void test_every_pair(void **state) {
  (void)state;
  ctx c = {{0}, 0};
  mpu_result_t r = mpu_launch(NRANKS, pairs_rank, &c, NULL, NULL);
  if (r) fprintf(stderr, "%s\n", mpu_last_error());
  assert_int_equal(r, MPU_SUCCESS);
  assert_int_equal(c.pairs, 3 * (25 + 625));
  for (int k = 0; k < NRANKS; k++) assert_int_equal(c.failures[k], 0);
}

/* The tensor-parallel regions are these moves on a (tp) mesh: each region's
 * forward (and copy_to_tp's backward) gives what mpu_redistribute gives. */
typedef struct region_case {
  mpu_region region;
  int backward;
  mpu_placement from, to;
} region_case;

static mpu_result_t regions_rank(mpu_comm *world, void *arg) {
  int *bad = arg, rank;
  mpu_comm_rank(world, &rank);
  int64_t tp_shape[1] = {NRANKS};
  const char *names[1] = {"tp"};
  mpu_device_mesh *dm;
  mpu_result_t r = mpu_device_mesh_init(world, 1, tp_shape, names, MPU_MESH_EAGER, &dm);
  if (r) return r;
  const region_case cases[] = {
      {MPU_COPY_TO_TP, 1, MPU_PARTIAL(MPU_SUM), MPU_REPLICATE},
      {MPU_REDUCE_FROM_TP, 0, MPU_PARTIAL(MPU_SUM), MPU_REPLICATE},
      {MPU_SCATTER_TO_TP, 0, MPU_REPLICATE, MPU_SHARD(1)},
      {MPU_GATHER_FROM_TP, 0, MPU_SHARD(1), MPU_REPLICATE},
      {MPU_SCATTER_TO_SP, 0, MPU_REPLICATE, MPU_SHARD(0)},
      {MPU_GATHER_FROM_SP, 0, MPU_SHARD(0), MPU_REPLICATE},
      {MPU_REDUCE_SCATTER_TO_SP, 0, MPU_PARTIAL(MPU_SUM), MPU_SHARD(0)},
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases && !r; k++) {
    const region_case *c = &cases[k];
    mpu_dtensor_spec src = {2, {8, 12}, {c->from}, MPU_FLOAT32};
    mpu_dtensor_spec dst = {2, {8, 12}, {c->to}, MPU_FLOAT32};
    int64_t in_shape[2], out_shape[2];
    mpu_dtensor_local_shape(mpu_device_mesh_mesh(dm), rank, &src, in_shape, NULL);
    mpu_dtensor_local_shape(mpu_device_mesh_mesh(dm), rank, &dst, out_shape, NULL);
    float in[96], a[96], b[96];
    float partial = c->from.kind == MPU_PLACE_PARTIAL ? (float)rank : 0.0f;
    for (int e = 0; e < 96; e++) in[e] = (float)(e % 17) + partial;
    mpu_tensor tin, tout;
    mpu_tensor_init(&tin, in, MPU_FLOAT32, 2, in_shape);
    mpu_tensor_init(&tout, a, MPU_FLOAT32, 2, out_shape);
    r = c->backward ? mpu_region_backward(c->region, world, &tin, &tout, MPU_REGION_DEFAULT)
                    : mpu_region_forward(c->region, world, &tin, &tout);
    if (!r) r = mpu_redistribute(dm, &src, in, &dst, b);
    for (int64_t e = 0; !r && e < out_shape[0] * out_shape[1]; e++)
      if (a[e] != b[e]) {
        bad[rank]++;
        fprintf(stderr, "%s: element %lld differs\n", mpu_region_name(c->region), (long long)e);
        break;
      }
  }
  mpu_device_mesh_free(dm);
  return r;
}

static void test_regions_are_special_cases(void **state) {
  (void)state;
  int bad[NRANKS] = {0};
  mpu_result_t r = mpu_launch(NRANKS, regions_rank, bad, NULL, NULL);
  if (r) fprintf(stderr, "%s\n", mpu_last_error());
  assert_int_equal(r, MPU_SUCCESS);
  for (int k = 0; k < NRANKS; k++) assert_int_equal(bad[k], 0);
}

/* The plan on a (4) mesh named "dp": one collective per change that needs one. */
static void test_plan_names_collectives(void **state) {
  (void)state;
  mpu_comm *fake;
  assert_int_equal(mpu_comm_fake_create(1, 4, &fake), 0);
  int64_t shape[1] = {4};
  const char *names[1] = {"dp"};
  mpu_device_mesh *dm;
  assert_int_equal(mpu_device_mesh_init(fake, 1, shape, names, MPU_MESH_LAZY, &dm), 0);
  mpu_dtensor_spec a = {2, {1024, 1024}, {MPU_SHARD(0)}, MPU_FLOAT32};
  mpu_dtensor_spec b = {2, {1024, 1024}, {MPU_REPLICATE}, MPU_FLOAT32};
  char plan[512];
  int n = -1;
  assert_int_equal(mpu_redistribute_plan(dm, &a, &b, plan, sizeof plan, &n), 0);
  assert_string_equal(plan, "Shard(0) -> Replicate on dim 'dp': all_gather of 4 MiB");
  assert_int_equal(n, 1);
  static const char *expect[NPLACE][NPLACE] = {
      /* to:   R               S(0)               S(1)              P(sum)    P(avg) */
      {NULL, "local slice", "local slice", "local", "local"},                  /* R */
      {"all_gather", NULL, "all_to_all", "local", "local"},                    /* S(0) */
      {"all_gather", "all_to_all", NULL, "local", "local"},                    /* S(1) */
      {"all_reduce", "reduce_scatter", "reduce_scatter", NULL, "local"},       /* P(sum) */
      {"all_reduce", "reduce_scatter", "reduce_scatter", "local", NULL},       /* P(avg) */
  };
  for (int x = 0; x < NPLACE; x++)
    for (int y = 0; y < NPLACE; y++) {
      mpu_dtensor_spec s = {2, {6, 5}, {place(x)}, MPU_FLOAT32};
      mpu_dtensor_spec d = {2, {6, 5}, {place(y)}, MPU_FLOAT32};
      assert_int_equal(mpu_redistribute_plan(dm, &s, &d, plan, sizeof plan, &n), 0);
      if (!expect[x][y]) {
        assert_string_equal(plan, "nothing to move");
        assert_int_equal(n, 0);
        continue;
      }
      assert_non_null(strstr(plan, expect[x][y]));
      assert_int_equal(n, strncmp(expect[x][y], "local", 5) ? 1 : 0);
    }
  /* nested shards on a (2, 2) mesh: moving the inner shard outward gathers first */
  int64_t two[2] = {2, 2};
  const char *names2[2] = {"dp", "tp"};
  mpu_device_mesh *dm2;
  assert_int_equal(mpu_device_mesh_init(fake, 2, two, names2, MPU_MESH_LAZY, &dm2), 0);
  mpu_dtensor_spec s = {2, {8, 8}, {MPU_SHARD(0), MPU_REPLICATE}, MPU_FLOAT32};
  mpu_dtensor_spec d = {2, {8, 8}, {MPU_REPLICATE, MPU_SHARD(0)}, MPU_FLOAT32};
  assert_int_equal(mpu_redistribute_plan(dm2, &s, &d, plan, sizeof plan, &n), 0);
  assert_string_equal(plan, "Shard(0) -> Replicate on dim 'dp': all_gather of 256 bytes\n"
                            "Replicate -> Shard(0) on dim 'tp': local slice");
  assert_int_equal(n, 1);
  /* bad input: a clear error, no crash */
  mpu_dtensor_spec bad = {2, {8, 8}, {MPU_SHARD(2), MPU_REPLICATE}, MPU_FLOAT32};
  assert_int_equal(mpu_redistribute_plan(dm2, &bad, &d, plan, sizeof plan, &n),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "Shard(-2..1)"));
  mpu_dtensor_spec other = {2, {8, 9}, {MPU_REPLICATE, MPU_REPLICATE}, MPU_FLOAT32};
  assert_int_equal(mpu_redistribute_plan(dm2, &s, &other, plan, sizeof plan, &n),
                   MPU_ERR_INVALID_ARGUMENT);
  mpu_dtensor_spec pprod = {2, {8, 8}, {MPU_PARTIAL(MPU_PROD), MPU_REPLICATE}, MPU_FLOAT32};
  assert_int_equal(mpu_redistribute_plan(dm2, &pprod, &d, plan, sizeof plan, &n),
                   MPU_ERR_INVALID_ARGUMENT);
  /* max and min do not mix with sum (DTensor's assert_no_mixed_partial_types) */
  mpu_dtensor_spec mixed = {2, {8, 8}, {MPU_PARTIAL(MPU_MAX), MPU_PARTIAL(MPU_SUM)}, MPU_FLOAT32};
  assert_int_equal(mpu_redistribute_plan(dm2, &mixed, &d, plan, sizeof plan, &n),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "mixes Partial(sum), Partial(max)"));
  mpu_device_mesh_free(dm2);
  mpu_device_mesh_free(dm);
  mpu_comm_destroy(fake);
}

/* ---- integer Partials: exact, never a truncated division or a wrapped product ------------ */

typedef struct icase {
  const char *what;
  mpu_dtype dt;
  mpu_placement from, to;
  int64_t in[2][2]; /* rank r's piece (Shard(0): one element) */
  int64_t want[2];  /* the global value, the destination's Partial reduced */
} icase;

#define P_SUM MPU_PARTIAL(MPU_SUM)
#define P_AVG MPU_PARTIAL(MPU_AVG)
static const icase icases[] = {
    /* the mean of [1, 1] is 1, so the sum after the move is 1 (not 1/2 + 1/2 = 0) */
    {"int32 avg -> sum", MPU_INT32, P_AVG, P_SUM, {{1, -3}, {1, -4}}, {1, -3}},
    /* 2^30 x 2 and INT32_MAX x 2 do not fit in int32 */
    {"int32 sum -> avg", MPU_INT32, P_SUM, P_AVG, {{1 << 30, INT32_MAX}, {1, -5}},
     {(1 << 30) + 1, INT32_MAX - 5}},
    {"int32 Shard(0) -> avg", MPU_INT32, MPU_SHARD(0), P_AVG, {{1 << 30}, {INT32_MIN}},
     {1 << 30, INT32_MIN}},
    {"int64 sum -> avg", MPU_INT64, P_SUM, P_AVG, {{(int64_t)1 << 62, INT64_MAX}, {1, -7}},
     {((int64_t)1 << 62) + 1, INT64_MAX - 7}},
    {"int64 avg -> sum", MPU_INT64, P_AVG, P_SUM, {{3, INT64_MAX}, {4, INT64_MAX}}, {3, INT64_MAX}},
    {"uint8 sum -> avg", MPU_UINT8, P_SUM, P_AVG, {{200, 0}, {50, 255}}, {250, 255}},
};

static void put(mpu_dtype dt, void *p, int k, int64_t v) {
  if (dt == MPU_INT32) ((int32_t *)p)[k] = (int32_t)v;
  else if (dt == MPU_INT64) ((int64_t *)p)[k] = v;
  else ((uint8_t *)p)[k] = (uint8_t)v;
}

static int64_t get(mpu_dtype dt, const void *p, int k) {
  if (dt == MPU_INT32) return ((const int32_t *)p)[k];
  if (dt == MPU_INT64) return ((const int64_t *)p)[k];
  return ((const uint8_t *)p)[k];
}

static mpu_result_t integer_rank(mpu_comm *world, void *arg) {
  int *bad = arg, rank;
  mpu_comm_rank(world, &rank);
  const int64_t shape[1] = {2};
  const char *names[1] = {"dp"};
  mpu_device_mesh *dm;
  mpu_result_t r = mpu_device_mesh_init(world, 1, shape, names, MPU_MESH_EAGER, &dm);
  for (size_t c = 0; !r && c < sizeof icases / sizeof *icases; c++) {
    const icase *t = &icases[c];
    mpu_dtensor_spec src = {1, {2}, {t->from}, t->dt}, dst = {1, {2}, {t->to}, t->dt};
    int64_t in[2] = {0}, out[2] = {0}; /* room for two elements of any of the dtypes */
    for (int k = 0; k < 2; k++) put(t->dt, in, k, t->in[rank][k]);
    r = mpu_redistribute(dm, &src, in, &dst, out);
    if (!r) r = mpu_comm_all_reduce(world, out, out, 2, t->dt, t->to.op);
    for (int k = 0; !r && k < 2; k++)
      if (get(t->dt, out, k) != t->want[k]) {
        fprintf(stderr, "rank %d, %s: element %d is %lld, want %lld\n", rank, t->what, k,
                (long long)get(t->dt, out, k), (long long)t->want[k]);
        bad[rank]++;
      }
  }
  mpu_device_mesh_free(dm);
  return r;
}

/* Integer Partials change exactly (through Replicate where a float would be
 * scaled in place), on 2 thread ranks; the plan shows the collective. */
static void test_integer_partials_are_exact(void **state) {
  (void)state;
  int bad[2] = {0};
  mpu_result_t r = mpu_launch(2, integer_rank, bad, NULL, NULL);
  if (r) fprintf(stderr, "%s\n", mpu_last_error());
  assert_int_equal(r, MPU_SUCCESS);
  assert_int_equal(bad[0] + bad[1], 0);
  mpu_comm *fake;
  assert_int_equal(mpu_comm_fake_create(0, 2, &fake), 0);
  const int64_t shape[1] = {2};
  const char *names[1] = {"dp"};
  mpu_device_mesh *dm;
  assert_int_equal(mpu_device_mesh_init(fake, 1, shape, names, MPU_MESH_LAZY, &dm), 0);
  mpu_dtensor_spec a = {1, {2}, {P_AVG}, MPU_INT32}, s = {1, {2}, {P_SUM}, MPU_INT32};
  char plan[256];
  int n = -1;
  assert_int_equal(mpu_redistribute_plan(dm, &a, &s, plan, sizeof plan, &n), 0);
  assert_string_equal(plan, "Partial(avg) -> Replicate on dim 'dp': all_reduce of 8 bytes\n"
                            "Replicate -> Partial(sum) on dim 'dp': local");
  assert_int_equal(n, 1);
  a.dtype = s.dtype = MPU_FLOAT32; /* floats are scaled in place */
  assert_int_equal(mpu_redistribute_plan(dm, &a, &s, plan, sizeof plan, &n), 0);
  assert_string_equal(plan, "Partial(avg) -> Partial(sum) on dim 'dp': local");
  assert_int_equal(n, 0);
  mpu_device_mesh_free(dm);
  mpu_comm_destroy(fake);
}

/* ---- torch's answers, derived by hand from its source -------------------------------------- */

static int fails(int *bad, int rank, const char *what, int ok) {
  if (!ok) {
    fprintf(stderr, "rank %d: %s\n", rank, what);
    bad[rank]++;
  }
  return !ok;
}

static mpu_result_t anchors_rank(mpu_comm *world, void *arg) {
  int *bad = arg, rank;
  mpu_comm_rank(world, &rank);
  const int64_t one[1] = {4}, two[2] = {2, 2};
  const char *names[2] = {"dp", "tp"};
  mpu_device_mesh *d1, *d2;
  mpu_result_t r = mpu_device_mesh_init(world, 1, one, names, MPU_MESH_EAGER, &d1);
  if (r) return r;
  r = mpu_device_mesh_init(world, 2, two, names, MPU_MESH_EAGER, &d2);
  if (r) return mpu_device_mesh_free(d1), r;
  int64_t c0 = rank / 2, c1 = rank % 2;
  /* _utils.py compute_local_shape_and_global_offset: (2, 7, 3) as [Shard(0),
   * Shard(0)] on (2, 2): dim 0 is 1, 1 after the outer cut, then 1, 0: the
   * empty pieces (ranks 1 and 3) sit at offset 2, the dim's global size */
  mpu_dtensor_spec nested = {3, {2, 7, 3}, {MPU_SHARD(0), MPU_SHARD(0)}, MPU_FLOAT32};
  int64_t shape[3], off[3];
  r = mpu_dtensor_local_shape(mpu_device_mesh_mesh(d2), rank, &nested, shape, off);
  if (!r) {
    fails(bad, rank, "nested shard shape", shape[0] == (c1 ? 0 : 1) && shape[1] == 7 && shape[2] == 3);
    fails(bad, rank, "nested shard offset", off[0] == (c1 ? 2 : c0) && off[1] == 0 && off[2] == 0);
  }
  /* Shard(-1) is Shard(1) (DTensor's API normalizes it) */
  mpu_dtensor_spec last = {2, {5, 7}, {MPU_SHARD(-1)}, MPU_FLOAT32};
  if (!r) r = mpu_dtensor_local_shape(mpu_device_mesh_mesh(d1), rank, &last, shape, off);
  if (!r) fails(bad, rank, "Shard(-1)", shape[0] == 5 && shape[1] == (rank < 3 ? 2 : 1) &&
                                           off[1] == 2 * rank);
  /* Partial._partition_value: Replicate -> Partial(sum) divides by the
   * dim's size on every rank; max and min keep the value */
  float x[4] = {1, -2, 6, 8}, y[4] = {0};
  mpu_dtensor_spec rep = {1, {4}, {MPU_REPLICATE}, MPU_FLOAT32}, p = rep;
  p.placements[0] = MPU_PARTIAL(MPU_SUM);
  if (!r) r = mpu_redistribute(d1, &rep, x, &p, y);
  if (!r) fails(bad, rank, "Replicate -> Partial(sum)", y[0] == 0.25f && y[1] == -0.5f && y[3] == 2);
  p.placements[0] = MPU_PARTIAL(MPU_MAX);
  if (!r) r = mpu_redistribute(d1, &rep, x, &p, y);
  if (!r) fails(bad, rank, "Replicate -> Partial(max)", !memcmp(x, y, sizeof x));
  /* Partial(max) -> Replicate is an all_reduce(max), Partial(min) -> Shard(0)
   * a reduce_scatter(min) */
  float mine[4] = {(float)rank, (float)-rank, 3, (float)(rank == 2 ? 9 : 0)};
  mpu_dtensor_spec pmax = p;
  if (!r) r = mpu_redistribute(d1, &pmax, mine, &rep, y);
  if (!r) fails(bad, rank, "Partial(max) -> Replicate", y[0] == 3 && y[1] == 0 && y[2] == 3 && y[3] == 9);
  mpu_dtensor_spec pmin = {1, {4}, {MPU_PARTIAL(MPU_MIN)}, MPU_FLOAT32};
  mpu_dtensor_spec s0 = {1, {4}, {MPU_SHARD(0)}, MPU_FLOAT32};
  const float want_min[4] = {0, -3, 3, 0};
  if (!r) r = mpu_redistribute(d1, &pmin, mine, &s0, y);
  if (!r) fails(bad, rank, "Partial(min) -> Shard(0)", y[0] == want_min[rank]);
  /* Shard -> Partial(sum) adds the piece into zeros (index_add): -0.0 comes out +0.0 */
  float negzero = -0.0f, z[4];
  if (!r) r = mpu_redistribute(d1, &s0, &negzero, &(mpu_dtensor_spec){1, {4}, {MPU_PARTIAL(MPU_SUM)}, MPU_FLOAT32}, z);
  if (!r) fails(bad, rank, "Shard -> Partial(sum) of -0.0", !signbit(z[rank]));
  /* the order is torch's: [Replicate, Partial(sum)] -> [Partial(sum), Replicate]
   * divides on dp first, then all_reduces on tp: every rank holds (a0 + a1) / 2
   * (innermost first would give a0 + a1 on dp's first rank, zeros on the other) */
  float a = (float)(c1 ? 6 : 2), b = 0;
  mpu_dtensor_spec from = {1, {1}, {MPU_REPLICATE, MPU_PARTIAL(MPU_SUM)}, MPU_FLOAT32};
  mpu_dtensor_spec to = {1, {1}, {MPU_PARTIAL(MPU_SUM), MPU_REPLICATE}, MPU_FLOAT32};
  if (!r) r = mpu_redistribute(d2, &from, &a, &to, &b);
  if (!r) fails(bad, rank, "[R, P] -> [P, R]", b == 4);
  mpu_device_mesh_free(d2);
  mpu_device_mesh_free(d1);
  return r;
}

/* Cases whose answer can be read off torch 2.15's source, on 4 thread
 * ranks; test_dtensor_torch checks every placement pair against torch's
 * own tables. */
static void test_torch_answers(void **state) {
  (void)state;
  int bad[NRANKS] = {0};
  mpu_result_t r = mpu_launch(NRANKS, anchors_rank, bad, NULL, NULL);
  if (r) fprintf(stderr, "%s\n", mpu_last_error());
  assert_int_equal(r, MPU_SUCCESS);
  for (int k = 0; k < NRANKS; k++) assert_int_equal(bad[k], 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_pair),
      cmocka_unit_test(test_three_dim_mesh),
      cmocka_unit_test(test_regions_are_special_cases),
      cmocka_unit_test(test_plan_names_collectives),
      cmocka_unit_test(test_integer_partials_are_exact),
      cmocka_unit_test(test_torch_answers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
