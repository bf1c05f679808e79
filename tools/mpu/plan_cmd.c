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
#include "plan.h"
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

int plan_cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

void plan_fprint_ranks(FILE *f, const int *v, int n) {
  for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", v[i]);
}

void plan_print_ranks(const int *v, int n) { plan_fprint_ranks(stdout, v, n); }

void plan_fail(const char *what) {
  fprintf(stderr, "mpu plan: %s: %s\n", what, mpu_last_error());
  exit(1);
}

/* kind's groups, each sorted ascending, as JSON or as text lines */
void plan_print_groups(const mpu_layout *l, mpu_group_kind kind, int json, int *buf) {
  int count = 0, n;
  if (mpu_layout_has(l, kind) && mpu_layout_num_groups(l, kind, &count)) plan_fail("groups");
  size_t cap = (size_t)mpu_layout_config_of(l)->world_size + 3;
  for (int g = 0; g < count; g++) {
    if (mpu_layout_group_at(l, kind, g, buf, cap, &n)) plan_fail("groups");
    qsort(buf, (size_t)n, sizeof(int), plan_cmp_int);
    if (json) {
      printf("%s[", g ? ", " : "");
      plan_print_ranks(buf, n);
      printf("]");
    } else {
      printf("%s[", g % 8 ? " " : "\n    ");
      plan_print_ranks(buf, n);
      printf("]");
    }
  }
}

int cmd_plan(int argc, char **argv) {
  plan_opts o;
  parse(argc, argv, &o);
  if (o.bench) return plan_bench(o.format);
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
  if (!buf) plan_fail("out of memory");
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
    plan_summary a = {l, kinds, nkinds};
    char title[512];
    plan_layout_title(l, title, sizeof title);
    if (o.format == CLI_HTML) pic_html_summary(stdout, title, plan_svg_summary, &a);
    else plan_svg_summary(&a, stdout);
  } else if (o.format == CLI_SVG || o.format == CLI_HTML) {
    pic p;
    plan_layout_picture(l, kinds, nkinds, buf, &p);
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
      plan_print_groups(l, kinds[k], 1, buf);
      printf("]");
    }
    printf("\n }");
    if (o.per_rank) {
      printf(",\n \"per_rank\": [");
      for (int r = 0; r < c->world_size; r++) {
        if (mpu_layout_rank_info(l, r, &info)) plan_fail("rank info");
        printf("%s\n  ", r ? "," : "");
        plan_print_info_json(stdout, l, &info);
      }
      printf("\n ]");
    }
    if (o.rank >= 0) {
      if (mpu_layout_rank_info(l, (int)o.rank, &info)) plan_fail("rank info");
      printf(",\n \"rank\": ");
      plan_print_info_json(stdout, l, &info);
    }
    printf("\n}\n");
  } else {
    char title[512];
    plan_layout_title(l, title, sizeof title);
    printf("%s\n", title);
    if (o.per_rank) {
      for (int r = 0; r < c->world_size; r++) {
        if (mpu_layout_rank_info(l, r, &info)) plan_fail("rank info");
        printf("\n");
        plan_print_info_text(l, &info);
      }
    } else if (o.rank >= 0) {
      if (mpu_layout_rank_info(l, (int)o.rank, &info)) plan_fail("rank info");
      printf("\n");
      plan_print_info_text(l, &info);
    } else {
      for (int k = 0; k < nkinds; k++) {
        int count = 0;
        if (mpu_layout_has(l, kinds[k])) mpu_layout_num_groups(l, kinds[k], &count);
        printf("\n%s: %d group%s", mpu_group_kind_name(c->flavor, kinds[k]), count,
               count == 1 ? "" : "s");
        mpu_group_kind alias = mpu_layout_alias_of(l, kinds[k]);
        if (alias != kinds[k]) printf(" (the %s groups)", mpu_group_kind_name(c->flavor, alias));
        if (!mpu_layout_has(l, kinds[k])) printf(" (needs --fp8)");
        plan_print_groups(l, kinds[k], 0, buf);
        printf("\n");
      }
      plan_picture(l, buf);
    }
  }
  free(buf);
  mpu_layout_free(l);
  return 0;
}
