/*
 * demo_gpt.h - what the files of `mpu demo gpt` share: demo_gpt.c parses the
 * options, runs the reference and the parallel run and reports them;
 * demo_gpt_rank.c is one rank's training loop; demo_gpt_bench.c is --bench.
 */
#ifndef MPU_TOOL_DEMO_GPT_H
#define MPU_TOOL_DEMO_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "cli.h"
#include "mpu.h"

typedef struct gpt_opts {
  long tp, pp, dp, vp, steps, micro, seq, hidden, heads, layers, seed;
  double lr, dropout;
  int sp, zero;
  const char *text_path;
  const char *save_dir, *load_dir; /* --save, --load */
  long save_step;                  /* --save-step (0: after the last step) */
  cli_format format;
  tool_backend backend;
  int shard;              /* --fsdp / --hsdp: parameters sharded over dp (mpu/fsdp.h) */
  long replicas;          /* --hsdp RxS: R (1 for --fsdp) */
  long recompute_layers; /* --recompute-layers (0: every block) */
  int recompute;         /* --recompute: GPT_RECOMPUTE_* */
  int overlap;           /* --overlap-grad-reduce */
  int fsdp_layout;       /* --fsdp-layout: mpu_fsdp_layout (FSDP1's flat parameter by default) */
} gpt_opts;

/* the text as token ids, and its vocabulary */
typedef struct corpus {
  int64_t *ids;
  size_t n;
  int vocab, vocab_padded;
  char chars[256];
} corpus;

/* the reference's parameters, by name, for the check at the end */
typedef struct named {
  char name[48];
  size_t numel;
  float *data;
} named;

typedef struct gpt_run {
  const gpt_opts *o;
  const corpus *text;
  int dp;                 /* replicas (1 for the reference) */
  mpu_schedule_kind kind;
  double *loss;           /* [steps] */
  double seconds;         /* the timed steps' wall time on rank 0 */
  int untimed;            /* the first steps, run but not timed (--bench: one, as PyTorch's
                             side warms up: first touches of the buffers, BLAS's set-up) */
  named *ref;             /* the reference's parameters (to check against), or NULL */
  int nref;
  named *keep;            /* the reference run: where to keep its parameters */
  int nkeep;
  double param_diff, param_scale; /* the largest difference found, and the largest value */
  double *comm;           /* [ranks]: each rank's seconds in communication (may be NULL) */
  int quiet;              /* no progress line (the benchmark's runs) */
  double saved[3];        /* bytes a micro-batch keeps per rank (most over ranks), by GPT_RECOMPUTE_* */
  int checkpoints;        /* this run saves and loads (--save, --load; not the reference) */
  long start;             /* the first step run (after --load) */
  /* --overlap-grad-reduce, summed over the ranks: seconds inside the blocking
   * reduces of the blocking steps, inside the overlapped reduces' starts and waits
   * of the other steps; reduces started, and found complete at the wait */
  double blocking_s, exposed_s, reduces, complete;
  double step_s[2];       /* the steps' wall time: [0] blocking, [1] overlapped (summed over ranks) */
  long overlapped_steps, blocking_steps;
} gpt_run;

/* OpenBLAS's own call (not in cblas.h): a rank is a core, its BLAS stays on it */
void openblas_set_num_threads(int num_threads);

/* One rank of a run (mpu_with_state's function; arg: the gpt_run). */
mpu_result_t demo_gpt_rank(mpu_state *s, void *arg);

/* --bench: tokens per second at tp 1 and 2 (only_tp 1 or 2: that one only) beside a GEMM's
 * GFLOP/s; the exit status */
int demo_gpt_bench(const gpt_opts *base, const corpus *text, int only_tp);

#endif
