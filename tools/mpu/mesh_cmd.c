/*
 * mesh_cmd.c - `mpu mesh`: see a device mesh's groups, or time its queries.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "mpu.h"
#include "picture.h"

typedef struct mesh_opts {
  int ndim;
  int64_t shape[MPU_MESH_MAX_DIMS];
  char *names[MPU_MESH_MAX_DIMS];
  int named;
  long rank, iters;
  int bench;
  cli_format format;
} mesh_opts;

static void help(void) {
  printf("usage: mpu mesh [options]\n"
         "\n"
         "Show an N-d device mesh: a rank's coordinates and groups, and every group along each\n"
         "dim. With --bench, time building the mesh and answering one rank's queries.\n"
         "\n"
         "options:\n"
         "  --shape A,B,...      mesh shape, up to 8 dims (default 2,4; with --bench 64,128,128)\n"
         "  --names a,b,...      dim names (default: none; the tutorial's are replicate,shard)\n"
         "  --rank R             the rank to describe (default 0; with --bench the last rank)\n"
         "  --bench              time the queries instead of listing groups\n"
         "  --iters N            timed repetitions of each query with --bench (default 100000)\n"
         "  --format FORMAT      text, json, svg or html (default text); svg draws the mesh as a\n"
         "                       grid (a row per index of the leading dims, the last dim\n"
         "                       across, framed; the first dim's groups as colour and number)\n"
         "                       with a small grid per dim; html is that picture in a page\n"
         "                       where a selector colours by any dim and hovering or clicking\n"
         "                       a rank shows its groups and coordinates\n"
         "  -h, --help           this text\n"
         "\n");
  cli_help_exit_status("the mesh cannot be built here (out of memory)");
  printf("\n"
         "examples:\n"
         "  mpu mesh --shape 2,4 --names replicate,shard --rank 5\n"
         "  mpu mesh --shape 2,2,4 --names pp,dp,tp --format html >mesh.html\n"
         "  mpu mesh --bench\n");
}

static void parse(int argc, char **argv, mesh_opts *o) {
  static const struct option longs[] = {
      {"shape", required_argument, 0, 's'}, {"names", required_argument, 0, 'n'},
      {"rank", required_argument, 0, 'r'},  {"bench", no_argument, 0, 'B'},
      {"iters", required_argument, 0, 'i'}, {"format", required_argument, 0, 'F'},
      {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
  memset(o, 0, sizeof *o);
  o->rank = -1;
  o->iters = 100000;
  char *shape = NULL, *names = NULL;
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    switch (c) {
    case 's': shape = optarg; break;
    case 'n': names = optarg; break;
    case 'r':
      if (cli_parse_int(optarg, 0, INT32_MAX, &o->rank))
        cli_usage_error("mesh", "--rank wants a rank >= 0, not '%s'", optarg);
      break;
    case 'B': o->bench = 1; break;
    case 'i':
      if (cli_parse_int(optarg, 1, 100000000, &o->iters))
        cli_usage_error("mesh", "--iters wants 1..1e8, not '%s'", optarg);
      break;
    case 'F':
      if (cli_parse_picture_format(optarg, &o->format))
        cli_usage_error("mesh", "--format wants text, json, svg or html, not '%s'", optarg);
      break;
    case 'h': help(); exit(0);
    case ':': cli_usage_error("mesh", "option '%s' needs a value", argv[optind - 1]);
    default: cli_usage_error("mesh", "unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) cli_usage_error("mesh", "unexpected argument '%s'", argv[optind]);
  static char shape_buf[256], names_buf[512];
  if (shape && (cli_list_ok(shape) || strlen(shape) >= sizeof shape_buf))
    cli_usage_error("mesh", "--shape wants up to 8 sizes separated by single commas, not '%s'", shape);
  if (names && (cli_list_ok(names) || strlen(names) >= sizeof names_buf))
    cli_usage_error("mesh", "--names wants names separated by single commas, not '%s'", names);
  snprintf(shape_buf, sizeof shape_buf, "%s", shape ? shape : o->bench ? "64,128,128" : "2,4");
  long dims[MPU_MESH_MAX_DIMS];
  int nd = 0;
  if (cli_parse_int_list(shape_buf, 1, INT32_MAX, dims, MPU_MESH_MAX_DIMS, &nd))
    cli_usage_error("mesh", "--shape wants up to 8 sizes >= 1, not '%s'", shape);
  for (int d = 0; d < nd; d++) o->shape[o->ndim++] = dims[d];
  char *save = NULL;
  if (!o->ndim) cli_usage_error("mesh", "--shape names no size");
  if (names) {
    snprintf(names_buf, sizeof names_buf, "%s", names);
    int n = 0;
    for (char *t = strtok_r(names_buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
      if (n < MPU_MESH_MAX_DIMS) o->names[n++] = t;
      else n++;
    if (n != o->ndim)
      cli_usage_error("mesh", "--names has %d names for %d dims", n, o->ndim);
    o->named = 1;
  }
}

/* --rank must name a rank of the mesh: one line and exit 2 otherwise */
static void check_rank(mpu_mesh *m, int rank) {
  if (mpu_mesh_contains(m, rank)) return;
  long long numel = (long long)mpu_mesh_numel(m);
  mpu_mesh_free(m);
  cli_usage_error("mesh", "--rank %d is not in a mesh of %lld ranks", rank, numel);
}

static double now_ns(void) { return cli_now() * 1e9; }

static void print_list(const int *v, int64_t n) {
  printf("[");
  for (int64_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", v[i]);
  printf("]");
}

static int bench(const mesh_opts *o) {
  mpu_mesh *m = NULL;
  int reps = 1000;
  double t0 = now_ns();
  for (int i = 0; i < reps; i++) {
    mpu_mesh_free(m);
    m = NULL;
    if (mpu_mesh_create(o->ndim, o->shape, o->named ? (const char *const *)o->names : NULL,
                        NULL, &m)) {
      fprintf(stderr, "mpu mesh: %s\n", mpu_last_error());
      return 1;
    }
  }
  double build_ns = (now_ns() - t0) / reps;
  int64_t numel = mpu_mesh_numel(m);
  int rank = o->rank >= 0 ? (int)o->rank : (int)(numel - 1);
  check_rank(m, rank);
  int64_t coords[MPU_MESH_MAX_DIMS], local, sink = 0;
  t0 = now_ns();
  for (long i = 0; i < o->iters; i++) {
    mpu_mesh_coords(m, rank - (int)(i & 7), coords); /* vary the rank a little */
    sink += coords[0];
  }
  double coords_ns = (now_ns() - t0) / (double)o->iters;
  t0 = now_ns();
  for (long i = 0; i < o->iters; i++) {
    mpu_mesh_local_rank(m, rank - (int)(i & 7), (int)(i % o->ndim), &local);
    sink += local;
  }
  double local_ns = (now_ns() - t0) / (double)o->iters;
  double group_ns[MPU_MESH_MAX_DIMS];
  int64_t gsize[MPU_MESH_MAX_DIMS];
  int *members = malloc((size_t)numel * sizeof(int) < ((size_t)1 << 24) ? (size_t)numel * sizeof(int) : ((size_t)1 << 24));
  size_t cap = (size_t)numel < ((size_t)1 << 22) ? (size_t)numel : ((size_t)1 << 22);
  for (int d = 0; d < o->ndim; d++) {
    long iters = o->iters / 10 + 1;
    t0 = now_ns();
    for (long i = 0; i < iters; i++) {
      if (mpu_mesh_group(m, rank - (int)(i & 7), &d, 1, members, cap, &gsize[d])) {
        fprintf(stderr, "mpu mesh: %s\n", mpu_last_error());
        free(members);
        mpu_mesh_free(m);
        return 1;
      }
      sink += members[0];
    }
    group_ns[d] = (now_ns() - t0) / (double)iters;
  }
  char desc[256];
  mpu_mesh_describe(m, desc, sizeof desc);
  size_t bytes = mpu_mesh_memory(m);
  if (o->format == CLI_JSON) {
    printf("{\"mesh\": ");
    cli_json_string(stdout, desc, 0);
    printf(", \"ranks\": %lld, \"rank\": %d, \"memory_bytes\": %zu, "
           "\"build_us\": %.3f, \"coords_us\": %.4f, \"local_rank_us\": %.4f, \"group_us\": [",
           (long long)numel, rank, bytes, build_ns / 1e3, coords_ns / 1e3, local_ns / 1e3);
    for (int d = 0; d < o->ndim; d++) printf("%s%.4f", d ? ", " : "", group_ns[d] / 1e3);
    printf("], \"group_sizes\": [");
    for (int d = 0; d < o->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)gsize[d]);
    printf("], \"checksum\": %lld}\n", (long long)sink);
  } else {
    printf("# mesh %s: %lld ranks, queries for rank %d (mean of %ld repetitions each)\n", desc,
           (long long)numel, rank, o->iters);
    printf("  %-28s %12s\n", "what", "time");
    printf("  %-28s %9.3f us\n", "build the mesh", build_ns / 1e3);
    printf("  %-28s %9.3f us\n", "coordinates of a rank", coords_ns / 1e3);
    printf("  %-28s %9.3f us\n", "local rank along a dim", local_ns / 1e3);
    for (int d = 0; d < o->ndim; d++) {
      char what[64];
      snprintf(what, sizeof what, "group along dim %d (%lld)", d, (long long)gsize[d]);
      printf("  %-28s %9.3f us\n", what, group_ns[d] / 1e3);
    }
    printf("  %-28s %9zu B  (independent of the number of ranks)\n", "memory held", bytes);
    if (sink == 42) printf("\n"); /* keeps the loops from being optimised away */
  }
  free(members);
  mpu_mesh_free(m);
  return 0;
}

/* The mesh as a picture (picture.h): rows are the indices of the leading
 * dims, the last dim runs across and is framed; the first dim colours the
 * cells (the page's selector any dim); every dim gets its small grid. */
static int draw(const mpu_mesh *m, cli_format format) {
  int nd = mpu_mesh_ndim(m), numel = (int)mpu_mesh_numel(m), *all = NULL;
  int64_t last, size, coords[MPU_MESH_MAX_DIMS], ng, gs;
  mpu_mesh_dim_size(m, nd - 1, &last);
  pic p;
  if (pic_init(&p, numel, numel / (int)last, (int)last) ||
      !(all = malloc((size_t)numel * sizeof(int)))) {
    fprintf(stderr, "mpu mesh: out of memory\n");
    free(all);
    pic_free(&p);
    return 1;
  }
  char desc[256], name[48];
  mpu_mesh_describe(m, desc, sizeof desc);
  snprintf(p.title, sizeof p.title, "device mesh %s: %d rank%s", desc, numel, numel == 1 ? "" : "s");
  snprintf(p.row_caption, sizeof p.row_caption, "row = an index of the leading dims");
  for (int d = 0; d < nd; d++) {
    const char *dn = mpu_mesh_dim_name(m, d);
    if (dn[0]) snprintf(name, sizeof name, "%s", dn);
    else snprintf(name, sizeof name, "dim %d", d);
    char caption[96];
    mpu_mesh_dim_size(m, d, &size);
    snprintf(caption, sizeof caption, "group along dim %d (size %lld)", d, (long long)size);
    pic_kind *k = pic_add_kind(&p, name, caption);
    if (!k || mpu_mesh_groups(m, &d, 1, all, (size_t)numel, &ng, &gs)) {
      fprintf(stderr, "mpu mesh: %s\n", k ? mpu_last_error() : "out of memory");
      free(all);
      pic_free(&p);
      return 1;
    }
    for (int64_t g = 0; g < ng; g++)
      for (int64_t i = 0; i < gs; i++) k->group_of[all[g * gs + i]] = (int)g;
    k->ngroups = (int)ng;
  }
  p.channel[PIC_FRAME] = nd - 1;
  if (nd >= 2) p.channel[PIC_FILL] = 0;
  /* the rank's place as PyTorch's DeviceMesh answers it */
  static const pic_name names[] = {{"rank", "torch.distributed.get_rank()"},
                                   {"coords", "mesh.get_coordinate()"},
                                   {NULL, NULL}};
  p.info_caption = "coordinates";
  p.info_names = names;
  for (int r = 0; r < numel; r++) {
    mpu_mesh_coords(m, r, coords);
    p.row[r] = r / (int)last, p.col[r] = r % (int)last;
    if (p.col[r] == 0) { /* the row's label: its leading coordinates */
      int n = snprintf(p.row_label[p.row[r]], sizeof p.row_label[0], "(");
      for (int d = 0; d + 1 < nd; d++)
        n += snprintf(p.row_label[p.row[r]] + n, sizeof p.row_label[0] - (size_t)n, "%lld, ",
                      (long long)coords[d]);
      snprintf(p.row_label[p.row[r]] + n, sizeof p.row_label[0] - (size_t)n, "*)");
    }
    char *json = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&json, &len);
    if (!f) break;
    fprintf(f, "{\"rank\": %d, \"coords\": [", r);
    for (int d = 0; d < nd; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)coords[d]);
    fprintf(f, "]}");
    fclose(f);
    pic_set_info(&p, r, json);
  }
  if (format == CLI_HTML) pic_html(&p, stdout);
  else pic_svg(&p, stdout);
  free(all);
  pic_free(&p);
  return 0;
}

static int show(const mesh_opts *o) {
  mpu_mesh *m = NULL;
  if (mpu_mesh_create(o->ndim, o->shape, o->named ? (const char *const *)o->names : NULL, NULL,
                      &m))
    cli_usage_error("mesh", "%s", mpu_last_error());
  int64_t numel = mpu_mesh_numel(m);
  if (numel > 4096) {
    mpu_mesh_free(m);
    cli_usage_error("mesh", "a mesh of %lld ranks is too big to list (use --bench)", (long long)numel);
  }
  int rank = o->rank >= 0 ? (int)o->rank : 0;
  check_rank(m, rank); /* every format refuses a rank outside the mesh */
  if (o->format == CLI_SVG || o->format == CLI_HTML) {
    int status = draw(m, o->format);
    mpu_mesh_free(m);
    return status;
  }
  int *all = malloc((size_t)numel * sizeof(int)), *g = malloc((size_t)numel * sizeof(int));
  int64_t coords[MPU_MESH_MAX_DIMS];
  mpu_mesh_coords(m, rank, coords);
  char desc[256];
  mpu_mesh_describe(m, desc, sizeof desc);
  int json = o->format == CLI_JSON;
  if (json) {
    printf("{\"shape\": [");
    for (int d = 0; d < o->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)o->shape[d]);
    printf("], \"names\": [");
    for (int d = 0; d < o->ndim; d++) {
      printf("%s", d ? ", " : "");
      cli_json_string(stdout, mpu_mesh_dim_name(m, d), 0);
    }
    printf("], \"rank\": %d, \"coords\": [", rank);
    for (int d = 0; d < o->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)coords[d]);
    printf("],\n \"dims\": [");
  } else {
    printf("mesh %s, %lld ranks\nrank %d: coordinates (", desc, (long long)numel, rank);
    for (int d = 0; d < o->ndim; d++) printf("%s%lld", d ? ", " : "", (long long)coords[d]);
    printf(")\n");
  }
  for (int d = 0; d < o->ndim; d++) {
    int64_t n, ng, gs;
    mpu_mesh_group(m, rank, &d, 1, g, (size_t)numel, &n);
    mpu_mesh_groups(m, &d, 1, all, (size_t)numel, &ng, &gs);
    const char *name = mpu_mesh_dim_name(m, d);
    if (json) {
      printf("%s\n  {\"dim\": %d, \"name\": ", d ? "," : "", d);
      cli_json_string(stdout, name, 0);
      printf(", \"size\": %lld, \"local_rank\": %lld, \"group\": ", (long long)o->shape[d],
             (long long)coords[d]);
      print_list(g, n);
      printf(", \"groups\": [");
      for (int64_t k = 0; k < ng; k++) {
        printf("%s", k ? ", " : "");
        print_list(all + k * gs, gs);
      }
      printf("]}");
    } else {
      printf("\ndim %d%s%s%s (size %lld): rank %d is local rank %lld of ", d, name[0] ? " '" : "",
             name, name[0] ? "'" : "", (long long)o->shape[d], rank, (long long)coords[d]);
      print_list(g, n);
      printf("\n  all %lld groups:", (long long)ng);
      for (int64_t k = 0; k < ng; k++) {
        printf(k % 8 ? " " : "\n    ");
        print_list(all + k * gs, gs);
      }
      printf("\n");
    }
  }
  if (json) printf("\n ]}\n");
  free(all);
  free(g);
  mpu_mesh_free(m);
  return 0;
}

int cmd_mesh(int argc, char **argv) {
  mesh_opts o;
  parse(argc, argv, &o);
  return o.bench ? bench(&o) : show(&o);
}
