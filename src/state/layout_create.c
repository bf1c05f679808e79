/*
 * layout_create.c - checking a layout config as the originals do, in their
 * order and with their messages, and building its rank generators.
 *
 * deepspeed and core (core_v0.8.0) answer with the original's message;
 * core-0.19 (core_v0.19.0) also names the Python exception the original
 * raises ("RuntimeError: ...", "AssertionError: ..."), since which checks
 * raise what is part of the behaviour to match.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "core/options.h"
#include "state/layout_internal.h"

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

static const char *const core19_names[MPU_GROUP_KIND_COUNT] = {
    [MPU_GROUP_DP] = "dp", [MPU_GROUP_TP] = "tp", [MPU_GROUP_PP] = "pp", [MPU_GROUP_MP] = "mp",
    [MPU_GROUP_EMBEDDING] = "embedding", [MPU_GROUP_POSITION_EMBEDDING] = "position_embedding",
    [MPU_GROUP_DP_CP] = "dp_cp", [MPU_GROUP_CP] = "cp", [MPU_GROUP_TP_DP_CP] = "tp_dp_cp",
    [MPU_GROUP_TP_DP] = "tp_dp", [MPU_GROUP_TP_CP] = "tp_cp", [MPU_GROUP_EP] = "ep",
    [MPU_GROUP_ETP] = "etp", [MPU_GROUP_TP_EP] = "etp_ep", [MPU_GROUP_TP_EP_PP] = "etp_ep_pp",
    [MPU_GROUP_DP_MODULO_EP] = "edp", [MPU_GROUP_INTRA_PARTIAL_DP_CP] = "intra_partial_dp_cp",
    [MPU_GROUP_INTRA_PARTIAL_EDP] = "intra_partial_edp",
    [MPU_GROUP_INTER_PARTIAL_EDP] = "inter_partial_edp",
    [MPU_GROUP_INTRA_DIST_OPT_INSTANCE] = "intra_dist_opt_instance",
    [MPU_GROUP_HCP_L0] = "hcp_l0", [MPU_GROUP_HCP_L0 + 1] = "hcp_l1",
    [MPU_GROUP_HCP_L0 + 2] = "hcp_l2", [MPU_GROUP_HCP_L0 + 3] = "hcp_l3",
    [MPU_GROUP_HCP_L0 + 4] = "hcp_l4", [MPU_GROUP_HCP_L0 + 5] = "hcp_l5",
    [MPU_GROUP_HCP_L0 + 6] = "hcp_l6", [MPU_GROUP_HCP_L0 + 7] = "hcp_l7",
    [MPU_GROUP_DP_GLOO] = "dp_gloo", [MPU_GROUP_DP_CP_GLOO] = "dp_cp_gloo",
    [MPU_GROUP_INTRA_PARTIAL_DP_CP_GLOO] = "intra_partial_dp_cp_gloo",
    [MPU_GROUP_EDP_GLOO] = "edp_gloo", [MPU_GROUP_INTRA_PARTIAL_EDP_GLOO] = "intra_partial_edp_gloo",
};
_Static_assert(MPU_HCP_MAX_LEVELS == 8, "core19_names lists eight hierarchical levels");

const char *mpu_flavor_name(mpu_flavor f) {
  switch (f) {
  case MPU_FLAVOR_DEEPSPEED: return "deepspeed";
  case MPU_FLAVOR_CORE: return "core";
  case MPU_FLAVOR_CORE_019: return "core-0.19";
  default: return "invalid";
  }
}

mpu_result_t mpu_flavor_from_name(const char *name, mpu_flavor *out) {
  for (int f = MPU_FLAVOR_DEEPSPEED; f <= MPU_FLAVOR_CORE_019; f++)
    if (name && out && !strcasecmp(name, mpu_flavor_name((mpu_flavor)f)))
      return *out = (mpu_flavor)f, MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                    "unknown flavor '%s' (want deepspeed, core or core-0.19)",
                    name ? name : "(null)");
}

/* The flavour's name for kind, NULL where it builds no such kind. */
static const char *kind_name(mpu_flavor flavor, mpu_group_kind kind) {
  if ((unsigned)kind >= (unsigned)MPU_GROUP_KIND_COUNT) return NULL;
  switch (flavor) {
  case MPU_FLAVOR_DEEPSPEED: return ds_names[kind];
  case MPU_FLAVOR_CORE: return core_names[kind];
  case MPU_FLAVOR_CORE_019: return core19_names[kind];
  default: return NULL;
  }
}

const char *mpu_group_kind_name(mpu_flavor flavor, mpu_group_kind kind) {
  const char *n = kind_name(flavor, kind);
  return n ? n : "invalid";
}

int mpu_group_kind_is_gloo(mpu_group_kind kind) {
  return kind >= MPU_GROUP_DP_GLOO && kind <= MPU_GROUP_INTRA_PARTIAL_EDP_GLOO;
}

int mpu_layout_has(const mpu_layout *l, mpu_group_kind kind) {
  if (!l || !kind_name(l->cfg.flavor, kind)) return 0;
  const mpu_layout_config *c = &l->cfg;
  if (kind == MPU_GROUP_AMAX) return c->fp8;
  if (kind == MPU_GROUP_INTER_PARTIAL_EDP) return c->dist_opt_instances > 1;
  if (kind >= MPU_GROUP_HCP_L0 && kind <= MPU_GROUP_HCP_LAST)
    return (int)kind - MPU_GROUP_HCP_L0 < c->n_hcp;
  if (mpu_group_kind_is_gloo(kind)) return c->gloo;
  return 1;
}

/* With one distributed-optimizer instance the original assigns the partial
 * groups the full ones (the same process group). */
mpu_group_kind mpu_layout_alias_of(const mpu_layout *l, mpu_group_kind kind) {
  if (!l || l->cfg.flavor != MPU_FLAVOR_CORE_019 || l->cfg.dist_opt_instances != 1) return kind;
  switch (kind) {
  case MPU_GROUP_INTRA_PARTIAL_DP_CP: return MPU_GROUP_DP_CP;
  case MPU_GROUP_INTRA_PARTIAL_EDP: return MPU_GROUP_DP_MODULO_EP;
  case MPU_GROUP_INTRA_PARTIAL_DP_CP_GLOO: return MPU_GROUP_DP_CP_GLOO;
  case MPU_GROUP_INTRA_PARTIAL_EDP_GLOO: return MPU_GROUP_EDP_GLOO;
  default: return kind;
  }
}

const mpu_layout_config *mpu_layout_config_of(const mpu_layout *l) { return l ? &l->cfg : NULL; }
int mpu_layout_dp(const mpu_layout *l) { return l ? l->dp : 0; }

void mpu_layout_grid(const mpu_layout *l, int *first, int *size) {
  if (first) *first = l ? l->offset : 0;
  if (size) *size = l ? l->grid : 0;
}

void mpu_layout_experts(const mpu_layout *l, int *etp, int *edp) {
  int t = 0, d = 0;
  if (l && l->cfg.flavor == MPU_FLAVOR_CORE_019) t = l->etp, d = l->edp;
  else if (l && l->cfg.flavor == MPU_FLAVOR_CORE) t = l->cfg.tp, d = l->dp / l->cfg.ep;
  if (etp) *etp = t;
  if (edp) *edp = d;
}

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

/* Split an order string into known, distinct tokens (lower-cased, as the
 * RankGenerator does). core-0.19 words an unknown token as the KeyError its
 * name_to_size lookup raises. */
static mpu_result_t parse_order(const char *order, char tok[NTOKENS][3], int *n, int keyerror) {
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
    if (k == NTOKENS && keyerror)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "KeyError: '%s' (the order (%s) has a token that is not tp, pp, dp, ep "
                        "or cp)",
                        t, order);
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
  MPU_CHECK(parse_order(order, tok, &n, 0));
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

/* ---- core-0.19: two rank generators over one order ----------------------------- */

/* The order a generator is given: "gtp_remat" put after `after` (else after
 * tp, else first), as _inject_gtp_remat_axis does; its size is 1 here, so it
 * moves no rank, but it is in the text of the original's messages. */
static void inject_gtp(const char *order, const char *after, char *out, size_t len) {
  char buf[64];
  snprintf(buf, sizeof buf, "%s", order);
  const char *toks[40];
  int n = 0, pos = 0, anchor = -1, tp = -1;
  char *save = NULL;
  for (char *t = strtok_r(buf, "-", &save); t && n < 40; t = strtok_r(NULL, "-", &save)) {
    if (anchor < 0 && !strcmp(t, after)) anchor = n;
    if (tp < 0 && !strcmp(t, "tp")) tp = n;
    toks[n++] = t;
  }
  pos = anchor >= 0 ? anchor + 1 : tp >= 0 ? tp + 1 : 0;
  size_t m = 0;
  out[0] = 0;
  for (int i = 0; i <= n; i++) {
    if (i == pos) m += (size_t)snprintf(out + m, m < len ? len - m : 0, "%sgtp_remat", m ? "-" : "");
    if (i < n) m += (size_t)snprintf(out + m, m < len ? len - m : 0, "%s%s", m ? "-" : "", toks[i]);
  }
}

/* One RankGenerator's constructor checks, then its mesh: dims = tokens
 * reversed. The original tests `name not in order` on the lower-cased text,
 * in which "tp" always appears (inside "gtp_remat"): a missing tp token is not
 * caught here but by get_ranks later (mpu_layout_create). */
static mpu_result_t generator_019(const char *order, const char *gen_order, const int sizes[NTOKENS],
                                  char tok[NTOKENS][3], int *ntok, mpu_mesh **mesh) {
  static const char *const names[NTOKENS] = {"tp", "pp", "dp", "ep", "cp"};
  char lower[96];
  snprintf(lower, sizeof lower, "%s", gen_order);
  for (char *p = lower; *p; p++)
    if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
  for (int k = 0; k < NTOKENS; k++) /* first the names, then the tokens' lookups */
    if (!strstr(lower, names[k]) && sizes[k] != 1)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "RuntimeError: The size of (%s) is (%d), but you haven'tspecified the "
                        "order (%s).",
                        names[k], sizes[k], gen_order);
  int n = 0;
  MPU_CHECK(parse_order(order, tok, &n, 1));
  for (int k = 0; k < NTOKENS; k++)
    if (tok_index(tok, n, names[k]) < 0) snprintf(tok[n++], 3, "%s", names[k]); /* size 1 */
  int64_t shape[NTOKENS];
  for (int i = 0; i < n; i++) {
    int k = 0;
    while (strcmp(names[k], tok[i])) k++;
    /* a tp hidden in "gtp_remat" is appended here; the caller refuses it as the original does */
    shape[n - 1 - i] = sizes[k];
  }
  *ntok = n;
  return mpu_mesh_create(n, shape, NULL, NULL, mesh);
}

/* The product of the sizes of the tokens before pp: the stride of the
 * pipeline dim, which alone decides the pipeline groups and their order. */
static int64_t pp_stride(char tok[NTOKENS][3], int n, const int64_t *shape_reversed) {
  int64_t s = 1;
  for (int i = 0; i < n && strcmp(tok[i], "pp"); i++) s *= shape_reversed[n - 1 - i];
  return s;
}

static mpu_result_t check_core_019(mpu_layout *l) {
  const mpu_layout_config *c = &l->cfg;
  const char *order = c->order[0] ? c->order : "tp-cp-ep-dp-pp";
  int64_t L = c->local_world_size ? c->local_world_size : c->world_size;
  int64_t model = prod(prod(c->tp, c->pp), c->cp);
  if (L % model != 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "RuntimeError: world_size (%lld) is not divisible by %lld", (long long)L,
                      (long long)model);
  l->grid = (int)L;
  l->offset = c->rank_offset > 0 ? c->rank_offset : 0; /* `if self.rank_offset > 0` */
  l->dp = (int)(L / model);
  if (c->vp && !(c->pp > 1))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "RuntimeError: pipeline-model-parallel size should be greater than 1 with "
                      "interleaved schedule");
  char dense_order[96], expert_order[96];
  inject_gtp(order, "tp", dense_order, sizeof dense_order);
  inject_gtp(order, "ep", expert_order, sizeof expert_order);
  int dense[NTOKENS] = {c->tp, c->pp, l->dp, 1, c->cp};
  MPU_CHECK(generator_019(order, dense_order, dense, l->tok_wo, &l->ntok_wo, &l->wo_ep));
  int etp = l->etp = c->etp ? c->etp : c->tp;
  int64_t etpp = prod(prod(etp, c->ep), c->pp);
  if (L % etpp != 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "RuntimeError: world_size (%lld) is not divisible by "
                      "expert_tensor_model_pipeline_parallel size (%lld)",
                      (long long)L, (long long)etpp);
  l->edp = (int)(L / etpp);
  int expert[NTOKENS] = {etp, c->pp, l->edp, c->ep, 1};
  MPU_CHECK(generator_019(order, expert_order, expert, l->tok_w, &l->ntok_w, &l->w_ep));
  size_t olen = strlen(order);
  if (!(olen >= 2 && !strcmp(order + olen - 2, "pp")) && c->pp != 1 && l->edp != l->dp)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "AssertionError: When not using pp-last rank ordering, the data parallel "
                      "size of the attention and moe layers must be the same");
  char given[NTOKENS][3];
  int ngiven = 0;
  MPU_CHECK(parse_order(order, given, &ngiven, 1));
  int has_tp = tok_index(given, ngiven, "tp") >= 0;
  if (!has_tp && (c->tp > 1 || etp > 1)) /* the generator's sizes miss tp: decompose asserts */
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "AssertionError: the order (%s) has no tp token, so the rank generator's "
                      "sizes do not multiply to the world size (%lld)",
                      order, (long long)L);
  int64_t sd[NTOKENS], se[NTOKENS];
  for (int i = 0; i < l->ntok_wo; i++) mpu_mesh_dim_size(l->wo_ep, i, &sd[i]);
  for (int i = 0; i < l->ntok_w; i++) mpu_mesh_dim_size(l->w_ep, i, &se[i]);
  if (c->pp > 1 && pp_stride(l->tok_wo, l->ntok_wo, sd) != pp_stride(l->tok_w, l->ntok_w, se))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "AssertionError: Pipeline parallel groups are expected to be the same for "
                      "Non-Expert and Expert part (order %s: the dense pipeline stride is %lld, "
                      "the expert one %lld)",
                      order, (long long)pp_stride(l->tok_wo, l->ntok_wo, sd),
                      (long long)pp_stride(l->tok_w, l->ntok_w, se));
  int inst = c->dist_opt_instances;
  if (prod(l->dp, c->cp) % inst != 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "AssertionError: Data parallel size should be divisible by partial DistOpt "
                      "shard factor");
  l->intra_dp_cp = (int)(prod(l->dp, c->cp) / inst);
  if ((int64_t)l->offset + L > c->world_size) /* the first new_group sees the rank */
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "ValueError: The new group's rank should be within the world_size set by "
                      "init_process_group (rank_offset %d + local_world_size %lld > world size %d)",
                      l->offset, (long long)L, c->world_size);
  if (c->n_hcp) {
    int64_t p = 1;
    for (int i = 0; i < c->n_hcp; i++) p = prod(p, c->hcp[i]);
    if (p != c->cp)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "AssertionError: the hierarchical context parallel sizes multiply to "
                        "%lld, not context_parallel_size (%d)",
                        (long long)p, c->cp);
  }
  if (!has_tp) /* get_ranks('tp-gtp_remat-pp'): ordered_token.index('tp') */
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "ValueError: 'tp' is not in list (the order (%s) has no tp token)", order);
  if (l->edp % inst != 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "AssertionError: Expert data parallel size should be divisible by partial "
                      "DistOpt shard factor");
  l->intra_edp = l->edp / inst;
  return MPU_SUCCESS;
}

/* core-0.19's arguments on another flavour, or out of range */
static mpu_result_t check_new_fields(const mpu_layout_config *c) {
  if (c->etp < 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "expert_tensor_parallel_size (%d) must be at least 1 (0: None, = tp)", c->etp);
  if (c->n_hcp < 0 || c->n_hcp > MPU_HCP_MAX_LEVELS)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "hierarchical_context_parallel_sizes has %d levels (want 0..%d)", c->n_hcp,
                      MPU_HCP_MAX_LEVELS);
  for (int i = 0; i < c->n_hcp; i++)
    if (c->hcp[i] < 1)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "hierarchical_context_parallel_sizes[%d] (%d) must be at least 1", i,
                        c->hcp[i]);
  if (c->dist_opt_instances < 1)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "num_distributed_optimizer_instances (%d) must be at least 1",
                      c->dist_opt_instances);
  if (c->local_world_size < 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "local_world_size (%d) must be at least 1 (0: None)", c->local_world_size);
  if (c->gloo != 0 && c->gloo != 1)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "gloo (%d) must be 0 or 1", c->gloo);
  if (c->flavor == MPU_FLAVOR_CORE_019) {
    if (c->sp != 1 || c->fp8)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "the core-0.19 flavor has no DeepSpeed sequence parallelism and builds "
                        "no separate amax groups (use --flavor deepspeed, or cp)");
    if (c->split_rank != -1)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "TypeError: initialize_model_parallel() got an unexpected keyword "
                        "argument 'pipeline_model_parallel_split_rank' (core_v0.19.0 has no "
                        "split rank)");
    return MPU_SUCCESS;
  }
  if (c->etp || c->n_hcp || c->dist_opt_instances != 1 || !c->gloo || c->rank_offset ||
      c->local_world_size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "expert tensor parallelism, hierarchical context parallelism, distributed-"
                      "optimizer instances, gloo, rank offsets and local world sizes are "
                      "core-0.19's (use --flavor core-0.19)");
  return MPU_SUCCESS;
}


mpu_result_t mpu_layout_create(const mpu_layout_config *cfg, mpu_layout **out) {
  static const char fn[] = "mpu_layout_create";
  if (!cfg || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  mpu_layout_config full = MPU_LAYOUT_CONFIG_INIT;
  MPU_CHECK(mpu__take_options(fn, "config", "MPU_LAYOUT_CONFIG_INIT",
                              cfg, sizeof full, MPU_LAYOUT_CONFIG_MIN_SIZE, &full));
  cfg = &full;
  if (cfg->flavor != MPU_FLAVOR_DEEPSPEED && cfg->flavor != MPU_FLAVOR_CORE &&
      cfg->flavor != MPU_FLAVOR_CORE_019)
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
  MPU_CHECK(check_new_fields(cfg));
  mpu_layout *l = calloc(1, sizeof *l);
  if (!l) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  l->cfg = *cfg;
  l->grid = cfg->world_size;
  mpu_result_t r = cfg->flavor == MPU_FLAVOR_DEEPSPEED ? check_deepspeed(cfg, &l->dp)
                   : cfg->flavor == MPU_FLAVOR_CORE    ? check_core(cfg, &l->dp)
                                                       : check_core_019(l);
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

/* ---- "key=value" configs -------------------------------------------------------- */

mpu_result_t mpu_layout_parse_hcp(const char *text, char sep, mpu_layout_config *cfg) {
  static const char fn[] = "hierarchical context parallel sizes";
  if (!text || !cfg) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  int n = 0, sizes[MPU_HCP_MAX_LEVELS] = {0};
  const char *p = text;
  for (;;) {
    char *end;
    if (*p < '0' || *p > '9')
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s '%s': want sizes joined by '%c', like 2%c4",
                        fn, text, sep, sep);
    long x = strtol(p, &end, 10);
    if (x < 1 || x > 1L << 30)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s '%s': %ld is not a size in 1..2^30", fn,
                        text, x);
    if (n == MPU_HCP_MAX_LEVELS)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s '%s': more than %d levels", fn, text,
                        MPU_HCP_MAX_LEVELS);
    sizes[n++] = (int)x;
    if (!*end) break;
    if (*end != sep || !end[1])
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s '%s': want sizes joined by '%c', like 2%c4",
                        fn, text, sep, sep);
    p = end + 1;
  }
  memcpy(cfg->hcp, sizes, sizeof sizes);
  cfg->n_hcp = n;
  return MPU_SUCCESS;
}

mpu_result_t mpu_layout_config_parse(const char *text, mpu_layout_config *cfg) {
  static const char fn[] = "mpu_layout_config_parse";
  if (!text || !cfg) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  const char *p = text;
  static const char *const keys[] = {"world_size", "tp", "pp", "vp", "split_rank", "sp", "cp",
                                     "ep", "fp8", "etp", "dist_opt_instances", "gloo",
                                     "rank_offset", "local_world_size", "flavor", "order", "hcp"};
  enum { NKEYS = sizeof keys / sizeof keys[0], NINTS = NKEYS - 3, SPLIT_RANK = 4 };
  int seen[NKEYS] = {0}, entries = 0;
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
    size_t i = 0;
    while (i < NKEYS && strcmp(k, keys[i])) i++;
    if (i == NKEYS)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: unknown key '%s' (want flavor, world_size, tp, pp, vp, split_rank, "
                        "sp, cp, ep, fp8, order, etp, hcp, dist_opt_instances, gloo, "
                        "rank_offset, local_world_size)",
                        fn, k);
    if (seen[i]++) /* which of two values was meant is not ours to guess */
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s' is given twice", fn, k);
    entries++;
    if (!strcmp(k, "flavor")) {
      MPU_CHECK(mpu_flavor_from_name(v, &c.flavor));
      continue;
    }
    if (!strcmp(k, "order")) {
      snprintf(c.order, sizeof c.order, "%s", v);
      continue;
    }
    if (!strcmp(k, "hcp")) {
      MPU_CHECK(mpu_layout_parse_hcp(v, 'x', &c));
      continue;
    }
    int *fields[NINTS] = {&c.world_size, &c.tp, &c.pp, &c.vp, &c.split_rank, &c.sp, &c.cp, &c.ep,
                          &c.fp8, &c.etp, &c.dist_opt_instances, &c.gloo, &c.rank_offset,
                          &c.local_world_size};
    long lowest = i == SPLIT_RANK ? -1 : 0; /* split_rank -1 is Megatron's None */
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lowest || x > 1L << 30)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s=%s is not a whole number in %ld..2^30%s",
                        fn, k, v, lowest, lowest < 0 ? " (-1: none)" : "");
    *fields[i] = (int)x;
  }
  if (!entries)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: no entries (want key=value entries such as 'world_size=8 tp=2')", fn);
  *cfg = c;
  return MPU_SUCCESS;
}
