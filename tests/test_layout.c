/*
 * test_layout.c - Megatron's groups and getters, against:
 *   - the worked examples of Megatron-DeepSpeed's sources and values derived by hand;
 *   - a brute force that follows the original Python line by line (the loops
 *     of Megatron-DeepSpeed's initialize_model_parallel, and core_v0.8.0's
 *     RankGenerator with generate_masked_orthogonal_rank_groups), building
 *     every group of the world and answering each getter from those lists;
 *   - every invalid config, with the original's message, first check first.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"

/* ---- a list of groups (brute force) -------------------------------------------- */

#define MAXG 4096
typedef struct glist {
  int n;
  int size[MAXG];
  int *members[MAXG];
} glist;

static void add(glist *g, const int *m, int n) {
  assert_true(g->n < MAXG);
  g->members[g->n] = malloc((size_t)(n ? n : 1) * sizeof(int));
  memcpy(g->members[g->n], m, (size_t)n * sizeof(int));
  g->size[g->n++] = n;
}

static void clear(glist *g) {
  for (int i = 0; i < g->n; i++) free(g->members[i]);
  g->n = 0;
}

static int find(const glist *g, int rank, int *pos) {
  for (int i = 0; i < g->n; i++)
    for (int j = 0; j < g->size[i]; j++)
      if (g->members[i][j] == rank) {
        if (pos) *pos = j;
        return i;
      }
  return -1;
}

typedef struct brute {
  glist k[MPU_GROUP_KIND_COUNT];
} brute;

static void brute_free(brute *b) {
  for (int i = 0; i < MPU_GROUP_KIND_COUNT; i++) clear(&b->k[i]);
}

/* embedding and position embedding lists of a pipeline, as the original */
static void embeddings(brute *b, const int *ranks, int n, int split) {
  int e[3], ne, p[2], np;
  if (n > 1) {
    e[0] = ranks[0], e[1] = ranks[n - 1], ne = 2;
    p[0] = ranks[0], np = 1;
    if (split >= 0) {
      int s = ranks[split];
      int in_e = 0, in_p = 0;
      for (int i = 0; i < ne; i++) in_e |= e[i] == s;
      for (int i = 0; i < np; i++) in_p |= p[i] == s;
      if (!in_e) e[0] = ranks[0], e[1] = s, e[2] = ranks[n - 1], ne = 3;
      if (!in_p) p[0] = ranks[0], p[1] = s, np = 2;
    }
  } else {
    e[0] = p[0] = ranks[0];
    ne = np = 1;
  }
  add(&b->k[MPU_GROUP_EMBEDDING], e, ne);
  add(&b->k[MPU_GROUP_POSITION_EMBEDDING], p, np);
}

/* Megatron-DeepSpeed (parallel_state.py), loop for loop. */
static void brute_deepspeed(brute *b, int W, int tp, int pp, int sp, int split, int fp8) {
  memset(b, 0, sizeof *b);
  int dp = W / (tp * pp * sp), sdp = sp * dp, r[MAXG], n;
  int num_tp = W / tp, num_pp = W / pp, num_sp = W / sp, num_sdp = W / sp / dp;
  for (int i = 0; i < pp; i++) {
    int start = i * num_pp, end = (i + 1) * num_pp, k = sp > 1 ? sp : tp;
    for (int j = 0; j < k; j++) {
      n = 0;
      for (int x = start + j; x < end; x += k) r[n++] = x;
      add(&b->k[MPU_GROUP_DP], r, n);
    }
  }
  for (int i = 0; i < num_sp; i++) {
    n = 0;
    for (int x = i * sp; x < (i + 1) * sp; x++) r[n++] = x;
    add(&b->k[MPU_GROUP_SP], r, n);
  }
  if (sp > 1)
    for (int i = 0; i < num_sdp; i++) {
      n = 0;
      for (int x = i * sdp; x < (i + 1) * sdp; x++) r[n++] = x;
      add(&b->k[MPU_GROUP_SDP], r, n);
    }
  else
    for (int i = 0; i < b->k[MPU_GROUP_DP].n; i++)
      add(&b->k[MPU_GROUP_SDP], b->k[MPU_GROUP_DP].members[i], b->k[MPU_GROUP_DP].size[i]);
  const glist *src = sp > 1 ? &b->k[MPU_GROUP_SDP] : &b->k[MPU_GROUP_DP];
  int num_mp = sp > 1 ? sdp : dp;
  for (int i = 0; i < num_mp; i++) {
    n = 0;
    for (int g = 0; g < src->n; g++) r[n++] = src->members[g][i];
    add(&b->k[MPU_GROUP_MP], r, n);
  }
  for (int i = 0; i < num_tp; i++) {
    n = 0;
    for (int x = i * tp; x < (i + 1) * tp; x++) r[n++] = x;
    add(&b->k[MPU_GROUP_TP], r, n);
  }
  for (int i = 0; i < num_pp; i++) {
    n = 0;
    for (int x = i; x < W; x += num_pp) r[n++] = x;
    add(&b->k[MPU_GROUP_PP], r, n);
    embeddings(b, r, n, split);
  }
  if (fp8) {
    int size = tp * dp;
    for (int i = 0; i < W / size; i++) {
      n = 0;
      for (int x = i * size; x < (i + 1) * size; x++) r[n++] = x;
      add(&b->k[MPU_GROUP_AMAX], r, n);
    }
  }
}

/* core_v0.8.0: generate_masked_orthogonal_rank_groups, as written */
static void masked_groups(glist *out, int W, const int *psize, int nsz, const int *mask) {
  int masked[8], unmasked[8], mstride[8], ustride[8], nm = 0, nu = 0, stride = 1;
  for (int i = 0; i < nsz; i++) { /* global stride: prefix product */
    if (mask[i]) masked[nm] = psize[i], mstride[nm++] = stride;
    else unmasked[nu] = psize[i], ustride[nu++] = stride;
    stride *= psize[i];
  }
  int gsize = 1;
  for (int i = 0; i < nm; i++) gsize *= masked[i];
  int r[MAXG];
  for (int g = 0; g < W / gsize; g++) {
    int base = 0, d = 1;
    for (int i = 0; i < nu; i++) { /* decompose(group_index, unmasked_shape) */
      base += ((g / d) % unmasked[i]) * ustride[i];
      d *= unmasked[i];
    }
    for (int k = 0; k < gsize; k++) {
      int off = 0, e = 1;
      for (int i = 0; i < nm; i++) {
        off += ((k / e) % masked[i]) * mstride[i];
        e *= masked[i];
      }
      r[k] = base + off;
    }
    add(out, r, gsize);
  }
}

static void get_ranks(glist *out, int W, const char *order, const int *sizes_by_tok,
                      const char *token, int independent_ep) {
  /* order already complete ("tp-cp-ep-dp-pp" style); sizes_by_tok: tp pp dp ep cp */
  static const char *const names[5] = {"tp", "pp", "dp", "ep", "cp"};
  char buf[64], *save = NULL;
  snprintf(buf, sizeof buf, "%s", order);
  int psize[8], mask[8], n = 0;
  for (char *t = strtok_r(buf, "-", &save); t; t = strtok_r(NULL, "-", &save)) {
    int k = 0;
    while (strcmp(names[k], t)) k++;
    if (k == 3 && !independent_ep) continue; /* order without ep */
    psize[n] = k == 2 && independent_ep ? sizes_by_tok[2] / sizes_by_tok[3] : sizes_by_tok[k];
    char want[16];
    snprintf(want, sizeof want, "%s", token);
    int m = 0;
    char *s2 = NULL;
    for (char *u = strtok_r(want, "-", &s2); u; u = strtok_r(NULL, "-", &s2)) m |= !strcmp(u, t);
    mask[n++] = m;
  }
  masked_groups(out, W, psize, n, mask);
}

static void brute_core(brute *b, int W, int tp, int pp, int cp, int ep, const char *order_in,
                       int split) {
  memset(b, 0, sizeof *b);
  int dp = W / (tp * pp * cp);
  int sizes[5] = {tp, pp, dp, ep, cp};
  static const char *const names[5] = {"tp", "pp", "dp", "ep", "cp"};
  char order[64];
  snprintf(order, sizeof order, "%s", order_in);
  for (int k = 0; k < 5; k++) /* append missing tokens, as the RankGenerator does */
    if (!strstr(order, names[k])) {
      strcat(order, "-");
      strcat(order, names[k]);
    }
  get_ranks(&b->k[MPU_GROUP_DP], W, order, sizes, "dp", 0);
  get_ranks(&b->k[MPU_GROUP_DP_CP], W, order, sizes, "dp-cp", 0);
  get_ranks(&b->k[MPU_GROUP_CP], W, order, sizes, "cp", 0);
  get_ranks(&b->k[MPU_GROUP_MP], W, order, sizes, "tp-pp", 0);
  get_ranks(&b->k[MPU_GROUP_TP_EP_PP], W, order, sizes, "tp-ep-pp", 1);
  get_ranks(&b->k[MPU_GROUP_TP], W, order, sizes, "tp", 0);
  get_ranks(&b->k[MPU_GROUP_PP], W, order, sizes, "pp", 0);
  for (int i = 0; i < b->k[MPU_GROUP_PP].n; i++)
    embeddings(b, b->k[MPU_GROUP_PP].members[i], b->k[MPU_GROUP_PP].size[i], split);
  get_ranks(&b->k[MPU_GROUP_TP_DP_CP], W, order, sizes, "tp-dp-cp", 0);
  get_ranks(&b->k[MPU_GROUP_TP_DP], W, order, sizes, "tp-dp", 0);
  get_ranks(&b->k[MPU_GROUP_TP_CP], W, order, sizes, "tp-cp", 0);
  get_ranks(&b->k[MPU_GROUP_TP_EP], W, order, sizes, "tp-ep", 1);
  get_ranks(&b->k[MPU_GROUP_EP], W, order, sizes, "ep", 1);
  get_ranks(&b->k[MPU_GROUP_DP_MODULO_EP], W, order, sizes, "dp", 1);
  get_ranks(&b->k[MPU_GROUP_DP_CP_MODULO_EP], W, order, sizes, "dp-cp", 1);
}

/* ---- comparing --------------------------------------------------------------------- */

static void compare(const mpu_layout *l, brute *b) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  int W = c->world_size, out[MAXG], n, count;
  for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++) {
    if (!mpu_layout_has(l, (mpu_group_kind)k)) {
      assert_int_equal(b->k[k].n, 0);
      continue;
    }
    assert_int_equal(mpu_layout_num_groups(l, (mpu_group_kind)k, &count), MPU_SUCCESS);
    if (count != b->k[k].n)
      fail_msg("%s: %d groups, the original makes %d", mpu_group_kind_name(c->flavor, k), count,
               b->k[k].n);
    for (int g = 0; g < count; g++) {
      assert_int_equal(mpu_layout_group_at(l, (mpu_group_kind)k, g, out, MAXG, &n), MPU_SUCCESS);
      assert_int_equal(n, b->k[k].size[g]);
      assert_memory_equal(out, b->k[k].members[g], (size_t)n * sizeof(int));
    }
    for (int r = 0; r < W; r++) {
      assert_int_equal(mpu_layout_group(l, (mpu_group_kind)k, r, out, MAXG, &n), MPU_SUCCESS);
      int gi = find(&b->k[k], r, NULL);
      if (k == MPU_GROUP_EMBEDDING || k == MPU_GROUP_POSITION_EMBEDDING) {
        /* the rank's group: one of the lists it is in (the last assigned wins in Python;
         * a rank is in at most one here) */
        if (gi < 0) {
          assert_int_equal(n, 0);
          continue;
        }
      }
      assert_true(gi >= 0);
      if (n != b->k[k].size[gi] || memcmp(out, b->k[k].members[gi], (size_t)n * sizeof(int)))
        fail_msg("%s group of rank %d differs", mpu_group_kind_name(c->flavor, k), r);
    }
  }
  /* getters, as the Python getters compute them from these lists */
  for (int r = 0; r < W; r++) {
    mpu_rank_info x = MPU_RANK_INFO_INIT;
    int pos = -1, g;
    assert_int_equal(mpu_layout_rank_info(l, r, &x), MPU_SUCCESS);
    assert_int_equal(x.rank, r);
    g = find(&b->k[MPU_GROUP_TP], r, &pos);
    assert_int_equal(x.tp_rank, pos);
    assert_int_equal(x.tp_size, b->k[MPU_GROUP_TP].size[g]);
    assert_int_equal(x.tp_src, c->flavor == MPU_FLAVOR_DEEPSPEED ? (r / c->tp) * c->tp
                                                                 : b->k[MPU_GROUP_TP].members[g][0]);
    g = find(&b->k[MPU_GROUP_PP], r, &pos);
    const int *pipe = b->k[MPU_GROUP_PP].members[g];
    int ps = b->k[MPU_GROUP_PP].size[g];
    assert_int_equal(x.pp_rank, pos);
    assert_int_equal(x.pp_size, ps);
    assert_int_equal(x.pp_first, pipe[0]);
    assert_int_equal(x.pp_last, pipe[ps - 1]);
    assert_int_equal(x.pp_next, pipe[(pos + 1) % ps]);
    assert_int_equal(x.pp_prev, pipe[((pos - 1) % ps + ps) % ps]);
    /* _EMBEDDING_GLOBAL_RANKS: the lists made for this rank's pipeline */
    const int *emb = b->k[MPU_GROUP_EMBEDDING].members[g];
    int ne = b->k[MPU_GROUP_EMBEDDING].size[g];
    assert_int_equal(x.n_embedding, ne);
    assert_memory_equal(x.embedding_global_ranks, emb, (size_t)ne * sizeof(int));
    int first = (c->vp == 0 || 0 == 0) && pos == 0;
    int last = (c->vp == 0 || 0 == c->vp - 1) && pos == ps - 1;
    int in_emb = 0;
    for (int i = 0; i < ne; i++)
      if (emb[i] == r) in_emb = r == emb[0] ? first : r == emb[ne - 1] ? last : 1;
    assert_int_equal(x.in_embedding_group, in_emb);
    const int *pe = b->k[MPU_GROUP_POSITION_EMBEDDING].members[g];
    int npe = b->k[MPU_GROUP_POSITION_EMBEDDING].size[g], in_pe = 0;
    assert_int_equal(x.n_position_embedding, npe);
    for (int i = 0; i < npe; i++) in_pe |= pe[i] == r;
    assert_int_equal(x.in_position_embedding_group, in_pe);
    int dg = find(&b->k[MPU_GROUP_DP], r, &pos);
    assert_int_equal(x.dp_src, b->k[MPU_GROUP_DP].members[dg][0]);
    if (c->flavor == MPU_FLAVOR_DEEPSPEED) {
      int sg = find(&b->k[MPU_GROUP_SDP], r, &pos);
      assert_int_equal(x.dp_rank, pos); /* the sdp group answers for dp */
      assert_int_equal(x.dp_size, b->k[MPU_GROUP_SDP].size[sg]);
      assert_int_equal(x.sdp_rank, pos);
      g = find(&b->k[MPU_GROUP_SP], r, &pos);
      assert_int_equal(x.sp_rank, pos);
      assert_int_equal(x.sp_size, c->sp);
      assert_int_equal(x.sp_src, (r / c->sp) * c->sp);
      g = find(&b->k[MPU_GROUP_MP], r, &pos);
      assert_int_equal(x.mp_rank, pos);
      assert_int_equal(x.mp_size, b->k[MPU_GROUP_MP].size[g]);
      int split = c->split_rank, pr = x.pp_rank;
      int before = ps == 1 || split < 0 || pr < split, after = ps == 1 || split < 0 || pr >= split;
      int after_next = ps == 1 || split < 0 || pr + 1 >= split;
      assert_int_equal(x.stage_before_split, before);
      assert_int_equal(x.stage_after_split, after);
      assert_int_equal(x.stage_at_split, before && after_next);
      assert_int_equal(x.is_first_stage, pr == 0);
      assert_int_equal(x.is_last_stage, pr == ps - 1);
    } else {
      assert_int_equal(x.dp_rank, pos);
      assert_int_equal(x.dp_size, b->k[MPU_GROUP_DP].size[dg]);
      g = find(&b->k[MPU_GROUP_DP_CP], r, &pos);
      assert_int_equal(x.dp_cp_rank, pos);
      assert_int_equal(x.dp_cp_src, b->k[MPU_GROUP_DP_CP].members[g][0]);
      g = find(&b->k[MPU_GROUP_CP], r, &pos);
      assert_int_equal(x.cp_rank, pos);
      g = find(&b->k[MPU_GROUP_TP_EP], r, &pos);
      assert_int_equal(x.tp_ep_rank, pos);
      assert_int_equal(x.ep_rank, pos / x.tp_size);
      assert_int_equal(x.ep_size, b->k[MPU_GROUP_TP_EP].size[g] / x.tp_size);
      g = find(&b->k[MPU_GROUP_DP_MODULO_EP], r, &pos);
      assert_int_equal(x.dp_modulo_ep_rank, pos);
      assert_int_equal(x.dp_modulo_ep_size, b->k[MPU_GROUP_DP_MODULO_EP].size[g]);
    }
  }
}

static mpu_layout *make(const mpu_layout_config *c) {
  mpu_layout *l = NULL;
  mpu_result_t r = mpu_layout_create(c, &l);
  if (r) fail_msg("layout: %s", mpu_last_error());
  return l;
}

static mpu_layout_config ds(int W, int tp, int pp, int sp, int vp, int split, int fp8) {
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  c.flavor = MPU_FLAVOR_DEEPSPEED;
  c.world_size = W, c.tp = tp, c.pp = pp, c.sp = sp, c.vp = vp, c.split_rank = split, c.fp8 = fp8;
  return c;
}

static mpu_layout_config core(int W, int tp, int pp, int cp, int ep, const char *order, int vp,
                              int split) {
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  c.world_size = W, c.tp = tp, c.pp = pp, c.cp = cp, c.ep = ep, c.vp = vp, c.split_rank = split;
  snprintf(c.order, sizeof c.order, "%s", order ? order : "");
  return c;
}

/* ---- tests ------------------------------------------------------------------------ */

static void test_brute_deepspeed(void **state) {
  (void)state;
  static const int cfgs[][7] = {
      /* W, tp, pp, sp, vp, split, fp8 */
      {8, 2, 2, 1, 0, -1, 0},  {16, 2, 4, 1, 2, -1, 0}, {16, 1, 1, 4, 0, -1, 1},
      {12, 3, 2, 1, 0, 1, 1},  {24, 2, 3, 1, 2, 1, 0},  {32, 4, 4, 1, 0, 2, 1},
      {8, 1, 8, 1, 4, 3, 0},   {6, 1, 1, 3, 0, -1, 1},  {1, 1, 1, 1, 0, -1, 1},
      {64, 4, 4, 1, 0, 0, 1},  {16, 2, 4, 1, 0, 3, 0},  {8, 8, 1, 1, 0, -1, 1},
  };
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
    const int *v = cfgs[i];
    mpu_layout_config c = ds(v[0], v[1], v[2], v[3], v[4], v[5], v[6]);
    mpu_layout *l = make(&c);
    static brute b;
    brute_deepspeed(&b, v[0], v[1], v[2], v[3], v[5], v[6]);
    compare(l, &b);
    brute_free(&b);
    mpu_layout_free(l);
  }
}

static void test_brute_core(void **state) {
  (void)state;
  static const struct {
    int W, tp, pp, cp, ep;
    const char *order;
    int vp, split;
  } cfgs[] = {
      {8, 2, 2, 1, 1, NULL, 0, -1},          {16, 2, 2, 2, 2, NULL, 0, -1},
      {32, 2, 2, 1, 4, "tp-ep-dp-pp", 0, 1}, {24, 2, 3, 2, 1, NULL, 2, 1},
      {16, 2, 2, 1, 1, "tp-pp-dp", 0, -1},   {16, 2, 2, 1, 2, "tp-dp-ep-pp", 0, -1},
      {64, 4, 4, 1, 1, NULL, 2, 2},          {48, 2, 2, 3, 2, "pp-dp-ep-cp-tp", 0, 0},
      {1, 1, 1, 1, 1, NULL, 0, -1},          {36, 3, 2, 2, 3, "cp-tp-ep-dp-pp", 0, -1},
  };
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
    mpu_layout_config c = core(cfgs[i].W, cfgs[i].tp, cfgs[i].pp, cfgs[i].cp, cfgs[i].ep,
                               cfgs[i].order, cfgs[i].vp, cfgs[i].split);
    mpu_layout *l = make(&c);
    static brute b;
    brute_core(&b, cfgs[i].W, cfgs[i].tp, cfgs[i].pp, cfgs[i].cp, cfgs[i].ep,
               cfgs[i].order ? cfgs[i].order : "tp-cp-ep-dp-pp", cfgs[i].split);
    compare(l, &b);
    brute_free(&b);
    mpu_layout_free(l);
  }
}

static void expect_groups(const mpu_layout *l, mpu_group_kind k, const int *want, int ngroups,
                          int size) {
  int count, out[64], n;
  assert_int_equal(mpu_layout_num_groups(l, k, &count), MPU_SUCCESS);
  assert_int_equal(count, ngroups);
  for (int g = 0; g < ngroups; g++) {
    assert_int_equal(mpu_layout_group_at(l, k, g, out, 64, &n), MPU_SUCCESS);
    assert_int_equal(n, size);
    assert_memory_equal(out, want + g * size, (size_t)size * sizeof(int));
  }
}

/* The docstring's 16 GPUs with tp=2, pp=4 (parallel_state.py), and the mpu/mappings.py walkthrough's 8 with tp=2, pp=2. */
static void test_seed_examples(void **state) {
  (void)state;
  for (int flavor = 0; flavor < 2; flavor++) {
    mpu_layout_config c = flavor ? core(16, 2, 4, 1, 1, NULL, 0, -1) : ds(16, 2, 4, 1, 0, -1, 0);
    mpu_layout *l = make(&c);
    static const int dp[] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    static const int tp[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    static const int pp[] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    expect_groups(l, MPU_GROUP_DP, dp, 8, 2);
    expect_groups(l, MPU_GROUP_TP, tp, 8, 2);
    expect_groups(l, MPU_GROUP_PP, pp, 4, 4);
    mpu_layout_free(l);
  }
  mpu_layout_config c = ds(8, 2, 2, 1, 0, -1, 0);
  mpu_layout *l = make(&c);
  static const int tp[] = {0, 1, 2, 3, 4, 5, 6, 7}, pp[] = {0, 4, 1, 5, 2, 6, 3, 7};
  static const int dp[] = {0, 2, 1, 3, 4, 6, 5, 7};
  expect_groups(l, MPU_GROUP_TP, tp, 4, 2);
  expect_groups(l, MPU_GROUP_PP, pp, 4, 2);
  expect_groups(l, MPU_GROUP_DP, dp, 4, 2);
  /* rank 6 in the mpu/mappings.py walkthrough: tp group [6, 7] (its _reduce of [6] and [7] gives 13), pp rank 1 */
  mpu_rank_info x = MPU_RANK_INFO_INIT;
  assert_int_equal(mpu_layout_rank_info(l, 6, &x), MPU_SUCCESS);
  assert_int_equal(x.tp_rank, 0);
  assert_int_equal(x.tp_src, 6);
  assert_int_equal(x.pp_rank, 1);
  assert_int_equal(x.pp_first, 2);
  assert_int_equal(x.pp_next, 2);
  assert_true(x.is_last_stage);
  assert_true(x.in_embedding_group);
  assert_false(x.in_position_embedding_group);
  mpu_layout_free(l);
}

/* Values worked out by hand from the algorithms. */
static void test_by_hand(void **state) {
  (void)state;
  int out[64], n;
  /* core, W=16, tp=2 cp=2 ep=2 pp=2 (dp 2): order tp-cp-ep-dp-pp, strides tp 1, cp 2,
   * dp 4, pp 8; with ep apart: ep stride 4 and dp/ep = 1 */
  mpu_layout_config c = core(16, 2, 2, 2, 2, NULL, 0, -1);
  mpu_layout *l = make(&c);
  static const int dp_of_5[] = {1, 5}, dpcp_of_5[] = {1, 3, 5, 7}, tpep_of_5[] = {0, 1, 4, 5};
  static const int ep_of_5[] = {1, 5}, pp_of_5[] = {5, 13}, mp_of_5[] = {4, 5, 12, 13};
  assert_int_equal(mpu_layout_group(l, MPU_GROUP_DP, 5, out, 64, &n), 0);
  assert_memory_equal(out, dp_of_5, sizeof dp_of_5);
  assert_int_equal(mpu_layout_group(l, MPU_GROUP_DP_CP, 5, out, 64, &n), 0);
  assert_memory_equal(out, dpcp_of_5, sizeof dpcp_of_5);
  assert_int_equal(mpu_layout_group(l, MPU_GROUP_TP_EP, 5, out, 64, &n), 0);
  assert_memory_equal(out, tpep_of_5, sizeof tpep_of_5);
  assert_int_equal(mpu_layout_group(l, MPU_GROUP_EP, 5, out, 64, &n), 0);
  assert_memory_equal(out, ep_of_5, sizeof ep_of_5);
  assert_int_equal(mpu_layout_group(l, MPU_GROUP_DP_MODULO_EP, 5, out, 64, &n), 0);
  assert_int_equal(n, 1); /* dp/ep = 1 */
  assert_int_equal(mpu_layout_group(l, MPU_GROUP_PP, 5, out, 64, &n), 0);
  assert_memory_equal(out, pp_of_5, sizeof pp_of_5);
  assert_int_equal(mpu_layout_group(l, MPU_GROUP_MP, 5, out, 64, &n), 0);
  assert_memory_equal(out, mp_of_5, sizeof mp_of_5);
  mpu_rank_info x = MPU_RANK_INFO_INIT;
  assert_int_equal(mpu_layout_rank_info(l, 5, &x), 0);
  assert_int_equal(x.ep_rank, 1); /* tp_ep rank 3 // tp 2 */
  assert_int_equal(x.ep_size, 2);
  mpu_layout_free(l);

  /* core with order tp-pp-dp, W=8 tp=2 pp=2: pp stride 2, dp stride 4 */
  c = core(8, 2, 2, 1, 1, "tp-pp-dp", 0, -1);
  l = make(&c);
  static const int pp[] = {0, 2, 1, 3, 4, 6, 5, 7}, dp[] = {0, 4, 1, 5, 2, 6, 3, 7};
  expect_groups(l, MPU_GROUP_PP, pp, 4, 2);
  expect_groups(l, MPU_GROUP_DP, dp, 4, 2);
  mpu_layout_free(l);

  /* deepspeed split rank: pp=4, split 2: pipeline [1, 5, 9, 13] has embedding
   * [1, 9, 13] and position embedding [1, 9]; stage 1 is at the split */
  c = ds(16, 1, 4, 1, 0, 2, 0);
  l = make(&c);
  assert_int_equal(mpu_layout_rank_info(l, 5, &x), 0);
  static const int emb[] = {1, 9, 13}, pos[] = {1, 9};
  assert_int_equal(x.n_embedding, 3);
  assert_memory_equal(x.embedding_global_ranks, emb, sizeof emb);
  assert_int_equal(x.n_position_embedding, 2);
  assert_memory_equal(x.position_embedding_global_ranks, pos, sizeof pos);
  assert_false(x.in_embedding_group);
  assert_true(x.stage_before_split && !x.stage_after_split && x.stage_at_split);
  assert_int_equal(mpu_layout_rank_info(l, 9, &x), 0);
  assert_true(x.in_embedding_group && x.in_position_embedding_group);
  assert_true(!x.stage_before_split && x.stage_after_split && !x.stage_at_split);
  mpu_layout_free(l);

  /* virtual stages: the last stage is not in the embedding group at virtual rank 0 */
  c = ds(4, 1, 4, 1, 2, -1, 0);
  l = make(&c);
  assert_int_equal(mpu_layout_rank_info(l, 3, &x), 0);
  assert_int_equal(x.vp_rank, 0);
  assert_int_equal(x.vp_size, 2);
  assert_false(x.in_embedding_group);
  assert_true(x.is_last_stage);
  assert_int_equal(mpu_layout_rank_info(l, 0, &x), 0);
  assert_true(x.in_embedding_group);
  mpu_layout_free(l);

  /* DeepSpeed-Ulysses: sp=4 of 16: sp groups are blocks of 4; dp groups stride 4;
   * sdp is the whole world and answers for dp; the model group is the rank alone */
  c = ds(16, 1, 1, 4, 0, -1, 1);
  l = make(&c);
  assert_int_equal(mpu_layout_rank_info(l, 6, &x), 0);
  assert_int_equal(x.sp_rank, 2);
  assert_int_equal(x.sp_src, 4);
  assert_int_equal(x.dp_size, 16);
  assert_int_equal(x.dp_rank, 6);
  assert_int_equal(x.dp_src, 2); /* _DATA_PARALLEL_GLOBAL_RANKS[0] of [2, 6, 10, 14] */
  assert_int_equal(x.mp_size, 1);
  assert_int_equal(mpu_layout_group(l, MPU_GROUP_AMAX, 6, out, 64, &n), 0);
  assert_int_equal(n, 4); /* tp * dp = 4 consecutive ranks */
  assert_int_equal(out[0], 4);
  mpu_layout_free(l);
}

static void expect_refused(mpu_layout_config c, const char *message) {
  mpu_layout *l = NULL;
  assert_int_equal(mpu_layout_create(&c, &l), MPU_ERR_INVALID_ARGUMENT);
  assert_null(l);
  if (!strstr(mpu_last_error(), message))
    fail_msg("message '%s' does not contain '%s'", mpu_last_error(), message);
}

static void test_invalid(void **state) {
  (void)state;
  expect_refused(ds(10, 4, 1, 1, 0, -1, 0),
                 "world_size (10) is not divisible by tensor_model_parallel_size (4) x "
                 "pipeline_model_parallel_size (1)");
  expect_refused(ds(8, 2, 1, 2, 0, -1, 0),
                 "DeepSpeed's sequence parallel does not work with tensor parallel or pipeline "
                 "parallel");
  expect_refused(ds(10, 1, 1, 4, 0, -1, 0),
                 "world_size (10) is not divisible by sequence_parallel_size 4)");
  expect_refused(ds(8, 1, 2, 1, 2, -1, 0),
                 "pipeline-model-parallel size should be greater than 2 with interleaved schedule");
  /* the first failing check wins: not divisible and vp both wrong */
  expect_refused(ds(9, 2, 2, 1, 2, -1, 0), "world_size (9) is not divisible");
  expect_refused(ds(8, 1, 4, 1, 0, 4, 0), "pipeline_model_parallel_split_rank (4)");
  expect_refused(ds(0, 1, 1, 1, 0, -1, 0), "world_size (0) must be at least 1");
  expect_refused(ds(8, 0, 1, 1, 0, -1, 0), "tensor_model_parallel_size (0) must be at least 1");
  mpu_layout_config c = ds(8, 1, 1, 1, 0, -1, 0);
  c.cp = 2;
  expect_refused(c, "the deepspeed flavor has no context");

  expect_refused(core(12, 2, 2, 2, 1, NULL, 0, -1),
                 "world_size (12) is not divisible by tensor_model_parallel_size (2) x "
                 "pipeline_model_parallel_size (2) x context_parallel_size (2)");
  expect_refused(core(12, 2, 1, 1, 4, NULL, 0, -1),
                 "data_parallel_size (6) is not divisible by expert_model_parallel_size (4)");
  expect_refused(core(8, 2, 1, 1, 1, NULL, 2, -1),
                 "pipeline-model-parallel size should be greater than 1 with interleaved schedule");
  expect_refused(core(16, 2, 2, 1, 2, "tp-ep-pp-dp", 0, -1),
                 "The ep and dp must be adjacent in order (tp-ep-pp-dp).");
  expect_refused(core(16, 2, 2, 1, 1, "tp-dp", 0, -1),
                 "The size of (pp) is (2), but you haven't specified the order (tp-dp).");
  expect_refused(core(16, 2, 2, 1, 1, "tp-dp-xp", 0, -1), "unknown token 'xp'");
  /* empty tokens are refused, not skipped */
  expect_refused(core(16, 2, 2, 1, 1, "tp--dp-pp", 0, -1), "empty token");
  expect_refused(core(16, 2, 2, 1, 1, "-tp-dp-pp-", 0, -1), "empty token");
  expect_refused(core(16, 2, 2, 1, 1, "tp-cp-ep-dp-pp-", 0, -1), "empty token");
  /* products past int: refused as Python would (its ints do not overflow), not a SIGFPE */
  expect_refused(core(1 << 30, 65536, 65536, 1, 1, NULL, 0, -1),
                 "world_size (1073741824) is not divisible by tensor_model_parallel_size (65536) "
                 "x pipeline_model_parallel_size (65536) x context_parallel_size (1)");
  expect_refused(ds(1 << 30, 65536, 65536, 1, 0, -1, 0),
                 "world_size (1073741824) is not divisible by tensor_model_parallel_size (65536) "
                 "x pipeline_model_parallel_size (65536)");
  expect_refused(core(INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, 1, NULL, 0, -1),
                 "is not divisible");
  expect_refused(ds(INT32_MAX, 1, 1, 2, 0, -1, 0), "is not divisible by sequence_parallel_size 2)");
  expect_refused(ds(INT32_MAX, INT32_MAX, INT32_MAX, 1, 0, -1, 0), "is not divisible");
  expect_refused(core(16, 2, 2, 1, 1, "tp-dp-tp-pp", 0, -1), "token 'tp' appears twice");
  c = core(8, 1, 1, 1, 1, NULL, 0, -1);
  c.sp = 2;
  expect_refused(c, "the core flavor has no DeepSpeed sequence parallelism");
  c = core(8, 1, 1, 1, 1, NULL, 0, -1);
  c.size = 4;
  expect_refused(c, "MPU_LAYOUT_CONFIG_INIT");
  /* a size of 1 may be left out of the order */
  mpu_layout *l = NULL;
  c = core(8, 2, 1, 1, 1, "tp-dp", 0, -1);
  assert_int_equal(mpu_layout_create(&c, &l), MPU_SUCCESS);
  mpu_layout_free(l);
}

static void test_parse(void **state) {
  (void)state;
  mpu_layout_config c;
  assert_int_equal(mpu_layout_config_parse("flavor=deepspeed world_size=16 tp=2 pp=4 fp8=1", &c),
                   MPU_SUCCESS);
  assert_int_equal(c.flavor, MPU_FLAVOR_DEEPSPEED);
  assert_int_equal(c.world_size, 16);
  assert_int_equal(c.pp, 4);
  assert_int_equal(c.fp8, 1);
  assert_int_equal(mpu_layout_config_parse("world_size=8,order=tp-pp-dp", &c), MPU_SUCCESS);
  assert_string_equal(c.order, "tp-pp-dp");
  assert_int_equal(mpu_layout_config_parse("world_size=8 bogus=1", &c), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_layout_config_parse("world_size=eight", &c), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_layout_config_parse("world_size", &c), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_layout_config_parse("flavor=megatron", &c), MPU_ERR_INVALID_ARGUMENT);
}

/* A million ranks: one rank's answers without enumerating the world. */
static void test_million(void **state) {
  (void)state;
  mpu_layout_config c = core(1 << 20, 8, 16, 2, 4, NULL, 2, 3);
  mpu_layout *l = make(&c);
  mpu_rank_info x = MPU_RANK_INFO_INIT;
  assert_int_equal(mpu_layout_rank_info(l, 999999, &x), MPU_SUCCESS);
  assert_int_equal(x.tp_rank, 999999 % 8);
  assert_int_equal(x.pp_size, 16);
  assert_int_equal(x.pp_rank, 999999 / 65536);
  assert_int_equal(x.dp_size, (1 << 20) / (8 * 16 * 2));
  mpu_layout_free(l);
  mpu_layout_config d = ds(1 << 20, 8, 16, 1, 0, -1, 1);
  l = make(&d);
  assert_int_equal(mpu_layout_rank_info(l, 999999, &x), MPU_SUCCESS);
  assert_int_equal(x.pp_rank, 999999 / 65536);
  mpu_layout_free(l);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_brute_deepspeed), cmocka_unit_test(test_brute_core),
      cmocka_unit_test(test_seed_examples),   cmocka_unit_test(test_by_hand),
      cmocka_unit_test(test_invalid),         cmocka_unit_test(test_parse),
      cmocka_unit_test(test_million),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
