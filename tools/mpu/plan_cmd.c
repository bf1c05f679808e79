/*
 * plan_cmd.c - `mpu plan`: plan a Megatron layout and see it (text, JSON, SVG).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plan_names.h"
#include "mpu.h"
#include "picture.h"
#include "plan_compare.h"
#include "schedule_cmd.h"


typedef struct plan_opts {
  mpu_layout_config cfg;
  mpu_schedule_config schedule; /* --schedule: kind set, else not asked */
  int has_schedule;
  int compare;                  /* --compare: the three flavours side by side */
  long rank;
  int per_rank;
  int bench;
  cli_format format;
  char given[64];               /* the options given, by their short letters */
} plan_opts;

static void help(void) {
  printf("usage: mpu plan --world-size W [options]\n"
         "\n"
         "The rank groups Megatron builds for a layout, by arithmetic (no ranks are started):\n"
         "each kind with its groups and a picture of the rank grid, one rank's answers to every\n"
         "parallel_state getter (--rank or --per-rank), or the whole plan as JSON, an SVG\n"
         "picture or an HTML page. An invalid layout exits with status 2 and the original's\n"
         "message for the check that failed; so does an option the chosen plan does not\n"
         "use (--flavor, --rank or --format svg with --compare, --micro-batches without\n"
         "--schedule, ...).\n"
         "\n"
         "options:\n"
         "  --flavor deepspeed|core|core-0.19\n"
         "                            Megatron-DeepSpeed's parallel_state, Megatron-LM core's\n"
         "                            (core_v0.8.0) RankGenerator (default core), or core_v0.19.0's\n"
         "                            two generators (dense and expert)\n"
         "  --world-size W            number of ranks (required)\n"
         "  --tp T, --pp P            tensor and pipeline model parallel sizes (default 1)\n"
         "  --vp V                    virtual pipeline stages per rank (default none)\n"
         "  --split-rank K            encoder/decoder pipeline split rank (default none)\n"
         "  --sp S                    deepspeed: DeepSpeed-Ulysses sequence parallel size\n"
         "  --fp8                     deepspeed: build the FP8 amax reduction groups\n"
         "  --cp C, --ep E            core: context and expert parallel sizes\n"
         "  --order ORDER             core: token order, first fastest (default tp-cp-ep-dp-pp)\n"
         "  --etp T                   core-0.19: expert tensor parallel size (default --tp)\n"
         "  --hcp SIZES               core-0.19: hierarchical context parallel sizes, comma-\n"
         "                            separated, multiplying to --cp (e.g. 2,4)\n"
         "  --dist-opt-instances K    core-0.19: distributed-optimizer instances (default 1)\n"
         "  --no-gloo                 core-0.19: no gloo twins of the data-parallel groups\n"
         "  --rank-offset O           core-0.19: the grid's first rank (default 0)\n"
         "  --local-world-size L      core-0.19: the grid's size (default the world size)\n"
         "  --rank R                  print rank R's answers to every getter\n"
         "  --per-rank                every rank's answers to every getter (text or json)\n"
         "  --format FORMAT           text, json, svg (a picture: rows = pipeline stages,\n"
         "                            frame = tp, colour and number = dp, and a small grid\n"
         "                            for every kind of group with its group numbers) or html\n"
         "                            (the same picture in a page: colour by any kind, hover\n"
         "                            or click a rank to see its groups and its getters by\n"
         "                            Megatron's names); default text\n"
         "  --schedule NAME           a pipeline schedule instead of a layout: no-pipelining,\n"
         "                            1f1b or interleaved (Megatron's schedules.py): each\n"
         "                            stage's order of forwards and backwards and the timeline,\n"
         "                            with the bubble next to (pp-1)/(vp x micro-batches);\n"
         "                            takes --pp, --vp and these (text, json or svg):\n"
         "  --micro-batches M         number of micro-batches (default 1)\n"
         "  --group-size N            interleaved: micro-batches per group on a chunk (default pp)\n"
         "  --forward-only            forwards only (evaluation)\n"
         "  --compare                 the same sizes in the three flavours side by side: each\n"
         "                            kind of group they share, and what a flavour refuses\n"
         "                            (text or json; past 4,096 ranks each kind's number of\n"
         "                            groups, their size and rank 0's group)\n"
         "  --bench                   time one rank's groups and getters at 4,096 and 1,048,576\n"
         "                            ranks, and initialising the state of 64 thread ranks\n"
         "                            (tp 4, pp 4, dp 4) against every rank creating every group\n"
         "                            (text or json)\n"
         "  -h, --help                this text\n"
         "\n");
  cli_help_exit_status("out of memory");
  printf("\n"
         "examples:\n"
         "  mpu plan --world-size 16 --tp 2 --pp 2 --rank 6\n"
         "  mpu plan --flavor core-0.19 --world-size 64 --tp 2 --pp 4 --ep 4 --format html >plan.html\n"
         "  mpu plan --schedule interleaved --pp 4 --vp 2 --micro-batches 8 --format svg >schedule.svg\n"
         "  mpu plan --compare --world-size 16 --tp 2 --pp 2 --cp 2\n");
}

/* The options each way of planning reads, by short letter: one it does not
 * read is refused (exit 2, naming it), never silently dropped. */
#define LAYOUT_SIZES "wtpvks8ceoEHDGOL"
static void refuse_unread(const plan_opts *o, const struct option *longs) {
  const char *mode = "a layout plan", *reads = LAYOUT_SIZES "frRF";
  if (o->bench) mode = "--bench", reads = "BF";
  else if (o->compare) mode = "--compare", reads = LAYOUT_SIZES "CF";
  else if (o->has_schedule) mode = "--schedule", reads = "SpvMNYF";
  for (const char *g = o->given; *g; g++) {
    if (*g == 'h' || strchr(reads, *g)) continue;
    const char *name = "?";
    for (const struct option *l = longs; l->name; l++)
      if (l->val == *g) name = l->name;
    cli_usage_error("plan", "%s does not use --%s%s", mode, name,
                    strchr("MNY", *g) ? " (it is for --schedule)" : "");
  }
  if ((o->compare || o->bench) && o->format != CLI_TEXT && o->format != CLI_JSON)
    cli_usage_error("plan", "%s prints text or json, not --format %s", mode,
                    o->format == CLI_SVG ? "svg" : "html");
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
      {"bench", no_argument, 0, 'B'},        {"etp", required_argument, 0, 'E'},
      {"hcp", required_argument, 0, 'H'},    {"dist-opt-instances", required_argument, 0, 'D'},
      {"no-gloo", no_argument, 0, 'G'},      {"rank-offset", required_argument, 0, 'O'},
      {"local-world-size", required_argument, 0, 'L'},
      {"schedule", required_argument, 0, 'S'}, {"micro-batches", required_argument, 0, 'M'},
      {"group-size", required_argument, 0, 'N'}, {"forward-only", no_argument, 0, 'Y'},
      {"compare", no_argument, 0, 'C'},
      {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
  mpu_layout_config init = MPU_LAYOUT_CONFIG_INIT;
  o->cfg = init;
  o->cfg.world_size = 0;
  o->rank = -1;
  o->per_rank = 0;
  o->bench = 0;
  o->format = CLI_TEXT;
  mpu_schedule_config sc = MPU_SCHEDULE_CONFIG_INIT;
  o->schedule = sc;
  o->has_schedule = 0;
  o->compare = 0;
  memset(o->given, 0, sizeof o->given);
  opterr = 0;
  optind = 1;
  int c;
  long v;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    int *field = NULL;
    const char *what = NULL;
    size_t ngiven = strlen(o->given);
    if (c != ':' && c != '?' && !strchr(o->given, c) && ngiven + 1 < sizeof o->given)
      o->given[ngiven] = (char)c;
    switch (c) {
    case 'f':
      if (mpu_flavor_from_name(optarg, &o->cfg.flavor))
        cli_usage_error("plan", "--flavor wants deepspeed, core or core-0.19, not '%s'", optarg);
      break;
    case 'E': field = &o->cfg.etp, what = "--etp"; break;
    case 'S':
      if (mpu_schedule_from_name(optarg, &o->schedule.kind))
        cli_usage_error("plan", "--schedule wants no-pipelining, 1f1b or interleaved, not '%s'",
                        optarg);
      o->has_schedule = 1;
      break;
    case 'M': field = &o->schedule.microbatches, what = "--micro-batches"; break;
    case 'N': field = &o->schedule.group_size, what = "--group-size"; break;
    case 'Y': o->schedule.forward_only = 1; break;
    case 'D': field = &o->cfg.dist_opt_instances, what = "--dist-opt-instances"; break;
    case 'L': field = &o->cfg.local_world_size, what = "--local-world-size"; break;
    case 'G': o->cfg.gloo = 0; break;
    case 'H':
      if (mpu_layout_parse_hcp(optarg, ',', &o->cfg))
        cli_usage_error("plan", "--hcp: %s", mpu_last_error());
      break;
    case 'O':
      if (cli_parse_int(optarg, -(1L << 30), 1L << 30, &v))
        cli_usage_error("plan", "--rank-offset wants a whole number, not '%s'", optarg);
      o->cfg.rank_offset = (int)v;
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
    case 'C': o->compare = 1; break;
    case 'F':
      if (cli_parse_picture_format(optarg, &o->format))
        cli_usage_error("plan", "--format wants text, json, svg or html, not '%s'", optarg);
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
  refuse_unread(o, longs);
  if (o->has_schedule) {
    if (o->format == CLI_HTML) cli_usage_error("plan", "--schedule draws text, json or svg");
    o->schedule.pp = o->cfg.pp;
    o->schedule.vp = o->cfg.vp ? o->cfg.vp : 1;
    return;
  }
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
static const mpu_group_kind core19_kinds[] = {
    MPU_GROUP_DP, MPU_GROUP_DP_CP, MPU_GROUP_INTRA_PARTIAL_DP_CP, MPU_GROUP_CP,
    MPU_GROUP_HCP_L0, MPU_GROUP_HCP_L0 + 1, MPU_GROUP_HCP_L0 + 2, MPU_GROUP_HCP_L0 + 3,
    MPU_GROUP_HCP_L0 + 4, MPU_GROUP_HCP_L0 + 5, MPU_GROUP_HCP_L0 + 6, MPU_GROUP_HCP_L0 + 7,
    MPU_GROUP_MP, MPU_GROUP_TP, MPU_GROUP_PP, MPU_GROUP_EMBEDDING, MPU_GROUP_POSITION_EMBEDDING,
    MPU_GROUP_TP_DP_CP, MPU_GROUP_TP_DP, MPU_GROUP_TP_CP, MPU_GROUP_EP, MPU_GROUP_ETP,
    MPU_GROUP_TP_EP, MPU_GROUP_TP_EP_PP, MPU_GROUP_DP_MODULO_EP, MPU_GROUP_INTRA_PARTIAL_EDP,
    MPU_GROUP_INTER_PARTIAL_EDP, MPU_GROUP_INTRA_DIST_OPT_INSTANCE, MPU_GROUP_DP_GLOO,
    MPU_GROUP_DP_CP_GLOO, MPU_GROUP_INTRA_PARTIAL_DP_CP_GLOO, MPU_GROUP_EDP_GLOO,
    MPU_GROUP_INTRA_PARTIAL_EDP_GLOO};

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

static void fprint_ranks(FILE *f, const int *v, int n) {
  for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", v[i]);
}

static void print_ranks(const int *v, int n) { fprint_ranks(stdout, v, n); }

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
  fprint_ranks(f, v, n);
  fprintf(f, "]");
}

static void print_info_json_019(FILE *f, const mpu_layout *l, const mpu_rank_info *x) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  int in = x->in_grid, k = 1, n;
  int *buf = malloc(((size_t)c->world_size + 3) * sizeof(int));
  if (!buf) fail("out of memory");
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
    fail("cp group");
  json_key_ranks(f, &k, "cp_global_ranks", buf, n, !in);
  fprintf(f, ", \"hcp_groups\": ");
  if (!in || !c->n_hcp) {
    fprintf(f, "null");
  } else {
    fprintf(f, "[");
    for (int lv = 0; lv < c->n_hcp; lv++) {
      if (mpu_layout_group(l, (mpu_group_kind)(MPU_GROUP_HCP_L0 + lv), x->rank, buf,
                           (size_t)c->world_size + 3, &n))
        fail("hcp group");
      fprintf(f, "%s[", lv ? ", " : "");
      fprint_ranks(f, buf, n);
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

static void print_info_json(FILE *f, const mpu_layout *l, const mpu_rank_info *x) {
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
  fprint_ranks(f, x->embedding_global_ranks, x->n_embedding);
  fprintf(f, "], \"in_embedding_group\": %s, \"position_embedding_global_ranks\": [",
         x->in_embedding_group ? "true" : "false");
  fprint_ranks(f, x->position_embedding_global_ranks, x->n_position_embedding);
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

static void print_info_text(const mpu_layout *l, const mpu_rank_info *x) {
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

static void picture(const mpu_layout *l, int *buf) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  if (c->world_size > 256) {
    printf("\n(picture left out for more than 256 ranks)\n");
    return;
  }
  int W = c->world_size, per = W / c->pp;
  int *row = malloc((size_t)W * sizeof(int)), *col = malloc((size_t)W * sizeof(int));
  int *tpg = malloc((size_t)W * sizeof(int)), *at = malloc((size_t)W * sizeof(int));
  if (!row || !col || !tpg || !at || place_ranks(l, row, col, tpg, buf)) fail("picture");
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
static void layout_title(const mpu_layout *l, char *t, size_t len) {
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
static void layout_picture(const mpu_layout *l, const mpu_group_kind *kinds, int nkinds, int *buf,
                           pic *p) {
  const mpu_layout_config *c = mpu_layout_config_of(l);
  int W = c->world_size, *tpg = malloc((size_t)W * sizeof(int));
  if (!tpg || pic_init(p, W, c->pp, W / c->pp) || place_ranks(l, p->row, p->col, tpg, buf))
    fail("picture: out of memory");
  free(tpg);
  layout_title(l, p->title, sizeof p->title);
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
    if (!pk || mpu_layout_num_groups(l, kinds[k], &count)) fail("picture");
    for (int g = 0; g < count; g++) {
      if (mpu_layout_group_at(l, kinds[k], g, buf, (size_t)W + 3, &n)) fail("picture");
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
    if (!f || mpu_layout_rank_info(l, r, &x)) fail("picture");
    print_info_json(f, l, &x);
    fclose(f);
    pic_set_info(p, r, json);
  }
}

/* Beyond a few thousand ranks a picture of every rank is neither readable nor
 * cheap: say the sizes and show rank 0's groups, a bounded amount of work. */
typedef struct summary_args {
  const mpu_layout *l;
  const mpu_group_kind *kinds;
  int nkinds;
} summary_args;

static void svg_summary(void *arg, FILE *f) {
  const summary_args *a = arg;
  const mpu_layout_config *c = mpu_layout_config_of(a->l);
  char title[512];
  int line = 0;
  layout_title(a->l, title, sizeof title);
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

/* ---- --bench ------------------------------------------------------------------------ */

#include <time.h>

static double now_us(void) { return cli_now() * 1e6; }

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

static int bench(cli_format format) {
  static const char *const rows_text[2][2] = {{"W 4096, tp 8, pp 8, fp8", "W 1048576, tp 8, pp 8, fp8"},
                                              {"W 4096, tp 8, pp 8, cp 2, ep 4",
                                               "W 1048576, tp 8, pp 8, cp 2, ep 4"}};
  double info_us[2][2], mock_us[2][2], init_us[2][2];
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
      info_us[f][big] = (now_us() - t0) / iters;
      mpu_layout_free(l);
    }
  for (int f = 0; f < 2; f++)
    for (int w = 0; w < 2; w++) {
      mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
      c.flavor = f ? MPU_FLAVOR_CORE : MPU_FLAVOR_DEEPSPEED;
      c.world_size = w ? 1 << 24 : 1 << 20;
      c.tp = 8, c.pp = 8;
      if (f) c.cp = 2, c.ep = 4;
      double best = 1e30;
      for (int rep = 0; rep < 5; rep++) {
        mpu_state *st;
        double t0 = now_us();
        if (mpu_state_mock(c.world_size - 1, &c, 1, &st)) fail("mpu_state_mock");
        double t = now_us() - t0;
        mpu_state_destroy(st);
        best = t < best ? t : best;
      }
      mock_us[f][w] = best;
    }
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
    for (int way = 0; way < 2; way++) { /* median of 5 */
      for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
          if (t[way][j] < t[way][i]) {
            double x = t[way][i];
            t[way][i] = t[way][j];
            t[way][j] = x;
          }
      init_us[f][way] = t[way][2];
    }
  }
  cli_progress_done();
  static const char *const mock_text[2][2] = {{"W 1048576, tp 8, pp 8, dp only", "W 16777216, tp 8, pp 8, dp only"},
                                              {"W 1048576, tp 8, pp 8, cp 2, ep 4",
                                               "W 16777216, tp 8, pp 8, cp 2, ep 4"}};
  const char *flavor[2] = {mpu_flavor_name(MPU_FLAVOR_DEEPSPEED), mpu_flavor_name(MPU_FLAVOR_CORE)};
  if (format == CLI_JSON) {
    printf("{\"rank_info_us\": [");
    for (int f = 0; f < 2; f++)
      for (int b = 0; b < 2; b++)
        printf("%s\n  {\"flavor\": \"%s\", \"layout\": \"%s\", \"us\": %.4g}", f || b ? "," : "",
               flavor[f], rows_text[f][b], info_us[f][b]);
    printf("],\n \"state_mock_us\": [");
    for (int f = 0; f < 2; f++)
      for (int w = 0; w < 2; w++)
        printf("%s\n  {\"flavor\": \"%s\", \"layout\": \"%s\", \"us\": %.4g}", f || w ? "," : "",
               flavor[f], mock_text[f][w], mock_us[f][w]);
    printf("],\n \"state_init_64_ranks_us\": [");
    for (int f = 0; f < 2; f++)
      printf("%s\n  {\"flavor\": \"%s\", \"layout\": \"tp 4, pp 4, dp 4\", \"members_only\": "
             "%.4g, \"every_rank_every_group\": %.4g}", f ? "," : "", flavor[f], init_us[f][0],
             init_us[f][1]);
    printf("]}\n");
    return 0;
  }
  printf("# mpu plan --bench: one rank's groups and getters (mpu_layout_rank_info), mean of "
         "repeated calls for the last rank\n");
  printf("  %-10s %-44s %12s\n", "flavour", "layout", "time");
  for (int f = 0; f < 2; f++)
    for (int b = 0; b < 2; b++)
      printf("  %-10s %-44s %9.2f us\n", flavor[f], rows_text[f][b], info_us[f][b]);
  printf("\n# one rank's whole parallel state on the fake backend (mpu_state_mock: every group a\n"
         "# communicator, made from its description), best of 5, last rank\n");
  for (int f = 0; f < 2; f++)
    for (int w = 0; w < 2; w++)
      printf("  %-10s %-44s %9.2f us\n", flavor[f], mock_text[f][w], mock_us[f][w]);
  printf("\n# initialising the parallel state of 64 thread ranks (tp 4, pp 4, dp 4), threads "
         "backend,\n# rank 0's time between barriers, median of 5\n");
  for (int f = 0; f < 2; f++)
    printf("  %-10s mpu (members only) %10.0f us   every rank every group %10.0f us   (%.1fx)\n",
           flavor[f], init_us[f][0], init_us[f][1], init_us[f][1] / init_us[f][0]);
  return 0;
}

int cmd_plan(int argc, char **argv) {
  plan_opts o;
  parse(argc, argv, &o);
  if (o.bench) return bench(o.format);
  if (o.compare) return plan_compare(stdout, stderr, &o.cfg, o.format == CLI_JSON);
  if (o.has_schedule) return plan_schedule(&o.schedule, o.format);
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
  const mpu_group_kind *kinds = core_kinds;
  int nkinds = (int)(sizeof core_kinds / sizeof core_kinds[0]);
  if (c->flavor == MPU_FLAVOR_DEEPSPEED)
    kinds = ds_kinds, nkinds = (int)(sizeof ds_kinds / sizeof ds_kinds[0]);
  mpu_group_kind built[sizeof core19_kinds / sizeof core19_kinds[0]];
  if (c->flavor == MPU_FLAVOR_CORE_019) { /* only the kinds this config builds */
    nkinds = 0;
    for (size_t k = 0; k < sizeof core19_kinds / sizeof core19_kinds[0]; k++)
      if (mpu_layout_has(l, core19_kinds[k])) built[nkinds++] = core19_kinds[k];
    kinds = built;
  }
  int first, grid;
  mpu_layout_grid(l, &first, &grid);
  if ((o.format == CLI_SVG || o.format == CLI_HTML) && (grid != c->world_size || first > 0)) {
    mpu_layout_free(l);
    free(buf);
    cli_usage_error("plan", "--format %s draws a grid that is the whole world (leave out "
                    "--rank-offset and --local-world-size)", o.format == CLI_SVG ? "svg" : "html");
  }
  mpu_rank_info info = MPU_RANK_INFO_INIT;
  if ((o.format == CLI_SVG || o.format == CLI_HTML) && c->world_size > PLAN_LIST_MAX_RANKS) {
    summary_args a = {l, kinds, nkinds};
    char title[512];
    layout_title(l, title, sizeof title);
    if (o.format == CLI_HTML) pic_html_summary(stdout, title, svg_summary, &a);
    else svg_summary(&a, stdout);
  } else if (o.format == CLI_SVG || o.format == CLI_HTML) {
    pic p;
    layout_picture(l, kinds, nkinds, buf, &p);
    if (o.format == CLI_HTML) pic_html(&p, stdout);
    else pic_svg(&p, stdout);
    pic_free(&p);
  } else if (o.format == CLI_JSON) {
    printf("{\"flavor\": \"%s\", \"world_size\": %d, \"tp\": %d, \"pp\": %d, \"dp\": %d",
           mpu_flavor_name(c->flavor), c->world_size, c->tp, c->pp, mpu_layout_dp(l));
    if (c->flavor == MPU_FLAVOR_DEEPSPEED) printf(", \"sp\": %d, \"fp8\": %s", c->sp, c->fp8 ? "true" : "false");
    else {
      printf(", \"cp\": %d, \"ep\": %d, \"order\": ", c->cp, c->ep);
      cli_json_string(stdout, c->order[0] ? c->order : "tp-cp-ep-dp-pp", 0);
    }
    if (c->flavor == MPU_FLAVOR_CORE_019) {
      int etp, edp;
      mpu_layout_experts(l, &etp, &edp);
      printf(", \"etp\": %d, \"edp\": %d, \"hcp\": ", etp, edp);
      if (!c->n_hcp) printf("null");
      for (int i = 0; i < c->n_hcp; i++) printf("%s%d%s", i ? ", " : "[", c->hcp[i], i + 1 == c->n_hcp ? "]" : "");
      printf(", \"dist_opt_instances\": %d, \"gloo\": %s, \"rank_offset\": %d, "
             "\"local_world_size\": %d", c->dist_opt_instances, c->gloo ? "true" : "false",
             c->rank_offset, grid);
    }
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
        print_info_json(stdout, l, &info);
      }
      printf("\n ]");
    }
    if (o.rank >= 0) {
      if (mpu_layout_rank_info(l, (int)o.rank, &info)) fail("rank info");
      printf(",\n \"rank\": ");
      print_info_json(stdout, l, &info);
    }
    printf("\n}\n");
  } else {
    char title[512];
    layout_title(l, title, sizeof title);
    printf("%s\n", title);
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
        mpu_group_kind alias = mpu_layout_alias_of(l, kinds[k]);
        if (alias != kinds[k]) printf(" (the %s groups)", mpu_group_kind_name(c->flavor, alias));
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
