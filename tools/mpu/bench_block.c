/*
 * bench_block.c - `mpu bench --block`: one ColumnParallelLinear -> GeLU ->
 * RowParallelLinear block, forward + backward, tp = 1 against tp = 2 on
 * thread ranks, with this machine's single-thread GEMM rate measured in the
 * same run. Each rank's BLAS runs on one thread, so tp = 2 uses two cores and
 * tp = 1 one, as GPUs would.
 */
#include <cblas.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "mpu.h"

void openblas_set_num_threads(int num_threads);

typedef struct block_run {
  int hidden, tokens, iters;
  double work_before, work_total; /* the progress line's time left (in flop-units) */
  double step_ms;  /* median forward + backward, slowest rank */
  double comm_ms;  /* the block's two all-reduces of (tokens, hidden), timed alone */
  int failed;
} block_run;

static double now_ms(void) { return cli_now() * 1e3; }

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static mpu_result_t block_rank(mpu_comm *tp, void *arg) {
  block_run *b = arg;
  int T, rank, N = b->tokens, H = b->hidden, F = 4 * H;
  mpu_comm_size(tp, &T);
  mpu_comm_rank(tp, &rank);
  openblas_set_num_threads(1);
  mpu_column_linear c;
  mpu_row_linear r;
  mpu_result_t e = mpu_column_linear_init(&c, tp, H, F, 1, 0, 0, 1, 0.02f);
  if (!e) e = mpu_row_linear_init(&r, tp, F, H, 1, 1, 0, 2, 0.02f);
  if (e) return e;
  int fl = F / T;
  float *x = calloc((size_t)N * H, sizeof(float)), *h = malloc((size_t)N * fl * sizeof(float));
  float *g = malloc((size_t)N * fl * sizeof(float)), *y = malloc((size_t)N * H * sizeof(float));
  float *dg = malloc((size_t)N * fl * sizeof(float)), *dh = malloc((size_t)N * fl * sizeof(float));
  float *dx = malloc((size_t)N * H * sizeof(float));
  double *t = malloc((size_t)(b->iters + 1) * sizeof(double));
  if (!x || !h || !g || !y || !dg || !dh || !dx || !t) e = MPU_ERR_OUT_OF_MEMORY;
  for (int i = 0; i < N * H && !e; i++) x[i] = (float)((i * 7) % 13) * 0.01f;
  for (int it = 0; it <= b->iters && !e; it++) { /* iteration 0 warms up */
    mpu_comm_barrier(tp);
    double t0 = now_ms();
    e = mpu_column_linear_forward(&c, x, N, h);
    mpu_gelu_forward(h, g, (size_t)N * fl);
    if (!e) e = mpu_row_linear_forward(&r, g, N, y);
    if (!e) e = mpu_row_linear_backward(&r, y, dg);
    mpu_gelu_backward(h, dg, dh, (size_t)N * fl);
    if (!e) e = mpu_column_linear_backward(&c, dh, dx);
    t[it] = now_ms() - t0;
    if (rank == 0) {
      cli_progress_share((b->work_before + (it + 1.0) / (b->iters + 1) * (double)H * H / T) /
                         b->work_total);
      cli_progress("mpu bench --block: hidden %d, tp %d, iteration %d of %d", H, T, it,
                   b->iters);
    }
  }
  if (!e) e = mpu_comm_all_reduce(tp, t, t, (size_t)b->iters + 1, MPU_FLOAT64, MPU_MAX);
  if (!e && rank == 0) {
    qsort(t + 1, (size_t)b->iters, sizeof(double), cmp_double);
    b->step_ms = t[1 + b->iters / 2];
  }
  if (!e && T > 1) { /* the block's communication alone: two all-reduces of (N, H) */
    double best = 1e30;
    for (int it = 0; it < 3 && !e; it++) {
      mpu_comm_barrier(tp);
      double t0 = now_ms();
      e = mpu_comm_all_reduce(tp, y, y, (size_t)N * H, MPU_FLOAT32, MPU_SUM);
      if (!e) e = mpu_comm_all_reduce(tp, dx, dx, (size_t)N * H, MPU_FLOAT32, MPU_SUM);
      double d = now_ms() - t0;
      if (d < best) best = d;
    }
    if (rank == 0) b->comm_ms = best;
  }
  mpu_column_linear_free(&c);
  mpu_row_linear_free(&r);
  free(x), free(h), free(g), free(y), free(dg), free(dh), free(dx), free(t);
  return e;
}

/* One thread's sgemm rate (GFLOP/s) on the block's first product. */
static double gemm_gflops(int N, int H) {
  int F = 4 * H;
  float *a = calloc((size_t)N * H, sizeof(float)), *w = calloc((size_t)F * H, sizeof(float));
  float *c = calloc((size_t)N * F, sizeof(float));
  double best = 1e30;
  if (a && w && c) {
    openblas_set_num_threads(1);
    for (int it = 0; it < 3; it++) {
      double t0 = now_ms();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, F, H, 1.0f, a, H, w, H, 0.0f, c, F);
      double d = now_ms() - t0;
      if (d < best) best = d;
    }
  }
  free(a), free(w), free(c);
  return 2.0 * N * H * (double)F / (best * 1e6);
}

int cmd_bench_block(int argc, char **argv) {
  static const struct option longs[] = {
      {"block", no_argument, 0, 'B'},         {"hidden", required_argument, 0, 'H'},
      {"tokens", required_argument, 0, 'n'},  {"iters", required_argument, 0, 'i'},
      {"format", required_argument, 0, 'F'},  {"backend", required_argument, 0, 'b'},
      {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
  long hidden[8] = {1024, 4096}, nh = 2, tokens = 2048, iters = 3;
  cli_format format = CLI_TEXT;
  int c;
  opterr = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    switch (c) {
    case 'B': break;
    case 'H': {
      nh = 0;
      char buf[128], *save = NULL;
      snprintf(buf, sizeof buf, "%s", optarg);
      for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (nh == 8 || cli_parse_int(t, 8, 16384, &hidden[nh++]) || hidden[nh - 1] % 8)
          cli_usage_error("bench", "--hidden wants up to 8 sizes, multiples of 8, not '%s'", optarg);
      break;
    }
    case 'n':
      if (cli_parse_int(optarg, 2, 1 << 20, &tokens) || tokens % 2)
        cli_usage_error("bench", "--tokens wants an even number, not '%s'", optarg);
      break;
    case 'i':
      if (cli_parse_int(optarg, 1, 1000, &iters))
        cli_usage_error("bench", "--iters wants 1..1000, not '%s'", optarg);
      break;
    case 'F':
      if (cli_parse_format(optarg, &format)) cli_usage_error("bench", "--format wants text or json");
      break;
    case 'b': /* tp 1 and tp 2 in one run, on this machine's cores: thread ranks only */
      if (strcmp(optarg, "threads"))
        cli_usage_error("bench", "--block runs on thread ranks only (--backend threads), not '%s'",
                        optarg);
      break;
    case 'h':
      printf("usage: mpu bench --block [options]\n\n"
             "One ColumnParallelLinear -> GeLU -> RowParallelLinear block (4x expansion), forward +\n"
             "backward, tp 1 against tp 2 thread ranks, one BLAS thread per rank; with the\n"
             "single-thread GEMM rate of this machine measured in the same run.\n\n"
             "options:\n"
             "  --hidden LIST        hidden sizes, multiples of 8 (default 1024,4096)\n"
             "  --tokens N           tokens per step, even (default 2048)\n"
             "  --iters N            timed steps per config, median reported (default 3)\n"
             "  --backend threads    thread ranks (the only backend --block runs on)\n"
             "  --format text|json   output format (default text)\n"
             "  -h, --help           this text\n");
      return 0;
    case ':': cli_usage_error("bench", "option '%s' needs a value", argv[optind - 1]);
    default: cli_usage_error("bench", "unknown option '%s' (with --block)", argv[optind - 1]);
    }
  }
  if (optind < argc) cli_usage_error("bench", "unexpected argument '%s'", argv[optind]);
  if (format == CLI_JSON) printf("{\"rows\": [");
  else
    printf("# block: ColumnParallelLinear(H, 4H) -> GeLU -> RowParallelLinear(4H, H), %ld tokens, "
           "forward + backward,\n# median of %ld, one BLAS thread per rank; comm = the block's two "
           "all-reduces of (tokens, H) timed alone\n"
           "# %-6s %3s %12s %9s %12s %12s %12s\n",
           tokens, iters, "hidden", "tp", "step (ms)", "speed-up", "comm share", "GFLOP/s", "of GEMM peak");
  double work_total = 0, work_before = 0; /* a config's time grows as hidden^2 / tp */
  for (int k = 0; k < nh; k++) work_total += 1.5 * (double)hidden[k] * hidden[k];
  for (int k = 0; k < nh; k++) {
    double gemm = gemm_gflops((int)tokens, (int)hidden[k]), t1 = 0;
    double flops = 6.0 * 2.0 * (double)tokens * hidden[k] * 4.0 * hidden[k];
    for (int T = 1; T <= 2; T++) {
      block_run b = {(int)hidden[k], (int)tokens, (int)iters, work_before, work_total, 0, 0, 0};
      mpu_result_t r = mpu_launch(T, block_rank, &b, NULL, NULL);
      work_before += (double)hidden[k] * hidden[k] / T;
      cli_progress_done();
      if (r) {
        fprintf(stderr, "mpu bench --block: %s: %s\n", mpu_result_name(r), mpu_last_error());
        return 1;
      }
      if (T == 1) t1 = b.step_ms;
      double rate = flops / (b.step_ms * 1e6), peak = gemm * T;
      if (format == CLI_JSON)
        printf("%s\n  {\"hidden\": %ld, \"tp\": %d, \"tokens\": %ld, \"step_ms\": %.3f, "
               "\"speedup\": %.3f, \"comm_ms\": %.3f, \"comm_fraction\": %.4f, \"gflops\": %.2f, "
               "\"gemm_gflops_per_core\": %.2f, \"fraction_of_gemm_peak\": %.4f}",
               (k || T > 1) ? "," : "", hidden[k], T, tokens, b.step_ms, t1 / b.step_ms, b.comm_ms,
               b.comm_ms / b.step_ms, rate, gemm, rate / peak);
      else
        printf("  %-6ld %3d %12.1f %8.2fx %11.1f%% %12.1f %11.1f%%   (GEMM: %.1f GFLOP/s per core)\n",
               hidden[k], T, b.step_ms, t1 / b.step_ms, 100.0 * b.comm_ms / b.step_ms, rate,
               100.0 * rate / peak, gemm);
    }
  }
  if (format == CLI_JSON) printf("\n]}\n");
  return 0;
}
