/*
 * plan_picture.c - `mpu plan --format svg|html` and the terminal picture: where
 * each rank is drawn, its groups as coloured outlines, and the summary beyond
 * a few thousand ranks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mpu.h"
#include "plan.h"
#include "plan_compare.h"
#include "plan_names.h"

/* Where each rank is drawn: a row per pipeline stage and, in the row, the
 * ranks in ascending order with each tensor-parallel group kept together.
 * tpg[r] is 1 where a tensor group starts. */
static int place_ranks(const mpu_layout *l, int *row, int *col, int *tpg, int *buf) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  int W = c->world_size, *next = calloc((size_t)c->pp, sizeof(int)), nt;
  if (!next) return -1;
  for (int r = 0; r < W; r++) col[r] = -1;
  for (int r = 0; r < W; r++) {
    if (col[r] >= 0) continue;
    mpu_rank_info x = MPU_RANK_INFO_INIT;
    if (mpu_layout_rank_info(l, r, &x) ||
        mpu_layout_group(l, MPU_GROUP_TP, r, buf, (size_t)W, &nt)) {
      free(next);
      return -1;
    }
    for (int i = 0; i < nt; i++) { /* a tensor group lies within one stage */
      row[buf[i]] = x.pp_rank;
      col[buf[i]] = next[x.pp_rank]++;
      tpg[buf[i]] = i == 0;
    }
  }
  free(next);
  return 0;
}

void plan_picture(const mpu_layout *l, int *buf) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  if (c->world_size > 256) {
    printf("\n(picture left out for more than 256 ranks)\n");
    return;
  }
  int W = c->world_size, per = W / c->pp;
  int *row = malloc((size_t)W * sizeof(int)), *col = malloc((size_t)W * sizeof(int));
  int *tpg = malloc((size_t)W * sizeof(int)), *at = malloc((size_t)W * sizeof(int));
  if (!row || !col || !tpg || !at || place_ranks(l, row, col, tpg, buf)) plan_fail("picture");
  for (int r = 0; r < W; r++) at[row[r] * per + col[r]] = r;
  /* a row's ranks at one place of every [...] are the replicas, and the context (core)
   * or sequence (deepspeed) ranks among them when those are not 1 */
  int other = c->flavor == MPU_FLAVOR_DEEPSPEED ? c->sp : c->cp;
  const char *kind = c->flavor == MPU_FLAVOR_DEEPSPEED ? "sequence" : "context";
  printf("\nrank grid: a row per pipeline stage, [tensor-parallel groups] in it; the ranks at one\n"
         "place of every [...] in a row form ");
  if (other > 1)
    printf("a data- and %s-parallel group (%s; the %s and dp groups\n"
           "above divide it), those at one place of every row a pipeline\n",
           kind, c->flavor == MPU_FLAVOR_DEEPSPEED ? "sdp" : "dp_cp",
           c->flavor == MPU_FLAVOR_DEEPSPEED ? "sp" : "cp");
  else
    printf("a data-parallel group, those at one place of every\nrow a pipeline\n");
  for (int s = 0; s < c->pp; s++) {
    printf("  stage %-3d", s);
    for (int i = 0; i < per; i++) {
      int r = at[s * per + i];
      printf("%s%d%s", tpg[r] ? " [" : " ", r, i + 1 == per || tpg[at[s * per + i + 1]] ? "]" : "");
    }
    printf("\n");
  }
  free(row), free(col), free(tpg), free(at);
}

/* "core layout: world 16 = tp 2 x cp 2 x pp 2 x dp 2 (ep 2 within dp), ...":
 * every size, so that the product is the world */
void plan_layout_title(const mpu_layout *l, char *t, size_t len) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  int first, grid, etp, edp;
  mpu_layout_grid(l, &first, &grid);
  mpu_layout_experts(l, &etp, &edp);
  int n = snprintf(t, len, "%s layout: world %d", mpu_flavor_name(c->flavor), c->world_size);
  if (grid != c->world_size) /* the product below is the grid's */
    n += snprintf(t + n, len - n, ", a grid of %d ranks from rank %d", grid, first);
  n += snprintf(t + n, len - n, " = tp %d", c->tp);
  int core = c->flavor != MPU_FLAVOR_DEEPSPEED;
  if (core && c->cp > 1) n += snprintf(t + n, len - n, " x cp %d", c->cp);
  if (c->flavor == MPU_FLAVOR_DEEPSPEED && c->sp > 1)
    n += snprintf(t + n, len - n, " x sp %d", c->sp);
  n += snprintf(t + n, len - n, " x pp %d x dp %d", c->pp, mpu_layout_dp(l));
  if (c->flavor == MPU_FLAVOR_CORE && c->ep > 1)
    n += snprintf(t + n, len - n, " (ep %d within dp)", c->ep);
  if (c->flavor == MPU_FLAVOR_CORE_019 && (c->ep > 1 || c->etp))
    n += snprintf(t + n, len - n, "; experts: etp %d x ep %d x pp %d x edp %d", etp, c->ep, c->pp,
                  edp);
  if (c->vp) n += snprintf(t + n, len - n, ", %d virtual stages per rank", c->vp);
  if (c->split_rank >= 0) n += snprintf(t + n, len - n, ", split rank %d", c->split_rank);
  if (core && c->order[0]) snprintf(t + n, len - n, ", order %s", c->order);
}

/* The layout as a picture (picture.h): rows = stages, frame = tp, colour and
 * number = dp (the page's selector: any kind), and a small grid per kind. */
void plan_layout_picture(const mpu_layout *l, const mpu_group_kind *kinds, int nkinds, int *buf,
                           pic *p) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  int W = c->world_size, *tpg = malloc((size_t)W * sizeof(int));
  if (!tpg || pic_init(p, W, c->pp, W / c->pp) || place_ranks(l, p->row, p->col, tpg, buf))
    plan_fail("picture: out of memory");
  free(tpg);
  plan_layout_title(l, p->title, sizeof p->title);
  snprintf(p->row_caption, sizeof p->row_caption, "row = pipeline stage%s",
           c->vp ? ", with the model chunks it holds (virtual stages)" : "");
  for (int s = 0; s < c->pp; s++) {
    int n = snprintf(p->row_label[s], sizeof p->row_label[s], "stage %d", s);
    for (int v = 0; v < c->vp && v < 4; v++)
      n += snprintf(p->row_label[s] + n, sizeof p->row_label[s] - n, "%s%d",
                    v ? "," : " chunks ", s + v * c->pp);
    if (c->vp > 4) snprintf(p->row_label[s] + n, sizeof p->row_label[s] - n, ",..");
  }
  for (int k = 0; k < nkinds; k++) {
    if (!mpu_layout_has(l, kinds[k])) continue;
    char cap[96];
    pic_kind *pk = pic_add_kind(p, mpu_group_kind_name(c->flavor, kinds[k]),
                                plan_kind_caption(c->flavor, kinds[k], cap, sizeof cap));
    int count = 0, n;
    if (!pk || mpu_layout_num_groups(l, kinds[k], &count)) plan_fail("picture");
    for (int g = 0; g < count; g++) {
      if (mpu_layout_group_at(l, kinds[k], g, buf, (size_t)W + 3, &n)) plan_fail("picture");
      for (int i = 0; i < n; i++) pk->group_of[buf[i]] = g;
    }
    pk->ngroups = count;
    int idx = p->nkinds - 1;
    if (kinds[k] == MPU_GROUP_TP) p->channel[PIC_FRAME] = idx;
    if (kinds[k] == MPU_GROUP_DP) p->channel[PIC_FILL] = idx;
  }
  p->info_caption = "getters (Megatron's parallel_state)";
  p->info_names = plan_getter_names;
  for (int r = 0; r < W; r++) {
    mpu_rank_info x = MPU_RANK_INFO_INIT;
    char *json = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&json, &len);
    if (!f || mpu_layout_rank_info(l, r, &x)) plan_fail("picture");
    plan_print_info_json(f, l, &x);
    fclose(f);
    pic_set_info(p, r, json);
  }
}


void plan_svg_summary(void *arg, FILE *f) {
  const plan_summary *a = arg;
  const mpu_layout_config *c = mpu_layout_config_of(a->l);
  char title[512];
  int line = 0;
  plan_layout_title(a->l, title, sizeof title);
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"1000\" height=\"%d\" "
         "font-family=\"monospace\" font-size=\"13\">\n<rect width=\"100%%\" height=\"100%%\" "
         "fill=\"#fff\"/>\n", 90 + 20 * a->nkinds);
  fprintf(f, "<text x=\"10\" y=\"%d\" font-weight=\"bold\">%s</text>\n", 20 + 20 * line++, title);
  fprintf(f, "<text x=\"10\" y=\"%d\">more than %d ranks: too many to draw; rank 0's "
         "groups (first 12 members)</text>\n", 20 + 20 * line++, PLAN_LIST_MAX_RANKS);
  for (int k = 0; k < a->nkinds; k++) {
    plan_group_peek peek;
    if (!mpu_layout_has(a->l, a->kinds[k]) || plan_group_peek_of(a->l, a->kinds[k], &peek) ||
        !peek.size || peek.up_to)
      continue;
    fprintf(f, "<text x=\"10\" y=\"%d\">%-20s size %-8d [", 20 + 20 * line++,
           mpu_group_kind_name(c->flavor, a->kinds[k]), peek.size);
    for (int i = 0; i < peek.listed; i++) fprintf(f, "%s%d", i ? ", " : "", peek.members[i]);
    fprintf(f, "%s]</text>\n", peek.listed < peek.size ? ", ..." : "");
  }
  fprintf(f, "</svg>\n");
}
