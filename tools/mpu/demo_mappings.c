/*
 * demo_mappings.c - `mpu demo mappings`: the walkthrough of Megatron-DeepSpeed's
 * mpu/mappings.py, Megatron's
 * mappings.py on thread ranks (deepspeed layout, default 8 ranks, tp 2, pp 2):
 * each primitive and each region's forward and backward, with what every
 * rank holds, as the walkthrough's printouts (text) or one JSON object keyed by rank.
 */
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cli.h"
#include "mpu.h"

enum { SC_REDUCE, SC_GATHER, SC_SPLIT, SC_COPY_TO, SC_REDUCE_FROM, SC_SCATTER_TO, SC_GATHER_FROM,
       SC_SP_SCATTER, SC_SP_GATHER, SC_SP_GATHER_NO_TP, SC_SP_REDUCE_SCATTER, SC_COUNT };

static const char *const sc_names[SC_COUNT] = {
    "reduce", "gather", "split", "copy_to", "reduce_from", "scatter_to", "gather_from",
    "sp_scatter", "sp_gather", "sp_gather_no_tp_output_grad", "sp_reduce_scatter"};

#define OUT_MAX 4096

typedef struct mappings_run {
  int world, tp, pp;
  tool_backend backend;
  cli_format format;
  char (*json)[SC_COUNT][OUT_MAX]; /* [rank][scenario] */
  char (*text)[SC_COUNT][OUT_MAX];
} mappings_run;

/* ---- formatting ------------------------------------------------------------------------ */

typedef struct buf {
  char *p;
  size_t len, used;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...) {
  if (b->used >= b->len) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b->p + b->used, b->len - b->used, fmt, ap);
  va_end(ap);
  if (n > 0) b->used += (size_t)n;
}

/* A tensor's values: JSON nested lists, or torch's "tensor([[1., 2.]])" text. */
static void values(buf *b, const mpu_tensor *t, int torch) {
  const float *v = t->data;
  int rows = t->ndim == 2 ? (int)t->shape[0] : 1, cols = (int)t->shape[t->ndim - 1];
  if (torch) put(b, "tensor(");
  if (t->ndim == 2) put(b, "[");
  for (int i = 0; i < rows; i++) {
    put(b, "%s[", i ? ", " : "");
    for (int j = 0; j < cols; j++) {
      float x = v[i * cols + j];
      if (torch && x == floorf(x)) put(b, "%s%.0f.", j ? ", " : "", x);
      else put(b, "%s%.9g", j ? ", " : "", x);
    }
    put(b, "]");
  }
  if (t->ndim == 2) put(b, "]");
  if (torch) put(b, ")");
}

/* ---- the scenarios on one rank --------------------------------------------------------- */

typedef struct rank_ctx {
  mappings_run *run;
  int rank, tr, T;
  mpu_comm *tp;
} rank_ctx;

static mpu_tensor vec(float *data, int n) {
  mpu_tensor t;
  int64_t s[1] = {n};
  mpu_tensor_init(&t, data, MPU_FLOAT32, 1, s);
  return t;
}

static mpu_tensor mat(float *data, int rows, int cols) {
  mpu_tensor t;
  int64_t s[2] = {rows, cols};
  mpu_tensor_init(&t, data, MPU_FLOAT32, 2, s);
  return t;
}

#define TRY(call)                      \
  do {                                 \
    mpu_result_t r_ = (call);          \
    if (r_) return r_;                 \
  } while (0)

static mpu_result_t primitives(rank_ctx *c, buf *j, buf *t, int sc) {
  float in[64], out[64];
  int T = c->T, r = c->rank;
  mpu_tensor x, y;
  mpu_primitive prim = sc == SC_REDUCE ? MPU_PRIM_ALL_REDUCE
                       : sc == SC_GATHER ? MPU_PRIM_GATHER_LAST
                                         : MPU_PRIM_SPLIT_LAST;
  if (sc == SC_SPLIT) {
    for (int i = 0; i < T; i++) in[i] = (float)i;
    x = vec(in, T), y = vec(out, 1);
  } else {
    in[0] = (float)r;
    x = vec(in, 1), y = vec(out, sc == SC_GATHER ? T : 1);
  }
  TRY(mpu_primitive_run(prim, c->tp, &x, &y));
  put(j, "{\"input\": "), values(j, &x, 0), put(j, ", \"output\": "), values(j, &y, 0), put(j, "}");
  put(t, "rank %d > Before %s: ", r, sc_names[sc]), values(t, &x, 1);
  put(t, "  After %s: ", sc_names[sc]), values(t, &y, 1);
  return MPU_SUCCESS;
}

static mpu_result_t tp_regions(rank_ctx *c, buf *j, buf *t, int sc) {
  int T = c->T, r = c->rank;
  float xv[64], yv[64], gy[64], gx[64];
  float fr = (float)r;
  mpu_tensor x, y, grad_y, grad_x;
  switch (sc) {
  case SC_COPY_TO: { /* loss = r * x without, then with, the region */
    xv[0] = fr;
    x = vec(xv, 1), y = vec(yv, 1), grad_y = vec(gy, 1), grad_x = vec(gx, 1);
    TRY(mpu_region_forward(MPU_COPY_TO_TP, c->tp, &x, &y));
    gy[0] = fr; /* d(r * y)/dy */
    TRY(mpu_region_backward(MPU_COPY_TO_TP, c->tp, &grad_y, &grad_x, 0));
    put(j, "{\"input\": [%.9g], \"output\": ", xv[0]), values(j, &y, 0);
    put(j, ", \"loss\": %.9g, \"no_copy_grad\": [%.9g], \"copy_grad\": ", fr * yv[0], fr);
    values(j, &grad_x, 0), put(j, "}");
    put(t, "rank %d > x: tensor([%.0f.])  grad without copy: tensor([%.0f.])  with copy_to: ", r,
        fr, fr);
    values(t, &grad_x, 1);
    return MPU_SUCCESS;
  }
  case SC_REDUCE_FROM: { /* z = reduce_from(r * x), loss = 2 z */
    xv[0] = fr;
    float u[1] = {fr * fr};
    mpu_tensor uu = vec(u, 1);
    y = vec(yv, 1), grad_y = vec(gy, 1), grad_x = vec(gx, 1);
    TRY(mpu_region_forward(MPU_REDUCE_FROM_TP, c->tp, &uu, &y));
    gy[0] = 2;
    TRY(mpu_region_backward(MPU_REDUCE_FROM_TP, c->tp, &grad_y, &grad_x, 0));
    gx[0] *= fr; /* through u = r * x */
    put(j, "{\"input\": [%.9g], \"z\": ", fr), values(j, &y, 0);
    put(j, ", \"loss\": %.9g, \"x_grad\": ", 2 * yv[0]), values(j, &grad_x, 0), put(j, "}");
    put(t, "rank %d > z: ", r), values(t, &y, 1);
    put(t, "  loss: %.0f.  x grad: ", 2 * yv[0]), values(t, &grad_x, 1);
    return MPU_SUCCESS;
  }
  case SC_SCATTER_TO: { /* x = [1..T], s = scatter_to(x), loss = r * s */
    for (int i = 0; i < T; i++) xv[i] = (float)(i + 1);
    x = vec(xv, T), y = vec(yv, 1), grad_y = vec(gy, 1), grad_x = vec(gx, T);
    TRY(mpu_region_forward(MPU_SCATTER_TO_TP, c->tp, &x, &y));
    gy[0] = fr;
    TRY(mpu_region_backward(MPU_SCATTER_TO_TP, c->tp, &grad_y, &grad_x, 0));
    put(j, "{\"input\": "), values(j, &x, 0), put(j, ", \"s\": "), values(j, &y, 0);
    put(j, ", \"loss\": %.9g, \"x_grad\": ", fr * yv[0]), values(j, &grad_x, 0), put(j, "}");
    put(t, "rank %d > s: ", r), values(t, &y, 1);
    put(t, "  loss: %.0f.  x grad: ", fr * yv[0]), values(t, &grad_x, 1);
    return MPU_SUCCESS;
  }
  default: { /* gather_from: g = gather_from([r]), loss = sum(r * g) */
    xv[0] = fr;
    x = vec(xv, 1), y = vec(yv, T), grad_y = vec(gy, T), grad_x = vec(gx, 1);
    TRY(mpu_region_forward(MPU_GATHER_FROM_TP, c->tp, &x, &y));
    double loss = 0;
    for (int i = 0; i < T; i++) loss += (double)fr * yv[i], gy[i] = fr;
    TRY(mpu_region_backward(MPU_GATHER_FROM_TP, c->tp, &grad_y, &grad_x, 0));
    put(j, "{\"input\": [%.9g], \"g\": ", fr), values(j, &y, 0);
    put(j, ", \"loss\": %.9g, \"x_grad\": ", (float)loss), values(j, &grad_x, 0), put(j, "}");
    put(t, "rank %d > g: ", r), values(t, &y, 1);
    put(t, "  loss: %.0f.  x grad: ", loss), values(t, &grad_x, 1);
    return MPU_SUCCESS;
  }
  }
}

/* x has rows = max(4, T), 3 columns, x[i][j] = 100 r + 10 i + j; loss = sum(w * out)
 * with w[i][j] = (r + 1)(i + 1) + j over the output's shape. */
static mpu_result_t sp_regions(rank_ctx *c, buf *j, buf *t, int sc) {
  int T = c->T, r = c->rank, rows = T > 4 ? T : 4;
  mpu_region reg = sc == SC_SP_SCATTER ? MPU_SCATTER_TO_SP
                   : sc == SC_SP_REDUCE_SCATTER ? MPU_REDUCE_SCATTER_TO_SP
                                                : MPU_GATHER_FROM_SP;
  int flags = sc == SC_SP_GATHER_NO_TP ? MPU_NO_TP_OUTPUT_GRAD : 0;
  int out_rows = reg == MPU_GATHER_FROM_SP ? rows * T : rows / T;
  float *xv = calloc((size_t)rows * 3, sizeof(float)), *ov = calloc((size_t)out_rows * 3, sizeof(float));
  float *wv = calloc((size_t)out_rows * 3, sizeof(float)), *gv = calloc((size_t)rows * 3, sizeof(float));
  mpu_result_t res = MPU_ERR_OUT_OF_MEMORY;
  if (!xv || !ov || !wv || !gv) goto out;
  for (int i = 0; i < rows; i++)
    for (int k = 0; k < 3; k++) xv[i * 3 + k] = (float)(100 * r + 10 * i + k);
  for (int i = 0; i < out_rows; i++)
    for (int k = 0; k < 3; k++) wv[i * 3 + k] = (float)((r + 1) * (i + 1) + k);
  mpu_tensor x = mat(xv, rows, 3), o = mat(ov, out_rows, 3), w = mat(wv, out_rows, 3),
             g = mat(gv, rows, 3);
  if ((res = mpu_region_forward(reg, c->tp, &x, &o))) goto out;
  double loss = 0;
  for (int i = 0; i < out_rows * 3; i++) loss += (double)wv[i] * ov[i];
  if ((res = mpu_region_backward(reg, c->tp, &w, &g, flags))) goto out;
  put(j, "{\"input\": "), values(j, &x, 0), put(j, ", \"output\": "), values(j, &o, 0);
  put(j, ", \"weight\": "), values(j, &w, 0), put(j, ", \"loss\": %.17g, \"input_grad\": ", loss);
  values(j, &g, 0), put(j, "}");
  put(t, "rank %d > output: ", r), values(t, &o, 1);
  put(t, "\n          loss: %.0f  input grad: ", loss), values(t, &g, 1);
out:
  free(xv);
  free(ov);
  free(wv);
  free(gv);
  return res;
}

static mpu_result_t mappings_rank(mpu_state *s, void *arg) {
  mappings_run *run = arg;
  rank_ctx c = {run, 0, 0, 0, NULL};
  mpu_comm_rank(mpu_state_world(s), &c.rank);
  TRY(mpu_state_tp_rank(s, &c.tr));
  TRY(mpu_state_tp_size(s, &c.T));
  TRY(mpu_state_comm(s, MPU_GROUP_TP, &c.tp));
  for (int sc = 0; sc < SC_COUNT; sc++) {
    buf j = {run->json[c.rank][sc], OUT_MAX, 0}, t = {run->text[c.rank][sc], OUT_MAX, 0};
    mpu_result_t r = sc <= SC_SPLIT ? primitives(&c, &j, &t, sc)
                     : sc <= SC_GATHER_FROM ? tp_regions(&c, &j, &t, sc)
                                            : sp_regions(&c, &j, &t, sc);
    if (r) return r;
    TRY(mpu_comm_barrier(mpu_state_world(s)));
  }
  if (tool_is_process(run->backend)) { /* every process filled its own row: bring them all to each */
    TRY(mpu_comm_all_gather(mpu_state_world(s), run->json[c.rank], run->json, sizeof run->json[0],
                            MPU_UINT8));
    TRY(mpu_comm_all_gather(mpu_state_world(s), run->text[c.rank], run->text, sizeof run->text[0],
                            MPU_UINT8));
  }
  return MPU_SUCCESS;
}

static void help(void) {
  printf("usage: mpu demo mappings [options]\n"
         "\n"
         "The walkthrough of Megatron-DeepSpeed's mpu/mappings.py (tensor-parallel mappings) on thread ranks: _reduce,\n"
         "_gather, _split, and the forward and backward of copy_to, reduce_from, scatter_to,\n"
         "gather_from and the sequence-parallel regions, printing what every rank holds.\n"
         "\n"
         "options:\n"
         "  --world-size W      ranks (default 8)\n"
         "  --tp T, --pp P      tensor and pipeline parallel sizes (default 2, 2)\n"
         "  --backend threads|mpi  thread ranks (default), or the processes of an MPI job\n"
         "                      (mpirun -n W mpu demo mappings --backend mpi)\n"
         "  --format text|json  text mirrors the walkthrough's printouts; json is an object keyed by\n"
         "                      global rank, one object per scenario (default text)\n"
         "  -h, --help          this text\n"
         "\n");
  cli_help_exit_status("a run failed");
  printf("\n"
         "examples:\n"
         "  mpu demo mappings | grep \"rank 6\"\n"
         "  mpu demo mappings --format json\n"
         "  mpirun -n 8 mpu demo mappings --backend mpi\n");
}

int cmd_demo_mappings(int argc, char **argv) {
  static const struct option longs[] = {
      {"world-size", required_argument, 0, 'w'}, {"tp", required_argument, 0, 't'},
      {"pp", required_argument, 0, 'p'},         {"format", required_argument, 0, 'F'},
      {"backend", required_argument, 0, 'B'},
      {"help", no_argument, 0, 'h'},             {0, 0, 0, 0}};
  mappings_run run = {8, 2, 2, TOOL_THREADS, CLI_TEXT, NULL, NULL};
  long v;
  int c;
  opterr = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    switch (c) {
    case 'w':
    case 't':
    case 'p':
      if (cli_parse_int(optarg, 1, 64, &v))
        cli_usage_error("demo mappings", "--%s wants 1..64, not '%s'",
                        c == 'w' ? "world-size" : c == 't' ? "tp" : "pp", optarg);
      *(c == 'w' ? &run.world : c == 't' ? &run.tp : &run.pp) = (int)v;
      break;
    case 'F':
      if (cli_parse_format(optarg, &run.format))
        cli_usage_error("demo mappings", "--format wants text or json, not '%s'", optarg);
      break;
    case 'B': run.backend = tool_parse_backend("demo mappings", optarg); break;
    case 'h': help(); return 0;
    case ':': cli_usage_error("demo mappings", "option '%s' needs a value", argv[optind - 1]);
    default: cli_usage_error("demo mappings", "unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) cli_usage_error("demo mappings", "unexpected argument '%s'", argv[optind]);
  int rows = run.tp > 4 ? run.tp : 4;
  if (rows % run.tp)
    cli_usage_error("demo mappings", "--tp %d does not divide the %d rows of the sequence-parallel "
                    "scenarios (use 1, 2, 4, 8, ...)", run.tp, rows);
  mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
  cfg.flavor = MPU_FLAVOR_DEEPSPEED;
  cfg.world_size = run.world, cfg.tp = run.tp, cfg.pp = run.pp;
  mpu_layout *check;
  if (mpu_layout_create(&cfg, &check)) cli_usage_error("demo mappings", "%s", mpu_last_error());
  mpu_layout_free(check);
  run.json = calloc((size_t)run.world, sizeof *run.json);
  run.text = calloc((size_t)run.world, sizeof *run.text);
  if (!run.json || !run.text) {
    fprintf(stderr, "mpu demo mappings: out of memory\n");
    free(run.json);
    free(run.text);
    return 1;
  }
  int printer = 0;
  mpu_result_t r = tool_run(run.backend, run.world, &cfg, 42, mappings_rank, &run, &printer);
  if (r || !printer) {
    tool_report("demo mappings", r);
    free(run.json);
    free(run.text);
    tool_backend_done(run.backend);
    return r ? 1 : 0;
  }
  if (run.format == CLI_JSON) {
    printf("{");
    for (int k = 0; k < run.world; k++) {
      printf("%s\n \"%d\": {", k ? "," : "", k);
      for (int sc = 0; sc < SC_COUNT; sc++)
        printf("%s\n  \"%s\": %s", sc ? "," : "", sc_names[sc], run.json[k][sc]);
      printf("\n }");
    }
    printf("\n}\n");
  } else {
    char phrase[48];
    printf("# Megatron-DeepSpeed's mpu/mappings.py walkthrough: %s, tp %d, pp %d (deepspeed layout)\n",
           tool_ranks_phrase(run.backend, run.world, phrase, sizeof phrase), run.tp, run.pp);
    for (int sc = 0; sc < SC_COUNT; sc++) {
      printf("\n------------ > Test %s ------------\n", sc_names[sc]);
      for (int k = 0; k < run.world; k++) printf("%s\n", run.text[k][sc]);
    }
  }
  free(run.json);
  free(run.text);
  tool_backend_done(run.backend);
  return 0;
}
