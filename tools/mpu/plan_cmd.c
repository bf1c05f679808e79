/*
 * plan_cmd.c - `mpu plan`: plan a Megatron layout and see it (text, JSON, SVG).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mpu.h"

typedef enum plan_format { PLAN_TEXT, PLAN_JSON, PLAN_SVG } plan_format;

typedef struct plan_opts {
  mpu_layout_config cfg;
  long rank;
  int per_rank;
  int bench;
  plan_format format;
} plan_opts;

static void help(void) {
  printf("usage: mpu plan --world-size W [options]\n"
         "\n"
         "The rank groups Megatron builds for a layout, by arithmetic (no ranks are started):\n"
         "each kind with its groups and a picture of the rank grid, one rank's answers to every\n"
         "parallel_state getter (--rank), or the whole plan as JSON or SVG. An invalid layout\n"
         "exits with status 2 and the original's message for the check that failed.\n"
         "\n"
         "options:\n"
         "  --flavor deepspeed|core   Megatron-DeepSpeed's parallel_state or Megatron-LM core's\n"
         "                            (core_v0.8.0) RankGenerator (default core)\n"
         "  --world-size W            number of ranks (required)\n"
         "  --tp T, --pp P            tensor and pipeline model parallel sizes (default 1)\n"
         "  --vp V                    virtual pipeline stages per rank (default none)\n"
         "  --split-rank K            encoder/decoder pipeline split rank (default none)\n"
         "  --sp S                    deepspeed: DeepSpeed-Ulysses sequence parallel size\n"
         "  --fp8                     deepspeed: build the FP8 amax reduction groups\n"
         "  --cp C, --ep E            core: context and expert parallel sizes\n"
         "  --order ORDER             core: token order, first fastest (default tp-cp-ep-dp-pp)\n"
         "  --rank R                  print rank R's answers to every getter\n"
         "  --per-rank                every rank's answers to every getter (text or json)\n"
         "  --format text|json|svg    output format (default text)\n"
         "  --bench                   time one rank's groups and getters at 4,096 and 1,048,576\n"
         "                            ranks, and initialising the state of 64 thread ranks\n"
         "                            (tp 4, pp 4, dp 4) against every rank creating every group\n"
         "  -h, --help                this text\n");
}

static void parse(int argc, char **argv, plan_opts *o) {
  static const struct option longs[] = {
      {"flavor", required_argument, 0, 'f'}, {"world-size", required_argument, 0, 'w'},
      {"tp", required_argument, 0, 't'},     {"pp", required_argument, 0, 'p'},
      {"vp", required_argument, 0, 'v'},     {"split-rank", required_argument, 0, 'k'},
      {"sp", required_argument, 0, 's'},     {"fp8", no_argument, 0, '8'},
      {"cp", required_argument, 0, 'c'},     {"ep", required_argument, 0, 'e'},
      {"order", required_argument, 0, 'o'},  {"rank", required_argument, 0, 'r'},
      {"per-rank", no_argument, 0, 'R'},     {"format", required_argument, 0, 'F'},
      {"bench", no_argument, 0, 'B'},
      {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
  mpu_layout_config init = MPU_LAYOUT_CONFIG_INIT;
  o->cfg = init;
  o->cfg.world_size = 0;
  o->rank = -1;
  o->per_rank = 0;
  o->bench = 0;
  o->format = PLAN_TEXT;
  opterr = 0;
  optind = 1;
  int c;
  long v;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    int *field = NULL;
    const char *what = NULL;
    switch (c) {
    case 'f':
      if (mpu_flavor_from_name(optarg, &o->cfg.flavor))
        cli_usage_error("plan", "--flavor wants deepspeed or core, not '%s'", optarg);
      break;
    case 'w': field = &o->cfg.world_size, what = "--world-size"; break;
    case 't': field = &o->cfg.tp, what = "--tp"; break;
    case 'p': field = &o->cfg.pp, what = "--pp"; break;
    case 'v': field = &o->cfg.vp, what = "--vp"; break;
    case 'k':
      if (cli_parse_int(optarg, 0, 1 << 30, &v))
        cli_usage_error("plan", "--split-rank wants a stage number >= 0, not '%s'", optarg);
      o->cfg.split_rank = (int)v;
      break;
    case 's': field = &o->cfg.sp, what = "--sp"; break;
    case '8': o->cfg.fp8 = 1; break;
    case 'c': field = &o->cfg.cp, what = "--cp"; break;
    case 'e': field = &o->cfg.ep, what = "--ep"; break;
    case 'o':
      if (!*optarg) cli_usage_error("plan", "--order is empty (want tokens like tp-cp-ep-dp-pp)");
      if (strlen(optarg) >= sizeof o->cfg.order)
        cli_usage_error("plan", "--order '%s' is too long", optarg);
      snprintf(o->cfg.order, sizeof o->cfg.order, "%s", optarg);
      break;
    case 'r':
      if (cli_parse_int(optarg, 0, 1 << 30, &o->rank))
        cli_usage_error("plan", "--rank wants a rank >= 0, not '%s'", optarg);
      break;
    case 'R': o->per_rank = 1; break;
    case 'B': o->bench = 1; break;
    case 'F':
      if (!strcmp(optarg, "text")) o->format = PLAN_TEXT;
      else if (!strcmp(optarg, "json")) o->format = PLAN_JSON;
      else if (!strcmp(optarg, "svg")) o->format = PLAN_SVG;
      else cli_usage_error("plan", "--format wants text, json or svg, not '%s'", optarg);
      break;
    case 'h': help(); exit(0);
    case ':': cli_usage_error("plan", "option '%s' needs a value", argv[optind - 1]);
    default: cli_usage_error("plan", "unknown option '%s'", argv[optind - 1]);
    }
    if (field) {
      if (cli_parse_int(optarg, 1, 1 << 30, &v))
        cli_usage_error("plan", "%s wants a whole number 1..%d, not '%s'", what, 1 << 30, optarg);
      *field = (int)v;
    }
  }
  if (optind < argc) cli_usage_error("plan", "unexpected argument '%s'", argv[optind]);
  if (!o->cfg.world_size && !o->bench) cli_usage_error("plan", "--world-size is required");
}

/* kinds in the order mpu plan lists them, per flavour */
static const mpu_group_kind ds_kinds[] = {
    MPU_GROUP_DP, MPU_GROUP_SP, MPU_GROUP_SDP, MPU_GROUP_MP, MPU_GROUP_TP, MPU_GROUP_PP,
    MPU_GROUP_EMBEDDING, MPU_GROUP_POSITION_EMBEDDING, MPU_GROUP_AMAX};
static const mpu_group_kind core_kinds[] = {
    MPU_GROUP_DP, MPU_GROUP_DP_CP, MPU_GROUP_CP, MPU_GROUP_MP, MPU_GROUP_TP_EP_PP, MPU_GROUP_TP,
    MPU_GROUP_PP, MPU_GROUP_EMBEDDING, MPU_GROUP_POSITION_EMBEDDING, MPU_GROUP_TP_DP_CP,
    MPU_GROUP_TP_DP, MPU_GROUP_TP_CP, MPU_GROUP_TP_EP, MPU_GROUP_EP, MPU_GROUP_DP_MODULO_EP,
    MPU_GROUP_DP_CP_MODULO_EP};

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static void print_ranks(const int *v, int n) {
  for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", v[i]);
}

static void fail(const char *what) {
  fprintf(stderr, "mpu plan: %s: %s\n", what, mpu_last_error());
  exit(1);
}

/* kind's groups, each sorted ascending, as JSON or as text lines */
static void print_groups(const mpu_layout *l, mpu_group_kind kind, int json, int *buf) {
  int count = 0, n;
  if (mpu_layout_has(l, kind) && mpu_layout_num_groups(l, kind, &count)) fail("groups");
  size_t cap = (size_t)mpu_layout_config_of(l)->world_size + 3;
  for (int g = 0; g < count; g++) {
    if (mpu_layout_group_at(l, kind, g, buf, cap, &n)) fail("groups");
    qsort(buf, (size_t)n, sizeof(int), cmp_int);
    if (json) {
      printf("%s[", g ? ", " : "");
      print_ranks(buf, n);
      printf("]");
    } else {
      printf("%s[", g % 8 ? " " : "\n    ");
      print_ranks(buf, n);
      printf("]");
    }
  }
}

static void print_info_json(const mpu_layout *l, const mpu_rank_info *x) {
  int ds = mpu_layout_config_of(l)->flavor == MPU_FLAVOR_DEEPSPEED;
  printf("{\"rank\": %d, \"tp_rank\": %d, \"tp_size\": %d, \"tp_src\": %d, \"pp_rank\": %d, "
         "\"pp_size\": %d, \"pp_first\": %d, \"pp_last\": %d, \"pp_next\": %d, \"pp_prev\": %d, "
         "\"dp_rank\": %d, \"dp_size\": %d, \"dp_src\": %d, \"embedding_global_ranks\": [",
         x->rank, x->tp_rank, x->tp_size, x->tp_src, x->pp_rank, x->pp_size, x->pp_first,
         x->pp_last, x->pp_next, x->pp_prev, x->dp_rank, x->dp_size, x->dp_src);
  print_ranks(x->embedding_global_ranks, x->n_embedding);
  printf("], \"in_embedding_group\": %s, \"position_embedding_global_ranks\": [",
         x->in_embedding_group ? "true" : "false");
  print_ranks(x->position_embedding_global_ranks, x->n_position_embedding);
  printf("], \"in_position_embedding_group\": %s", x->in_position_embedding_group ? "true" : "false");
  if (ds)
    printf(", \"is_first_stage\": %s, \"is_last_stage\": %s, \"sp_rank\": %d, \"sp_size\": %d, "
           "\"sp_src\": %d, \"sdp_rank\": %d, \"sdp_size\": %d, \"mp_rank\": %d, \"mp_size\": %d, "
           "\"stage_before_split\": %s, \"stage_after_split\": %s, \"stage_at_split\": %s",
           x->is_first_stage ? "true" : "false", x->is_last_stage ? "true" : "false", x->sp_rank,
           x->sp_size, x->sp_src, x->sdp_rank, x->sdp_size, x->mp_rank, x->mp_size,
           x->stage_before_split ? "true" : "false", x->stage_after_split ? "true" : "false",
           x->stage_at_split ? "true" : "false");
  else
    printf(", \"dp_cp_rank\": %d, \"dp_cp_size\": %d, \"dp_cp_src\": %d, \"cp_rank\": %d, "
           "\"cp_size\": %d, \"ep_rank\": %d, \"ep_size\": %d, \"tp_ep_rank\": %d, "
           "\"dp_modulo_ep_rank\": %d, \"dp_modulo_ep_size\": %d",
           x->dp_cp_rank, x->dp_cp_size, x->dp_cp_src, x->cp_rank, x->cp_size, x->ep_rank,
           x->ep_size, x->tp_ep_rank, x->dp_modulo_ep_rank, x->dp_modulo_ep_size);
  if (x->vp_size > 0) printf(", \"vp_rank\": %d, \"vp_size\": %d", x->vp_rank, x->vp_size);
  printf("}");
}

static void print_info_text(const mpu_layout *l, const mpu_rank_info *x) {
  int ds = mpu_layout_config_of(l)->flavor == MPU_FLAVOR_DEEPSPEED;
  printf("rank %d\n", x->rank);
  printf("  tensor    rank %d of %d, src %d\n", x->tp_rank, x->tp_size, x->tp_src);
  printf("  pipeline  rank %d of %d, first %d, last %d, next %d, prev %d\n", x->pp_rank,
         x->pp_size, x->pp_first, x->pp_last, x->pp_next, x->pp_prev);
  if (x->vp_size > 0) printf("  virtual   rank %d of %d\n", x->vp_rank, x->vp_size);
  printf("  data      rank %d of %d, src %d\n", x->dp_rank, x->dp_size, x->dp_src);
  printf("  embedding ranks [");
  print_ranks(x->embedding_global_ranks, x->n_embedding);
  printf("], in group: %s\n", x->in_embedding_group ? "yes" : "no");
  printf("  position embedding ranks [");
  print_ranks(x->position_embedding_global_ranks, x->n_position_embedding);
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
    printf("  expert    rank %d of %d (tensor+expert rank %d); data modulo expert rank %d of %d\n",
           x->ep_rank, x->ep_size, x->tp_ep_rank, x->dp_modulo_ep_rank, x->dp_modulo_ep_size);
  }
}

/* stage s's ranks, grouped by tensor group: the rows of the picture */
static int stage_row(const mpu_layout *l, int stage, int *row, int *tpg, int *buf) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  int n = 0, nt;
  for (int r = 0; r < c->world_size; r++) {
    mpu_rank_info x = MPU_RANK_INFO_INIT;
    if (mpu_layout_rank_info(l, r, &x)) fail("rank info");
    if (x.pp_rank != stage) continue;
    int seen = 0;
    for (int i = 0; i < n && !seen; i++) seen = row[i] == r;
    if (seen) continue;
    mpu_layout_group(l, MPU_GROUP_TP, r, buf, (size_t)c->world_size, &nt);
    for (int i = 0; i < nt; i++) {
      tpg[n] = i == 0;
      row[n++] = buf[i];
    }
  }
  return n;
}

static void picture(const mpu_layout *l, int *buf) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  if (c->world_size > 256) {
    printf("\n(picture left out for more than 256 ranks)\n");
    return;
  }
  int *row = malloc((size_t)c->world_size * sizeof(int)), *tpg = malloc((size_t)c->world_size * sizeof(int));
  printf("\nrank grid: a row per pipeline stage, [tensor-parallel groups] in it; the ranks at one\n"
         "place of every [...] in a row form a data-parallel group, those at one place of every\n"
         "row a pipeline\n");
  for (int s = 0; s < c->pp; s++) {
    int n = stage_row(l, s, row, tpg, buf);
    printf("  stage %-3d", s);
    for (int i = 0; i < n; i++) printf("%s%d%s", tpg[i] ? " [" : " ", row[i],
                                       i + 1 == n || tpg[i + 1] ? "]" : "");
    printf("\n");
  }
  free(row);
  free(tpg);
}

#define SVG_MAX_RANKS 4096

/* Beyond a few thousand ranks a picture of every rank is neither readable nor
 * cheap: say the sizes and show rank 0's groups, a bounded amount of work. */
static void svg_summary(const mpu_layout *l, int *buf, const mpu_group_kind *kinds, int nkinds) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  int line = 0;
  printf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"%d\" "
         "font-family=\"monospace\" font-size=\"13\">\n", 90 + 20 * nkinds);
  printf("<text x=\"10\" y=\"%d\">%s layout: world %d = tp %d x pp %d x dp %d", 20 + 20 * line++,
         mpu_flavor_name(c->flavor), c->world_size, c->tp, c->pp, mpu_layout_dp(l));
  if (c->flavor == MPU_FLAVOR_CORE && c->cp > 1) printf(" (dp counts cp %d)", c->cp);
  printf("</text>\n<text x=\"10\" y=\"%d\">more than %d ranks: too many to draw; rank 0's "
         "groups (first 12 members)</text>\n", 20 + 20 * line++, SVG_MAX_RANKS);
  for (int k = 0; k < nkinds; k++) {
    int n = 0;
    if (!mpu_layout_has(l, kinds[k]) ||
        mpu_layout_group(l, kinds[k], 0, buf, (size_t)c->world_size + 3, &n) || !n)
      continue;
    printf("<text x=\"10\" y=\"%d\">%-20s size %-8d [", 20 + 20 * line++,
           mpu_group_kind_name(c->flavor, kinds[k]), n);
    for (int i = 0; i < n && i < 12; i++) printf("%s%d", i ? ", " : "", buf[i]);
    printf("%s]</text>\n", n > 12 ? ", ..." : "");
  }
  printf("</svg>\n");
}

static void svg(const mpu_layout *l, int *buf) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  int per_stage = c->world_size / c->pp, bw = 44, bh = 30, gap = 6, left = 80, top = 40;
  int width = left + per_stage * (bw + gap) + 40, height = top + c->pp * (bh + 24) + 40;
  if (width < 960) width = 960; /* room for the title */
  int *row = malloc((size_t)c->world_size * sizeof(int)), *tpg = malloc((size_t)c->world_size * sizeof(int));
  printf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"monospace\" "
         "font-size=\"12\">\n",
         width, height);
  /* the title states every size, so that their product is the world */
  printf("<text x=\"10\" y=\"20\">%s layout: world %d = tp %d", mpu_flavor_name(c->flavor),
         c->world_size, c->tp);
  if (c->flavor == MPU_FLAVOR_CORE && c->cp > 1) printf(" x cp %d", c->cp);
  if (c->flavor == MPU_FLAVOR_DEEPSPEED && c->sp > 1) printf(" x sp %d", c->sp);
  printf(" x pp %d x dp %d", c->pp, mpu_layout_dp(l));
  if (c->flavor == MPU_FLAVOR_CORE && c->ep > 1) printf(" (ep %d within dp)", c->ep);
  if (c->vp) printf(", %d virtual stages", c->vp);
  printf("; colour = data-parallel group, frame = tensor-parallel group</text>\n");
  for (int s = 0; s < c->pp; s++) {
    int n = stage_row(l, s, row, tpg, buf), y = top + s * (bh + 24);
    printf("<text x=\"10\" y=\"%d\">stage %d</text>\n", y + 20, s);
    int frame_start = 0;
    for (int i = 0; i < n; i++) {
      int x = left + i * (bw + gap), g = 0, nd;
      mpu_rank_info info = MPU_RANK_INFO_INIT;
      mpu_layout_rank_info(l, row[i], &info);
      mpu_layout_group(l, MPU_GROUP_DP, row[i], buf, (size_t)c->world_size, &nd);
      g = buf[0]; /* colour by the data-parallel group's first rank */
      printf("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"hsl(%d,60%%,75%%)\"/>"
             "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text>\n",
             x, y, bw, bh, (g * 47) % 360, x + bw / 2, y + 20, row[i]);
      if (tpg[i]) frame_start = x;
      if (i + 1 == n || tpg[i + 1])
        printf("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"black\" "
               "stroke-width=\"2\"/>\n",
               frame_start - 2, y - 2, x + bw - frame_start + 4, bh + 4);
    }
  }
  printf("</svg>\n");
  free(row);
  free(tpg);
}

/* ---- --bench ------------------------------------------------------------------------ */

#include <time.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

typedef struct init_bench {
  mpu_layout_config cfg;
  int megatron_way;
  double us; /* rank 0's time between two barriers around the initialisation */
} init_bench;

/* Megatron's way: every rank walks every group of every kind; members create
 * it, and as torch's new_group is collective over the whole world, everyone
 * then meets at a world barrier. */
static mpu_result_t every_rank_every_group(mpu_comm *world, const mpu_layout *l, int rank,
                                           mpu_comm **made, int *nmade) {
  int W = mpu_layout_config_of(l)->world_size, *m = malloc(((size_t)W + 3) * sizeof(int)), n,
      count;
  mpu_result_t r = m ? MPU_SUCCESS : MPU_ERR_OUT_OF_MEMORY;
  for (int k = 0; k < MPU_GROUP_KIND_COUNT && !r; k++) {
    if (!mpu_layout_has(l, (mpu_group_kind)k)) continue;
    mpu_layout_num_groups(l, (mpu_group_kind)k, &count);
    for (int g = 0; g < count && !r; g++) {
      mpu_layout_group_at(l, (mpu_group_kind)k, g, m, (size_t)W + 3, &n);
      for (int i = 0; i < n && !r; i++)
        if (m[i] == rank) r = mpu_comm_create_group(world, m, n, &made[(*nmade)++]);
      if (!r) r = mpu_comm_barrier(world);
    }
  }
  free(m);
  return r;
}

static mpu_result_t init_rank(mpu_comm *world, void *arg) {
  init_bench *b = arg;
  int rank;
  mpu_comm_rank(world, &rank);
  mpu_state *s = NULL;
  mpu_comm *made[64];
  int nmade = 0;
  mpu_layout *l = NULL;
  mpu_result_t r = mpu_layout_create(&b->cfg, &l);
  if (r) return r;
  mpu_comm_barrier(world);
  double t0 = now_us();
  r = b->megatron_way ? every_rank_every_group(world, l, rank, made, &nmade)
                      : mpu_state_init(world, &b->cfg, &s);
  if (!r) r = mpu_comm_barrier(world);
  if (rank == 0) b->us = now_us() - t0;
  for (int i = 0; i < nmade; i++) mpu_comm_destroy(made[i]);
  mpu_state_destroy(s);
  mpu_layout_free(l);
  return r;
}

static int bench(void) {
  printf("# mpu plan --bench: one rank's groups and getters (mpu_layout_rank_info), mean of "
         "repeated calls for the last rank\n");
  printf("  %-10s %-44s %12s\n", "flavour", "layout", "time");
  for (int f = 0; f < 2; f++)
    for (int big = 0; big < 2; big++) {
      mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
      c.flavor = f ? MPU_FLAVOR_CORE : MPU_FLAVOR_DEEPSPEED;
      c.world_size = big ? 1 << 20 : 4096;
      c.tp = 8, c.pp = 8;
      if (f) c.cp = 2, c.ep = 4;
      else c.fp8 = 1;
      mpu_layout *l;
      if (mpu_layout_create(&c, &l)) fail("layout");
      mpu_rank_info info = MPU_RANK_INFO_INIT;
      int iters = 20000;
      double t0 = now_us();
      for (int i = 0; i < iters; i++)
        if (mpu_layout_rank_info(l, c.world_size - 1 - (i & 7), &info)) fail("rank info");
      double us = (now_us() - t0) / iters;
      char desc[64];
      snprintf(desc, sizeof desc, "W %d, tp 8, pp 8, %s", c.world_size,
               f ? "cp 2, ep 4" : "fp8");
      printf("  %-10s %-44s %9.2f us\n", mpu_flavor_name(c.flavor), desc, us);
      mpu_layout_free(l);
    }
  printf("\n# initialising the parallel state of 64 thread ranks (tp 4, pp 4, dp 4), threads "
         "backend,\n# rank 0's time between barriers, median of 5\n");
  for (int f = 0; f < 2; f++) {
    double t[2][5];
    for (int way = 0; way < 2; way++)
      for (int rep = 0; rep < 5; rep++) {
        init_bench b = {MPU_LAYOUT_CONFIG_INIT, way, 0};
        b.cfg.flavor = f ? MPU_FLAVOR_CORE : MPU_FLAVOR_DEEPSPEED;
        b.cfg.world_size = 64, b.cfg.tp = 4, b.cfg.pp = 4;
        if (mpu_launch(64, init_rank, &b, NULL, NULL)) fail("init bench");
        t[way][rep] = b.us;
        cli_progress_share((f * 10 + way * 5 + rep + 1) / 20.0);
        cli_progress("mpu plan --bench: state initialisation %d/20", f * 10 + way * 5 + rep + 1);
      }
    for (int way = 0; way < 2; way++) /* median of 5 */
      for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
          if (t[way][j] < t[way][i]) {
            double x = t[way][i];
            t[way][i] = t[way][j];
            t[way][j] = x;
          }
    printf("  %-10s mpu (members only) %10.0f us   every rank every group %10.0f us   (%.1fx)\n",
           f ? "core" : "deepspeed", t[0][2], t[1][2], t[1][2] / t[0][2]);
  }
  cli_progress_done();
  return 0;
}

int cmd_plan(int argc, char **argv) {
  plan_opts o;
  parse(argc, argv, &o);
  if (o.bench) return bench();
  mpu_layout *l = NULL;
  if (mpu_layout_create(&o.cfg, &l)) {
    fprintf(stderr, "mpu plan: %s\n", mpu_last_error());
    return CLI_USAGE_EXIT;
  }
  const mpu_layout_config *c = mpu_layout_config_of(l);
  if (o.rank >= c->world_size) {
    int world = c->world_size;
    mpu_layout_free(l);
    cli_usage_error("plan", "--rank %ld is not a rank of a world of %d", o.rank, world);
  }
  int *buf = malloc(((size_t)c->world_size + 3) * sizeof(int));
  if (!buf) fail("out of memory");
  const mpu_group_kind *kinds = c->flavor == MPU_FLAVOR_DEEPSPEED ? ds_kinds : core_kinds;
  int nkinds = c->flavor == MPU_FLAVOR_DEEPSPEED ? (int)(sizeof ds_kinds / sizeof ds_kinds[0])
                                                 : (int)(sizeof core_kinds / sizeof core_kinds[0]);
  mpu_rank_info info = MPU_RANK_INFO_INIT;
  if (o.format == PLAN_SVG && c->world_size > SVG_MAX_RANKS) {
    svg_summary(l, buf, kinds, nkinds);
  } else if (o.format == PLAN_SVG) {
    svg(l, buf);
  } else if (o.format == PLAN_JSON) {
    printf("{\"flavor\": \"%s\", \"world_size\": %d, \"tp\": %d, \"pp\": %d, \"dp\": %d",
           mpu_flavor_name(c->flavor), c->world_size, c->tp, c->pp, mpu_layout_dp(l));
    if (c->flavor == MPU_FLAVOR_DEEPSPEED) printf(", \"sp\": %d, \"fp8\": %s", c->sp, c->fp8 ? "true" : "false");
    else printf(", \"cp\": %d, \"ep\": %d, \"order\": \"%s\"", c->cp, c->ep, c->order[0] ? c->order : "tp-cp-ep-dp-pp");
    if (c->vp) printf(", \"vp\": %d", c->vp);
    if (c->split_rank >= 0) printf(", \"split_rank\": %d", c->split_rank);
    printf(",\n \"groups\": {");
    for (int k = 0; k < nkinds; k++) {
      printf("%s\n  \"%s\": [", k ? "," : "", mpu_group_kind_name(c->flavor, kinds[k]));
      print_groups(l, kinds[k], 1, buf);
      printf("]");
    }
    printf("\n }");
    if (o.per_rank) {
      printf(",\n \"per_rank\": [");
      for (int r = 0; r < c->world_size; r++) {
        if (mpu_layout_rank_info(l, r, &info)) fail("rank info");
        printf("%s\n  ", r ? "," : "");
        print_info_json(l, &info);
      }
      printf("\n ]");
    }
    if (o.rank >= 0) {
      if (mpu_layout_rank_info(l, (int)o.rank, &info)) fail("rank info");
      printf(",\n \"rank\": ");
      print_info_json(l, &info);
    }
    printf("\n}\n");
  } else {
    printf("%s layout: world %d = tp %d x pp %d x dp %d", mpu_flavor_name(c->flavor),
           c->world_size, c->tp, c->pp, mpu_layout_dp(l));
    if (c->flavor == MPU_FLAVOR_DEEPSPEED) printf(" x sp %d%s", c->sp, c->fp8 ? ", fp8" : "");
    else printf(" x cp %d (ep %d), order %s", c->cp, c->ep, c->order[0] ? c->order : "tp-cp-ep-dp-pp");
    if (c->vp) printf(", vp %d", c->vp);
    if (c->split_rank >= 0) printf(", split rank %d", c->split_rank);
    printf("\n");
    if (o.per_rank) {
      for (int r = 0; r < c->world_size; r++) {
        if (mpu_layout_rank_info(l, r, &info)) fail("rank info");
        printf("\n");
        print_info_text(l, &info);
      }
    } else if (o.rank >= 0) {
      if (mpu_layout_rank_info(l, (int)o.rank, &info)) fail("rank info");
      printf("\n");
      print_info_text(l, &info);
    } else {
      for (int k = 0; k < nkinds; k++) {
        int count = 0;
        if (mpu_layout_has(l, kinds[k])) mpu_layout_num_groups(l, kinds[k], &count);
        printf("\n%s: %d group%s", mpu_group_kind_name(c->flavor, kinds[k]), count,
               count == 1 ? "" : "s");
        if (!mpu_layout_has(l, kinds[k])) printf(" (needs --fp8)");
        print_groups(l, kinds[k], 0, buf);
        printf("\n");
      }
      picture(l, buf);
    }
  }
  free(buf);
  mpu_layout_free(l);
  return 0;
}
