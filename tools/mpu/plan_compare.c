/*
 * plan_compare.c - `mpu plan --compare`: the same sizes in Megatron-DeepSpeed's,
 * Megatron-LM core's and core_v0.19.0's layouts, kind by kind. Up to
 * PLAN_LIST_MAX_RANKS ranks every group is listed; past it each kind says its
 * number of groups, their size and the first rank's group, so a world of a
 * billion ranks answers at once in a page of text (the layout picture's
 * summary does the same).
 */
#include "plan_compare.h"

#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The kinds the three flavours share (by meaning), each flavour's kind for it. */
static const struct {
  const char *what;
  mpu_group_kind kind[3]; /* deepspeed, core, core-0.19; MPU_GROUP_KIND_COUNT: none */
} shared_kinds[] = {
    {"data parallel", {MPU_GROUP_DP, MPU_GROUP_DP, MPU_GROUP_DP}},
    {"tensor parallel", {MPU_GROUP_TP, MPU_GROUP_TP, MPU_GROUP_TP}},
    {"pipeline", {MPU_GROUP_PP, MPU_GROUP_PP, MPU_GROUP_PP}},
    {"model parallel", {MPU_GROUP_MP, MPU_GROUP_MP, MPU_GROUP_MP}},
    {"embedding", {MPU_GROUP_EMBEDDING, MPU_GROUP_EMBEDDING, MPU_GROUP_EMBEDDING}},
    {"sequence parallel (Ulysses)", {MPU_GROUP_SP, MPU_GROUP_KIND_COUNT, MPU_GROUP_KIND_COUNT}},
    {"context parallel", {MPU_GROUP_KIND_COUNT, MPU_GROUP_CP, MPU_GROUP_CP}},
    {"expert parallel", {MPU_GROUP_KIND_COUNT, MPU_GROUP_EP, MPU_GROUP_EP}},
    {"expert data parallel", {MPU_GROUP_KIND_COUNT, MPU_GROUP_DP_MODULO_EP, MPU_GROUP_DP_MODULO_EP}},
};
#define NSHARED (sizeof shared_kinds / sizeof shared_kinds[0])

static const mpu_flavor flavors[3] = {MPU_FLAVOR_DEEPSPEED, MPU_FLAVOR_CORE, MPU_FLAVOR_CORE_019};

int plan_group_peek_of(const mpu_layout *l, mpu_group_kind kind, plan_group_peek *peek) {
  int first, grid, most = mpu_layout_max_group_size(l, kind);
  mpu_layout_grid(l, &first, &grid);
  memset(peek, 0, sizeof *peek);
  peek->rank = first;
  if ((kind == MPU_GROUP_EMBEDDING || kind == MPU_GROUP_POSITION_EMBEDDING) &&
      mpu_layout_config_of(l)->pp > PLAN_PEEK_LIST_MAX) {
    peek->size = most, peek->up_to = 1; /* the library walks the whole pipeline for it */
    return 0;
  }
  int *all = most <= PLAN_PEEK_LIST_MAX ? malloc(((size_t)most + 3) * sizeof(int)) : NULL;
  if (all) { /* list it: a few MB at most (the embedding kinds always are) */
    int n = 0;
    int r = mpu_layout_group(l, kind, first, all, (size_t)most + 3, &n);
    peek->size = n;
    peek->listed = n < PLAN_PEEK_MEMBERS_MAX ? n : PLAN_PEEK_MEMBERS_MAX;
    if (!r) memcpy(peek->members, all, (size_t)peek->listed * sizeof(int));
    free(all);
    return r ? -1 : 0;
  }
  int pos, size, member0; /* huge (or no memory): where it starts and its size, O(dims) */
  if (mpu_layout_locate(l, kind, first, &pos, &size, &member0)) return -1;
  peek->size = size, peek->listed = 1;
  peek->members[0] = member0;
  return 0;
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static void put_ranks(FILE *out, const int *v, int n) {
  for (int i = 0; i < n; i++) fprintf(out, "%s%d", i ? ", " : "", v[i]);
}

/* Every group of kind, each sorted: JSON lists, or text wrapped at 100
 * columns under the flavour's name. buf holds a world's ranks. */
static int list_groups(FILE *out, const mpu_layout *l, mpu_group_kind kind, int json, int *buf,
                       size_t cap) {
  int count = 0, n, col = 12;
  if (mpu_layout_num_groups(l, kind, &count)) return -1;
  for (int g = 0; g < count; g++) {
    if (mpu_layout_group_at(l, kind, g, buf, cap, &n)) return -1;
    qsort(buf, (size_t)n, sizeof(int), cmp_int);
    if (json) {
      fprintf(out, "%s[", g ? ", " : "");
      put_ranks(out, buf, n);
      fprintf(out, "]");
      continue;
    }
    int width = 3;
    for (int i = 0; i < n; i++) width += snprintf(NULL, 0, "%d", buf[i]) + (i ? 2 : 0);
    if (g && col + width > 100) fprintf(out, "\n%12s", ""), col = 12;
    fprintf(out, " [");
    put_ranks(out, buf, n);
    fprintf(out, "]");
    col += width;
  }
  return 0;
}

/* A kind's count, size and first group, for worlds too large to list. */
static int summarise(FILE *out, const mpu_layout *l, mpu_group_kind kind, int json) {
  int count = 0;
  plan_group_peek peek;
  if (mpu_layout_num_groups(l, kind, &count) || plan_group_peek_of(l, kind, &peek)) return -1;
  if (json) {
    fprintf(out, "{\"groups\": %d, \"%s\": %d, \"rank\": %d, \"first_members\": [", count,
            peek.up_to ? "size_at_most" : "size", peek.size, peek.rank);
    put_ranks(out, peek.members, peek.listed);
    fprintf(out, "]}");
    return 0;
  }
  fprintf(out, " %d group%s of %s%d", count, count == 1 ? "" : "s", peek.up_to ? "up to " : "",
          peek.size);
  if (peek.up_to) return 0;
  fprintf(out, "; rank %d's: [", peek.rank);
  put_ranks(out, peek.members, peek.listed);
  fprintf(out, "%s]", peek.listed < peek.size ? ", ..." : "");
  return 0;
}

int plan_compare(FILE *out, FILE *err, const mpu_layout_config *cfg, int json) {
  mpu_layout *l[3] = {NULL, NULL, NULL};
  char why[3][256] = {"", "", ""};
  int any = 0, status = 0;
  for (int f = 0; f < 3; f++) {
    mpu_layout_config c = *cfg;
    c.flavor = flavors[f];
    if (mpu_layout_create(&c, &l[f])) snprintf(why[f], sizeof why[f], "%s", mpu_last_error());
    else any = 1;
  }
  if (!any) {
    fprintf(err, "mpu plan: every flavour refuses it (core-0.19: %s)\n", why[2]);
    return CLI_USAGE_EXIT;
  }
  int W = cfg->world_size, listed = W <= PLAN_LIST_MAX_RANKS;
  size_t cap = listed ? (size_t)W + 3 : 0;
  int *buf = listed ? malloc(cap * sizeof(int)) : NULL;
  if (listed && !buf) {
    for (int f = 0; f < 3; f++) mpu_layout_free(l[f]);
    fprintf(err, "mpu plan: out of memory\n");
    return 1;
  }
  static const char summary[] = "more than %d ranks: too many groups to list; each kind's "
                                "number of groups, their size and the first rank's group";
  if (json) {
    fprintf(out, "{\"world_size\": %d, ", W);
    if (!listed) {
      fprintf(out, "\"summary\": \"");
      fprintf(out, summary, PLAN_LIST_MAX_RANKS);
      fprintf(out, "\", ");
    }
    fprintf(out, "\"flavors\": {");
  } else {
    fprintf(out, "the same sizes in the three flavours (world %d, tp %d, pp %d, cp %d, ep %d, sp %d):\n",
            W, cfg->tp, cfg->pp, cfg->cp, cfg->ep, cfg->sp);
    if (!listed) fprintf(out, summary, PLAN_LIST_MAX_RANKS), fprintf(out, "\n");
  }
  for (int f = 0; f < 3 && json && !status; f++) {
    fprintf(out, "%s\n  \"%s\": ", f ? "," : "", mpu_flavor_name(flavors[f]));
    if (!l[f]) {
      fprintf(out, "{\"refused\": ");
      cli_json_string(out, why[f], 0);
      fprintf(out, "}");
      continue;
    }
    fprintf(out, "{");
    int first = 1;
    for (size_t k = 0; k < NSHARED && !status; k++) {
      mpu_group_kind kind = shared_kinds[k].kind[f];
      if (kind == MPU_GROUP_KIND_COUNT || !mpu_layout_has(l[f], kind)) continue;
      fprintf(out, "%s\"%s\": %s", first ? "" : ", ", shared_kinds[k].what, listed ? "[" : "");
      status = listed ? list_groups(out, l[f], kind, 1, buf, cap) : summarise(out, l[f], kind, 1);
      fprintf(out, "%s", listed ? "]" : "");
      first = 0;
    }
    fprintf(out, "}");
  }
  if (json && !status) fprintf(out, "\n}}\n");
  for (int f = 0; f < 3 && !json; f++) /* a refusal once, not under every kind */
    if (!l[f]) fprintf(out, "\n%s refuses: %s\n", mpu_flavor_name(flavors[f]), why[f]);
  for (size_t k = 0; k < NSHARED && !json && !status; k++) {
    fprintf(out, "\n%s\n", shared_kinds[k].what);
    for (int f = 0; f < 3 && !status; f++) {
      mpu_group_kind kind = shared_kinds[k].kind[f];
      if (!l[f]) continue;
      fprintf(out, "  %-10s", mpu_flavor_name(flavors[f]));
      if (kind == MPU_GROUP_KIND_COUNT) fprintf(out, " (no such group)");
      else if (mpu_layout_has(l[f], kind))
        status = listed ? list_groups(out, l[f], kind, 0, buf, cap) : summarise(out, l[f], kind, 0);
      fprintf(out, "\n");
    }
  }
  if (status) fprintf(err, "mpu plan: groups: %s\n", mpu_last_error());
  free(buf);
  for (int f = 0; f < 3; f++) mpu_layout_free(l[f]);
  return status ? 1 : 0;
}
