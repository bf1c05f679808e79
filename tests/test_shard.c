/*
 * test_shard.c - who holds what (mpu/shard.h): torch.chunk's cut,
 * Megatron's strided partition, kept spans, the box copy and the pieces a
 * span of whole rows makes; and FSDP's two layouts against torch's own
 * ownership: the tables below were printed by torch 2.x's code itself
 * (FlatParamHandle._get_unpadded_shard on the flat parameter for FSDP1,
 * use_orig_params=False; _chunk_with_empty along dim 0 for FSDP2's
 * fully_shard) for odd-sized parameters on 4 and 8 ranks. And a DTensor's
 * pieces, described as shards, saved and loaded into other placements with
 * no checkpoint code of their own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpu.h"

/* torch.chunk: pieces of ceil(n / S), the last short, empty ones at the end */
static void test_chunk(void **state) {
  (void)state;
  size_t lo, hi;
  assert_int_equal(mpu_shard_chunk(0, 10, 4, 3, &lo, &hi), 3);
  assert_true(lo == 9 && hi == 10);
  assert_int_equal(mpu_shard_chunk(100, 105, 4, 2, &lo, &hi), 2); /* [104, 105) */
  assert_true(lo == 104 && hi == 105);
  mpu_shard_chunk(100, 105, 4, 3, &lo, &hi); /* torch.chunk gives 3 pieces: the 4th empty */
  assert_true(lo == 105 && hi == 105);
  assert_int_equal(mpu_shard_chunk(0, 0, 4, 0, &lo, &hi), 0);
}

static void test_megatron(void **state) {
  (void)state;
  int64_t shape[2] = {24, 5};
  mpu_shard s;
  assert_int_equal(mpu_shard_megatron(2, shape, 0, 3, 5, 0, &s), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_shard_megatron(2, shape, 0, 3, 2, 1, &s), MPU_SUCCESS);
  assert_int_equal(s.nboxes, 3); /* pieces 1, 3, 5 of 6 rows of 4 */
  assert_true(s.local_shape[0] == 12 && s.local_shape[1] == 5);
  for (int k = 0; k < 3; k++) {
    assert_int_equal(s.boxes[k].local_offset[0], 4 * k);
    assert_int_equal(s.boxes[k].global_offset[0], 4 * (1 + 2 * k));
    assert_true(s.boxes[k].length[0] == 4 && s.boxes[k].length[1] == 5);
  }
  assert_true(s.nspans == 1 && s.spans[0].lo == 0 && s.spans[0].hi == 60);
  assert_int_equal(mpu_shard_megatron(2, shape, -1, 3, 2, 1, &s), MPU_SUCCESS); /* a duplicate */
  assert_true(s.nboxes == 1 && s.boxes[0].length[0] == 24 && s.local_shape[0] == 24);
  s.nspans = 0;
  assert_int_equal(mpu_shard_keep(&s, 10, 20, 0), 0);
  assert_int_equal(mpu_shard_keep(&s, 15, 30, 10), MPU_ERR_INVALID_ARGUMENT); /* out of order */
  assert_int_equal(mpu_shard_keep(&s, 100, 121, 10), MPU_ERR_INVALID_ARGUMENT); /* past 120 */
  assert_int_equal(mpu_shard_keep(&s, 30, 30, 10), 0);                          /* empty: none */
  assert_int_equal(s.nspans, 1);
}

/* The box copy against element-by-element indexing, 3-d */
static void test_copy_box(void **state) {
  (void)state;
  int64_t ss[3] = {4, 5, 6}, ds[3] = {3, 4, 7}, so[3] = {1, 2, 3}, dof[3] = {0, 1, 2},
          box[3] = {3, 3, 2};
  float src[120], dst[84], want[84];
  for (int i = 0; i < 120; i++) src[i] = (float)i;
  for (int i = 0; i < 84; i++) dst[i] = want[i] = -1.0f;
  for (int a = 0; a < 3; a++)
    for (int b = 0; b < 3; b++)
      for (int c = 0; c < 2; c++)
        want[((dof[0] + a) * 4 + dof[1] + b) * 7 + dof[2] + c] =
            src[((so[0] + a) * 5 + so[1] + b) * 6 + so[2] + c];
  mpu_shard_copy_box(sizeof(float), dst, ds, dof, src, ss, so, box, 3);
  assert_memory_equal(dst, want, sizeof want);
}

/* A span of a box's elements is a box when it is whole rows of the dims it cuts */
static void test_span_box(void **state) {
  (void)state;
  mpu_shard_box b;
  memset(&b, 0, sizeof b);
  b.global_offset[0] = 8, b.length[0] = 6, b.length[1] = 5; /* rows 8..13 of a (n, 5) tensor */
  int64_t off[4], len[4];
  assert_int_equal(mpu_shard_span_box(2, &b, 10, 25, off, len), 1); /* rows 2..4 of the box */
  assert_true(off[0] == 10 && len[0] == 3 && off[1] == 0 && len[1] == 5);
  assert_int_equal(mpu_shard_span_box(2, &b, 11, 14, off, len), 1); /* inside row 2 */
  assert_true(off[0] == 10 && len[0] == 1 && off[1] == 1 && len[1] == 3);
  assert_int_equal(mpu_shard_span_box(2, &b, 3, 12, off, len), 0); /* across a row's end */
  mpu_shard_box c; /* (2, 3, 4): whole slabs of dim 1 under one index of dim 0 */
  memset(&c, 0, sizeof c);
  c.length[0] = 2, c.length[1] = 3, c.length[2] = 4;
  assert_int_equal(mpu_shard_span_box(3, &c, 16, 24, off, len), 1);
  assert_true(off[0] == 1 && len[0] == 1 && off[1] == 1 && len[1] == 2 && len[2] == 4);
  assert_int_equal(mpu_shard_span_box(3, &c, 4, 12, off, len), 1); /* [0, 1..2, :] */
  assert_int_equal(mpu_shard_span_box(3, &c, 8, 20, off, len), 0); /* across dim 0 */
}

/* ---- FSDP's layouts against torch's ---------------------------------------------------- */

typedef struct expect {
  size_t piece;            /* the padded shard */
  size_t span[5][3];       /* per parameter: lo, hi, where lo lies in the rank's piece */
} expect;

static const expect fsdp1_a_4[] = {
    {15, {{0, 7, 0}, {0, 8, 7}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}}},
    {15, {{0, 0, 0}, {8, 13, 0}, {0, 1, 5}, {0, 9, 6}, {0, 0, 0}}},
    {15, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {9, 24, 0}, {0, 0, 0}}},
    {15, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {24, 31, 0}, {0, 5, 7}}},
};
static const expect fsdp1_a_8[] = {
    {8, {{0, 7, 0}, {0, 1, 7}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}}},
    {8, {{0, 0, 0}, {1, 9, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}}},
    {8, {{0, 0, 0}, {9, 13, 0}, {0, 1, 4}, {0, 3, 5}, {0, 0, 0}}},
    {8, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {3, 11, 0}, {0, 0, 0}}},
    {8, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {11, 19, 0}, {0, 0, 0}}},
    {8, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {19, 27, 0}, {0, 0, 0}}},
    {8, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {27, 31, 0}, {0, 4, 4}}},
    {8, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {4, 5, 0}}},
};
static const expect fsdp1_b_4[] = {
    {3, {{0, 3, 0}, {0, 0, 0}, {0, 0, 0}}},
    {3, {{0, 0, 0}, {0, 2, 0}, {0, 1, 2}}},
    {3, {{0, 0, 0}, {0, 0, 0}, {1, 4, 0}}},
    {3, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}}},
};
static const expect fsdp1_b_8[] = {
    {2, {{0, 2, 0}, {0, 0, 0}, {0, 0, 0}}},
    {2, {{2, 3, 0}, {0, 1, 1}, {0, 0, 0}}},
    {2, {{0, 0, 0}, {1, 2, 0}, {0, 1, 1}}},
    {2, {{0, 0, 0}, {0, 0, 0}, {1, 3, 0}}},
    {2, {{0, 0, 0}, {0, 0, 0}, {3, 4, 0}}},
    {2, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}}},
    {2, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}}},
    {2, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}}},
};
static const expect fsdp2_4[] = {
    {28, {{0, 6, 0}, {0, 4, 6}, {0, 5, 10}, {0, 9, 15}, {0, 4, 24}}},
    {28, {{6, 12, 0}, {4, 8, 6}, {0, 0, 0}, {9, 18, 15}, {4, 8, 24}}},
    {28, {{12, 18, 0}, {8, 12, 6}, {0, 0, 0}, {18, 27, 15}, {8, 10, 24}}},
    {28, {{18, 21, 0}, {12, 13, 6}, {0, 0, 0}, {27, 30, 15}, {0, 0, 0}}},
};
static const expect fsdp2_8[] = {
    {18, {{0, 3, 0}, {0, 2, 3}, {0, 5, 5}, {0, 6, 10}, {0, 2, 16}}},
    {18, {{3, 6, 0}, {2, 4, 3}, {0, 0, 0}, {6, 12, 10}, {2, 4, 16}}},
    {18, {{6, 9, 0}, {4, 6, 3}, {0, 0, 0}, {12, 18, 10}, {4, 6, 16}}},
    {18, {{9, 12, 0}, {6, 8, 3}, {0, 0, 0}, {18, 24, 10}, {6, 8, 16}}},
    {18, {{12, 15, 0}, {8, 10, 3}, {0, 0, 0}, {24, 30, 10}, {8, 10, 16}}},
    {18, {{15, 18, 0}, {10, 12, 3}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}}},
    {18, {{18, 21, 0}, {12, 13, 3}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}}},
    {18, {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}}},
};

/* Each rank of S (the fake backend: rank r of S, no data moved) holds what
 * torch's table says; params: numels (FSDP1) or shapes (FSDP2). */
static void check_layout(mpu_fsdp_layout layout, int S, int nparams, const int64_t (*shapes)[2],
                         const expect *want) {
  for (int r = 0; r < S; r++) {
    mpu_param_buffer b;
    mpu_param_buffer_init(&b, 0);
    for (int i = 0; i < nparams; i++) {
      char name[8] = {'p', (char)('0' + i), 0};
      int64_t numel = shapes[i][0] * (shapes[i][1] ? shapes[i][1] : 1);
      assert_int_equal(mpu_param_buffer_add(&b, name, (size_t)numel, MPU_PARAM_DUPLICATE, NULL), 0);
      assert_int_equal(mpu_param_buffer_set_shape(&b, i, shapes[i][1] ? 2 : 1, shapes[i]), 0);
    }
    mpu_comm *fake;
    assert_int_equal(mpu_comm_fake_create(r, S, &fake), 0);
    mpu_fsdp_options o = MPU_FSDP_OPTIONS_INIT;
    o.layout = layout;
    mpu_fsdp *f;
    assert_int_equal(mpu_fsdp_create(&b, fake, NULL, &o, &f), 0);
    assert_int_equal(mpu_fsdp_nbuckets(f), 1);
    size_t piece, held;
    mpu_fsdp_shard_params(f, &held);
    assert_int_equal(mpu_fsdp_bucket_range(f, 0, NULL, NULL, &piece), 0);
    assert_int_equal(piece, want[r].piece);
    assert_int_equal(held, want[r].piece);
    for (int i = 0; i < nparams; i++) {
      mpu_shard ps;
      assert_int_equal(mpu_fsdp_param_shard(f, i, &ps), 0);
      assert_true(ps.nspans <= 1);
      mpu_shard_span sp = ps.nspans ? ps.spans[0] : (mpu_shard_span){0, 0, 0};
      if (sp.lo != want[r].span[i][0] || sp.hi != want[r].span[i][1])
        fail_msg("%s S=%d rank %d param %d: [%zu, %zu), torch [%zu, %zu)",
                 mpu_fsdp_layout_name(layout), S, r, i, sp.lo, sp.hi, want[r].span[i][0],
                 want[r].span[i][1]);
      if (sp.hi > sp.lo) assert_int_equal(sp.at, want[r].span[i][2]);
    }
    mpu_fsdp_free(f);
    mpu_comm_destroy(fake);
    mpu_param_buffer_free(&b);
  }
}

static void test_fsdp1_flat_parameter(void **state) {
  (void)state;
  static const int64_t a[5][2] = {{7, 0}, {13, 0}, {1, 0}, {31, 0}, {5, 0}};
  static const int64_t b[3][2] = {{3, 0}, {2, 0}, {4, 0}};
  check_layout(MPU_FSDP_FLAT, 4, 5, a, fsdp1_a_4);
  check_layout(MPU_FSDP_FLAT, 8, 5, a, fsdp1_a_8);
  check_layout(MPU_FSDP_FLAT, 4, 3, b, fsdp1_b_4);
  check_layout(MPU_FSDP_FLAT, 8, 3, b, fsdp1_b_8);
}

static void test_fsdp2_dim0(void **state) {
  (void)state;
  static const int64_t shapes[5][2] = {{7, 3}, {13, 0}, {1, 5}, {10, 3}, {5, 2}};
  check_layout(MPU_FSDP_PER_PARAM, 4, 5, shapes, fsdp2_4);
  check_layout(MPU_FSDP_PER_PARAM, 8, 5, shapes, fsdp2_8);
  mpu_fsdp_layout l;
  assert_int_equal(mpu_fsdp_layout_from_name("fsdp2", &l), 0);
  assert_int_equal(l, MPU_FSDP_PER_PARAM);
  assert_int_equal(mpu_fsdp_layout_from_name("zero", &l), MPU_ERR_INVALID_ARGUMENT);
  /* wrong shapes and layouts: clear errors, nothing changed */
  mpu_param_buffer b;
  mpu_param_buffer_init(&b, 0);
  assert_int_equal(mpu_param_buffer_add(&b, "w", 12, MPU_PARAM_DUPLICATE, NULL), 0);
  int64_t bad[5] = {5, 3, 1, 1, 1}, zero[2] = {0, 12}, good[2] = {4, 3};
  assert_int_equal(mpu_param_buffer_set_shape(&b, 0, 2, bad), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_param_buffer_set_shape(&b, 0, 5, bad), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_param_buffer_set_shape(&b, 0, 2, zero), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_param_buffer_set_shape(&b, 1, 2, good), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(b.params[0].ndim, 0);
  assert_int_equal(mpu_param_buffer_set_shape(&b, 0, 2, good), 0);
  mpu_comm *fake;
  assert_int_equal(mpu_comm_fake_create(0, 4, &fake), 0);
  mpu_fsdp_options o = MPU_FSDP_OPTIONS_INIT;
  o.layout = (mpu_fsdp_layout)7;
  mpu_fsdp *f = NULL;
  assert_int_equal(mpu_fsdp_create(&b, fake, NULL, &o, &f), MPU_ERR_INVALID_ARGUMENT);
  assert_null(f);
  mpu_comm_destroy(fake);
  mpu_param_buffer_free(&b);
}

/* ---- any DTensor saved and loaded as shards ------------------------------------------ */

enum { ROWS = 10, COLS = 5 };

typedef struct dt_job {
  const char *dir;
  int mdim;
  int64_t mshape[2];
  mpu_placement pl[2];
  int save, bad;
  int empty; /* ranks whose piece is empty */
} dt_job;

static float dt_value(int64_t r, int64_t c) { return 0.5f * (float)(r * COLS + c) + 1.0f; }

/* This rank's piece of a (ROWS, COLS) tensor placed as j->pl on j's mesh,
 * as a shard (mpu_dtensor_local_shape's shape and offset: one box); the one
 * replica that writes is the rank at coordinate 0 of every Replicate dim. */
static mpu_result_t dt_rank(mpu_comm *world, void *arg) {
  dt_job *j = arg;
  int rank;
  mpu_comm_rank(world, &rank);
  mpu_mesh *mesh = NULL;
  mpu_result_t r = mpu_mesh_create(j->mdim, j->mshape, NULL, NULL, &mesh);
  mpu_dtensor_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.ndim = 2, spec.shape[0] = ROWS, spec.shape[1] = COLS, spec.dtype = MPU_FLOAT32;
  memcpy(spec.placements, j->pl, sizeof j->pl);
  int64_t local[2] = {0, 0}, off[2] = {0, 0}, coords[2];
  mpu_shard_tensor *t = calloc(1, sizeof *t);
  if (!r && !t) r = MPU_ERR_OUT_OF_MEMORY;
  if (!r) r = mpu_dtensor_describe(mesh, rank, &spec, &t->shard);
  if (!r) r = mpu_mesh_coords(mesh, rank, coords);
  if (!r) {
    memcpy(local, t->shard.local_shape, sizeof local);
    memcpy(off, t->shard.boxes[0].global_offset, sizeof off);
  }
  /* an empty piece keeps nothing (and needs no memory) */
  float *data = r ? NULL : calloc((size_t)(local[0] * local[1]) + 1, sizeof *data);
  if (!r && !data) r = MPU_ERR_OUT_OF_MEMORY;
  int writer = 1;
  for (int d = 0; d < j->mdim; d++) writer &= j->pl[d].kind != MPU_PLACE_REPLICATE || !coords[d];
  if (!r) {
    snprintf(t->name, sizeof t->name, "w");
    t->data = data;
    if (writer) t->nsave = t->shard.nspans, memcpy(t->save, t->shard.spans, sizeof t->save);
    if (local[0] * local[1] == 0) __atomic_fetch_add(&j->empty, 1, __ATOMIC_RELAXED);
  }
  mpu_shard_list l;
  mpu_shard_list_init(&l);
  mpu_ckpt_set set;
  mpu_ckpt_set_init(&set);
  set.layout.world = set.layout.dp = 4;
  if (!r) r = mpu_shard_list_add(&l, t);
  if (!r) r = mpu_ckpt_add_shards(&set, &l);
  for (int64_t a = 0; !r && j->save && a < local[0]; a++)
    for (int64_t c = 0; c < local[1]; c++) data[a * local[1] + c] = dt_value(off[0] + a, off[1] + c);
  if (!r && j->save) r = mpu_ckpt_save(j->dir, world, &set);
  mpu_ckpt *ck = NULL;
  if (!r && !j->save) r = mpu_ckpt_open(j->dir, &ck);
  if (!r && !j->save) r = mpu_ckpt_load(ck, world, &set);
  for (int64_t a = 0; !r && !j->save && a < local[0]; a++)
    for (int64_t c = 0; c < local[1]; c++)
      if (data[a * local[1] + c] != dt_value(off[0] + a, off[1] + c))
        __atomic_fetch_add(&j->bad, 1, __ATOMIC_RELAXED);
  mpu_ckpt_free(ck);
  mpu_ckpt_set_free(&set);
  mpu_shard_list_free(&l);
  free(t), free(data);
  mpu_mesh_free(mesh);
  return r;
}

static int dt_run(dt_job j) {
  mpu_result_t r = mpu_launch(4, dt_rank, &j, NULL, NULL);
  if (r) fprintf(stderr, "%s\n", mpu_last_error());
  assert_int_equal(r, MPU_SUCCESS);
  assert_int_equal(j.bad, 0);
  return j.empty;
}

static void test_dtensor_checkpoint(void **state) {
  (void)state;
  char dir[64];
  snprintf(dir, sizeof dir, "test_shard_ckpt_%d", (int)getpid());
  mpu_placement s0 = MPU_SHARD(0), s1 = MPU_SHARD(1), rep = MPU_REPLICATE;
  dt_run((dt_job){dir, 2, {2, 2}, {s0, s1}, 1, 0, 0});   /* saved as [Shard(0), Shard(1)] on (2, 2) */
  dt_run((dt_job){dir, 1, {4, 0}, {s0, rep}, 0, 0, 0});  /* loaded as [Shard(0)] on (4): 3, 3, 3, 1 */
  dt_run((dt_job){dir, 1, {4, 0}, {rep, rep}, 0, 0, 0}); /* ... and [Replicate] */
  dt_run((dt_job){dir, 2, {2, 2}, {rep, s1}, 1, 0, 0});  /* replicas: one of them writes */
  dt_run((dt_job){dir, 2, {2, 2}, {s1, s0}, 0, 0, 0});
  /* 5 columns over 4 ranks are 2, 2, 1 and 0: rank 3 saves and loads an empty piece */
  assert_int_equal(dt_run((dt_job){dir, 1, {4, 0}, {s1, rep}, 1, 0, 0}), 1);
  assert_int_equal(dt_run((dt_job){dir, 2, {2, 2}, {s0, s1}, 0, 0, 0}), 0);
  assert_int_equal(dt_run((dt_job){dir, 1, {4, 0}, {s1, rep}, 0, 0, 0}), 1);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  assert_int_equal(system(cmd), 0);
}

/* A DTensor piece as a shard, empty pieces included: on mesh (2, 2), a (2, 7, 3) tensor placed
 * [Shard(0), Shard(0)] gives rank 1 (coordinates (0, 1)) none of row 0, the only row of its
 * outer piece; torch 2.15 puts that empty piece at offset (2, 0, 0), the dim's end
 * (compute_local_shape_and_global_offset), and DCP keys chunks by offset. */
static void test_dtensor_describe(void **state) {
  (void)state;
  int64_t dims[2] = {2, 2};
  mpu_mesh *mesh = NULL;
  assert_int_equal(mpu_mesh_create(2, dims, NULL, NULL, &mesh), 0);
  mpu_dtensor_spec spec;
  memset(&spec, 0, sizeof spec);
  spec.ndim = 3, spec.shape[0] = 2, spec.shape[1] = 7, spec.shape[2] = 3;
  spec.placements[0] = MPU_SHARD(0), spec.placements[1] = MPU_SHARD(0);
  static const int64_t want_len[4] = {1, 0, 1, 0}, want_off[4] = {0, 2, 1, 2};
  for (int rank = 0; rank < 4; rank++) {
    mpu_shard s;
    assert_int_equal(mpu_dtensor_describe(mesh, rank, &spec, &s), 0);
    assert_true(s.ndim == 3 && s.shape[0] == 2 && s.shape[1] == 7 && s.shape[2] == 3);
    assert_int_equal(s.nboxes, 1);
    assert_int_equal(s.local_shape[0], want_len[rank]);
    assert_int_equal(s.boxes[0].length[0], want_len[rank]);
    assert_int_equal(s.boxes[0].global_offset[0], want_off[rank]);
    assert_true(s.boxes[0].length[1] == 7 && s.boxes[0].length[2] == 3);
    assert_true(s.boxes[0].global_offset[1] == 0 && s.boxes[0].global_offset[2] == 0);
    assert_int_equal(s.nspans, want_len[rank] ? 1 : 0); /* an empty piece keeps nothing */
    if (s.nspans) assert_true(s.spans[0].lo == 0 && s.spans[0].hi == 21 && s.spans[0].at == 0);
  }
  /* a shard holds 4 dims; the spec's fifth is refused, naming it */
  spec.ndim = 5, spec.shape[3] = spec.shape[4] = 1;
  mpu_shard s;
  assert_int_equal(mpu_dtensor_describe(mesh, 0, &spec, &s), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "5 dims"));
  /* a box past the tensor is still refused; an empty one at the end is not */
  int64_t shape[1] = {5}, len[1] = {0}, at[1] = {5}, past[1] = {6};
  assert_int_equal(mpu_shard_box_at(1, shape, len, at, &s), 0);
  assert_true(s.nspans == 0 && s.boxes[0].global_offset[0] == 5);
  assert_int_equal(mpu_shard_box_at(1, shape, len, past, &s), MPU_ERR_INVALID_ARGUMENT);
  mpu_mesh_free(mesh);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunk),     cmocka_unit_test(test_megatron),
      cmocka_unit_test(test_copy_box),  cmocka_unit_test(test_span_box),
      cmocka_unit_test(test_fsdp1_flat_parameter), cmocka_unit_test(test_fsdp2_dim0),
      cmocka_unit_test(test_dtensor_describe),      cmocka_unit_test(test_dtensor_checkpoint),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
