/*
 * layout.c - the groups of Megatron's initialize_model_parallel, computed for
 * one rank at a time.
 *
 * deepspeed: each group kind is a simple arithmetic progression or block of
 * ranks (the loops of the original, solved for "the group containing rank r"
 * and "group number g"). core flavours: a RankGenerator is a mesh whose dims
 * are the order string's tokens reversed (Megatron's first token varies
 * fastest, a mesh's last dim does), so a token set's groups are the mesh's
 * groups along those dims, listed from the slowest token to the fastest.
 * core-0.19 adds groups cut from those: a distributed-optimizer instance's
 * share and the hierarchical context-parallel levels pick positions of a
 * parent group (p = (l * S + s) * U + u, as einops' "(l s u) -> (l u) s"),
 * and an instance's ranks are a box of the expert mesh (a block of expert-dp
 * coordinates). Every core group's members ascend, so a rank's index in the
 * list is the rank torch gives it in the group (new_group sorts its ranks).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/options.h"
#include "state/layout_internal.h"

/* ---- deepspeed: group number g of a kind, and the group number of rank r ---- */

static int ds_count(const mpu_layout *l, mpu_group_kind kind) {
  const mpu_layout_config *c = &l->cfg;
  int W = c->world_size, sdp = c->sp * l->dp;
  switch (kind) {
  case MPU_GROUP_DP: return c->pp * (c->sp > 1 ? c->sp : c->tp);
  case MPU_GROUP_SP: return W / c->sp;
  case MPU_GROUP_SDP: return c->sp > 1 ? W / sdp : c->pp * c->tp;
  case MPU_GROUP_MP: return c->sp > 1 ? sdp : l->dp;
  case MPU_GROUP_TP: return W / c->tp;
  case MPU_GROUP_AMAX: return c->fp8 ? W / (c->tp * l->dp) : 0;
  default: return W / c->pp; /* pp, embedding, position embedding: one per pipeline */
  }
}

static int ds_index(const mpu_layout *l, mpu_group_kind kind, int r) {
  const mpu_layout_config *c = &l->cfg;
  int W = c->world_size, per_stage = W / c->pp, k = c->sp > 1 ? c->sp : c->tp;
  switch (kind) {
  case MPU_GROUP_DP: return (r / per_stage) * k + (r % per_stage) % k;
  case MPU_GROUP_SP: return r / c->sp;
  case MPU_GROUP_SDP: return c->sp > 1 ? r / (c->sp * l->dp) : ds_index(l, MPU_GROUP_DP, r);
  case MPU_GROUP_MP: return c->sp > 1 ? r : (r % per_stage) / c->tp;
  case MPU_GROUP_TP: return r / c->tp;
  case MPU_GROUP_AMAX: return r / (c->tp * l->dp);
  default: return r % per_stage;
  }
}

/* Members of deepspeed group g of kind (not the embedding kinds). */
static int ds_members(const mpu_layout *l, mpu_group_kind kind, int g, int *out) {
  const mpu_layout_config *c = &l->cfg;
  int W = c->world_size, per_stage = W / c->pp, k = c->sp > 1 ? c->sp : c->tp, n = 0;
  switch (kind) {
  case MPU_GROUP_DP: {
    int start = (g / k) * per_stage, j = g % k;
    for (int m = start + j; m < start + per_stage; m += k) out[n++] = m;
    return n;
  }
  case MPU_GROUP_SDP:
    if (c->sp == 1) return ds_members(l, MPU_GROUP_DP, g, out);
    for (int m = 0; m < c->sp * l->dp; m++) out[n++] = g * c->sp * l->dp + m;
    return n;
  case MPU_GROUP_SP:
    for (int m = 0; m < c->sp; m++) out[n++] = g * c->sp + m;
    return n;
  case MPU_GROUP_MP: /* element g of every dp (or sdp) group, in group order */
    if (c->sp > 1) {
      out[0] = g;
      return 1;
    }
    for (int i = 0; i < c->pp; i++)
      for (int j = 0; j < c->tp; j++) out[n++] = i * per_stage + j + g * c->tp;
    return n;
  case MPU_GROUP_TP:
    for (int m = 0; m < c->tp; m++) out[n++] = g * c->tp + m;
    return n;
  case MPU_GROUP_AMAX:
    for (int m = 0; m < c->tp * l->dp; m++) out[n++] = g * c->tp * l->dp + m;
    return n;
  default: /* pp */
    for (int m = g; m < W; m += per_stage) out[n++] = m;
    return n;
  }
}

/* ---- core flavours: what a kind's groups are ---------------------------------- */

/* mesh kinds: the token set and whether the expert mesh (w_ep) holds them */
typedef struct mesh_kind {
  const char *tokens;
  int expert;
} mesh_kind;

static const mesh_kind core_kinds[MPU_GROUP_KIND_COUNT] = {
    [MPU_GROUP_DP] = {"dp", 0},          [MPU_GROUP_TP] = {"tp", 0},
    [MPU_GROUP_PP] = {"pp", 0},          [MPU_GROUP_MP] = {"tp-pp", 0},
    [MPU_GROUP_DP_CP] = {"dp-cp", 0},    [MPU_GROUP_CP] = {"cp", 0},
    [MPU_GROUP_TP_EP_PP] = {"tp-ep-pp", 1}, [MPU_GROUP_TP_DP_CP] = {"tp-dp-cp", 0},
    [MPU_GROUP_TP_DP] = {"tp-dp", 0},    [MPU_GROUP_TP_CP] = {"tp-cp", 0},
    [MPU_GROUP_TP_EP] = {"tp-ep", 1},    [MPU_GROUP_EP] = {"ep", 1},
    [MPU_GROUP_DP_MODULO_EP] = {"dp", 1}, [MPU_GROUP_DP_CP_MODULO_EP] = {"dp-cp", 1},
};

/* core-0.19: the dense generator's token sets and the expert generator's */
static const mesh_kind core19_kinds[MPU_GROUP_KIND_COUNT] = {
    [MPU_GROUP_DP] = {"dp", 0},          [MPU_GROUP_TP] = {"tp", 0},
    [MPU_GROUP_PP] = {"pp", 0},          [MPU_GROUP_MP] = {"tp-pp", 0},
    [MPU_GROUP_DP_CP] = {"dp-cp", 0},    [MPU_GROUP_CP] = {"cp", 0},
    [MPU_GROUP_TP_DP_CP] = {"tp-dp-cp", 0}, [MPU_GROUP_TP_DP] = {"tp-dp", 0},
    [MPU_GROUP_TP_CP] = {"tp-cp", 0},    [MPU_GROUP_EP] = {"ep", 1},
    [MPU_GROUP_ETP] = {"tp", 1},         [MPU_GROUP_TP_EP] = {"tp-ep", 1},
    [MPU_GROUP_TP_EP_PP] = {"tp-ep-pp", 1}, [MPU_GROUP_DP_MODULO_EP] = {"dp", 1},
};

typedef enum { SPEC_MESH, SPEC_SUB, SPEC_BOX, SPEC_EMBEDDING } spec_type;

typedef struct kind_spec {
  spec_type type;
  const mpu_mesh *mesh;  /* MESH, BOX */
  int dims[NTOKENS], nd; /* MESH: the group's dims, slowest first; BOX: dims[0] is blocked */
  mpu_group_kind parent; /* SUB: a MESH kind */
  int L, S, U;           /* SUB: parent position p = (l * S + s) * U + u, s along the group */
  int block;             /* BOX: how many coordinates of dims[0] a group spans */
} kind_spec;

/* A gloo twin has the members of the group it twins. */
static mpu_group_kind twin_of(mpu_group_kind kind) {
  switch (kind) {
  case MPU_GROUP_DP_GLOO: return MPU_GROUP_DP;
  case MPU_GROUP_DP_CP_GLOO: return MPU_GROUP_DP_CP;
  case MPU_GROUP_INTRA_PARTIAL_DP_CP_GLOO: return MPU_GROUP_INTRA_PARTIAL_DP_CP;
  case MPU_GROUP_EDP_GLOO: return MPU_GROUP_DP_MODULO_EP;
  case MPU_GROUP_INTRA_PARTIAL_EDP_GLOO: return MPU_GROUP_INTRA_PARTIAL_EDP;
  default: return kind;
  }
}

static void mesh_spec(const mpu_layout *l, const mesh_kind *mk, kind_spec *sp) {
  int ntok = mk->expert ? l->ntok_w : l->ntok_wo;
  const char(*tok)[3] = mk->expert ? (const char(*)[3])l->tok_w : (const char(*)[3])l->tok_wo;
  sp->type = SPEC_MESH;
  sp->mesh = mk->expert ? l->w_ep : l->wo_ep;
  sp->nd = 0;
  /* masked tokens from the slowest (last in the order) to the fastest: mesh dims ascending */
  for (int p = ntok - 1; p >= 0; p--)
    if (strstr(mk->tokens, tok[p])) sp->dims[sp->nd++] = ntok - 1 - p;
}

/* What kind's groups are, for a core flavour (kind is one the layout has). */
static void spec_of(const mpu_layout *l, mpu_group_kind kind, kind_spec *sp) {
  const mpu_layout_config *c = &l->cfg;
  memset(sp, 0, sizeof *sp);
  kind = twin_of(kind);
  if (kind == MPU_GROUP_EMBEDDING || kind == MPU_GROUP_POSITION_EMBEDDING) {
    sp->type = SPEC_EMBEDDING;
    return;
  }
  if (c->flavor == MPU_FLAVOR_CORE) {
    mesh_spec(l, &core_kinds[kind], sp);
    return;
  }
  int inst = c->dist_opt_instances;
  sp->type = SPEC_SUB;
  sp->L = sp->S = sp->U = 1;
  switch (kind) {
  case MPU_GROUP_INTRA_PARTIAL_DP_CP: /* consecutive shares of the dp_cp group */
    sp->parent = MPU_GROUP_DP_CP, sp->S = l->intra_dp_cp, sp->L = inst;
    return;
  case MPU_GROUP_INTRA_PARTIAL_EDP: /* hierarchical level 0 of [intra, instances] */
    sp->parent = MPU_GROUP_DP_MODULO_EP, sp->S = l->intra_edp, sp->L = inst;
    return;
  case MPU_GROUP_INTER_PARTIAL_EDP: /* level 1: one rank of every share */
    sp->parent = MPU_GROUP_DP_MODULO_EP, sp->U = l->intra_edp, sp->S = inst;
    return;
  case MPU_GROUP_INTRA_DIST_OPT_INSTANCE: { /* intra_edp consecutive etp_ep_pp groups */
    kind_spec dp;
    mesh_spec(l, &core19_kinds[MPU_GROUP_DP_MODULO_EP], &dp);
    sp->type = SPEC_BOX;
    sp->mesh = l->w_ep;
    sp->dims[0] = dp.dims[0];
    sp->nd = 1;
    sp->block = l->intra_edp;
    return;
  }
  default: break;
  }
  if (kind >= MPU_GROUP_HCP_L0 && kind <= MPU_GROUP_HCP_LAST) {
    int level = kind - MPU_GROUP_HCP_L0;
    sp->parent = MPU_GROUP_CP;
    for (int i = 0; i < c->n_hcp; i++) {
      if (i < level) sp->U *= c->hcp[i];
      if (i > level) sp->L *= c->hcp[i];
    }
    sp->S = c->hcp[level];
    return;
  }
  mesh_spec(l, &core19_kinds[kind], sp);
}

static int64_t dim_size(const mpu_mesh *m, int d) {
  int64_t s = 0;
  mpu_mesh_dim_size(m, d, &s);
  return s;
}

/* ---- one group of a core flavour, on grid-local ranks ------------------------------- */

static mpu_result_t mesh_locate(const kind_spec *sp, int r, int *pos, int *size, int *first) {
  int p = 0, n = 1;
  int64_t coords[NTOKENS];
  MPU_CHECK(mpu_mesh_coords(sp->mesh, r, coords));
  for (int i = 0; i < sp->nd; i++) { /* dims run from the slowest token to the fastest */
    int64_t sz = dim_size(sp->mesh, sp->dims[i]);
    p = p * (int)sz + (int)coords[sp->dims[i]];
    n *= (int)sz;
    coords[sp->dims[i]] = 0;
  }
  *pos = p, *size = n;
  return mpu_mesh_rank_at(sp->mesh, coords, first);
}

/* The member at position q of the mesh group through r. */
static mpu_result_t mesh_member_at(const kind_spec *sp, int r, int q, int *out) {
  int64_t coords[NTOKENS];
  MPU_CHECK(mpu_mesh_coords(sp->mesh, r, coords));
  for (int i = sp->nd - 1; i >= 0; i--) {
    int64_t sz = dim_size(sp->mesh, sp->dims[i]);
    coords[sp->dims[i]] = q % sz;
    q = (int)(q / sz);
  }
  return mpu_mesh_rank_at(sp->mesh, coords, out);
}

/* A rank of mesh group number g: the unlisted dims spell g (row-major), the
 * listed ones are 0 (the group's first member). */
static mpu_result_t mesh_group_base(const kind_spec *sp, int g, int *rank) {
  int64_t coords[NTOKENS] = {0};
  for (int d = mpu_mesh_ndim(sp->mesh) - 1; d >= 0; d--) {
    int listed = 0;
    for (int i = 0; i < sp->nd; i++) listed |= sp->dims[i] == d;
    if (listed) continue;
    int64_t s = dim_size(sp->mesh, d);
    coords[d] = g % s;
    g = (int)(g / s);
  }
  return mpu_mesh_rank_at(sp->mesh, coords, rank);
}

/* BOX: a block of `block` coordinates of one dim, every other dim whole */
static void box_bounds(const kind_spec *sp, const int64_t *coords, int64_t *lo, int64_t *hi) {
  int nd = mpu_mesh_ndim(sp->mesh);
  for (int d = 0; d < nd; d++) lo[d] = 0, hi[d] = dim_size(sp->mesh, d);
  int b = sp->dims[0];
  lo[b] = (coords[b] / sp->block) * sp->block;
  hi[b] = lo[b] + sp->block;
}

static int box_size(const kind_spec *sp) {
  int64_t n = sp->block;
  for (int d = 0; d < mpu_mesh_ndim(sp->mesh); d++)
    if (d != sp->dims[0]) n *= dim_size(sp->mesh, d);
  return (int)n;
}

/* Every rank of the box with lower corner lo (row-major: ascending). */
static mpu_result_t box_members(const kind_spec *sp, const int64_t *lo, const int64_t *hi,
                                int *out, int *n) {
  int nd = mpu_mesh_ndim(sp->mesh);
  int64_t c[NTOKENS];
  memcpy(c, lo, (size_t)nd * sizeof *c);
  *n = 0;
  for (;;) {
    MPU_CHECK(mpu_mesh_rank_at(sp->mesh, c, &out[(*n)++]));
    int d = nd - 1;
    while (d >= 0 && ++c[d] == hi[d]) c[d] = lo[d], d--;
    if (d < 0) return MPU_SUCCESS;
  }
}

static mpu_result_t spec_locate(const mpu_layout *l, const kind_spec *sp, int r, int *pos,
                                int *size, int *first) {
  if (sp->type == SPEC_MESH) return mesh_locate(sp, r, pos, size, first);
  if (sp->type == SPEC_SUB) {
    kind_spec parent;
    int p, n, f;
    spec_of(l, sp->parent, &parent);
    MPU_CHECK(mesh_locate(&parent, r, &p, &n, &f));
    int u = p % sp->U, s = (p / sp->U) % sp->S, lv = p / (sp->U * sp->S);
    *pos = s, *size = sp->S;
    return mesh_member_at(&parent, r, (lv * sp->S) * sp->U + u, first);
  }
  /* SPEC_BOX */
  int64_t coords[NTOKENS], lo[NTOKENS], hi[NTOKENS];
  MPU_CHECK(mpu_mesh_coords(sp->mesh, r, coords));
  box_bounds(sp, coords, lo, hi);
  int p = 0;
  for (int d = 0; d < mpu_mesh_ndim(sp->mesh); d++)
    p = p * (int)(hi[d] - lo[d]) + (int)(coords[d] - lo[d]);
  *pos = p, *size = box_size(sp);
  return mpu_mesh_rank_at(sp->mesh, lo, first);
}

static mpu_result_t spec_members(const mpu_layout *l, const kind_spec *sp, int r, int *out,
                                 size_t cap, int *n) {
  if (sp->type == SPEC_MESH) {
    int64_t got;
    MPU_CHECK(mpu_mesh_group(sp->mesh, r, sp->dims, sp->nd, out, cap, &got));
    *n = (int)got;
    return MPU_SUCCESS;
  }
  if (sp->type == SPEC_SUB) {
    kind_spec parent;
    int p, size, f;
    spec_of(l, sp->parent, &parent);
    MPU_CHECK(mesh_locate(&parent, r, &p, &size, &f));
    int u = p % sp->U, lv = p / (sp->U * sp->S);
    for (int s = 0; s < sp->S; s++)
      MPU_CHECK(mesh_member_at(&parent, r, (lv * sp->S + s) * sp->U + u, &out[s]));
    *n = sp->S;
    return MPU_SUCCESS;
  }
  int64_t coords[NTOKENS], lo[NTOKENS], hi[NTOKENS];
  MPU_CHECK(mpu_mesh_coords(sp->mesh, r, coords));
  box_bounds(sp, coords, lo, hi);
  return box_members(sp, lo, hi, out, n);
}

static int spec_max_size(const mpu_layout *l, const kind_spec *sp) {
  if (sp->type == SPEC_SUB) return sp->S;
  if (sp->type == SPEC_BOX) return box_size(sp);
  if (sp->type == SPEC_EMBEDDING) return 3;
  (void)l;
  int64_t n = 1;
  for (int i = 0; i < sp->nd; i++) n *= dim_size(sp->mesh, sp->dims[i]);
  return (int)n;
}

static int spec_count(const mpu_layout *l, const kind_spec *sp) {
  if (sp->type == SPEC_EMBEDDING) return l->grid / l->cfg.pp;
  if (sp->type == SPEC_SUB) {
    kind_spec parent;
    spec_of(l, sp->parent, &parent);
    return spec_count(l, &parent) * sp->L * sp->U;
  }
  return l->grid / spec_max_size(l, sp);
}

/* Group number g in the order the original creates them. */
static mpu_result_t spec_group_at(const mpu_layout *l, const kind_spec *sp, int g, int *out,
                                  size_t cap, int *n) {
  int base;
  if (sp->type == SPEC_MESH) {
    MPU_CHECK(mesh_group_base(sp, g, &base));
    return spec_members(l, sp, base, out, cap, n);
  }
  if (sp->type == SPEC_SUB) { /* per parent group, its (l, u) groups, l slowest */
    kind_spec parent;
    spec_of(l, sp->parent, &parent);
    int per = sp->L * sp->U, w = g % per, lv = w / sp->U, u = w % sp->U;
    MPU_CHECK(mesh_group_base(&parent, g / per, &base));
    for (int s = 0; s < sp->S; s++)
      MPU_CHECK(mesh_member_at(&parent, base, (lv * sp->S + s) * sp->U + u, &out[s]));
    *n = sp->S;
    return MPU_SUCCESS;
  }
  int64_t lo[NTOKENS] = {0}, hi[NTOKENS];
  box_bounds(sp, lo, lo, hi);
  lo[sp->dims[0]] = (int64_t)g * sp->block;
  hi[sp->dims[0]] = lo[sp->dims[0]] + sp->block;
  return box_members(sp, lo, hi, out, n);
}

/* The group of a pipeline's embedding (or position embedding) ranks. */
static int embedding_of(const mpu_layout *l, mpu_group_kind kind, const int *pipe, int n,
                        int *out) {
  int split = l->cfg.split_rank;
  if (n <= 1) {
    for (int i = 0; i < n; i++) out[i] = pipe[i];
    return n;
  }
  if (kind == MPU_GROUP_EMBEDDING) {
    int m = 0;
    out[m++] = pipe[0];
    if (split >= 0 && pipe[split] != pipe[0] && pipe[split] != pipe[n - 1]) out[m++] = pipe[split];
    out[m++] = pipe[n - 1];
    return m;
  }
  out[0] = pipe[0];
  if (split >= 0 && pipe[split] != pipe[0]) {
    out[1] = pipe[split];
    return 2;
  }
  return 1;
}

/* ---- queries --------------------------------------------------------------------- */

static mpu_result_t check_kind(const char *fn, const mpu_layout *l, mpu_group_kind kind) {
  if (!l) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: layout is NULL", fn);
  if (!mpu_layout_has(l, kind))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the %s layout has no %s groups (kind %d)%s",
                      fn, mpu_flavor_name(l->cfg.flavor),
                      mpu_group_kind_name(l->cfg.flavor, kind), (int)kind,
                      kind == MPU_GROUP_AMAX ? " (amax groups need fp8)" : "");
  return MPU_SUCCESS;
}

static mpu_result_t check_rank(const char *fn, const mpu_layout *l, int rank) {
  if (rank < 0 || rank >= l->cfg.world_size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: rank %d is outside 0..%d", fn, rank,
                      l->cfg.world_size - 1);
  return MPU_SUCCESS;
}

/* Is rank in the grid (core-0.19's rank_offset and local_world_size)? */
static int in_grid(const mpu_layout *l, int rank) {
  return rank >= l->offset && rank - l->offset < l->grid;
}

static void shift(int *v, int n, int by) {
  for (int i = 0; i < n; i++) v[i] += by;
}

int mpu_layout_max_group_size(const mpu_layout *l, mpu_group_kind kind) {
  if (!mpu_layout_has(l, kind)) return 0;
  if (kind == MPU_GROUP_EMBEDDING) return 3;
  if (kind == MPU_GROUP_POSITION_EMBEDDING) return 2;
  if (l->cfg.flavor == MPU_FLAVOR_DEEPSPEED) {
    const mpu_layout_config *c = &l->cfg;
    switch (kind) {
    case MPU_GROUP_DP: return l->dp;
    case MPU_GROUP_SP: return c->sp;
    case MPU_GROUP_SDP: return c->sp * l->dp;
    case MPU_GROUP_MP: return c->sp > 1 ? 1 : c->pp * c->tp;
    case MPU_GROUP_TP: return c->tp;
    case MPU_GROUP_AMAX: return c->tp * l->dp;
    default: return c->pp;
    }
  }
  kind_spec sp;
  spec_of(l, kind, &sp);
  return spec_max_size(l, &sp);
}

static mpu_result_t need(const char *fn, int n, size_t cap) {
  if ((size_t)n > cap)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the group has %d ranks, out holds %zu", fn, n,
                      cap);
  return MPU_SUCCESS;
}

/* The pipeline (pp group) containing rank, into pipe, as global ranks (rank
 * must be in the grid). */
static mpu_result_t pipeline_of(const mpu_layout *l, int rank, int *pipe, int *n) {
  if (l->cfg.flavor == MPU_FLAVOR_DEEPSPEED) {
    *n = ds_members(l, MPU_GROUP_PP, ds_index(l, MPU_GROUP_PP, rank), pipe);
    return MPU_SUCCESS;
  }
  kind_spec sp;
  spec_of(l, MPU_GROUP_PP, &sp);
  MPU_CHECK(spec_members(l, &sp, rank - l->offset, pipe, (size_t)l->cfg.pp, n));
  shift(pipe, *n, l->offset);
  return MPU_SUCCESS;
}

mpu_result_t mpu_layout_group(const mpu_layout *l, mpu_group_kind kind, int rank, int *out,
                              size_t cap, int *n) {
  static const char fn[] = "mpu_layout_group";
  MPU_CHECK(check_kind(fn, l, kind));
  if (!out || !n) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL output", fn);
  MPU_CHECK(check_rank(fn, l, rank));
  MPU_CHECK(need(fn, mpu_layout_max_group_size(l, kind), cap));
  *n = 0;
  if (!in_grid(l, rank)) return MPU_SUCCESS; /* a rank outside the grid is in no group */
  if (kind == MPU_GROUP_EMBEDDING || kind == MPU_GROUP_POSITION_EMBEDDING) {
    int *pipe = malloc((size_t)l->cfg.pp * sizeof(int)), np = 0, e[3], ne;
    if (!pipe) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    mpu_result_t r = pipeline_of(l, rank, pipe, &np);
    ne = r ? 0 : embedding_of(l, kind, pipe, np, e);
    free(pipe);
    MPU_CHECK(r);
    for (int i = 0; i < ne; i++)
      if (e[i] == rank) { /* only members have the group */
        memcpy(out, e, (size_t)ne * sizeof(int));
        *n = ne;
      }
    return MPU_SUCCESS;
  }
  if (l->cfg.flavor == MPU_FLAVOR_DEEPSPEED) {
    *n = ds_members(l, kind, ds_index(l, kind, rank), out);
    return MPU_SUCCESS;
  }
  kind_spec sp;
  spec_of(l, kind, &sp);
  MPU_CHECK(spec_members(l, &sp, rank - l->offset, out, cap, n));
  shift(out, *n, l->offset);
  return MPU_SUCCESS;
}

mpu_result_t mpu_layout_num_groups(const mpu_layout *l, mpu_group_kind kind, int *count) {
  MPU_CHECK(check_kind("mpu_layout_num_groups", l, kind));
  if (!count) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_layout_num_groups: NULL");
  if (l->cfg.flavor == MPU_FLAVOR_DEEPSPEED) {
    *count = ds_count(l, kind);
    return MPU_SUCCESS;
  }
  kind_spec sp;
  spec_of(l, kind, &sp);
  *count = spec_count(l, &sp);
  return MPU_SUCCESS;
}

mpu_result_t mpu_layout_group_at(const mpu_layout *l, mpu_group_kind kind, int index, int *out,
                                 size_t cap, int *n) {
  static const char fn[] = "mpu_layout_group_at";
  int count;
  MPU_CHECK(mpu_layout_num_groups(l, kind, &count));
  if (!out || !n) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL output", fn);
  if (index < 0 || index >= count)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: group %d of %d", fn, index, count);
  MPU_CHECK(need(fn, mpu_layout_max_group_size(l, kind), cap));
  if (kind == MPU_GROUP_EMBEDDING || kind == MPU_GROUP_POSITION_EMBEDDING) {
    int *pipe = malloc((size_t)l->cfg.pp * sizeof(int)), np;
    if (!pipe) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    mpu_result_t r = MPU_SUCCESS;
    if (l->cfg.flavor == MPU_FLAVOR_DEEPSPEED) {
      np = ds_members(l, MPU_GROUP_PP, index, pipe);
    } else {
      kind_spec sp;
      spec_of(l, MPU_GROUP_PP, &sp);
      r = spec_group_at(l, &sp, index, pipe, (size_t)l->cfg.pp, &np);
      if (!r) shift(pipe, np, l->offset);
    }
    if (!r) *n = embedding_of(l, kind, pipe, np, out);
    free(pipe);
    return r;
  }
  if (l->cfg.flavor == MPU_FLAVOR_DEEPSPEED) {
    *n = ds_members(l, kind, index, out);
    return MPU_SUCCESS;
  }
  kind_spec sp;
  spec_of(l, kind, &sp);
  MPU_CHECK(spec_group_at(l, &sp, index, out, cap, n));
  shift(out, *n, l->offset);
  return MPU_SUCCESS;
}

/* ---- what the getters answer ------------------------------------------------------ */

/* rank's index in members[0..n-1], -1 if absent */
static int index_in(const int *members, int n, int rank) {
  for (int i = 0; i < n; i++)
    if (members[i] == rank) return i;
  return -1;
}

/* Where rank sits in its group of kind: *pos (its torch rank in the group),
 * *size, *first (member 0), in O(1) for deepspeed and O(dims) for core, so
 * the getters do not depend on the size of the world (a data-parallel group
 * of a million-rank layout has tens of thousands of members). */
static mpu_result_t locate(const mpu_layout *l, mpu_group_kind kind, int r, int *pos, int *size,
                           int *first) {
  const mpu_layout_config *c = &l->cfg;
  if (c->flavor == MPU_FLAVOR_DEEPSPEED) {
    int W = c->world_size, per_stage = W / c->pp, k = c->sp > 1 ? c->sp : c->tp;
    int sdp = c->sp * l->dp, start = (r / per_stage) * per_stage;
    switch (kind) {
    case MPU_GROUP_SDP:
      if (c->sp > 1) {
        *pos = r % sdp, *size = sdp, *first = r - *pos;
        return MPU_SUCCESS;
      }
      __attribute__((fallthrough)); /* the sdp group is the dp group */
    case MPU_GROUP_DP: {
      int j = (r - start) % k;
      *pos = (r - start - j) / k, *size = per_stage / k, *first = start + j;
      return MPU_SUCCESS;
    }
    case MPU_GROUP_SP: *pos = r % c->sp, *size = c->sp, *first = r - *pos; return MPU_SUCCESS;
    case MPU_GROUP_MP:
      if (c->sp > 1) *pos = 0, *size = 1, *first = r;
      else *pos = (r / per_stage) * c->tp + r % c->tp, *size = c->pp * c->tp,
           *first = ((r % per_stage) / c->tp) * c->tp;
      return MPU_SUCCESS;
    case MPU_GROUP_TP: *pos = r % c->tp, *size = c->tp, *first = r - *pos; return MPU_SUCCESS;
    case MPU_GROUP_PP: *pos = r / per_stage, *size = c->pp, *first = r % per_stage; return MPU_SUCCESS;
    default: /* amax */
      *size = c->tp * l->dp, *pos = r % *size, *first = r - *pos;
      return MPU_SUCCESS;
    }
  }
  kind_spec sp;
  spec_of(l, kind, &sp);
  MPU_CHECK(spec_locate(l, &sp, r - l->offset, pos, size, first));
  *first += l->offset;
  return MPU_SUCCESS;
}

static int before_split(const mpu_layout *l, int pp_size, int stage) {
  if (pp_size == 1 || l->cfg.split_rank < 0) return 1;
  return stage < l->cfg.split_rank;
}

static int after_split(const mpu_layout *l, int pp_size, int stage) {
  if (pp_size == 1 || l->cfg.split_rank < 0) return 1;
  return stage >= l->cfg.split_rank;
}

mpu_result_t mpu_layout_locate(const mpu_layout *l, mpu_group_kind kind, int rank, int *pos,
                               int *size, int *first) {
  static const char fn[] = "mpu_layout_locate";
  MPU_CHECK(check_kind(fn, l, kind));
  if (kind == MPU_GROUP_EMBEDDING || kind == MPU_GROUP_POSITION_EMBEDDING)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: embedding groups hold only some ranks; use mpu_layout_group", fn);
  if (!pos || !size || !first) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL output", fn);
  MPU_CHECK(check_rank(fn, l, rank));
  if (!in_grid(l, rank))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: rank %d is outside the grid (ranks %d..%d) and in no group", fn, rank,
                      l->offset, l->offset + l->grid - 1);
  return locate(l, kind, rank, pos, size, first);
}

mpu_result_t mpu_layout_rank_info(const mpu_layout *l, int rank, mpu_rank_info *info) {
  static const char fn[] = "mpu_layout_rank_info";
  if (!l || !info) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  MPU_CHECK(mpu__check_size(fn, "info", "MPU_RANK_INFO_INIT", info->size,
                            MPU_RANK_INFO_MIN_SIZE, sizeof *info));
  const mpu_layout_config *c = &l->cfg;
  MPU_CHECK(check_rank(fn, l, rank));
  mpu_rank_info x;
  memset(&x, -1, sizeof x);
  x.size = sizeof x;
  x.rank = rank;
  x.vp_rank = c->vp ? 0 : -1; /* globals, set on every rank */
  x.vp_size = c->vp ? c->vp : -1;
  x.in_grid = in_grid(l, rank);
  x.n_embedding = x.n_position_embedding = 0;
  x.in_embedding_group = x.in_position_embedding_group = 0;
  if (!x.in_grid) /* core-0.19: a rank outside the grid has no group and no answers */
    return mpu__give_out(fn, "info", "MPU_RANK_INFO_INIT", info, &x, sizeof x,
                         MPU_RANK_INFO_MIN_SIZE);
  int *pipe = malloc((size_t)c->pp * sizeof(int));
  if (!pipe) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  mpu_result_t r = MPU_SUCCESS;
  int ds = c->flavor == MPU_FLAVOR_DEEPSPEED, c19 = c->flavor == MPU_FLAVOR_CORE_019, first, n;
#define LOCATE(kind, pos, size, first_) MPU_CHECK_GOTO(locate(l, kind, rank, pos, size, first_), r, out)

  LOCATE(MPU_GROUP_TP, &x.tp_rank, &x.tp_size, &first);
  x.tp_src = ds ? (rank / x.tp_size) * x.tp_size : first; /* deepspeed computes it */
  MPU_CHECK_GOTO(pipeline_of(l, rank, pipe, &x.pp_size), r, out);
  x.pp_rank = index_in(pipe, x.pp_size, rank);
  x.pp_first = pipe[0];
  x.pp_last = pipe[x.pp_size - 1];
  x.pp_next = pipe[(x.pp_rank + 1) % x.pp_size];
  x.pp_prev = pipe[(x.pp_rank - 1 + x.pp_size) % x.pp_size];
  x.is_first_stage = x.pp_rank == 0; /* ignoring virtual stages */
  x.is_last_stage = x.pp_rank == x.pp_size - 1;
  x.n_embedding = embedding_of(l, MPU_GROUP_EMBEDDING, pipe, x.pp_size, x.embedding_global_ranks);
  x.n_position_embedding = embedding_of(l, MPU_GROUP_POSITION_EMBEDDING, pipe, x.pp_size,
                                        x.position_embedding_global_ranks);
  int in_e = index_in(x.embedding_global_ranks, x.n_embedding, rank) >= 0;
  x.in_position_embedding_group =
      index_in(x.position_embedding_global_ranks, x.n_position_embedding, rank) >= 0;
  if (c19) {
    /* core_v0.19.0 keeps the global ranks on members only, and
     * is_rank_in_embedding_group() ignores virtual stages by default */
    if (!in_e) x.n_embedding = 0;
    if (!x.in_position_embedding_group) x.n_position_embedding = 0;
    x.in_embedding_group = in_e;
  } else if (in_e) {
    /* is_rank_in_embedding_group(ignore_virtual=False): the first and last
     * ranks count only on the first and last virtual stage (0 after init) */
    int first_stage = (!c->vp || x.vp_rank == 0) && x.pp_rank == 0;
    int last_stage = (!c->vp || x.vp_rank == c->vp - 1) && x.pp_rank == x.pp_size - 1;
    if (rank == x.embedding_global_ranks[0]) x.in_embedding_group = first_stage;
    else if (rank == x.embedding_global_ranks[x.n_embedding - 1]) x.in_embedding_group = last_stage;
    else x.in_embedding_group = 1;
  }
  LOCATE(MPU_GROUP_DP, &x.dp_rank, &x.dp_size, &x.dp_src);
  LOCATE(MPU_GROUP_MP, &x.mp_rank, &x.mp_size, &x.mp_src);
  if (ds) {
    LOCATE(MPU_GROUP_SP, &x.sp_rank, &n, &first);
    x.sp_size = c->sp; /* set explicitly by the original */
    x.sp_src = (rank / x.sp_size) * x.sp_size;
    LOCATE(MPU_GROUP_SDP, &x.sdp_rank, &x.sdp_size, &first);
    /* get_data_parallel_world_size/group answer with the sequence-data group */
    x.dp_rank = x.sdp_rank;
    x.dp_size = x.sdp_size;
    x.stage_before_split = before_split(l, x.pp_size, x.pp_rank);
    x.stage_after_split = after_split(l, x.pp_size, x.pp_rank);
    x.stage_at_split = before_split(l, x.pp_size, x.pp_rank) &&
                       after_split(l, x.pp_size, x.pp_rank + 1);
    goto done;
  }
  LOCATE(MPU_GROUP_DP_CP, &x.dp_cp_rank, &x.dp_cp_size, &x.dp_cp_src);
  LOCATE(MPU_GROUP_CP, &x.cp_rank, &x.cp_size, &first);
  LOCATE(MPU_GROUP_TP_CP, &x.tp_cp_rank, &x.tp_cp_size, &first);
  LOCATE(MPU_GROUP_TP_DP, &x.tp_dp_rank, &x.tp_dp_size, &first);
  LOCATE(MPU_GROUP_TP_DP_CP, &x.tp_dp_cp_rank, &x.tp_dp_cp_size, &first);
  LOCATE(MPU_GROUP_TP_EP, &x.etp_ep_rank, &x.etp_ep_size, &first);
  LOCATE(MPU_GROUP_TP_EP_PP, &x.etp_ep_pp_rank, &x.etp_ep_pp_size, &first);
  LOCATE(MPU_GROUP_DP_MODULO_EP, &x.edp_rank, &x.edp_size, &first);
  x.tp_ep_rank = x.etp_ep_rank;
  x.dp_modulo_ep_rank = x.edp_rank, x.dp_modulo_ep_size = x.edp_size;
  if (!c19) { /* core_v0.8.0 derives the expert rank from the tensor+expert group */
    x.ep_rank = x.tp_ep_rank / x.tp_size;
    x.ep_size = x.etp_ep_size / x.tp_size;
    goto done;
  }
  LOCATE(MPU_GROUP_EP, &x.ep_rank, &x.ep_size, &x.ep_src);
  LOCATE(MPU_GROUP_ETP, &x.etp_rank, &x.etp_size, &first);
  LOCATE(MPU_GROUP_INTRA_PARTIAL_DP_CP, &x.partial_dp_cp_rank, &x.partial_dp_cp_size, &first);
  LOCATE(MPU_GROUP_INTRA_PARTIAL_EDP, &x.partial_edp_rank, &x.partial_edp_size, &first);
  LOCATE(MPU_GROUP_INTRA_DIST_OPT_INSTANCE, &x.intra_dist_opt_rank, &x.intra_dist_opt_size,
         &first);
  if (c->dist_opt_instances > 1)
    LOCATE(MPU_GROUP_INTER_PARTIAL_EDP, &x.inter_dist_opt_rank, &x.inter_dist_opt_size, &first);
done:
#undef LOCATE
  r = mpu__give_out(fn, "info", "MPU_RANK_INFO_INIT", info, &x, sizeof x, MPU_RANK_INFO_MIN_SIZE);
out:
  free(pipe);
  return r;
}
