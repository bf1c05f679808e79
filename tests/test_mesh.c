/*
 * test_mesh.c - the mesh against brute force: every query of every rank of
 * meshes of 1..4 dims, their slices, flattenings and reshapes, compared with
 * an explicit table built here by plain enumeration; the errors; and device
 * meshes moving real data on the threads backend.
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

/* ---- the reference: a full table of ranks ------------------------------------ */

#define MAXN 512

typedef struct ref {
  int ndim;
  int64_t shape[8];
  int64_t n;
  int table[MAXN]; /* rank at each row-major coordinate */
} ref;

static void unravel(const ref *r, int64_t i, int64_t *c) {
  for (int d = r->ndim - 1; d >= 0; d--) {
    c[d] = i % r->shape[d];
    i /= r->shape[d];
  }
}

static int64_t ravel(const ref *r, const int64_t *c) {
  int64_t i = 0;
  for (int d = 0; d < r->ndim; d++) i = i * r->shape[d] + c[d];
  return i;
}

static ref ref_root(int ndim, const int64_t *shape, const int *ranks) {
  ref r = {.ndim = ndim, .n = 1};
  for (int d = 0; d < ndim; d++) r.shape[d] = shape[d], r.n *= shape[d];
  for (int64_t i = 0; i < r.n; i++) r.table[i] = ranks ? ranks[i] : (int)i;
  return r;
}

static int64_t ref_find(const ref *r, int rank) {
  for (int64_t i = 0; i < r->n; i++)
    if (r->table[i] == rank) return i;
  return -1;
}

/* slice at rank: keep dims (in order), others fixed at rank's coordinates */
static ref ref_slice(const ref *r, int rank, const int *dims, int nd) {
  int64_t at[8], c[8], full[8];
  unravel(r, ref_find(r, rank), at);
  ref s = {.ndim = nd, .n = 1};
  for (int i = 0; i < nd; i++) s.shape[i] = r->shape[dims[i]], s.n *= s.shape[i];
  for (int64_t i = 0; i < s.n; i++) {
    unravel(&s, i, c);
    memcpy(full, at, sizeof full);
    for (int k = 0; k < nd; k++) full[dims[k]] = c[k];
    s.table[i] = r->table[ravel(r, full)];
  }
  return s;
}

/* flatten dims (listed order) into one placed where dims[0] was */
static ref ref_flatten(const ref *r, const int *dims, int nd) {
  ref f = {.ndim = 0, .n = r->n};
  int where[8]; /* new dim of each old dim, -1 if flattened */
  int fpos = -1;
  for (int d = 0; d < r->ndim; d++) {
    int listed = 0;
    for (int i = 0; i < nd; i++) listed |= dims[i] == d;
    if (!listed) {
      where[d] = f.ndim;
      f.shape[f.ndim++] = r->shape[d];
    } else {
      where[d] = -1;
      if (d == dims[0]) {
        fpos = f.ndim;
        f.shape[f.ndim] = 1;
        for (int i = 0; i < nd; i++) f.shape[f.ndim] *= r->shape[dims[i]];
        f.ndim++;
      }
    }
  }
  int64_t c[8], old[8];
  for (int64_t i = 0; i < f.n; i++) {
    unravel(&f, i, c);
    for (int d = 0; d < r->ndim; d++)
      if (where[d] >= 0) old[d] = c[where[d]];
    int64_t k = c[fpos];
    for (int j = nd - 1; j >= 0; j--) {
      old[dims[j]] = k % r->shape[dims[j]];
      k /= r->shape[dims[j]];
    }
    f.table[i] = r->table[ravel(r, old)];
  }
  return f;
}

/* split dim into parts of sizes (row-major) */
static ref ref_reshape(const ref *r, int dim, int np, const int64_t *sizes) {
  ref s = {.ndim = 0, .n = r->n};
  for (int d = 0; d < r->ndim; d++) {
    if (d != dim) s.shape[s.ndim++] = r->shape[d];
    else
      for (int p = 0; p < np; p++) s.shape[s.ndim++] = sizes[p];
  }
  int64_t c[8], old[8];
  for (int64_t i = 0; i < s.n; i++) {
    unravel(&s, i, c);
    int k = 0;
    for (int d = 0; d < r->ndim; d++) {
      if (d != dim) {
        old[d] = c[k++];
        continue;
      }
      old[d] = 0;
      for (int p = 0; p < np; p++) old[d] = old[d] * sizes[p] + c[k++];
    }
    s.table[i] = r->table[ravel(r, old)];
  }
  return s;
}

/* the group along dims containing table index i, row-major in listed order */
static int64_t ref_group(const ref *r, int64_t i, const int *dims, int nd, int *out) {
  int64_t at[8], c[8];
  unravel(r, i, at);
  ref g = {.ndim = nd, .n = 1};
  for (int k = 0; k < nd; k++) g.shape[k] = r->shape[dims[k]], g.n *= g.shape[k];
  for (int64_t j = 0; j < g.n; j++) {
    unravel(&g, j, c);
    int64_t full[8];
    memcpy(full, at, sizeof full);
    for (int k = 0; k < nd; k++) full[dims[k]] = c[k];
    out[j] = r->table[ravel(r, full)];
  }
  return g.n;
}

/* Every query of m against the table. */
static void check_mesh(const mpu_mesh *m, const ref *r) {
  assert_int_equal(mpu_mesh_ndim(m), r->ndim);
  assert_int_equal(mpu_mesh_numel(m), r->n);
  for (int d = 0; d < r->ndim; d++) {
    int64_t s;
    assert_int_equal(mpu_mesh_dim_size(m, d, &s), MPU_SUCCESS);
    assert_int_equal(s, r->shape[d]);
  }
  int64_t c[8], got[8];
  for (int64_t i = 0; i < r->n; i++) {
    unravel(r, i, c);
    int rank = -1;
    assert_int_equal(mpu_mesh_rank_at(m, c, &rank), MPU_SUCCESS);
    assert_int_equal(rank, r->table[i]);
    assert_true(mpu_mesh_contains(m, rank));
    assert_int_equal(mpu_mesh_coords(m, rank, got), MPU_SUCCESS);
    for (int d = 0; d < r->ndim; d++) {
      assert_int_equal(got[d], c[d]);
      int64_t local;
      assert_int_equal(mpu_mesh_local_rank(m, rank, d, &local), MPU_SUCCESS);
      assert_int_equal(local, c[d]);
    }
    /* every non-empty set of dims, in mesh order and reversed */
    for (unsigned mask = 1; mask < (1u << r->ndim); mask++) {
      int dims[8], nd = 0;
      for (int d = 0; d < r->ndim; d++)
        if (mask & (1u << d)) dims[nd++] = d;
      for (int rev = 0; rev < (nd > 1 ? 2 : 1); rev++) {
        if (rev)
          for (int a = 0, b = nd - 1; a < b; a++, b--) {
            int t = dims[a];
            dims[a] = dims[b];
            dims[b] = t;
          }
        int want[MAXN], have[MAXN];
        int64_t wn = ref_group(r, i, dims, nd, want), hn = 0;
        assert_int_equal(mpu_mesh_group(m, rank, dims, nd, have, MAXN, &hn), MPU_SUCCESS);
        assert_int_equal(hn, wn);
        assert_memory_equal(have, want, (size_t)wn * sizeof(int));
      }
    }
  }
  /* all groups along each single dim and along all dims */
  for (int d = 0; d <= r->ndim; d++) {
    int dims[8], nd = 0;
    if (d < r->ndim) dims[nd++] = d;
    else
      for (int k = 0; k < r->ndim; k++) dims[nd++] = k;
    int have[MAXN], want[MAXN];
    int64_t ng, gs;
    assert_int_equal(mpu_mesh_groups(m, dims, nd, have, MAXN, &ng, &gs), MPU_SUCCESS);
    assert_int_equal(ng * gs, r->n);
    /* group g: the one containing the g-th combination of the other dims */
    ref others = {.ndim = 0, .n = 1};
    int odims[8];
    for (int k = 0; k < r->ndim; k++) {
      int listed = 0;
      for (int j = 0; j < nd; j++) listed |= dims[j] == k;
      if (!listed) odims[others.ndim] = k, others.shape[others.ndim++] = r->shape[k], others.n *= r->shape[k];
    }
    assert_int_equal(others.n, ng);
    for (int64_t g = 0; g < ng; g++) {
      int64_t oc[8], full[8] = {0};
      unravel(&others, g, oc);
      for (int k = 0; k < others.ndim; k++) full[odims[k]] = oc[k];
      ref_group(r, ravel(r, full), dims, nd, want);
      assert_memory_equal(&have[g * gs], want, (size_t)gs * sizeof(int));
    }
  }
  /* a rank outside the mesh */
  assert_false(mpu_mesh_contains(m, 100000));
  assert_int_equal(mpu_mesh_coords(m, 100000, got), MPU_ERR_INVALID_ARGUMENT);
}

static mpu_mesh *make(int ndim, const int64_t *shape, const char *const *names, const int *ranks) {
  mpu_mesh *m = NULL;
  assert_int_equal(mpu_mesh_create(ndim, shape, names, ranks, &m), MPU_SUCCESS);
  return m;
}

/* ---- tests -------------------------------------------------------------------- */

static void test_roots(void **state) {
  (void)state;
  static const int64_t s1[] = {5}, s2[] = {2, 4}, s3[] = {2, 3, 4}, s4[] = {2, 1, 3, 2};
  const int64_t *shapes[] = {s1, s2, s3, s4};
  for (int i = 0; i < 4; i++) {
    mpu_mesh *m = make(i + 1, shapes[i], NULL, NULL);
    ref r = ref_root(i + 1, shapes[i], NULL);
    check_mesh(m, &r);
    mpu_mesh_free(m);
  }
  /* a rank list given by the caller */
  int ranks[12] = {40, 3, 17, 9, 0, 22, 5, 31, 8, 12, 1, 77};
  int64_t s[2] = {3, 4};
  mpu_mesh *m = make(2, s, NULL, ranks);
  ref r = ref_root(2, s, ranks);
  check_mesh(m, &r);
  assert_false(mpu_mesh_contains(m, 2));
  assert_true(mpu_mesh_memory(m) > sizeof(int) * 12);
  mpu_mesh_free(m);
}

static void test_tutorial_2d(void **state) {
  (void)state;
  const char *names[] = {"replicate", "shard"};
  int64_t shape[] = {2, 4};
  mpu_mesh *m = make(2, shape, names, NULL);
  int g[8];
  int64_t n;
  int shard;
  assert_int_equal(mpu_mesh_dim_index(m, "shard", &shard), MPU_SUCCESS);
  assert_int_equal(mpu_mesh_group(m, 5, &shard, 1, g, 8, &n), MPU_SUCCESS);
  assert_int_equal(n, 4);
  int want_shard[] = {4, 5, 6, 7};
  assert_memory_equal(g, want_shard, sizeof want_shard);
  int rep = 0;
  assert_int_equal(mpu_mesh_group(m, 5, &rep, 1, g, 8, &n), MPU_SUCCESS);
  int want_rep[] = {1, 5};
  assert_memory_equal(g, want_rep, sizeof want_rep);
  int all[8];
  int64_t ng, gs;
  assert_int_equal(mpu_mesh_groups(m, &rep, 1, all, 8, &ng, &gs), MPU_SUCCESS);
  int want_all[] = {0, 4, 1, 5, 2, 6, 3, 7}; /* (0,4), (1,5), (2,6), (3,7) as in the tutorial */
  assert_memory_equal(all, want_all, sizeof want_all);
  char buf[64];
  assert_string_equal(mpu_mesh_describe(m, buf, sizeof buf), "(replicate=2, shard=4)");
  mpu_mesh_free(m);
}

static void test_slices(void **state) {
  (void)state;
  const char *names[] = {"pp", "dp", "cp", "tp"};
  int64_t shape[] = {2, 3, 2, 2};
  mpu_mesh *m = make(4, shape, names, NULL);
  ref r = ref_root(4, shape, NULL);
  for (int rank = 0; rank < 24; rank++) {
    static const int picks[][3] = {{1, -1, -1}, {3, 1, -1}, {0, 2, -1}, {2, 0, 3}, {3, 2, 1}};
    for (size_t p = 0; p < sizeof picks / sizeof picks[0]; p++) {
      int dims[3], nd = 0;
      for (int k = 0; k < 3 && picks[p][k] >= 0; k++) dims[nd++] = picks[p][k];
      mpu_mesh *s = NULL;
      assert_int_equal(mpu_mesh_slice(m, rank, dims, nd, &s), MPU_SUCCESS);
      ref rs = ref_slice(&r, rank, dims, nd);
      check_mesh(s, &rs);
      assert_string_equal(mpu_mesh_dim_name(s, 0), names[dims[0]]);
      /* a slice of the slice */
      if (nd > 1) {
        mpu_mesh *ss = NULL;
        int last = nd - 1;
        assert_int_equal(mpu_mesh_slice(s, rank, &last, 1, &ss), MPU_SUCCESS);
        ref rss = ref_slice(&rs, rank, &last, 1);
        check_mesh(ss, &rss);
        mpu_mesh_free(ss);
      }
      mpu_mesh_free(s);
    }
  }
  /* by names, as mesh["tp", "dp"] */
  mpu_mesh *s = NULL;
  const char *want[] = {"tp", "dp"};
  assert_int_equal(mpu_mesh_slice_names(m, 13, want, 2, &s), MPU_SUCCESS);
  int dims[2] = {3, 1};
  ref rs = ref_slice(&r, 13, dims, 2);
  check_mesh(s, &rs);
  /* rank 0 is not in the slice through rank 13 (pp = 1 there) */
  assert_false(mpu_mesh_contains(s, 0));
  mpu_mesh_free(s);
  mpu_mesh_free(m);
}

static void test_flatten_reshape(void **state) {
  (void)state;
  const char *names[] = {"dp", "cp", "tp"};
  int64_t shape[] = {3, 2, 4};
  mpu_mesh *m = make(3, shape, names, NULL);
  ref r = ref_root(3, shape, NULL);
  static const int flats[][2] = {{0, 1}, {1, 0}, {0, 2}, {2, 1}};
  for (size_t i = 0; i < 4; i++) {
    mpu_mesh *f = NULL;
    assert_int_equal(mpu_mesh_flatten(m, flats[i], 2, "flat", &f), MPU_SUCCESS);
    ref rf = ref_flatten(&r, flats[i], 2);
    check_mesh(f, &rf);
    /* and slices of it, at every rank */
    int flat;
    assert_int_equal(mpu_mesh_dim_index(f, "flat", &flat), MPU_SUCCESS);
    for (int rank = 0; rank < 24; rank++) {
      mpu_mesh *s = NULL;
      assert_int_equal(mpu_mesh_slice(f, rank, &flat, 1, &s), MPU_SUCCESS);
      ref rs = ref_slice(&rf, rank, &flat, 1);
      check_mesh(s, &rs);
      mpu_mesh_free(s);
    }
    mpu_mesh_free(f);
  }
  /* reshape tp (4) into (2, 2) and dp (3)... only as (3) or (1, 3) */
  int64_t parts[2] = {2, 2};
  const char *pn[] = {"tp_outer", "tp_inner"};
  mpu_mesh *rsh = NULL;
  assert_int_equal(mpu_mesh_reshape_dim(m, 2, 2, parts, pn, &rsh), MPU_SUCCESS);
  ref rr = ref_reshape(&r, 2, 2, parts);
  check_mesh(rsh, &rr);
  /* flatten (cp, tp_inner), then reshape the flattened dim back into (2, 2) the other way */
  int fl[2] = {1, 3};
  mpu_mesh *f2 = NULL, *back = NULL;
  assert_int_equal(mpu_mesh_flatten(rsh, fl, 2, "cp_tpi", &f2), MPU_SUCCESS);
  ref rf2 = ref_flatten(&rr, fl, 2);
  check_mesh(f2, &rf2);
  int64_t p2[2] = {2, 2};
  const char *pn2[] = {"a", "b"};
  assert_int_equal(mpu_mesh_reshape_dim(f2, 1, 2, p2, pn2, &back), MPU_SUCCESS);
  ref rback = ref_reshape(&rf2, 1, 2, p2);
  check_mesh(back, &rback);
  /* a reshape that cuts across factors of a flattened dim of sizes (3, 2): 6 -> (2, 3) */
  int f3d[2] = {0, 1};
  mpu_mesh *f3 = NULL, *cut = NULL;
  assert_int_equal(mpu_mesh_flatten(m, f3d, 2, "dp_cp", &f3), MPU_SUCCESS);
  int64_t p3[2] = {2, 3};
  assert_int_equal(mpu_mesh_reshape_dim(f3, 0, 2, p3, NULL, &cut), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "straddles"));
  int64_t p4[2] = {3, 2};
  assert_int_equal(mpu_mesh_reshape_dim(f3, 0, 2, p4, NULL, &cut), MPU_SUCCESS);
  ref rf3 = ref_flatten(&r, f3d, 2), rcut = ref_reshape(&rf3, 0, 2, p4);
  check_mesh(cut, &rcut);
  mpu_mesh_free(cut);
  mpu_mesh_free(f3);
  mpu_mesh_free(back);
  mpu_mesh_free(f2);
  mpu_mesh_free(rsh);
  mpu_mesh_free(m);
}

static void test_errors(void **state) {
  (void)state;
  mpu_mesh *m = NULL;
  int64_t shape[] = {2, 4}, zero[] = {2, 0}, big[] = {1 << 20, 1 << 20};
  const char *dup[] = {"a", "a"}, *bad[] = {"a b", "c"}, *empty[] = {"", "c"};
  const char *longname[] = {"abcdefghijklmnopqrstuvwxyz0123456789", "c"};
  assert_int_equal(mpu_mesh_create(0, shape, NULL, NULL, &m), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_mesh_create(9, shape, NULL, NULL, &m), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_mesh_create(2, zero, NULL, NULL, &m), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "shape[1] = 0"));
  assert_int_equal(mpu_mesh_create(2, big, NULL, NULL, &m), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_mesh_create(2, shape, dup, NULL, &m), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "'a' is used twice"));
  assert_int_equal(mpu_mesh_create(2, shape, bad, NULL, &m), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "'a b'"));
  assert_int_equal(mpu_mesh_create(2, shape, empty, NULL, &m), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_mesh_create(2, shape, longname, NULL, &m), MPU_ERR_INVALID_ARGUMENT);
  int ranks[8] = {0, 1, 2, 3, 4, 5, 6, 6};
  assert_int_equal(mpu_mesh_create(2, shape, NULL, ranks, &m), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "rank 6 is listed twice"));
  ranks[7] = -1;
  assert_int_equal(mpu_mesh_create(2, shape, NULL, ranks, &m), MPU_ERR_INVALID_ARGUMENT);
  assert_null(m);

  const char *names[] = {"dp", "tp"};
  m = make(2, shape, names, NULL);
  int d, g[8];
  int64_t n, c[2] = {1, 4};
  assert_int_equal(mpu_mesh_dim_index(m, "pp", &d), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "no dim named 'pp'"));
  assert_int_equal(mpu_mesh_dim_size(m, 2, &n), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "dim 2"));
  assert_int_equal(mpu_mesh_rank_at(m, c, &d), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "coordinate 4 along dim 1 ('tp')"));
  int two[2] = {1, 1}, out_of_range = 5;
  assert_int_equal(mpu_mesh_group(m, 0, two, 2, g, 8, &n), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_mesh_group(m, 0, &out_of_range, 1, g, 8, &n), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_mesh_group(m, 8, two, 1, g, 8, &n), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "rank 8 is not in the mesh"));
  assert_int_equal(mpu_mesh_group(m, 0, two, 1, g, 3, &n), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(n, 4); /* the size is reported even when out is short */
  assert_int_equal(mpu_mesh_groups(m, two, 1, g, 7, NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
  mpu_mesh *s = NULL;
  const char *unknown[] = {"ep"};
  assert_int_equal(mpu_mesh_slice_names(m, 0, unknown, 1, &s), MPU_ERR_INVALID_ARGUMENT);
  int both[2] = {0, 1};
  assert_int_equal(mpu_mesh_flatten(m, both, 2, "tp", &s), MPU_SUCCESS); /* replaces tp: fine */
  mpu_mesh_free(s);
  s = NULL;
  int one = 0;
  assert_int_equal(mpu_mesh_flatten(m, &one, 1, "tp", &s), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "'tp' is used twice"));
  int64_t parts[2] = {3, 1};
  assert_int_equal(mpu_mesh_reshape_dim(m, 1, 2, parts, NULL, &s), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "multiply to 3"));
  assert_null(s);
  mpu_mesh_free(m);
  mpu_mesh_free(NULL);
  assert_int_equal(mpu_mesh_ndim(NULL), 0);
}

/* A million ranks: O(dims) memory, answers without tables. */
static void test_million(void **state) {
  (void)state;
  int64_t shape[] = {64, 128, 128};
  const char *names[] = {"pp", "dp", "tp"};
  mpu_mesh *m = make(3, shape, names, NULL);
  assert_true(mpu_mesh_memory(m) < 4096);
  int64_t c[3];
  assert_int_equal(mpu_mesh_coords(m, 999999, c), MPU_SUCCESS);
  assert_int_equal(c[0], 999999 / 16384);
  assert_int_equal(c[1], (999999 / 128) % 128);
  assert_int_equal(c[2], 999999 % 128);
  int g[128], dp = 1;
  int64_t n;
  assert_int_equal(mpu_mesh_group(m, 999999, &dp, 1, g, 128, &n), MPU_SUCCESS);
  for (int i = 0; i < 128; i++) assert_int_equal(g[i], (int)(c[0] * 16384 + i * 128 + c[2]));
  mpu_mesh_free(m);
}

/* ---- device meshes on thread ranks ---------------------------------------------- */

typedef struct dm_case {
  int lazy;
  char message[8][512];
} dm_case;

#define RANK_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      snprintf(t->message[rank], sizeof t->message[rank], __VA_ARGS__);              \
      res = MPU_ERR_INTERNAL;                                                        \
      goto out;                                                                      \
    }                                                                                \
  } while (0)
#define RANK_OK(call)                                                                \
  do {                                                                               \
    mpu_result_t r_ = (call);                                                        \
    RANK_CHECK(r_ == MPU_SUCCESS, "%s: %s: %s", #call, mpu_result_name(r_), mpu_last_error()); \
  } while (0)

/* sum over comm of world ranks, against the mesh's own list of the group */
static mpu_result_t sum_matches(mpu_comm *c, const mpu_mesh *m, int rank, const int *dims,
                                int nd) {
  int g[64];
  int64_t n, want = 0, x = rank, got = 0;
  mpu_result_t r = mpu_mesh_group(m, rank, dims, nd, g, 64, &n);
  if (r) return r;
  for (int i = 0; i < n; i++) want += g[i];
  int size;
  mpu_comm_size(c, &size);
  if (size != n) return MPU_ERR_INTERNAL;
  r = mpu_comm_all_reduce(c, &x, &got, 1, MPU_INT64, MPU_SUM);
  if (r) return r;
  return got == want ? MPU_SUCCESS : MPU_ERR_INTERNAL;
}

static mpu_result_t device_mesh_rank(mpu_comm *world, void *arg) {
  dm_case *t = arg;
  int rank;
  mpu_comm_rank(world, &rank);
  mpu_result_t res = MPU_SUCCESS;
  mpu_device_mesh *dm = NULL, *wrapped = NULL;
  mpu_mesh *flat = NULL;
  const char *names[] = {"dp", "cp", "tp"};
  int64_t shape[] = {2, 2, 2};
  RANK_OK(mpu_device_mesh_init(world, 3, shape, names, t->lazy ? MPU_MESH_LAZY : MPU_MESH_EAGER,
                               &dm));
  const mpu_mesh *m = mpu_device_mesh_mesh(dm);
  for (int d = 0; d < 3; d++) {
    mpu_comm *c;
    RANK_OK(mpu_device_mesh_comm(dm, d, &c));
    RANK_OK(sum_matches(c, m, rank, &d, 1));
    mpu_comm *again;
    RANK_OK(mpu_device_mesh_comm_by_name(dm, names[d], &again));
    RANK_CHECK(again == c, "dim %d: asking twice gave two communicators", d);
  }
  /* the flattened dp_cp dim, and the same group asked as two dims */
  int dpcp[2] = {0, 1}, fdim;
  RANK_OK(mpu_mesh_flatten(m, dpcp, 2, "dp_cp", &flat));
  RANK_OK(mpu_mesh_dim_index(flat, "dp_cp", &fdim));
  mpu_comm *fc, *fc2;
  RANK_OK(mpu_device_mesh_group_comm(dm, flat, &fdim, 1, &fc));
  RANK_OK(sum_matches(fc, flat, rank, &fdim, 1));
  RANK_OK(mpu_device_mesh_group_comm(dm, NULL, dpcp, 2, &fc2));
  RANK_CHECK(fc == fc2, "dp_cp and (dp, cp) are one group but gave two communicators");

  /* wrap the dim communicators as a new device mesh (from_group) */
  mpu_comm *dims[3];
  for (int d = 0; d < 3; d++) RANK_OK(mpu_device_mesh_comm(dm, d, &dims[d]));
  RANK_OK(mpu_device_mesh_from_comms(world, 3, dims, names, &wrapped));
  int64_t c1[3], c2[3];
  RANK_OK(mpu_mesh_coords(mpu_device_mesh_mesh(wrapped), rank, c1));
  RANK_OK(mpu_mesh_coords(m, rank, c2));
  RANK_CHECK(!memcmp(c1, c2, sizeof c1), "wrapped mesh puts rank %d elsewhere", rank);
  mpu_comm *wc;
  RANK_OK(mpu_device_mesh_comm(wrapped, 2, &wc));
  RANK_CHECK(wc == dims[2], "the wrapped mesh made a new communicator instead of using the given one");
  /* communicators that do not form a mesh are refused on every rank */
  mpu_comm *wrong[2] = {dims[0], dims[0]};
  mpu_device_mesh *bad = NULL;
  mpu_result_t r = mpu_device_mesh_from_comms(world, 2, wrong, NULL, &bad);
  RANK_CHECK(r == MPU_ERR_INVALID_ARGUMENT && !bad, "wrong comms gave %s", mpu_result_name(r));
  /* a shape that is not the world */
  int64_t wrong_shape[] = {3, 3};
  r = mpu_device_mesh_init(world, 2, wrong_shape, NULL, MPU_MESH_EAGER, &bad);
  RANK_CHECK(r == MPU_ERR_INVALID_ARGUMENT && strstr(mpu_last_error(), "has 9 ranks but the communicator has 8"),
             "wrong shape: %s", mpu_last_error());
out:
  mpu_mesh_free(flat);
  mpu_device_mesh_free(wrapped);
  mpu_device_mesh_free(dm);
  return res;
}

static void test_device_mesh(void **state) {
  (void)state;
  static dm_case t;
  for (int lazy = 0; lazy <= 1; lazy++) {
    memset(&t, 0, sizeof t);
    t.lazy = lazy;
    mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
    o.check_calls = 1;
    o.timeout_s = 60;
    mpu_result_t r = mpu_launch(8, device_mesh_rank, &t, NULL, &o);
    if (r) {
      for (int k = 0; k < 8; k++)
        if (t.message[k][0]) print_error("rank %d: %s\n", k, t.message[k]);
      fail_msg("%s mesh: %s: %s", lazy ? "lazy" : "eager", mpu_result_name(r), mpu_last_error());
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roots),      cmocka_unit_test(test_tutorial_2d),
      cmocka_unit_test(test_slices),     cmocka_unit_test(test_flatten_reshape),
      cmocka_unit_test(test_errors),     cmocka_unit_test(test_million),
      cmocka_unit_test(test_device_mesh),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
