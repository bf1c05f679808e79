/*
 * demo_gpt_bench.c - `mpu demo gpt --bench`: the model's tokens per second at
 * tp 1 and tp 2 on thread ranks beside the machine's single-GEMM GFLOP/s, the
 * numbers scripts/gpt_torch.py gives for PyTorch.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "demo_gpt.h"
#include "gpt.h"
#include "mpu.h"

/* one core's sgemm rate (n^3, one BLAS thread), best of 5 */
static double gemm_gflops(int n) {
  float *a = malloc((size_t)n * n * sizeof(float)), *b = malloc((size_t)n * n * sizeof(float));
  float *c = calloc((size_t)n * n, sizeof(float));
  double best = 0;
  if (a && b && c) {
    for (int i = 0; i < n * n; i++) a[i] = 0.001f * (float)(i % 97), b[i] = 0.002f * (float)(i % 89);
    for (int rep = 0; rep < 5; rep++) {
      double t0 = cli_now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
      double t = cli_now() - t0;
      best = fmax(best, 2.0 * n * n * (double)n / t * 1e-9);
    }
  }
  free(a), free(b), free(c);
  return best;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int demo_gpt_bench(const gpt_opts *base, const corpus *text, int only_tp) {
  enum { REPS = 3 };
  gpt_opts o = *base;
  o.pp = o.dp = o.vp = 1, o.dropout = 0, o.backend = TOOL_THREADS;
  /* the model's work: forward and backward, 3 forwards' worth of matrix products per token
   * (causal attention counted at half the square); a recompute's extra forward not counted */
  double H = (double)o.hidden, T = (double)o.seq, V = (double)text->vocab_padded;
  double flops_token = 3.0 * ((double)o.layers * (24 * H * H + 2 * T * H) + 2 * H * V);
  char phrase[64];
  double tokens = (double)o.steps * o.micro * o.seq;
  o.steps += 1; /* one untimed step first, as scripts/gpt_torch.py has */
  double gemm[REPS], tps[2][REPS] = {{0}}, share[2][REPS] = {{0}}; /* (zeros: a tp not run) */
  for (int rep = 0; rep < REPS; rep++) { /* interleaved: GEMM, tp 1, tp 2, again */
    gemm[rep] = gemm_gflops(256);
    for (int k = 0; k < 2; k++) {
      if (only_tp && only_tp != k + 1) continue;
      o.tp = k + 1;
      double *loss = calloc((size_t)o.steps, sizeof(double)), comm[2] = {0, 0};
      mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
      cfg.tp = (int)o.tp;
      gpt_run run = {.o = &o, .text = text, .dp = 1, .kind = MPU_SCHEDULE_NO_PIPELINING, .loss = loss,
                     .comm = comm, .quiet = 1, .untimed = 1};
      mpu_result_t r = loss ? mpu_with_state((int)o.tp, &cfg, (uint64_t)o.seed, demo_gpt_rank, &run, NULL, NULL)
                            : MPU_ERR_OUT_OF_MEMORY;
      free(loss);
      if (r) {
        fprintf(stderr, "mpu demo gpt --bench: %s\n", mpu_last_error());
        return 1;
      }
      tps[k][rep] = tokens / run.seconds;
      share[k][rep] = (comm[0] + (k ? comm[1] : 0)) / ((double)o.tp * run.seconds);
      cli_progress_share((rep * 2 + k + 1) / (2.0 * REPS));
      cli_progress("mpu demo gpt --bench: run %d of %d", rep * 2 + k + 1, 2 * REPS);
    }
  }
  cli_progress_done();
  qsort(gemm, REPS, sizeof(double), cmp_double);
  for (int k = 0; k < 2; k++) {
    qsort(tps[k], REPS, sizeof(double), cmp_double);
    qsort(share[k], REPS, sizeof(double), cmp_double);
  }
  double peak = gemm[REPS / 2];
  if (o.format == CLI_JSON) {
    printf("{\"hidden\": %ld, \"heads\": %ld, \"layers\": %ld, \"seq\": %ld, \"micro_batches\": %ld, "
           "\"recompute\": \"%s\", \"gemm_gflops_one_core\": %.4g, \"flops_per_token\": %.6g, "
           "\"runs\": [", o.hidden, o.heads, o.layers, o.seq, o.micro,
           gpt_recompute_name(o.recompute), peak, flops_token);
    for (int k = 0, n = 0; k < 2; k++) {
      if (only_tp && only_tp != k + 1) continue;
      double per_rank = tps[k][REPS / 2] * flops_token / (k + 1) * 1e-9;
      printf("%s\n  {\"tp\": %d, \"tokens_per_s\": %.6g, \"comm_share\": %.4g, "
             "\"gflops_per_rank\": %.4g, \"of_gemm_rate\": %.4g}", n++ ? "," : "", k + 1,
             tps[k][REPS / 2], share[k][REPS / 2], per_rank, per_rank / peak);
    }
    printf("\n ]}\n");
    return 0;
  }
  printf("# mpu demo gpt --bench: the GPT (hidden %ld, %ld heads, %ld blocks, %ld micro-batches of "
         "%ld tokens per step, %ld timed steps after one untimed, %s), forward + backward + AdamW, tp 1 vs tp 2 on "
         "thread ranks with one BLAS thread each; median of %d runs, interleaved with the GEMM "
         "measurement\n", o.hidden, o.heads, o.layers, o.micro, o.seq, o.steps - 1,
         gpt_recompute_phrase(o.recompute, o.recompute_layers, phrase, sizeof phrase), REPS);
  printf("# one core's GEMM rate here (cblas_sgemm 256^3, 1 thread): %.1f GFLOP/s; model work "
         "%.3g FLOP per token (3 forwards' worth of products; recompute not counted)\n", peak,
         flops_token);
  printf("%4s %6s %11s %11s %16s %13s\n", "tp", "ranks", "tokens/s", "comm share",
         "GFLOP/s per rank", "of GEMM rate");
  for (int k = 0; k < 2; k++) {
    if (only_tp && only_tp != k + 1) continue;
    double per_rank = tps[k][REPS / 2] * flops_token / (k + 1) * 1e-9;
    printf("%4d %6d %11.0f %10.1f%% %16.2f %12.1f%%\n", k + 1, k + 1, tps[k][REPS / 2],
           100 * share[k][REPS / 2], per_rank, 100 * per_rank / peak);
  }
  printf("# comm share: each rank's time inside mpu's communication calls (mpu_comm_clock) over "
         "the run's time, averaged over the ranks; on 2 cores tp 2 runs a rank per core\n");
  return 0;
}
