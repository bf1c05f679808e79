/*
 * layout.c - the groups of Megatron's initialize_model_parallel, computed for
 * one rank at a time.
 *
 * deepspeed: each group kind is a simple arithmetic progression or block of
 * ranks (the loops of the original, solved for "the group containing rank r"
 * and "group number g"). core: the RankGenerator is a mesh whose dims are the
 * order string's tokens reversed (Megatron's first token varies fastest, a
 * mesh's last dim does), so a token set's groups are the mesh's groups along
 * those dims, listed from the slowest token to the fastest.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "core/options.h"
#include "mpu/layout.h"
#include "mpu/mesh.h"

#define NTOKENS 5

struct mpu_layout {
  mpu_layout_config cfg;
  int dp;
  /* core: positions of the tokens in the order (first = fastest) */
  int ntok_wo, ntok_w;
  char tok_wo[NTOKENS][3], tok_w[NTOKENS][3];
  mpu_mesh *wo_ep, *w_ep; /* dims = tokens reversed */
};

static const char *const ds_names[MPU_GROUP_KIND_COUNT] = {
    [MPU_GROUP_DP] = "dp", [MPU_GROUP_TP] = "tp", [MPU_GROUP_PP] = "pp", [MPU_GROUP_MP] = "mp",
    [MPU_GROUP_EMBEDDING] = "embedding", [MPU_GROUP_POSITION_EMBEDDING] = "position_embedding",
    [MPU_GROUP_SP] = "sp", [MPU_GROUP_SDP] = "sdp", [MPU_GROUP_AMAX] = "amax",
};

static const char *const core_names[MPU_GROUP_KIND_COUNT] = {
    [MPU_GROUP_DP] = "dp", [MPU_GROUP_TP] = "tp", [MPU_GROUP_PP] = "pp", [MPU_GROUP_MP] = "tp_pp",
    [MPU_GROUP_EMBEDDING] = "embedding", [MPU_GROUP_POSITION_EMBEDDING] = "position_embedding",
    [MPU_GROUP_DP_CP] = "dp_cp", [MPU_GROUP_CP] = "cp", [MPU_GROUP_TP_EP_PP] = "tp_ep_pp",
    [MPU_GROUP_TP_DP_CP] = "tp_dp_cp", [MPU_GROUP_TP_DP] = "tp_dp", [MPU_GROUP_TP_CP] = "tp_cp",
    [MPU_GROUP_TP_EP] = "tp_ep", [MPU_GROUP_EP] = "ep", [MPU_GROUP_DP_MODULO_EP] = "dp_modulo_ep",
    [MPU_GROUP_DP_CP_MODULO_EP] = "dp_cp_modulo_ep",
};

/* core kinds: the token set and whether ep is counted apart from dp */
static const struct {
  const char *tokens;
  int independent_ep;
} core_kinds[MPU_GROUP_KIND_COUNT] = {
    [MPU_GROUP_DP] = {"dp", 0},          [MPU_GROUP_TP] = {"tp", 0},
    [MPU_GROUP_PP] = {"pp", 0},          [MPU_GROUP_MP] = {"tp-pp", 0},
    [MPU_GROUP_DP_CP] = {"dp-cp", 0},    [MPU_GROUP_CP] = {"cp", 0},
    [MPU_GROUP_TP_EP_PP] = {"tp-ep-pp", 1}, [MPU_GROUP_TP_DP_CP] = {"tp-dp-cp", 0},
    [MPU_GROUP_TP_DP] = {"tp-dp", 0},    [MPU_GROUP_TP_CP] = {"tp-cp", 0},
    [MPU_GROUP_TP_EP] = {"tp-ep", 1},    [MPU_GROUP_EP] = {"ep", 1},
    [MPU_GROUP_DP_MODULO_EP] = {"dp", 1}, [MPU_GROUP_DP_CP_MODULO_EP] = {"dp-cp", 1},
};

const char *mpu_flavor_name(mpu_flavor f) {
  return f == MPU_FLAVOR_DEEPSPEED ? "deepspeed" : f == MPU_FLAVOR_CORE ? "core" : "invalid";
}

mpu_result_t mpu_flavor_from_name(const char *name, mpu_flavor *out) {
  if (name && out && !strcasecmp(name, "deepspeed")) return *out = MPU_FLAVOR_DEEPSPEED, MPU_SUCCESS;
  if (name && out && !strcasecmp(name, "core")) return *out = MPU_FLAVOR_CORE, MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT, "unknown flavor '%s' (want deepspeed or core)",
                    name ? name : "(null)");
}

const char *mpu_group_kind_name(mpu_flavor flavor, mpu_group_kind kind) {
  if ((unsigned)kind >= MPU_GROUP_KIND_COUNT) return "invalid";
  const char *n = flavor == MPU_FLAVOR_DEEPSPEED ? ds_names[kind] : core_names[kind];
  return n ? n : "invalid";
}

int mpu_layout_has(const mpu_layout *l, mpu_group_kind kind) {
  if (!l || (unsigned)kind >= MPU_GROUP_KIND_COUNT) return 0;
  if (l->cfg.flavor == MPU_FLAVOR_DEEPSPEED)
    return ds_names[kind] != NULL && (kind != MPU_GROUP_AMAX || l->cfg.fp8);
  return core_names[kind] != NULL;
}

const mpu_layout_config *mpu_layout_config_of(const mpu_layout *l) { return l ? &l->cfg : NULL; }
int mpu_layout_dp(const mpu_layout *l) { return l ? l->dp : 0; }

void mpu_layout_free(mpu_layout *l) {
  if (!l) return;
  mpu_mesh_free(l->wo_ep);
  mpu_mesh_free(l->w_ep);
  free(l);
}

/* ---- checks, in the order of the originals ------------------------------------ */

/* a * b in 64 bits, saturating: sizes are ints, but their products are not
 * (Python's are exact; a product past any world only has to stay too big) */
static int64_t prod(int64_t a, int64_t b) {
  int64_t p;
  return __builtin_mul_overflow(a, b, &p) ? INT64_MAX : p;
}

static mpu_result_t check_deepspeed(const mpu_layout_config *c, int *dp) {
  int64_t W = c->world_size, tp_pp = prod(c->tp, c->pp);
  if (W % tp_pp != 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "world_size (%d) is not divisible by tensor_model_parallel_size (%d) x "
                      "pipeline_model_parallel_size (%d)",
                      c->world_size, c->tp, c->pp);
  if (c->sp > 1) {
    if (!(c->tp == 1 && c->pp == 1))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "DeepSpeed's sequence parallel does not work with tensor parallel or "
                        "pipeline parallel");
    if (W % c->sp != 0)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "world_size (%d) is not divisible by sequence_parallel_size %d)",
                        c->world_size, c->sp);
  }
  if (c->vp && !(c->pp > 2))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "pipeline-model-parallel size should be greater than 2 with interleaved "
                      "schedule");
  *dp = (int)(W / prod(tp_pp, c->sp)); /* divides W, so at most W */
  return MPU_SUCCESS;
}

/* Split an order string into known, distinct tokens. */
static mpu_result_t parse_order(const char *order, char tok[NTOKENS][3], int *n) {
  static const char *const known[NTOKENS] = {"tp", "pp", "dp", "ep", "cp"};
  char buf[64];
  size_t len = strlen(order);
  if (len >= sizeof buf)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "order (%.40s...) is too long", order);
  if (order[0] == '-' || (len && order[len - 1] == '-') || strstr(order, "--"))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "order (%s) has an empty token (want tp, pp, dp, ep, cp joined by '-')",
                      order);
  snprintf(buf, sizeof buf, "%s", order);
  *n = 0;
  char *save = NULL;
  for (char *t = strtok_r(buf, "-", &save); t; t = strtok_r(NULL, "-", &save)) {
    for (char *p = t; *p; p++)
      if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a'); /* the original lower-cases */
    int k = 0;
    while (k < NTOKENS && strcmp(t, known[k])) k++;
    if (k == NTOKENS)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "unknown token '%s' in order (%s) (want tp, pp, dp, ep, cp joined by '-')",
                        t, order);
    for (int i = 0; i < *n; i++)
      if (!strcmp(tok[i], t))
        return mpu__error(MPU_ERR_INVALID_ARGUMENT, "token '%s' appears twice in order (%s)", t,
                          order);
    snprintf(tok[(*n)++], 3, "%s", t);
  }
  return MPU_SUCCESS;
}

static int tok_index(char tok[NTOKENS][3], int n, const char *t) {
  for (int i = 0; i < n; i++)
    if (!strcmp(tok[i], t)) return i;
  return -1;
}

static mpu_result_t check_core(const mpu_layout_config *c, int *dp) {
  int64_t W = c->world_size, model = prod(prod(c->tp, c->pp), c->cp);
  if (W % model != 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "world_size (%d) is not divisible by tensor_model_parallel_size (%d) x "
                      "pipeline_model_parallel_size (%d) x context_parallel_size (%d)",
                      c->world_size, c->tp, c->pp, c->cp);
  *dp = (int)(W / model);
  if (*dp % c->ep != 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "data_parallel_size (%d) is not divisible by expert_model_parallel_size (%d)",
                      *dp, c->ep);
  if (c->vp && !(c->pp > 1))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "pipeline-model-parallel size should be greater than 1 with interleaved "
                      "schedule");
  return MPU_SUCCESS;
}

/* The RankGenerator's checks and its two orders (with and without ep). */
static mpu_result_t rank_generator(mpu_layout *l) {
  const mpu_layout_config *c = &l->cfg;
  const char *order = c->order[0] ? c->order : "tp-cp-ep-dp-pp";
  char tok[NTOKENS][3];
  int n = 0;
  MPU_CHECK(parse_order(order, tok, &n));
  int ie = tok_index(tok, n, "ep"), id = tok_index(tok, n, "dp");
  if (ie >= 0 && (id < 0 || (ie != id + 1 && id != ie + 1)))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "The ep and dp must be adjacent in order (%s).",
                      order);
  static const char *const names[NTOKENS] = {"tp", "pp", "dp", "ep", "cp"};
  int sizes[NTOKENS] = {c->tp, c->pp, l->dp, c->ep, c->cp};
  for (int k = 0; k < NTOKENS; k++) {
    if (tok_index(tok, n, names[k]) >= 0) continue;
    if (sizes[k] != 1)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "The size of (%s) is (%d), but you haven't specified the order (%s).",
                        names[k], sizes[k], order);
    snprintf(tok[n++], 3, "%s", names[k]);
  }
  /* mesh shapes: tokens reversed; dp counts dp/ep where ep stands apart */
  int64_t shape_w[NTOKENS], shape_wo[NTOKENS];
  l->ntok_w = l->ntok_wo = 0;
  for (int i = 0; i < n; i++) {
    int k = 0;
    while (strcmp(names[k], tok[i])) k++;
    memcpy(l->tok_w[l->ntok_w], tok[i], 3);
    shape_w[l->ntok_w++] = k == 2 ? l->dp / c->ep : sizes[k];
    if (k != 3) {
      memcpy(l->tok_wo[l->ntok_wo], tok[i], 3);
      shape_wo[l->ntok_wo++] = sizes[k];
    }
  }
  int64_t rw[NTOKENS], rwo[NTOKENS];
  for (int i = 0; i < l->ntok_w; i++) rw[i] = shape_w[l->ntok_w - 1 - i];
  for (int i = 0; i < l->ntok_wo; i++) rwo[i] = shape_wo[l->ntok_wo - 1 - i];
  MPU_CHECK(mpu_mesh_create(l->ntok_w, rw, NULL, NULL, &l->w_ep));
  MPU_CHECK(mpu_mesh_create(l->ntok_wo, rwo, NULL, NULL, &l->wo_ep));
  return MPU_SUCCESS;
}

mpu_result_t mpu_layout_create(const mpu_layout_config *cfg, mpu_layout **out) {
  static const char fn[] = "mpu_layout_create";
  if (!cfg || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  mpu_layout_config full = MPU_LAYOUT_CONFIG_INIT;
  MPU_CHECK(mpu__take_options(fn, "config", "MPU_LAYOUT_CONFIG_INIT",
                              cfg, sizeof full, MPU_LAYOUT_CONFIG_MIN_SIZE, &full));
  cfg = &full;
  if (cfg->flavor != MPU_FLAVOR_DEEPSPEED && cfg->flavor != MPU_FLAVOR_CORE)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: flavor %d", fn, (int)cfg->flavor);
  const struct {
    const char *name;
    int value;
  } sizes[] = {{"world_size", cfg->world_size}, {"tensor_model_parallel_size", cfg->tp},
               {"pipeline_model_parallel_size", cfg->pp}, {"sequence_parallel_size", cfg->sp},
               {"context_parallel_size", cfg->cp}, {"expert_model_parallel_size", cfg->ep}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].value < 1)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s (%d) must be at least 1", sizes[i].name,
                        sizes[i].value);
  if (cfg->vp < 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "virtual_pipeline_model_parallel_size (%d) must be at least 1 (0: none)",
                      cfg->vp);
  if (cfg->flavor == MPU_FLAVOR_DEEPSPEED && (cfg->cp != 1 || cfg->ep != 1 || cfg->order[0]))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "the deepspeed flavor has no context or expert parallelism and no order "
                      "(use --flavor core)");
  if (cfg->flavor == MPU_FLAVOR_CORE && (cfg->sp != 1 || cfg->fp8))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "the core flavor has no DeepSpeed sequence parallelism and builds no "
                      "separate amax groups (use --flavor deepspeed, or cp)");
  mpu_layout *l = calloc(1, sizeof *l);
  if (!l) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  l->cfg = *cfg;
  mpu_result_t r = cfg->flavor == MPU_FLAVOR_DEEPSPEED ? check_deepspeed(cfg, &l->dp)
                                                       : check_core(cfg, &l->dp);
  if (!r && cfg->split_rank != -1 && (cfg->split_rank < 0 || cfg->split_rank >= cfg->pp))
    r = mpu__error(MPU_ERR_INVALID_ARGUMENT,
                   "pipeline_model_parallel_split_rank (%d) is not a stage of the %d-stage "
                   "pipeline (want 0..%d, or -1 for none)",
                   cfg->split_rank, cfg->pp, cfg->pp - 1);
  if (!r && cfg->flavor == MPU_FLAVOR_CORE) r = rank_generator(l);
  if (r) {
    mpu_layout_free(l);
    return r;
  }
  *out = l;
  return MPU_SUCCESS;
}

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

/* ---- core: token sets as mesh dims --------------------------------------------- */

static mpu_result_t core_dims(const mpu_layout *l, mpu_group_kind kind, const mpu_mesh **mesh,
                              int *dims, int *nd) {
  int ind = core_kinds[kind].independent_ep;
  int ntok = ind ? l->ntok_w : l->ntok_wo;
  char(*tok)[3] = ind ? (char(*)[3])l->tok_w : (char(*)[3])l->tok_wo;
  *mesh = ind ? l->w_ep : l->wo_ep;
  *nd = 0;
  /* masked tokens from the slowest (last in the order) to the fastest:
   * mesh dims ascending */
  for (int p = ntok - 1; p >= 0; p--)
    if (strstr(core_kinds[kind].tokens, tok[p])) dims[(*nd)++] = ntok - 1 - p;
  return MPU_SUCCESS;
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
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the %s flavor has no group kind %d%s", fn,
                      mpu_flavor_name(l->cfg.flavor), (int)kind,
                      kind == MPU_GROUP_AMAX ? " (amax groups need fp8)" : "");
  return MPU_SUCCESS;
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
  const mpu_mesh *m;
  int dims[NTOKENS], nd, size = 1;
  core_dims(l, kind, &m, dims, &nd);
  for (int i = 0; i < nd; i++) {
    int64_t s;
    mpu_mesh_dim_size(m, dims[i], &s);
    size *= (int)s;
  }
  return size;
}

static mpu_result_t need(const char *fn, int n, size_t cap) {
  if ((size_t)n > cap)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the group has %d ranks, out holds %zu", fn, n,
                      cap);
  return MPU_SUCCESS;
}

/* The pipeline (pp group) containing rank, into pipe. */
static mpu_result_t pipeline_of(const mpu_layout *l, int rank, int *pipe, int *n) {
  if (l->cfg.flavor == MPU_FLAVOR_DEEPSPEED) {
    *n = ds_members(l, MPU_GROUP_PP, ds_index(l, MPU_GROUP_PP, rank), pipe);
    return MPU_SUCCESS;
  }
  const mpu_mesh *m;
  int dims[NTOKENS], nd;
  int64_t got;
  core_dims(l, MPU_GROUP_PP, &m, dims, &nd);
  MPU_CHECK(mpu_mesh_group(m, rank, dims, nd, pipe, (size_t)l->cfg.pp, &got));
  *n = (int)got;
  return MPU_SUCCESS;
}

mpu_result_t mpu_layout_group(const mpu_layout *l, mpu_group_kind kind, int rank, int *out,
                              size_t cap, int *n) {
  static const char fn[] = "mpu_layout_group";
  MPU_CHECK(check_kind(fn, l, kind));
  if (!out || !n) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL output", fn);
  if (rank < 0 || rank >= l->cfg.world_size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: rank %d is outside 0..%d", fn, rank,
                      l->cfg.world_size - 1);
  MPU_CHECK(need(fn, mpu_layout_max_group_size(l, kind), cap));
  if (kind == MPU_GROUP_EMBEDDING || kind == MPU_GROUP_POSITION_EMBEDDING) {
    int *pipe = malloc((size_t)l->cfg.pp * sizeof(int)), np = 0, e[3], ne;
    if (!pipe) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    mpu_result_t r = pipeline_of(l, rank, pipe, &np);
    ne = r ? 0 : embedding_of(l, kind, pipe, np, e);
    free(pipe);
    MPU_CHECK(r);
    *n = 0;
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
  const mpu_mesh *m;
  int dims[NTOKENS], nd;
  int64_t got;
  core_dims(l, kind, &m, dims, &nd);
  MPU_CHECK(mpu_mesh_group(m, rank, dims, nd, out, cap, &got));
  *n = (int)got;
  return MPU_SUCCESS;
}

mpu_result_t mpu_layout_num_groups(const mpu_layout *l, mpu_group_kind kind, int *count) {
  MPU_CHECK(check_kind("mpu_layout_num_groups", l, kind));
  if (!count) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_layout_num_groups: NULL");
  if (l->cfg.flavor == MPU_FLAVOR_DEEPSPEED) *count = ds_count(l, kind);
  else if (kind == MPU_GROUP_EMBEDDING || kind == MPU_GROUP_POSITION_EMBEDDING)
    *count = l->cfg.world_size / l->cfg.pp;
  else
    *count = l->cfg.world_size / mpu_layout_max_group_size(l, kind);
  return MPU_SUCCESS;
}

/* Core group number g: the group through the rank whose coordinates along
 * the other dims spell g (row-major) and are 0 along the group's dims. */
static mpu_result_t core_group_at(const mpu_layout *l, mpu_group_kind kind, int g, int *out,
                                  size_t cap, int *n) {
  const mpu_mesh *m;
  int dims[NTOKENS], nd;
  core_dims(l, kind, &m, dims, &nd);
  int64_t coords[NTOKENS] = {0};
  for (int d = mpu_mesh_ndim(m) - 1; d >= 0; d--) {
    int listed = 0;
    for (int i = 0; i < nd; i++) listed |= dims[i] == d;
    if (listed) continue;
    int64_t s;
    mpu_mesh_dim_size(m, d, &s);
    coords[d] = g % s;
    g = (int)(g / s);
  }
  int rank;
  int64_t got;
  MPU_CHECK(mpu_mesh_rank_at(m, coords, &rank));
  MPU_CHECK(mpu_mesh_group(m, rank, dims, nd, out, cap, &got));
  *n = (int)got;
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
    mpu_result_t r;
    if (l->cfg.flavor == MPU_FLAVOR_DEEPSPEED) {
      np = ds_members(l, MPU_GROUP_PP, index, pipe);
      r = MPU_SUCCESS;
    } else {
      r = core_group_at(l, MPU_GROUP_PP, index, pipe, (size_t)l->cfg.pp, &np);
    }
    if (!r) *n = embedding_of(l, kind, pipe, np, out);
    free(pipe);
    return r;
  }
  if (l->cfg.flavor == MPU_FLAVOR_DEEPSPEED) {
    *n = ds_members(l, kind, index, out);
    return MPU_SUCCESS;
  }
  return core_group_at(l, kind, index, out, cap, n);
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
  const mpu_mesh *m;
  int dims[NTOKENS], nd, p = 0, n = 1;
  int64_t coords[NTOKENS], sz;
  core_dims(l, kind, &m, dims, &nd);
  MPU_CHECK(mpu_mesh_coords(m, r, coords));
  for (int i = 0; i < nd; i++) { /* dims run from the slowest token to the fastest */
    mpu_mesh_dim_size(m, dims[i], &sz);
    p = p * (int)sz + (int)coords[dims[i]];
    n *= (int)sz;
    coords[dims[i]] = 0;
  }
  *pos = p, *size = n;
  return mpu_mesh_rank_at(m, coords, first);
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
  if (rank < 0 || rank >= l->cfg.world_size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: rank %d is outside 0..%d", fn, rank,
                      l->cfg.world_size - 1);
  return locate(l, kind, rank, pos, size, first);
}

mpu_result_t mpu_layout_rank_info(const mpu_layout *l, int rank, mpu_rank_info *info) {
  static const char fn[] = "mpu_layout_rank_info";
  if (!l || !info) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  MPU_CHECK(mpu__check_size(fn, "info", "MPU_RANK_INFO_INIT", info->size,
                            MPU_RANK_INFO_MIN_SIZE, sizeof *info));
  const mpu_layout_config *c = &l->cfg;
  if (rank < 0 || rank >= c->world_size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: rank %d is outside 0..%d", fn, rank,
                      c->world_size - 1);
  int *pipe = malloc((size_t)c->pp * sizeof(int));
  if (!pipe) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  mpu_rank_info x;
  memset(&x, -1, sizeof x);
  x.size = sizeof x;
  x.rank = rank;
  mpu_result_t r = MPU_SUCCESS;
  int ds = c->flavor == MPU_FLAVOR_DEEPSPEED, first, n;
#define LOCATE(kind, pos, size, first_) MPU_CHECK_GOTO(locate(l, kind, rank, pos, size, first_), r, out)

  LOCATE(MPU_GROUP_TP, &x.tp_rank, &x.tp_size, &first);
  x.tp_src = ds ? (rank / x.tp_size) * x.tp_size : first; /* deepspeed computes it */
  MPU_CHECK_GOTO(pipeline_of(l, rank, pipe, &x.pp_size), r, out);
  x.pp_rank = index_in(pipe, x.pp_size, rank);
  x.pp_first = pipe[0];
  x.pp_last = pipe[x.pp_size - 1];
  x.pp_next = pipe[(x.pp_rank + 1) % x.pp_size];
  x.pp_prev = pipe[(x.pp_rank - 1 + x.pp_size) % x.pp_size];
  x.vp_rank = c->vp ? 0 : -1;
  x.vp_size = c->vp ? c->vp : -1;
  x.n_embedding = embedding_of(l, MPU_GROUP_EMBEDDING, pipe, x.pp_size, x.embedding_global_ranks);
  x.n_position_embedding = embedding_of(l, MPU_GROUP_POSITION_EMBEDDING, pipe, x.pp_size,
                                        x.position_embedding_global_ranks);
  /* is_rank_in_embedding_group(): the first and last ranks count only on the
   * first and last virtual stage (the virtual rank is 0 after init) */
  int first_stage = (!c->vp || x.vp_rank == 0) && x.pp_rank == 0;
  int last_stage = (!c->vp || x.vp_rank == c->vp - 1) && x.pp_rank == x.pp_size - 1;
  x.in_embedding_group = 0;
  if (index_in(x.embedding_global_ranks, x.n_embedding, rank) >= 0) {
    if (rank == x.embedding_global_ranks[0]) x.in_embedding_group = first_stage;
    else if (rank == x.embedding_global_ranks[x.n_embedding - 1]) x.in_embedding_group = last_stage;
    else x.in_embedding_group = 1;
  }
  x.in_position_embedding_group =
      index_in(x.position_embedding_global_ranks, x.n_position_embedding, rank) >= 0;
  LOCATE(MPU_GROUP_DP, &x.dp_rank, &x.dp_size, &x.dp_src);
  LOCATE(MPU_GROUP_MP, &x.mp_rank, &x.mp_size, &first);
  if (ds) {
    x.is_first_stage = x.pp_rank == 0;
    x.is_last_stage = x.pp_rank == x.pp_size - 1;
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
  } else {
    LOCATE(MPU_GROUP_DP_CP, &x.dp_cp_rank, &x.dp_cp_size, &x.dp_cp_src);
    LOCATE(MPU_GROUP_CP, &x.cp_rank, &x.cp_size, &first);
    int tp_ep_size;
    LOCATE(MPU_GROUP_TP_EP, &x.tp_ep_rank, &tp_ep_size, &first);
    x.ep_rank = x.tp_ep_rank / x.tp_size; /* as the original derives them */
    x.ep_size = tp_ep_size / x.tp_size;
    LOCATE(MPU_GROUP_DP_MODULO_EP, &x.dp_modulo_ep_rank, &x.dp_modulo_ep_size, &first);
  }
#undef LOCATE
  r = mpu__give_out(fn, "info", "MPU_RANK_INFO_INIT", info, &x, sizeof x, MPU_RANK_INFO_MIN_SIZE);
out:
  free(pipe);
  return r;
}

/* ---- "key=value" configs -------------------------------------------------------- */

mpu_result_t mpu_layout_config_parse(const char *text, mpu_layout_config *cfg) {
  static const char fn[] = "mpu_layout_config_parse";
  if (!text || !cfg) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  const char *p = text;
  while (*p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == ',') p++;
    if (!*p) break;
    const char *key = p;
    while (*p && *p != '=' && *p != ' ' && *p != '\t' && *p != '\n' && *p != ',') p++;
    size_t klen = (size_t)(p - key);
    if (*p != '=')
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%.*s' has no '=value'", fn, (int)klen,
                        key);
    const char *val = ++p;
    while (*p && *p != ' ' && *p != '\t' && *p != '\n' && *p != ',') p++;
    size_t vlen = (size_t)(p - val);
    char k[32], v[64];
    if (klen == 0 || klen >= sizeof k || vlen == 0 || vlen >= sizeof v)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: malformed entry near '%.20s'", fn, key);
    memcpy(k, key, klen);
    k[klen] = 0;
    memcpy(v, val, vlen);
    v[vlen] = 0;
    if (!strcmp(k, "flavor")) {
      MPU_CHECK(mpu_flavor_from_name(v, &c.flavor));
      continue;
    }
    if (!strcmp(k, "order")) {
      snprintf(c.order, sizeof c.order, "%s", v);
      continue;
    }
    static const char *const keys[] = {"world_size", "tp", "pp", "vp", "split_rank", "sp", "cp",
                                       "ep", "fp8"};
    int *fields[] = {&c.world_size, &c.tp, &c.pp, &c.vp, &c.split_rank, &c.sp, &c.cp, &c.ep,
                     &c.fp8};
    size_t i = 0;
    while (i < sizeof keys / sizeof keys[0] && strcmp(k, keys[i])) i++;
    if (i == sizeof keys / sizeof keys[0])
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: unknown key '%s' (want flavor, world_size, tp, pp, vp, split_rank, "
                        "sp, cp, ep, fp8, order)",
                        fn, k);
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < -1 || x > 1L << 30)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s=%s is not a whole number in -1..2^30",
                        fn, k, v);
    *fields[i] = (int)x;
  }
  *cfg = c;
  return MPU_SUCCESS;
}
