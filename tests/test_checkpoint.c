/*
 * test_checkpoint.c - distributed checkpoints (mpu/checkpoint.h) moved
 * across layouts.
 *
 * A small model (a fused QKV weight and bias with stride 3, a row-parallel
 * weight, a duplicated norm) whose every global element has a known value,
 * with AdamW moments of known values, is saved from tp 2 x dp 2 under ZeRO-1
 * on thread ranks and loaded into other layouts (tp 1, tp 4, dp 4 ZeRO-1,
 * tp 2 x dp 2 plain), and between sharded buffers (FSDP, HSDP; both FSDP
 * layouts) and plain ones both ways; each rank checks each local element
 * against the global value the test computes from Megatron's stride rule
 * itself, and that it read no more than the index and the pieces that
 * overlap its slices; a corrupted piece fails every rank, memory unchanged.
 * What must fail: test_ckpt_refusals.c; the root's folders and its lock:
 * test_ckpt_root.c; saves killed midway and a full disk: test_ckpt_crash.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpu.h"
#include "ckpt_helpers.h"

/* ---- the model --------------------------------------------------------------------------- */

enum { NPARAMS = 4 };
typedef struct pdef {
  const char *name;
  int ndim;
  int64_t shape[2];
  int dim, stride; /* dim -1: a duplicate */
} pdef;

static const pdef model[NPARAMS] = {
    {"layer0.qkv.weight", 2, {24, 5}, 0, 3},
    {"layer0.qkv.bias", 1, {24, 1}, 0, 3},
    {"layer0.proj.weight", 2, {6, 8}, 1, 1},
    {"layer0.norm", 1, {7, 1}, -1, 1},
};

/* the global value of element g of parameter p (kind 0), or of its moments (1, 2) */
static float value(int p, int kind, int64_t g) { return (float)(p * 1000 + kind * 100000) + 0.25f * (float)g; }

static int64_t numel(const pdef *d) { return d->ndim == 1 ? d->shape[0] : d->shape[0] * d->shape[1]; }

/* The global flat index of local element l of parameter d on tp rank r of tp:
 * Megatron's rule, written here on its own (pieces r, r + tp, ... of size
 * size / (tp x stride) along dim). */
static int64_t global_index(const pdef *d, int tp, int r, int64_t l) {
  int64_t rows = d->shape[0], cols = d->ndim == 1 ? 1 : d->shape[1];
  if (d->dim < 0 || tp == 1) return l;
  int64_t lc = d->dim == 1 ? cols / tp : cols, a = l / lc, b = l % lc;
  int64_t piece = (d->dim == 0 ? rows : cols) / (tp * d->stride);
  if (d->dim == 0) a = (r + (a / piece) * tp) * piece + a % piece;
  else b = (r + (b / piece) * tp) * piece + b % piece;
  return a * cols + b;
}

typedef struct rank_model {
  mpu_param_buffer b;
  mpu_optimizer opt;
  int tp, tp_rank, dp_rank;
} rank_model;

static mpu_result_t build(mpu_state *s, rank_model *m, int zero, mpu_comm **dp) {
  mpu_result_t r;
  mpu_state_tp_size(s, &m->tp), mpu_state_tp_rank(s, &m->tp_rank), mpu_state_dp_rank(s, &m->dp_rank);
  if ((r = mpu_state_comm(s, MPU_GROUP_DP, dp))) return r;
  mpu_param_buffer_init(&m->b, m->tp_rank);
  for (int p = 0; p < NPARAMS; p++) {
    int i;
    size_t local = (size_t)numel(&model[p]) / (model[p].dim < 0 ? 1 : (size_t)m->tp);
    mpu_param_attrs a = model[p].dim < 0 ? MPU_PARAM_DUPLICATE : MPU_PARAM_PARTITIONED(model[p].dim, model[p].stride);
    if ((r = mpu_param_buffer_add(&m->b, model[p].name, local, a, &i))) return r;
  }
  if ((r = mpu_param_buffer_finalize(&m->b, NULL, NULL))) return r;
  mpu_adamw_options o = MPU_ADAMW_OPTIONS_INIT;
  o.sync.bucket_bytes = 64; /* several buckets: a parameter's ZeRO-1 shard in pieces */
  return mpu_optimizer_init(&m->opt, &m->b, *dp, zero, &o);
}

static void globals(mpu_ckpt_global *g) {
  for (int p = 0; p < NPARAMS; p++) {
    memset(&g[p], 0, sizeof g[p]);
    g[p].name = model[p].name, g[p].ndim = model[p].ndim;
    g[p].shape[0] = model[p].shape[0], g[p].shape[1] = model[p].shape[1];
  }
}

static mpu_result_t describe(rank_model *m, mpu_ckpt_set *set) {
  mpu_ckpt_global g[NPARAMS];
  globals(g);
  return mpu_ckpt_add_buffer(set, &m->b, g, &m->opt, m->tp, m->dp_rank);
}

/* fill (or, check != 0, count the mismatches of) the parameters and the moments this rank keeps */
static int walk(rank_model *m, int check) {
  int bad = 0;
  for (int p = 0; p < NPARAMS; p++) {
    float *data = mpu_param_data(&m->b, p);
    for (int64_t l = 0; l < (int64_t)m->b.params[p].numel; l++) {
      float want = value(p, 0, global_index(&model[p], m->tp, m->tp_rank, l));
      if (check) bad += data[l] != want;
      else data[l] = want;
    }
    mpu_shard held;
    if (mpu_optimizer_param_shard(&m->opt, p, &held)) return -1;
    for (int k = 0; k < held.nspans; k++)
      for (size_t l = held.spans[k].lo; l < held.spans[k].hi; l++) {
        int64_t g = global_index(&model[p], m->tp, m->tp_rank, (int64_t)l);
        size_t at = held.spans[k].at + l - held.spans[k].lo;
        float *mm = &m->opt.m[at], *vv = &m->opt.v[at];
        if (check) bad += *mm != value(p, 1, g) || *vv != value(p, 2, g);
        else *mm = value(p, 1, g), *vv = value(p, 2, g);
      }
  }
  return bad;
}

static void free_model(rank_model *m) {
  mpu_optimizer_free(&m->opt);
  mpu_param_buffer_free(&m->b);
}

static char dir_a[256];

typedef struct job {
  int zero;
  int bad;          /* elements that differ, over the ranks */
  int over_budget;  /* ranks that read more than the index and their pieces */
  int read_less;    /* ranks that read less than everything (tp 4) */
  int expect_fail;  /* a piece is corrupted: every rank must fail and keep its memory */
} job;

/* a rank's model (filled with its values when saving) and its description */
static mpu_result_t start_rank(mpu_state *s, const job *j, rank_model *m, mpu_ckpt_set *set,
                               int fill) {
  mpu_comm *dp;
  memset(m, 0, sizeof *m);
  mpu_ckpt_set_init(set);
  mpu_result_t r = build(s, m, j->zero, &dp);
  if (!r && fill) walk(m, 0);
  return r ? r : describe(m, set);
}

static mpu_result_t save_rank(mpu_state *s, void *arg) {
  job *j = arg;
  rank_model m;
  mpu_ckpt_set set;
  mpu_result_t r = start_rank(s, j, &m, &set, 1);
  m.opt.step = 7;
  set.step = 7, set.has_adamw = 1, set.adamw = m.opt.o, set.optimizer_step = m.opt.step;
  set.layout.tp = m.tp, set.layout.dp = m.opt.dp_size, set.layout.zero1 = j->zero;
  if (!r) r = mpu_ckpt_set_meta(&set, "model", "test");
  if (!r) r = mpu_ckpt_save(dir_a, mpu_state_world(s), &set);
  mpu_ckpt_set_free(&set);
  free_model(&m);
  return r;
}

/* whether a piece's global box meets one of the rank's boxes of tensor `name` (a parameter of
 * the model or one of its moments), those of Megatron's partition on tp rank r of tp */
static int meets(const char *name, int tp, int r, const mpu_ckpt_piece_info *pi) {
  for (int p = 0; p < NPARAMS; p++) {
    size_t len = strlen(model[p].name);
    if (strncmp(name, model[p].name, len) || (name[len] && name[len] != '.')) continue;
    mpu_shard s;
    if (mpu_shard_megatron(model[p].ndim, model[p].shape, model[p].dim, model[p].stride, tp, r, &s))
      return 1; /* counted: a failure shows as bytes read past the budget */
    for (int k = 0; k < s.nboxes; k++) {
      int ok = 1;
      for (int d = 0; d < s.ndim; d++)
        ok &= pi->offset[d] < s.boxes[k].global_offset[d] + s.boxes[k].length[d] &&
              s.boxes[k].global_offset[d] < pi->offset[d] + pi->length[d];
      if (ok) return 1;
    }
  }
  return 0;
}

static mpu_result_t load_rank(mpu_state *s, void *arg) {
  job *j = arg;
  rank_model m;
  mpu_ckpt_set set;
  mpu_ckpt *ck = NULL;
  mpu_result_t r = start_rank(s, j, &m, &set, 0);
  if (!r) r = mpu_ckpt_open(dir_a, &ck);
  if (!r && j->expect_fail) {
    for (size_t e = 0; e < m.b.numel; e++) m.b.data[e] = -7.0f;
    for (size_t e = 0; e < m.opt.owned; e++) m.opt.m[e] = m.opt.v[e] = -7.0f;
    int bad = mpu_ckpt_load(ck, mpu_state_world(s), &set) == MPU_SUCCESS;
    for (size_t e = 0; e < m.b.numel; e++) bad += m.b.data[e] != -7.0f;
    for (size_t e = 0; e < m.opt.owned; e++) bad += m.opt.m[e] != -7.0f || m.opt.v[e] != -7.0f;
    __atomic_fetch_add(&j->bad, bad, __ATOMIC_RELAXED);
  } else if (!r) r = mpu_ckpt_load(ck, mpu_state_world(s), &set);
  if (!r && !j->expect_fail) {
    int bad = walk(&m, 1) + (set.step != 7) + (set.optimizer_step != 7) + !set.has_adamw;
    __atomic_fetch_add(&j->bad, bad, __ATOMIC_RELAXED);
    /* the bytes read: the index and pieces that meet this rank's boxes, no more */
    mpu_ckpt_info in;
    mpu_ckpt_get_info(ck, &in);
    uint64_t budget = in.index_bytes, all = in.index_bytes;
    for (int i = 0; i < in.ntensors; i++) {
      mpu_ckpt_tensor_info ti;
      mpu_ckpt_tensor_at(ck, i, &ti);
      for (int p = 0; p < ti.npieces; p++) {
        mpu_ckpt_piece_info pi;
        mpu_ckpt_piece_at(ck, i, p, &pi);
        all += pi.byte_hi - pi.byte_lo;
        if (meets(ti.name, m.tp, m.tp_rank, &pi)) budget += pi.byte_hi - pi.byte_lo;
      }
    }
    uint64_t read = mpu_ckpt_bytes_read(ck);
    if (read > budget) __atomic_fetch_add(&j->over_budget, 1, __ATOMIC_RELAXED);
    if (read < all) __atomic_fetch_add(&j->read_less, 1, __ATOMIC_RELAXED);
  }
  mpu_ckpt_free(ck);
  mpu_ckpt_set_free(&set);
  free_model(&m);
  return r;
}

static void run_layout(int world, int tp, int zero, job *j) {
  mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
  cfg.tp = tp;
  int expect_fail = j->expect_fail;
  memset(j, 0, sizeof *j);
  j->zero = zero, j->expect_fail = expect_fail;
  mpu_result_t r = mpu_with_state(world, &cfg, 1, load_rank, j, NULL, NULL);
  if (r) fprintf(stderr, "load into %d ranks, tp %d, zero %d: %s\n", world, tp, zero, mpu_last_error());
  assert_int_equal(r, MPU_SUCCESS);
  assert_int_equal(j->bad, 0);
  assert_int_equal(j->over_budget, 0);
}

static void test_reshard(void **state) {
  (void)state;
  make_dir("reshard", dir_a, sizeof dir_a);
  mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
  cfg.tp = 2;
  job j = {1, 0, 0, 0, 0};
  assert_int_equal(mpu_with_state(4, &cfg, 1, save_rank, &j, NULL, NULL), MPU_SUCCESS);
  run_layout(1, 1, 0, &j); /* one rank: the whole model */
  run_layout(4, 4, 0, &j); /* tp 4: each rank a quarter of each stride piece */
  assert_int_equal(j.read_less, 4);
  run_layout(4, 1, 1, &j); /* dp 4 ZeRO-1 */
  run_layout(4, 2, 0, &j); /* tp 2 x dp 2 plain */
  /* the merge: one file, every parameter whole, read back through a one-rank load */
  char merged[300];
  snprintf(merged, sizeof merged, "%s/merged.safetensors", dir_a);
  mpu_ckpt *ck;
  assert_int_equal(mpu_ckpt_open(dir_a, &ck), 0);
  assert_int_equal(mpu_ckpt_verify(ck), 0);
  assert_int_equal(mpu_ckpt_merge(ck, merged, 0), 0);
  mpu_ckpt_info in;
  assert_int_equal(mpu_ckpt_get_info(ck, &in), 0);
  assert_int_equal(in.ntensors, 3 * NPARAMS);
  assert_int_equal(in.layout.tp, 2);
  assert_true(in.layout.zero1);
  assert_string_equal(mpu_ckpt_meta(ck, "model"), "test");
  mpu_ckpt_free(ck);
  FILE *f = fopen(merged, "rb");
  assert_non_null(f);
  unsigned char len8[8];
  assert_int_equal(fread(len8, 1, 8, f), 8);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
  assert_int_equal((8 + hlen) % 8, 0); /* the data 8-byte aligned */
  char *head = calloc(hlen + 1, 1);
  assert_int_equal(fread(head, 1, hlen, f), hlen);
  assert_non_null(strstr(head, "\"layer0.qkv.weight\":{\"dtype\":\"F32\",\"shape\":[24,5]"));
  assert_null(strstr(head, "exp_avg"));
  /* qkv's values, whole, where its data_offsets say */
  char *at = strstr(head, "\"layer0.qkv.weight\"");
  char *off = strstr(at, "data_offsets\":[");
  long begin = strtol(off + 15, NULL, 10);
  float row[5];
  fseek(f, (long)(8 + hlen) + begin + 4 * 5 * 9, SEEK_SET); /* global row 9 */
  assert_int_equal(fread(row, sizeof(float), 5, f), 5);
  for (int c = 0; c < 5; c++) assert_true(row[c] == value(0, 0, 9 * 5 + c));
  free(head);
  fclose(f);
  /* one corrupted byte in rank 3's file: tp 4 ranks that do not read it fail too, and no
   * rank's memory changes */
  char rank3[600], folder[512];
  assert_int_equal(mpu_ckpt_latest(dir_a, folder, sizeof folder), 0);
  assert_non_null(strstr(folder, "/iter_0000007")); /* the root's iteration of step 7 */
  snprintf(rank3, sizeof rank3, "%s/rank00003.safetensors", folder);
  struct stat st;
  assert_int_equal(stat(rank3, &st), 0);
  f = fopen(rank3, "r+b");
  assert_non_null(f);
  fseek(f, (long)st.st_size - 5, SEEK_SET);
  int byte = fgetc(f);
  fseek(f, (long)st.st_size - 5, SEEK_SET);
  fputc(byte ^ 0xff, f);
  fclose(f);
  j.expect_fail = 1;
  run_layout(4, 4, 0, &j);
  j.expect_fail = 0;
  remove_dir(dir_a);
}

/* ---- sharded buffers (mpu/fsdp.h) -------------------------------------------------------- */

typedef struct fsdp_job {
  int replicas; /* 1: FULL_SHARD over dp; R > 1: HYBRID_SHARD on an (R, dp / R) mesh */
  int save;     /* 1: fill the pieces and save; 0: load and check */
  int bad;
  mpu_fsdp_layout layout;
} fsdp_job;

/* Fill (check 0) or count the mismatches of the pieces this rank holds: its
 * span of each parameter and of the moments there. */
static int walk_fsdp(mpu_fsdp *f, const rank_model *m, int check) {
  int bad = 0;
  for (int p = 0; p < NPARAMS; p++) {
    mpu_shard held;
    if (mpu_fsdp_param_shard(f, p, &held) || held.nspans > 1) return -1;
    float *pieces[3] = {mpu_fsdp_shard_params(f, NULL), mpu_fsdp_shard_exp_avg(f, NULL),
                        mpu_fsdp_shard_exp_avg_sq(f, NULL)};
    mpu_shard_span sp = held.nspans ? held.spans[0] : (mpu_shard_span){0, 0, 0};
    for (size_t l = sp.lo; l < sp.hi; l++) {
      int64_t g = global_index(&model[p], m->tp, m->tp_rank, (int64_t)l);
      size_t j = sp.at + l - sp.lo;
      float *at[3] = {&pieces[0][j], &pieces[1][j], &pieces[2][j]};
      for (int k = 0; k < 3; k++)
        if (check) bad += *at[k] != value(p, k, g);
        else *at[k] = value(p, k, g);
    }
  }
  return bad;
}

static mpu_result_t fsdp_rank(mpu_state *s, void *arg) {
  fsdp_job *j = arg;
  rank_model m;
  memset(&m, 0, sizeof m);
  mpu_comm *dp;
  mpu_device_mesh *dm = NULL;
  mpu_fsdp *f = NULL;
  mpu_ckpt *ck = NULL;
  mpu_ckpt_set set;
  mpu_ckpt_set_init(&set);
  mpu_ckpt_global g[NPARAMS];
  globals(g);
  int dp_size, bad = 0;
  mpu_result_t r = build(s, &m, 0, &dp);
  if (!r) r = mpu_comm_size(dp, &dp_size);
  mpu_fsdp_options o = MPU_FSDP_OPTIONS_INIT;
  o.bucket_bytes = 64; /* several buckets, a parameter alone in some */
  o.strategy = j->replicas > 1 ? MPU_SHARD_HYBRID : MPU_SHARD_FULL;
  o.layout = j->layout;
  for (int p = 0; !r && p < NPARAMS; p++) { /* the local shapes: FSDP2 cuts their dim 0 */
    int64_t shape[2] = {model[p].shape[0], model[p].shape[1]};
    if (model[p].dim >= 0) shape[model[p].dim] /= m.tp;
    r = mpu_param_buffer_set_shape(&m.b, p, model[p].ndim, shape);
  }
  if (!r && j->replicas > 1) {
    int64_t shape[2] = {j->replicas, dp_size / j->replicas};
    const char *names[2] = {"replicate", "shard"};
    r = mpu_device_mesh_init(dp, 2, shape, names, MPU_MESH_EAGER, &dm);
    if (!r) r = mpu_fsdp_create_on_mesh(&m.b, dm, 0, 1, &o, &f);
  } else if (!r) {
    r = mpu_fsdp_create(&m.b, dp, NULL, &o, &f);
  }
  if (!r && j->save) {
    walk_fsdp(f, &m, 0);
    r = mpu_fsdp_set_optimizer_step(f, 7);
    mpu_shard_list l; /* what the sharded buffer holds, as shards: the set takes them */
    mpu_shard_list_init(&l);
    if (!r) r = mpu_fsdp_describe(f, g, m.tp, &l);
    if (!r) r = mpu_ckpt_add_shards(&set, &l);
    mpu_shard_list_free(&l);
    set.step = 7, set.has_adamw = 1, set.adamw = o.adamw, set.optimizer_step = 7;
    set.layout.tp = m.tp, set.layout.dp = dp_size;
    if (!r) r = mpu_ckpt_set_meta(&set, "model", "test");
    if (!r) r = mpu_ckpt_save(dir_a, mpu_state_world(s), &set);
  } else if (!r) {
    size_t held;
    float *pieces = mpu_fsdp_shard_params(f, &held);
    for (size_t e = 0; e < held; e++) pieces[e] = -7.0f;
    r = mpu_ckpt_add_fsdp(&set, f, g, m.tp);
    if (!r) r = mpu_ckpt_open(dir_a, &ck);
    if (!r) r = mpu_ckpt_load(ck, mpu_state_world(s), &set);
    if (!r) r = mpu_fsdp_set_optimizer_step(f, set.optimizer_step);
    if (!r) bad += walk_fsdp(f, &m, 1) + (mpu_fsdp_optimizer_step(f) != 7) + (set.step != 7);
    /* the gathered parameters are the loaded ones, whole */
    float *whole = r ? NULL : malloc(m.b.numel * sizeof *whole);
    if (!r && !whole) r = MPU_ERR_OUT_OF_MEMORY;
    if (!r) r = mpu_fsdp_gather_params(f, whole);
    for (int p = 0; !r && p < NPARAMS; p++)
      for (size_t l = 0; l < m.b.params[p].numel; l++)
        bad += whole[m.b.params[p].offset + l] !=
               value(p, 0, global_index(&model[p], m.tp, m.tp_rank, (int64_t)l));
    free(whole);
  }
  __atomic_fetch_add(&j->bad, bad, __ATOMIC_RELAXED);
  mpu_ckpt_free(ck);
  mpu_ckpt_set_free(&set);
  mpu_fsdp_free(f);
  mpu_device_mesh_free(dm);
  free_model(&m);
  return r;
}

static void run_fsdp_as(int world, int tp, int replicas, int save, mpu_fsdp_layout layout) {
  mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
  cfg.tp = tp;
  fsdp_job j = {replicas, save, 0, layout};
  mpu_result_t r = mpu_with_state(world, &cfg, 1, fsdp_rank, &j, NULL, NULL);
  if (r)
    fprintf(stderr, "%s %d ranks, tp %d, %d replicas: %s\n", save ? "save from" : "load into",
            world, tp, replicas, mpu_last_error());
  assert_int_equal(r, MPU_SUCCESS);
  assert_int_equal(j.bad, 0);
}

static void run_fsdp(int world, int tp, int replicas, int save) {
  run_fsdp_as(world, tp, replicas, save, MPU_FSDP_FLAT);
}

/* The pieces of tensor `name` in dir_a that are not whole boxes (a flat span of one). */
static int span_pieces(const char *name) {
  mpu_ckpt *ck;
  assert_int_equal(mpu_ckpt_open(dir_a, &ck), 0);
  mpu_ckpt_info info;
  assert_int_equal(mpu_ckpt_get_info(ck, &info), 0);
  int spans = 0, found = 0;
  for (int i = 0; i < info.ntensors; i++) {
    mpu_ckpt_tensor_info t;
    assert_int_equal(mpu_ckpt_tensor_at(ck, i, &t), 0);
    if (strcmp(t.name, name)) continue;
    found = 1;
    for (int p = 0; p < t.npieces; p++) {
      mpu_ckpt_piece_info pi;
      assert_int_equal(mpu_ckpt_piece_at(ck, i, p, &pi), 0);
      uint64_t n = 1;
      for (int d = 0; d < t.ndim; d++) n *= (uint64_t)pi.length[d];
      spans += pi.flat_lo != 0 || pi.flat_hi != n;
    }
  }
  mpu_ckpt_free(ck);
  assert_true(found);
  return spans;
}

/* FSDP2's per-parameter layout saves and loads like FSDP1's, each into the
 * other and into plain layouts; a piece that covers whole rows of a weight
 * is stored as a box (as DCP's chunks), not as a span of a larger one. */
static void test_fsdp2(void **state) {
  (void)state;
  make_dir("fsdp2", dir_a, sizeof dir_a);
  job j = {0, 0, 0, 0, 0};
  run_fsdp_as(4, 1, 1, 1, MPU_FSDP_PER_PARAM); /* FSDP2 over dp 4 saves */
  /* qkv.weight (24, 5): rows 6 a rank; proj.weight (6, 8): rows 2 a rank (one empty) */
  assert_int_equal(span_pieces("layer0.qkv.weight"), 0);
  assert_int_equal(span_pieces("layer0.qkv.weight.exp_avg"), 0);
  assert_int_equal(span_pieces("layer0.proj.weight"), 0);
  run_layout(1, 1, 0, &j);                     /* one rank, plain */
  run_layout(4, 2, 1, &j);                     /* tp 2 x dp 2 ZeRO-1 */
  run_fsdp_as(4, 2, 1, 0, MPU_FSDP_FLAT);      /* tp 2 x FSDP1 over dp 2 */
  run_fsdp_as(4, 1, 2, 0, MPU_FSDP_PER_PARAM); /* HSDP 2 x 2, FSDP2 */
  remove_dir(dir_a);
  run_fsdp_as(4, 2, 1, 1, MPU_FSDP_FLAT);      /* tp 2 x FSDP1 over dp 2 saves */
  assert_int_equal(span_pieces("layer0.qkv.weight"), 0); /* 60 local elements: 30 each */
  run_fsdp_as(4, 1, 1, 0, MPU_FSDP_PER_PARAM); /* FSDP2 over dp 4 */
  remove_dir(dir_a);
}

/* FSDP and HSDP pieces saved load into plain and ZeRO-1 layouts, and the other way round:
 * every element exact */
static void test_fsdp(void **state) {
  (void)state;
  make_dir("fsdp", dir_a, sizeof dir_a);
  job j = {0, 0, 0, 0, 0};
  run_fsdp(4, 1, 1, 1);    /* FULL_SHARD over dp 4 saves */
  run_layout(1, 1, 0, &j); /* one rank, plain */
  run_layout(4, 2, 1, &j); /* tp 2 x dp 2 ZeRO-1 */
  run_fsdp(4, 2, 1, 0);    /* tp 2 x FULL_SHARD over dp 2 */
  remove_dir(dir_a);
  run_fsdp(4, 1, 2, 1);    /* HYBRID_SHARD 2 x 2 saves: one replica group writes */
  mpu_ckpt *ck;
  assert_int_equal(mpu_ckpt_open(dir_a, &ck), 0);
  assert_int_equal(mpu_ckpt_verify(ck), 0);
  mpu_ckpt_free(ck);
  run_layout(1, 1, 0, &j);
  run_fsdp(4, 1, 1, 0);
  remove_dir(dir_a);
  mpu_layout_config one = MPU_LAYOUT_CONFIG_INIT;
  assert_int_equal(mpu_with_state(1, &one, 1, save_rank, &j, NULL, NULL), MPU_SUCCESS);
  run_fsdp(4, 1, 1, 0);    /* one rank's plain save into FULL_SHARD over 4 */
  run_fsdp(4, 2, 1, 0);    /* ... and tp 2 x FULL_SHARD over 2 */
  run_fsdp(4, 1, 2, 0);    /* ... and HYBRID_SHARD 2 x 2 */
  remove_dir(dir_a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reshard),
      cmocka_unit_test(test_fsdp),
      cmocka_unit_test(test_fsdp2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
