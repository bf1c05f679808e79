/*
 * plan_info.c - `mpu plan --rank R`: one rank's groups and getters, as text,
 * as JSON, and as core-0.19's per-rank JSON (Megatron's names).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mpu.h"
#include "plan.h"
#include "plan_names.h"

/* ---- core-0.19's per-rank JSON: Megatron's names, null where it answers None ---- */

static void json_key_int(FILE *f, int *first, const char *key, int v, int null) {
  fprintf(f, "%s\"%s\": ", *first ? "" : ", ", key);
  *first = 0;
  if (null) fprintf(f, "null");
  else fprintf(f, "%d", v);
}

static void json_key_bool(FILE *f, int *first, const char *key, int v) {
  fprintf(f, "%s\"%s\": %s", *first ? "" : ", ", key, v ? "true" : "false");
  *first = 0;
}

static void json_key_ranks(FILE *f, int *first, const char *key, const int *v, int n, int null) {
  fprintf(f, "%s\"%s\": ", *first ? "" : ", ", key);
  *first = 0;
  if (null) {
    fprintf(f, "null");
    return;
  }
  fprintf(f, "[");
  plan_fprint_ranks(f, v, n);
  fprintf(f, "]");
}

static void print_info_json_019(FILE *f, const mpu_layout *l, const mpu_rank_info *x) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  int in = x->in_grid, k = 1, n;
  int *buf = malloc(((size_t)c->world_size + 3) * sizeof(int));
  if (!buf) plan_fail("out of memory");
  fprintf(f, "{");
  json_key_int(f, &k, "rank", x->rank, 0);
  const struct {
    const char *key;
    int v;
  } ints[] = {{"tp_rank", x->tp_rank}, {"tp_size", x->tp_size}, {"tp_src", x->tp_src},
              {"pp_rank", x->pp_rank}, {"pp_size", x->pp_size}, {"pp_first", x->pp_first},
              {"pp_last", x->pp_last}, {"pp_next", x->pp_next}, {"pp_prev", x->pp_prev}};
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    json_key_int(f, &k, ints[i].key, ints[i].v, !in);
  /* is_pipeline_first/last_stage() assert outside the grid (no pipeline group) */
  fprintf(f, ", \"is_first_stage\": %s, \"is_last_stage\": %s",
          !in ? "null" : x->is_first_stage ? "true" : "false",
          !in ? "null" : x->is_last_stage ? "true" : "false");
  json_key_int(f, &k, "vp_rank", x->vp_rank, x->vp_size < 0);
  json_key_int(f, &k, "vp_size", x->vp_size, x->vp_size < 0);
  const struct {
    const char *key;
    int v;
  } more[] = {{"dp_rank", x->dp_rank},
              {"dp_size", x->dp_size},
              {"dp_src", x->dp_src},
              {"dp_cp_rank", x->dp_cp_rank},
              {"dp_cp_size", x->dp_cp_size},
              {"dp_cp_src", x->dp_cp_src},
              {"partial_dp_cp_rank", x->partial_dp_cp_rank},
              {"partial_dp_cp_size", x->partial_dp_cp_size},
              {"replica_dp_rank", x->dp_rank}, /* with_gtp_remat=False: the same group here */
              {"replica_dp_size", x->dp_size},
              {"replica_dp_cp_rank", x->dp_cp_rank},
              {"replica_dp_cp_size", x->dp_cp_size},
              {"cp_rank", x->cp_rank},
              {"cp_size", x->cp_size}};
  for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
    json_key_int(f, &k, more[i].key, more[i].v, !in);
  n = 0;
  if (in && mpu_layout_group(l, MPU_GROUP_CP, x->rank, buf, (size_t)c->world_size + 3, &n))
    plan_fail("cp group");
  json_key_ranks(f, &k, "cp_global_ranks", buf, n, !in);
  fprintf(f, ", \"hcp_groups\": ");
  if (!in || !c->n_hcp) {
    fprintf(f, "null");
  } else {
    fprintf(f, "[");
    for (int lv = 0; lv < c->n_hcp; lv++) {
      if (mpu_layout_group(l, (mpu_group_kind)(MPU_GROUP_HCP_L0 + lv), x->rank, buf,
                           (size_t)c->world_size + 3, &n))
        plan_fail("hcp group");
      fprintf(f, "%s[", lv ? ", " : "");
      plan_fprint_ranks(f, buf, n);
      fprintf(f, "]");
    }
    fprintf(f, "]");
  }
  const struct {
    const char *key;
    int v, null;
  } rest[] = {{"tp_cp_rank", x->tp_cp_rank, 0},
              {"tp_cp_size", x->tp_cp_size, 0},
              {"mp_rank", x->mp_rank, 0},
              {"mp_size", x->mp_size, 0},
              {"mp_src", x->mp_src, 0},
              {"tp_dp_rank", x->tp_dp_rank, 0},
              {"tp_dp_size", x->tp_dp_size, 0},
              {"tp_dp_cp_rank", x->tp_dp_cp_rank, 0},
              {"tp_dp_cp_size", x->tp_dp_cp_size, 0},
              {"ep_rank", x->ep_rank, 0},
              {"ep_size", x->ep_size, 0},
              {"ep_src", x->ep_src, 0},
              {"etp_rank", x->etp_rank, 0},
              {"etp_size", x->etp_size, 0},
              {"etp_ep_rank", x->etp_ep_rank, 0},
              {"etp_ep_size", x->etp_ep_size, 0},
              {"etp_ep_pp_rank", x->etp_ep_pp_rank, 0},
              {"etp_ep_pp_size", x->etp_ep_pp_size, 0},
              {"edp_rank", x->edp_rank, 0},
              {"edp_size", x->edp_size, 0},
              {"partial_edp_rank", x->partial_edp_rank, 0},
              {"partial_edp_size", x->partial_edp_size, 0},
              {"replica_edp_rank", x->edp_rank, 0},
              {"replica_edp_size", x->edp_size, 0},
              {"intra_dist_opt_rank", x->intra_dist_opt_rank, 0},
              {"intra_dist_opt_size", x->intra_dist_opt_size, 0},
              {"inter_dist_opt_rank", x->inter_dist_opt_rank, x->inter_dist_opt_size < 0},
              {"inter_dist_opt_size", x->inter_dist_opt_size, x->inter_dist_opt_size < 0}};
  for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
    json_key_int(f, &k, rest[i].key, rest[i].v, !in || rest[i].null);
  json_key_ranks(f, &k, "embedding_global_ranks", x->embedding_global_ranks, x->n_embedding,
                 x->n_embedding == 0);
  json_key_bool(f, &k, "in_embedding_group", x->in_embedding_group);
  json_key_ranks(f, &k, "position_embedding_global_ranks", x->position_embedding_global_ranks,
                 x->n_position_embedding, x->n_position_embedding == 0);
  json_key_bool(f, &k, "in_position_embedding_group", x->in_position_embedding_group);
  fprintf(f, "}");
  free(buf);
}

void plan_print_info_json(FILE *f, const mpu_layout *l, const mpu_rank_info *x) {
  if (mpu_layout_config_of(l)->flavor == MPU_FLAVOR_CORE_019) {
    print_info_json_019(f, l, x);
    return;
  }
  int ds = mpu_layout_config_of(l)->flavor == MPU_FLAVOR_DEEPSPEED;
  fprintf(f, "{\"rank\": %d, \"tp_rank\": %d, \"tp_size\": %d, \"tp_src\": %d, \"pp_rank\": %d, "
         "\"pp_size\": %d, \"pp_first\": %d, \"pp_last\": %d, \"pp_next\": %d, \"pp_prev\": %d, "
         "\"dp_rank\": %d, \"dp_size\": %d, \"dp_src\": %d, \"embedding_global_ranks\": [",
         x->rank, x->tp_rank, x->tp_size, x->tp_src, x->pp_rank, x->pp_size, x->pp_first,
         x->pp_last, x->pp_next, x->pp_prev, x->dp_rank, x->dp_size, x->dp_src);
  plan_fprint_ranks(f, x->embedding_global_ranks, x->n_embedding);
  fprintf(f, "], \"in_embedding_group\": %s, \"position_embedding_global_ranks\": [",
         x->in_embedding_group ? "true" : "false");
  plan_fprint_ranks(f, x->position_embedding_global_ranks, x->n_position_embedding);
  fprintf(f, "], \"in_position_embedding_group\": %s", x->in_position_embedding_group ? "true" : "false");
  if (ds)
    fprintf(f, ", \"is_first_stage\": %s, \"is_last_stage\": %s, \"sp_rank\": %d, \"sp_size\": %d, "
           "\"sp_src\": %d, \"sdp_rank\": %d, \"sdp_size\": %d, \"mp_rank\": %d, \"mp_size\": %d, "
           "\"stage_before_split\": %s, \"stage_after_split\": %s, \"stage_at_split\": %s",
           x->is_first_stage ? "true" : "false", x->is_last_stage ? "true" : "false", x->sp_rank,
           x->sp_size, x->sp_src, x->sdp_rank, x->sdp_size, x->mp_rank, x->mp_size,
           x->stage_before_split ? "true" : "false", x->stage_after_split ? "true" : "false",
           x->stage_at_split ? "true" : "false");
  else
    fprintf(f, ", \"dp_cp_rank\": %d, \"dp_cp_size\": %d, \"dp_cp_src\": %d, \"cp_rank\": %d, "
           "\"cp_size\": %d, \"ep_rank\": %d, \"ep_size\": %d, \"tp_ep_rank\": %d, "
           "\"dp_modulo_ep_rank\": %d, \"dp_modulo_ep_size\": %d",
           x->dp_cp_rank, x->dp_cp_size, x->dp_cp_src, x->cp_rank, x->cp_size, x->ep_rank,
           x->ep_size, x->tp_ep_rank, x->dp_modulo_ep_rank, x->dp_modulo_ep_size);
  if (x->vp_size > 0) fprintf(f, ", \"vp_rank\": %d, \"vp_size\": %d", x->vp_rank, x->vp_size);
  fprintf(f, "}");
}

void plan_print_info_text(const mpu_layout *l, const mpu_rank_info *x) {
  int ds = mpu_layout_config_of(l)->flavor == MPU_FLAVOR_DEEPSPEED;
  int c19 = mpu_layout_config_of(l)->flavor == MPU_FLAVOR_CORE_019;
  printf("rank %d\n", x->rank);
  if (!x->in_grid) {
    printf("  outside the grid: in no group\n");
    return;
  }
  printf("  tensor    rank %d of %d, src %d\n", x->tp_rank, x->tp_size, x->tp_src);
  printf("  pipeline  rank %d of %d, first %d, last %d, next %d, prev %d\n", x->pp_rank,
         x->pp_size, x->pp_first, x->pp_last, x->pp_next, x->pp_prev);
  if (x->vp_size > 0) printf("  virtual   rank %d of %d\n", x->vp_rank, x->vp_size);
  printf("  data      rank %d of %d, src %d\n", x->dp_rank, x->dp_size, x->dp_src);
  printf("  embedding ranks [");
  plan_print_ranks(x->embedding_global_ranks, x->n_embedding);
  printf("], in group: %s\n", x->in_embedding_group ? "yes" : "no");
  printf("  position embedding ranks [");
  plan_print_ranks(x->position_embedding_global_ranks, x->n_position_embedding);
  printf("], in group: %s\n", x->in_position_embedding_group ? "yes" : "no");
  if (ds) {
    printf("  first stage %s, last stage %s (ignoring virtual stages)\n",
           x->is_first_stage ? "yes" : "no", x->is_last_stage ? "yes" : "no");
    printf("  sequence  rank %d of %d, src %d; sequence-data rank %d of %d\n", x->sp_rank,
           x->sp_size, x->sp_src, x->sdp_rank, x->sdp_size);
    printf("  model     rank %d of %d\n", x->mp_rank, x->mp_size);
    printf("  split     before %s, after %s, at %s\n", x->stage_before_split ? "yes" : "no",
           x->stage_after_split ? "yes" : "no", x->stage_at_split ? "yes" : "no");
  } else {
    printf("  data+context rank %d of %d, src %d; context rank %d of %d\n", x->dp_cp_rank,
           x->dp_cp_size, x->dp_cp_src, x->cp_rank, x->cp_size);
    if (!c19) {
      printf("  expert    rank %d of %d (tensor+expert rank %d); data modulo expert rank %d of %d\n",
             x->ep_rank, x->ep_size, x->tp_ep_rank, x->dp_modulo_ep_rank, x->dp_modulo_ep_size);
      return;
    }
    printf("  expert    rank %d of %d, src %d; expert tensor rank %d of %d\n", x->ep_rank,
           x->ep_size, x->ep_src, x->etp_rank, x->etp_size);
    printf("  expert tensor+expert rank %d of %d; +pipeline rank %d of %d\n", x->etp_ep_rank,
           x->etp_ep_size, x->etp_ep_pp_rank, x->etp_ep_pp_size);
    printf("  expert data rank %d of %d; its instance share rank %d of %d\n", x->edp_rank,
           x->edp_size, x->partial_edp_rank, x->partial_edp_size);
    printf("  data+context instance share rank %d of %d\n", x->partial_dp_cp_rank,
           x->partial_dp_cp_size);
    printf("  distributed-optimizer instance rank %d of %d", x->intra_dist_opt_rank,
           x->intra_dist_opt_size);
    if (x->inter_dist_opt_size > 0)
      printf("; across instances rank %d of %d", x->inter_dist_opt_rank, x->inter_dist_opt_size);
    printf("\n  model     rank %d of %d, src %d\n", x->mp_rank, x->mp_size, x->mp_src);
  }
}
