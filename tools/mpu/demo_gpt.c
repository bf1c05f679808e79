/*
 * demo_gpt.c - `mpu demo gpt`, the main job: a small GPT (gpt.h) trained on
 * the text that ships with mpu (data/tiny_corpus.txt, a character model) with
 * tensor (and sequence), pipeline (interleaved 1F1B over virtual stages) and
 * data parallelism, ZeRO-1 AdamW and full activation recompute, then checked
 * against the same model trained on one rank: every step's loss, and every
 * parameter at the end.
 *
 * Each rank builds its model chunks (virtual stages rank, rank + pp, ...),
 * one parameter buffer and one optimizer each; mpu_pipeline runs the
 * schedule's order over the pipeline group, calling forward (which keeps only
 * the chunk's input, mpu_checkpoint_forward) and backward (which recomputes
 * the chunk's forward with the streams of the first pass, then runs its
 * backward). The micro-batches of a step are the replica's share of the
 * global batch; the loss is their mean, and the gradients are averaged over
 * the data-parallel group, so one rank running every micro-batch computes the
 * same step.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gpt_device.h"
#include "cli.h"
#include "gpt.h"
#include "gpt_fsdp.h"
#include "read_text.h"
#include "gpt_ckpt.h"
#include "mpu.h"

extern const unsigned char gpt_corpus[];
extern const size_t gpt_corpus_len;

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

static mpu_result_t read_corpus(const char *path, corpus *c) {
  memset(c, 0, sizeof *c);
  unsigned char *text = NULL;
  size_t n = 0;
  if (path) {
    mpu_result_t r = cli_read_text("--text", path, 1 << 20, &text, &n);
    if (r) return r;
  } else {
    text = malloc(gpt_corpus_len);
    if (text) memcpy(text, gpt_corpus, n = gpt_corpus_len);
  }
  if (!text) return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "text");
  int index[256];
  for (int i = 0; i < 256; i++) index[i] = -1;
  for (size_t i = 0; i < n; i++) index[text[i]] = 0;
  for (int ch = 0; ch < 256; ch++)
    if (index[ch] == 0) c->chars[c->vocab] = (char)ch, index[ch] = c->vocab++;
  c->ids = malloc((n ? n : 1) * sizeof *c->ids);
  if (!c->ids) {
    free(text);
    return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "text");
  }
  for (size_t i = 0; i < n; i++) c->ids[i] = index[text[i]];
  c->n = n;
  c->vocab_padded = (c->vocab + 63) / 64 * 64; /* divisible by any tp up to 64 */
  free(text);
  return MPU_SUCCESS;
}

/* The text, or one line on stderr and -1: unreadable, or shorter than a micro-batch. */
static int load_text(const gpt_opts *o, corpus *text) {
  if (read_corpus(o->text_path, text)) {
    fprintf(stderr, "mpu demo gpt: %s\n", mpu_last_error());
    return -1;
  }
  if (text->n < (size_t)o->seq + 2) {
    fprintf(stderr, "mpu demo gpt: the text has %zu characters, a micro-batch needs %ld\n",
            text->n, o->seq + 2);
    free(text->ids);
    return -1;
  }
  return 0;
}

/* micro-batch gmb (global) of step s: a window of the text and its next characters */
static void make_batch(const gpt_opts *o, const corpus *text, int step, int gmb, int64_t *ids,
                       int64_t *targets) {
  mpu_rng g;
  mpu_rng_seed(&g, (uint64_t)o->seed * 1000003u + (uint64_t)step * 9176u + (uint64_t)gmb);
  size_t start = (size_t)(mpu_rng_next(&g) % (text->n - (size_t)o->seq - 1));
  for (int t = 0; t < o->seq; t++) ids[t] = text->ids[start + t], targets[t] = text->ids[start + t + 1];
}

/* one rank's training state */
typedef struct rank_model {
  const gpt_opts *o;
  gpt_run *run;
  mpu_state *s;
  gpt_ctx ctx;
  gpt_chunk *chunks;
  int vp, micro, dp_rank, step;
  int64_t *ids, *targets;    /* [micro][seq] */
  float *inputs;             /* [vp][micro][T_local x hidden]: each chunk's saved input */
  mpu_checkpoint *ck;        /* [vp][micro] */
  double loss_sum;
  /* the forward being run (for mpu_checkpoint's callback) */
  int cur_mb, cur_chunk, counting;
  float *cur_out;
  /* --overlap-grad-reduce: the dp reduces started in the last micro-batch's backward */
  mpu_comm *dp;
  mpu_grad_sync_options sync;
  int reducing;              /* this backward starts reduces */
  size_t *unreduced;         /* [vp]: a chunk's gradients [0, unreduced) are not being reduced */
  mpu_request **reqs;        /* [vp * max_reqs] */
  int *nreqs, max_reqs;      /* [vp] */
  double exposed_s;          /* inside the starts and the waits */
} rank_model;

static size_t act_size(const rank_model *m) { return (size_t)m->ctx.T_local * (size_t)m->o->hidden; }

static mpu_result_t run_chunk(void *user) {
  rank_model *m = user;
  int mb = m->cur_mb, c = m->cur_chunk;
  const float *in = m->inputs + ((size_t)c * m->micro + mb) * act_size(m);
  return gpt_chunk_forward(&m->ctx, &m->chunks[c], m->dp_rank * m->micro + mb,
                           m->ids + (size_t)mb * m->o->seq, m->targets + (size_t)mb * m->o->seq,
                           in, m->cur_out, m->counting ? &m->loss_sum : NULL);
}

static mpu_result_t on_forward(void *user, int mb, int chunk, const float *input, float *output) {
  rank_model *m = user;
  gpt_chunk_use_frame(&m->chunks[chunk], mb); /* (no frames: the chunk is recomputed) */
  /* the data (this replica's share of the global batch): the first stage reads the
   * tokens, the last the targets */
  if (m->chunks[chunk].first || m->chunks[chunk].last)
    make_batch(m->o, m->run->text, m->step, m->dp_rank * m->micro + mb,
               m->ids + (size_t)mb * m->o->seq, m->targets + (size_t)mb * m->o->seq);
  if (input) memcpy(m->inputs + ((size_t)chunk * m->micro + mb) * act_size(m), input,
                    act_size(m) * sizeof(float));
  m->cur_mb = mb, m->cur_chunk = chunk, m->cur_out = output, m->counting = 1;
  if (!gpt_chunk_whole_recompute(&m->ctx, &m->chunks[chunk])) return run_chunk(m);
  return mpu_checkpoint_forward(&m->ck[(size_t)chunk * m->micro + mb], m->s, run_chunk, m);
}

/* ctx.grads_final: start the dp reduce of the chunk's gradients that became
 * final, in the last micro-batch's backward (Megatron's overlap_grad_reduce) */
static mpu_result_t start_reduce(void *user, gpt_chunk *c, size_t from) {
  rank_model *m = user;
  int k = (int)(c - m->chunks);
  if (!m->reducing || from >= m->unreduced[k]) return MPU_SUCCESS;
  if (m->nreqs[k] == m->max_reqs)
    return mpu_fail(MPU_ERR_INTERNAL, "gpt: more than %d gradient reduces in a chunk", m->max_reqs);
  double t0 = cli_now();
  mpu_result_t r = mpu_grad_all_reduce_start(&c->params, m->dp, &m->sync, from, m->unreduced[k],
                                             &m->reqs[(size_t)k * m->max_reqs + m->nreqs[k]]);
  m->exposed_s += cli_now() - t0;
  if (!r) m->nreqs[k]++, m->unreduced[k] = from;
  return r;
}

/* Wait for every reduce started in the backward (counting those complete
 * already); the optimizer then does not reduce again. */
static mpu_result_t finish_reduces(rank_model *m, mpu_optimizer *opts, double *complete) {
  double t0 = cli_now();
  mpu_result_t r = MPU_SUCCESS;
  for (int k = 0; k < m->vp; k++) {
    for (int i = 0; i < m->nreqs[k]; i++) {
      mpu_request **q = &m->reqs[(size_t)k * m->max_reqs + i];
      int done = 0;
      if (!r) r = mpu_request_test(*q, &done);
      if (!r && done) *complete += 1, *q = NULL;
      if (!r && !done) r = mpu_request_wait(*q), *q = NULL;
    }
    if (!r && m->unreduced[k])
      r = mpu_fail(MPU_ERR_INTERNAL, "gpt: chunk %d's gradients [0, %zu) were not reduced", k,
                   m->unreduced[k]);
    if (!r) r = mpu_optimizer_set_grads_reduced(&opts[k], 1);
  }
  m->exposed_s += cli_now() - t0;
  return r;
}

/* Release what an error left pending. */
static void drop_reduces(rank_model *m) {
  for (int k = 0; m->nreqs && k < m->vp; k++)
    for (int i = 0; i < m->nreqs[k]; i++) {
      mpu_request **q = &m->reqs[(size_t)k * m->max_reqs + i];
      if (*q) mpu_request_free(*q), *q = NULL;
    }
}

static mpu_result_t on_backward(void *user, int mb, int chunk, const float *grad_output,
                                float *grad_input) {
  rank_model *m = user;
  /* the chunk's last backward of the step: its gradients then are final */
  m->reducing = m->unreduced && mb == m->micro - 1;
  m->cur_mb = mb, m->cur_chunk = chunk, m->cur_out = m->chunks[chunk].tmp, m->counting = 0;
  gpt_chunk_use_frame(&m->chunks[chunk], mb);
  mpu_result_t r = MPU_SUCCESS;
  if (gpt_chunk_whole_recompute(&m->ctx, &m->chunks[chunk]))
    r = mpu_checkpoint_recompute(&m->ck[(size_t)chunk * m->micro + mb], m->s, run_chunk, m);
  float scale = 1.0f / (float)(m->o->seq * m->micro); /* the replica's mean over its tokens */
  if (!r) r = gpt_chunk_backward(&m->ctx, &m->chunks[chunk], grad_output, grad_input, scale);
  m->reducing = 0;
  return r;
}

/* The largest difference between this rank's parameters and the slices of
 * the reference's, and the largest reference value. */
static void compare(const rank_model *m, double *diff, double *scale) {
  int tp = m->ctx.tp_size, r = m->ctx.tp_rank;
  for (int c = 0; c < m->vp; c++) {
    const gpt_chunk *ch = &m->chunks[c];
    for (int i = 0; i < ch->params.nparams; i++) {
      const gpt_shape *sh = &ch->shapes[i];
      const named *ref = NULL;
      for (int k = 0; k < m->run->nref && !ref; k++)
        if (!strcmp(m->run->ref[k].name, sh->name)) ref = &m->run->ref[k];
      if (!ref) {
        *diff = INFINITY;
        return;
      }
      const float *p = mpu_param_data(&ch->params, i);
      int rows = sh->rows, cols = sh->cols;
      int per = sh->dim < 0 ? 0 : (sh->dim == 0 ? rows : cols) / tp, piece = per / (sh->stride ? sh->stride : 1);
      int lr = sh->dim == 0 ? per : rows, lc = sh->dim == 1 ? per : cols;
      for (int a = 0; a < lr; a++)
        for (int b = 0; b < lc; b++) { /* local (a, b) -> master (ga, gb), pieces rank::tp */
          int ga = a, gb = b;
          if (sh->dim == 0) ga = (r + (a / piece) * tp) * piece + a % piece;
          if (sh->dim == 1) gb = (r + (b / piece) * tp) * piece + b % piece;
          double want = ref->data[(size_t)ga * cols + gb];
          *diff = fmax(*diff, fabs((double)p[(size_t)a * lc + b] - want));
          *scale = fmax(*scale, fabs(want));
        }
    }
  }
}

#define TRY(call)                              \
  do {                                         \
    if ((r = (call)) != MPU_SUCCESS) goto out; \
  } while (0)

/* --overlap-grad-reduce: step k of n overlaps its reduce (the others block) */
static int overlap_step(int k, int n) { return n > 1 && k % 2 == 0; }

static mpu_result_t gpt_rank(mpu_state *s, void *arg) {
  gpt_run *run = arg;
  const gpt_opts *o = run->o;
  mpu_result_t r = MPU_SUCCESS;
  rank_model m;
  memset(&m, 0, sizeof m);
  m.o = o, m.run = run, m.s = s;
  int tp_size, pp_size, pp_rank, tp_rank, dp_size, rank;
  mpu_comm *tp, *pp, *dpc, *mp, *world = mpu_state_world(s);
  mpu_comm_rank(world, &rank);
  if ((r = mpu_state_comm(s, MPU_GROUP_TP, &tp)) || (r = mpu_state_comm(s, MPU_GROUP_PP, &pp)) ||
      (r = mpu_state_comm(s, MPU_GROUP_DP, &dpc)) || (r = mpu_state_comm(s, MPU_GROUP_MP, &mp)))
    return r;
  mpu_state_tp_size(s, &tp_size), mpu_state_tp_rank(s, &tp_rank);
  mpu_state_pp_size(s, &pp_size), mpu_state_pp_rank(s, &pp_rank);
  mpu_state_dp_rank(s, &m.dp_rank), mpu_state_dp_size(s, &dp_size);
  m.vp = run->kind == MPU_SCHEDULE_INTERLEAVED ? (int)o->vp : 1;
  m.micro = (int)o->micro; /* the reference: every replica's (one.micro = micro x dp) */
  gpt_config cfg = {run->text->vocab_padded, (int)o->hidden, (int)o->heads, (int)o->layers,
                    (int)o->seq, (float)o->dropout, (uint64_t)o->seed, o->recompute,
                    (int)o->recompute_layers};
  mpu_pipeline *pipe = NULL;
  mpu_optimizer *opts = NULL, **optp = NULL;
  gpt_sharding sharding = {0, NULL, NULL};
  gpt_device dev;
  memset(&dev, 0, sizeof dev);
  TRY(gpt_ctx_init(&m.ctx, &cfg, tp, o->sp));
  m.chunks = calloc((size_t)m.vp, sizeof *m.chunks);
  opts = calloc((size_t)m.vp, sizeof *opts);
  optp = calloc((size_t)m.vp, sizeof *optp);
  m.ids = malloc((size_t)m.micro * o->seq * sizeof *m.ids);
  m.targets = malloc((size_t)m.micro * o->seq * sizeof *m.targets);
  m.inputs = malloc((size_t)m.vp * m.micro * act_size(&m) * sizeof(float));
  m.ck = calloc((size_t)m.vp * m.micro, sizeof *m.ck);
  if (!m.chunks || !opts || !optp || !m.ids || !m.targets || !m.inputs || !m.ck) {
    r = mpu_fail(MPU_ERR_OUT_OF_MEMORY, "gpt: rank state");
    goto out;
  }
  mpu_adamw_options ao = MPU_ADAMW_OPTIONS_INIT;
  ao.lr = (float)o->lr, ao.weight_decay = 0.01f, ao.clip_grad = 1.0f;
  ao.beta2 = 0.95f;
  for (int c = 0; c < m.vp; c++) {
    TRY(gpt_chunk_create(&m.ctx, &m.chunks[c], c * pp_size + pp_rank, pp_size * m.vp));
    TRY(gpt_chunk_frames(&m.ctx, &m.chunks[c], m.micro));
    if (!o->shard)
      TRY(mpu_optimizer_init(&opts[c], &m.chunks[c].params, dpc, o->zero && run->dp > 1, &ao));
    optp[c] = &opts[c];
  }
  if (o->shard) TRY(gpt_shard_init(&sharding, m.chunks, m.vp, dpc, (int)o->replicas, &ao));
  int overlap = o->overlap && run->dp > 1; /* (the one-rank reference reduces nothing) */
  double blocking_s = 0, complete = 0, reduces = 0, step_s[2] = {0, 0};
  if (overlap) {
    m.dp = dpc, m.sync = ao.sync, m.max_reqs = m.chunks[0].nlayers + 2;
    m.unreduced = calloc((size_t)m.vp, sizeof *m.unreduced);
    m.nreqs = calloc((size_t)m.vp, sizeof *m.nreqs);
    m.reqs = calloc((size_t)m.vp * m.max_reqs, sizeof *m.reqs);
    if (!m.unreduced || !m.nreqs || !m.reqs) {
      r = mpu_fail(MPU_ERR_OUT_OF_MEMORY, "gpt: gradient reduces");
      goto out;
    }
    m.ctx.grads_final = start_reduce, m.ctx.grads_user = &m;
  }
  double saved[3]; /* the same on every rank after the report's reduction */
  TRY(gpt_recompute_report(&m.ctx, m.chunks, m.vp, world, saved));
  if (rank == 0 || o->backend == TOOL_MPI) memcpy(run->saved, saved, sizeof saved);
  mpu_schedule_config sc = MPU_SCHEDULE_CONFIG_INIT;
  sc.kind = run->kind, sc.pp = pp_size, sc.vp = m.vp, sc.microbatches = m.micro;
  mpu_pipeline_callbacks cb = {on_forward, on_backward, &m};
  if (o->backend == TOOL_NCCL) /* the pipeline on NCCL's device buffers, staged for the host layers */
    TRY(gpt_device_init(&dev, s, act_size(&m), &cb, &cb));
  TRY(mpu_pipeline_create(o->backend == TOOL_NCCL ? dev.pp : pp, act_size(&m), &pipe));
  mpu_rng *dprng = NULL;
  TRY(mpu_rng_tracker_fork(mpu_state_rng_tracker(s), MPU_DATA_PARALLEL_RNG, &dprng));
  int last_stage = m.chunks[m.vp - 1].last;
  long start = 0;
  gpt_params gp = {opts, o->shard ? &sharding : NULL};
  if (run->checkpoints && o->load_dir)
    TRY(gpt_ckpt_load(o->load_dir, s, &m.ctx, m.chunks, m.vp, &gp, m.micro, &start));
  if (start > o->steps) {
    r = mpu_fail(MPU_ERR_INVALID_ARGUMENT, "gpt: the checkpoint is at step %ld, past --steps %ld",
                 start, o->steps);
    goto out;
  }
  if (rank == 0) run->start = start;
  TRY(mpu_comm_barrier(world));
  mpu_comm_clock_reset();
  double t0 = cli_now();
  for (m.step = (int)start; m.step < o->steps; m.step++) {
    if (run->untimed && m.step == start + run->untimed) { /* the clocks start here */
      TRY(mpu_comm_barrier(world));
      mpu_comm_clock_reset();
      t0 = cli_now();
    }
    double step_t0 = cli_now();
    m.ctx.key = mpu_rng_next(dprng); /* the step's dropout key: the same on every rank */
    for (int c = 0; c < m.vp; c++) mpu_param_buffer_zero_grad(&m.chunks[c].params);
    m.loss_sum = 0;
    if (o->shard) TRY(gpt_shard_unshard(&sharding));
    /* --overlap-grad-reduce: every second step reduces blocking, to know what the reduce
     * costs under the same load (interleaved); a one-step run only blocking */
    int overlapped = overlap && overlap_step(m.step - (int)start, (int)(o->steps - start));
    for (int c = 0; overlapped && c < m.vp; c++)
      m.unreduced[c] = m.chunks[c].params.numel, m.nreqs[c] = 0;
    size_t *unreduced = m.unreduced;
    if (!overlapped) m.unreduced = NULL; /* no reduce starts in this backward */
    r = mpu_pipeline_run(pipe, &sc, &cb, NULL);
    m.unreduced = unreduced;
    if (r) goto out;
    for (int c = 0; c < m.vp; c++) TRY(gpt_chunk_sync_sequence_grads(&m.ctx, &m.chunks[c]));
    if (overlapped) {
      TRY(finish_reduces(&m, opts, &complete));
      for (int c = 0; c < m.vp; c++) reduces += m.nreqs[c];
    } else if (overlap) { /* the same reduces as the optimizer's, timed */
      double t1 = cli_now();
      for (int c = 0; c < m.vp; c++) {
        TRY(mpu_grad_all_reduce(&m.chunks[c].params, dpc, &ao.sync));
        TRY(mpu_optimizer_set_grads_reduced(&opts[c], 1));
      }
      blocking_s += cli_now() - t1;
    }
    /* one norm over the whole model: every rank's shard (ZeRO-1) or every model-parallel rank */
    if (o->shard) TRY(gpt_shard_step(&sharding, mp));
    else TRY(mpu_optimizer_step_all(optp, m.vp, opts[0].distributed ? world : mp, NULL));
    if (last_stage) {
      double loss = m.loss_sum / (double)(o->seq * m.micro);
      if (o->backend == TOOL_NCCL) TRY(gpt_device_loss_avg(&dev, &loss));
      else TRY(mpu_comm_all_reduce(dpc, &loss, &loss, 1, MPU_FLOAT64, MPU_AVG));
      if (tp_rank == 0 && m.dp_rank == 0) {
        run->loss[m.step] = loss;
        if (!run->quiet && (run->dp > 1 || o->tp * o->pp * o->dp == 1)) {
          cli_progress_share(0.5 * (m.step + 1) / (double)o->steps);
          cli_progress("mpu demo gpt: step %d of %ld, loss %.4f", m.step + 1, o->steps, loss);
        }
      }
    }
    if (run->checkpoints && o->save_dir && m.step + 1 == (o->save_step ? o->save_step : o->steps))
      TRY(gpt_ckpt_save(o->save_dir, s, &m.ctx, m.chunks, m.vp, &gp, m.micro, m.step + 1));
    step_s[overlapped] += cli_now() - step_t0;
  }
  if (o->shard) TRY(gpt_shard_unshard(&sharding)); /* the trained parameters, whole */
  TRY(mpu_comm_barrier(world));
  if (rank == 0) run->seconds = cli_now() - t0;
  if (run->comm) mpu_comm_clock(&run->comm[rank], NULL);
  if (overlap) { /* every rank's, summed (the threads backend: one process) */
    double sums[6] = {blocking_s, m.exposed_s, reduces, complete, step_s[0], step_s[1]};
    TRY(mpu_comm_all_reduce(world, sums, sums, 6, MPU_FLOAT64, MPU_SUM));
    if (rank == 0) {
      run->blocking_s = sums[0], run->exposed_s = sums[1], run->reduces = sums[2];
      run->complete = sums[3], run->step_s[0] = sums[4], run->step_s[1] = sums[5];
      run->overlapped_steps = 0;
      for (long k = 0; k < o->steps - start; k++)
        run->overlapped_steps += overlap_step((int)k, (int)(o->steps - start));
      run->blocking_steps = o->steps - start - run->overlapped_steps;
    }
  }
  if (o->backend == TOOL_MPI) /* the losses live in one process (the last stage's): give them to all */
    TRY(mpu_comm_all_reduce(world, run->loss, run->loss, (size_t)o->steps, MPU_FLOAT64, MPU_SUM));
  if (run->keep) { /* the reference keeps its parameters */
    const gpt_chunk *ch = &m.chunks[0];
    if (ch->params.nparams > 4096) {
      r = mpu_fail(MPU_ERR_INVALID_ARGUMENT, "gpt: %d parameters to keep (at most 4096)",
                   ch->params.nparams);
      goto out;
    }
    run->nkeep = ch->params.nparams;
    for (int i = 0; i < ch->params.nparams; i++) {
      named *k = &run->keep[i];
      snprintf(k->name, sizeof k->name, "%s", ch->shapes[i].name);
      k->numel = ch->params.params[i].numel;
      k->data = malloc(k->numel * sizeof(float));
      if (!k->data) {
        r = mpu_fail(MPU_ERR_OUT_OF_MEMORY, "gpt: reference parameters");
        goto out;
      }
      memcpy(k->data, mpu_param_data(&ch->params, i), k->numel * sizeof(float));
    }
  }
  if (run->ref) { /* every rank checks its slices; the worst difference goes to everyone */
    double d[2] = {0, 0};
    compare(&m, &d[0], &d[1]);
    TRY(mpu_comm_all_reduce(world, d, d, 2, MPU_FLOAT64, MPU_MAX));
    if (rank == 0) run->param_diff = d[0], run->param_scale = d[1];
  }
out:
  drop_reduces(&m);
  free(m.unreduced), free(m.nreqs), free(m.reqs);
  mpu_pipeline_free(pipe);
  gpt_device_free(&dev);
  gpt_shard_free(&sharding);
  for (int c = 0; opts && c < m.vp; c++) mpu_optimizer_free(&opts[c]);
  for (int c = 0; m.chunks && c < m.vp; c++) gpt_chunk_free(&m.chunks[c]);
  free(m.chunks), free(opts), free(optp), free(m.ids), free(m.targets), free(m.inputs), free(m.ck);
  return r;
}

/* ---- --bench ------------------------------------------------------------------------ */

#include <cblas.h>

void openblas_set_num_threads(int num_threads);

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

static int bench(const gpt_opts *base, const corpus *text) {
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
  double gemm[REPS], tps[2][REPS], share[2][REPS];
  for (int rep = 0; rep < REPS; rep++) { /* interleaved: GEMM, tp 1, tp 2, again */
    gemm[rep] = gemm_gflops(256);
    for (int k = 0; k < 2; k++) {
      o.tp = k + 1;
      double *loss = calloc((size_t)o.steps, sizeof(double)), comm[2] = {0, 0};
      mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
      cfg.tp = (int)o.tp;
      gpt_run run = {.o = &o, .text = text, .dp = 1, .kind = MPU_SCHEDULE_NO_PIPELINING, .loss = loss,
                     .comm = comm, .quiet = 1, .untimed = 1};
      mpu_result_t r = loss ? mpu_with_state((int)o.tp, &cfg, (uint64_t)o.seed, gpt_rank, &run, NULL, NULL)
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
    for (int k = 0; k < 2; k++) {
      double per_rank = tps[k][REPS / 2] * flops_token / (k + 1) * 1e-9;
      printf("%s\n  {\"tp\": %d, \"tokens_per_s\": %.6g, \"comm_share\": %.4g, "
             "\"gflops_per_rank\": %.4g, \"of_gemm_rate\": %.4g}", k ? "," : "", k + 1,
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
    double per_rank = tps[k][REPS / 2] * flops_token / (k + 1) * 1e-9;
    printf("%4d %6d %11.0f %10.1f%% %16.2f %12.1f%%\n", k + 1, k + 1, tps[k][REPS / 2],
           100 * share[k][REPS / 2], per_rank, 100 * per_rank / peak);
  }
  printf("# comm share: each rank's time inside mpu's communication calls (mpu_comm_clock) over "
         "the run's time, averaged over the ranks; on 2 cores tp 2 runs a rank per core\n");
  return 0;
}

static void help(void) {
  printf("usage: mpu demo gpt [options]\n"
         "\n"
         "Train a small GPT (vocab-parallel embedding with position embedding, pre-LayerNorm blocks\n"
         "of causal self-attention with column-parallel QKV (stride 3) and row-parallel output and\n"
         "an MLP, vocab-parallel cross entropy, dropout) on the text that ships with mpu, with\n"
         "tensor and sequence parallelism, interleaved 1F1B pipelining over virtual stages, data\n"
         "parallelism with ZeRO-1 AdamW, and activation recompute (full, selective or none); then\n"
         "check every step's loss (1e-4 relative) and every parameter at the end against the same\n"
         "model trained on one rank with full recompute. Prints tokens/s, the pipeline bubble and\n"
         "the activation memory each recompute mode keeps. Exits 1 if the check fails.\n"
         "\n"
         "options:\n"
         "  --tp T, --pp P, --dp D  parallel sizes (default 2, 2, 2)\n"
         "  --vp V                  model chunks per pipeline rank (default 2; 1: plain 1F1B)\n"
         "  --no-sp                 no sequence parallelism (default on when tp > 1)\n"
         "  --no-zero               plain data-parallel AdamW instead of ZeRO-1\n"
         "  --overlap-grad-reduce   with --no-zero (threads, dp >= 2; off by default, as in\n"
         "                          Megatron): start each block's dp gradient all-reduce in the\n"
         "                          last micro-batch's backward as soon as its gradients are\n"
         "                          final, wait before the step; every second step reduces\n"
         "                          blocking instead, to measure it (interleaved).\n"
         "                          Prints the reduce's time blocking, the part\n"
         "                          exposed (inside the starts and waits, mean over ranks) and\n"
         "                          hidden behind compute = 1 - exposed / blocking\n"
         "  --fsdp                  parameters, gradients and AdamW state sharded over dp\n"
         "                          (FSDP's FULL_SHARD) instead of ZeRO-1\n"
         "  --hsdp RxS              hybrid sharding (FSDP's HYBRID_SHARD): dp = R*S, sharded\n"
         "                          over S, replicated over R\n"
         "  --steps N               optimizer steps (default 40)\n"
         "  --micro-batches M       micro-batches per replica per step (default 4)\n"
         "  --seq S                 tokens per micro-batch (default 32)\n"
         "  --hidden H, --heads A   hidden size and attention heads (default 64, 4)\n"
         "  --layers L              transformer blocks, a multiple of P x V (default 4)\n"
         "  --dropout P             dropout probability (default 0.1)\n"
         "  --lr LR                 AdamW learning rate (default 0.003)\n"
         "  --seed S                seed of parameters, data and dropout (default 1234)\n"
         "  --text FILE             train on FILE (its first MiB, one token per byte) instead of\n"
         "                          the bundled text\n"
         "  --backend threads|mpi|nccl  thread ranks (default), the processes of an MPI job\n"
         "                          (mpirun -n TPxPPxDP mpu demo gpt --backend mpi), or thread\n"
         "                          ranks with one GPU each: pipeline and loss on NCCL\n"
         "  --save DIR              save a checkpoint (mpu ckpt inspect DIR) after step N of\n"
         "                          --save-step N (default: after the last step), as folder\n"
         "                          DIR/iter_<N> of the checkpoint root DIR (earlier ones kept)\n"
         "  --save-step N           the step after which --save saves\n"
         "  --load DIR              continue from a checkpoint saved by any layout (a root: its\n"
         "                          newest complete iteration; or one iteration's folder): its\n"
         "                          step, parameters, AdamW state and data-parallel random stream\n"
         "                          (the check then covers the steps run)\n"
         "  --format text|json      output format (default text)\n"
         "  --bench                 instead: tokens/s of the model (hidden 256, 8 heads, 2 blocks,\n"
         "                          128 tokens, recompute none unless given) at tp 1 and tp 2, the share of time\n"
         "                          spent communicating, and the rate against one core's GEMM rate\n"
         "                          measured in the same run\n"
         "  --recompute MODE        activation recompute, as Megatron's granularity: full (default:\n"
         "                          each model chunk keeps its input and runs its forward again),\n"
         "                          selective (the attention core only) or none\n"
         "  --recompute-layers N    with full: only the first N blocks of each model chunk\n"
         "  -h, --help              this text\n"
         "\n");
  cli_help_exit_status("a check failed (losses or parameters differ from one rank's), or a run failed");
  printf("\n"
         "examples:\n"
         "  mpu demo gpt\n"
         "  mpu demo gpt --tp 1 --pp 4 --vp 2 --dp 1 --layers 8 --micro-batches 8\n"
         "  mpirun -n 8 mpu demo gpt --backend mpi\n"
         "  mpu demo gpt --bench\n");
}

/* how the data-parallel ranks hold the model */
static const char *data_parallel_name(const gpt_opts *o) {
  static char hybrid[64];
  if (o->shard && o->replicas > 1) {
    snprintf(hybrid, sizeof hybrid, "%s, replicate %ld x shard %ld", gpt_shard_name((int)o->replicas),
             o->replicas, o->dp / o->replicas);
    return hybrid;
  }
  if (o->shard) return gpt_shard_name(1);
  return o->zero && o->dp > 1 ? "ZeRO-1" : "plain AdamW";
}

/* --overlap-grad-reduce's report: the reduce's time when blocking (every
 * second step), the part of it the overlapped steps leave exposed (inside the starts
 * and the waits), and the share hidden behind compute, 1 - exposed / blocking */
/* seconds summed over the ranks and steps -> the mean per rank and step (NAN: no steps) */
static double per_rank_step(double sum, long world, long steps) {
  return steps ? sum / (double)world / (double)steps : NAN;
}

static void print_overlap(const gpt_opts *o, const gpt_run *run, long world) {
  double blocking = per_rank_step(run->blocking_s, world, run->blocking_steps);
  double exposed = per_rank_step(run->exposed_s, world, run->overlapped_steps);
  double hidden = run->overlapped_steps && blocking > 0 ? 1.0 - exposed / blocking : NAN;
  double step_block = per_rank_step(run->step_s[0], world, run->blocking_steps);
  double step_over = per_rank_step(run->step_s[1], world, run->overlapped_steps);
  if (o->format == CLI_JSON) {
    printf("\"overlap_grad_reduce\": {\"blocking_s\": %.6g, \"exposed_s\": %.6g, \"hidden\": %.6g, "
           "\"blocking_steps\": %ld, \"overlapped_steps\": %ld, \"reduces\": %.0f, "
           "\"complete_before_wait\": %.0f, \"step_blocking_s\": %.6g, \"step_overlapped_s\": %.6g},\n ",
           isnan(blocking) ? -1.0 : blocking, isnan(exposed) ? -1.0 : exposed,
           isnan(hidden) ? -1.0 : hidden, run->blocking_steps, run->overlapped_steps,
           run->reduces, run->complete, isnan(step_block) ? -1.0 : step_block,
           isnan(step_over) ? -1.0 : step_over);
    return;
  }
  if (!run->overlapped_steps) {
    printf("overlap: dp gradient reduce %.3f ms per step blocking; no step overlapped it (every "
           "second step is a blocking one: --steps 2 or more)\n", 1e3 * blocking);
    return;
  }
  printf("overlap: dp gradient reduce %.3f ms per step blocking (mean of %ld steps), %.3f ms "
         "exposed (mean of %ld overlapped steps, interleaved), hidden behind compute %.1f%%; %.0f "
         "of %.0f reduces complete before the wait\n", 1e3 * blocking, run->blocking_steps,
         1e3 * exposed, run->overlapped_steps, 100.0 * hidden, run->complete, run->reduces);
  printf("overlap: a step took %.3f ms overlapped, %.3f ms blocking (wall clock, means over ranks "
         "and steps)\n", 1e3 * step_over, 1e3 * step_block);
}

int cmd_demo_gpt(int argc, char **argv) {
  static const struct option longs[] = {
      {"tp", required_argument, 0, 't'},       {"pp", required_argument, 0, 'p'},
      {"dp", required_argument, 0, 'd'},       {"vp", required_argument, 0, 'v'},
      {"steps", required_argument, 0, 's'},    {"micro-batches", required_argument, 0, 'm'},
      {"seq", required_argument, 0, 'q'},      {"hidden", required_argument, 0, 'H'},
      {"heads", required_argument, 0, 'A'},    {"layers", required_argument, 0, 'L'},
      {"seed", required_argument, 0, 'S'},     {"lr", required_argument, 0, 'l'},
      {"dropout", required_argument, 0, 'D'},  {"no-sp", no_argument, 0, 'n'},
      {"no-zero", no_argument, 0, 'z'},        {"text", required_argument, 0, 'T'},
      {"format", required_argument, 0, 'F'},   {"backend", required_argument, 0, 'B'},
      {"bench", no_argument, 0, 'b'},        {"fsdp", no_argument, 0, 'f'},
      {"hsdp", required_argument, 0, 'Y'},     {"recompute", required_argument, 0, 'R'},
      {"recompute-layers", required_argument, 0, 'N'}, {"save", required_argument, 0, 'C'},
      {"load", required_argument, 0, 'W'},     {"save-step", required_argument, 0, 'K'},
      {"overlap-grad-reduce", no_argument, 0, 'O'},
      {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
  int bench_mode = 0, given[128] = {0};
  long hsdp_shard = 1;
  gpt_opts o = {2, 2, 2, 2, 40, 4, 32, 64, 4, 4, 1234, 0.003, 0.1, 1, 1, NULL, NULL, NULL, 0,
                CLI_TEXT, TOOL_THREADS, 0, 1, 0, GPT_RECOMPUTE_FULL, 0};
  long *fields[128] = {0};
  fields['t'] = &o.tp, fields['p'] = &o.pp, fields['d'] = &o.dp, fields['v'] = &o.vp;
  fields['s'] = &o.steps, fields['m'] = &o.micro, fields['q'] = &o.seq, fields['H'] = &o.hidden;
  fields['A'] = &o.heads, fields['L'] = &o.layers, fields['S'] = &o.seed;
  fields['N'] = &o.recompute_layers;
  fields['K'] = &o.save_step;
  int c;
  opterr = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    if (c > 0 && c < 128) given[c] = 1;
    if (c > 0 && c < 128 && fields[c]) {
      const char *name = "?";
      for (const struct option *l = longs; l->name; l++)
        if (l->val == c) name = l->name;
      if (cli_parse_int(optarg, c == 'S' ? 0 : 1, 1 << 20, fields[c]))
        cli_usage_error("demo gpt", "--%s wants a whole number %d..%d, not '%s'", name,
                        c == 'S' ? 0 : 1, 1 << 20, optarg);
      continue;
    }
    switch (c) {
    case 'l':
      if (cli_parse_double(optarg, 0, 10, &o.lr))
        cli_usage_error("demo gpt", "--lr wants a number in (0, 10], not '%s'", optarg);
      break;
    case 'D':
      if (cli_parse_double(optarg, 0, 0.9, &o.dropout) && strcmp(optarg, "0"))
        cli_usage_error("demo gpt", "--dropout wants a probability in [0, 0.9], not '%s'", optarg);
      if (!strcmp(optarg, "0")) o.dropout = 0;
      break;
    case 'b': bench_mode = 1; break;
    case 'R':
      if ((o.recompute = gpt_recompute_parse(optarg)) < 0)
        cli_usage_error("demo gpt", "--recompute wants none, selective or full, not '%s'", optarg);
      break;
    case 'n': o.sp = 0; break;
    case 'z': o.zero = 0; break;
    case 'O': o.overlap = 1; break;
    case 'f': o.shard = 1, o.replicas = 1; break;
    case 'Y':
      if (cli_parse_rxs(optarg, 64, &o.replicas, &hsdp_shard))
        cli_usage_error("demo gpt", "--hsdp wants RxS with R*S in 1..64, not '%s'", optarg);
      o.shard = 1;
      break;
    case 'T': o.text_path = optarg; break;
    case 'C': o.save_dir = optarg; break;
    case 'W': o.load_dir = optarg; break;
    case 'F':
      if (cli_parse_format(optarg, &o.format))
        cli_usage_error("demo gpt", "--format wants text or json, not '%s'", optarg);
      break;
    case 'B':
      if (strcmp(optarg, "nccl")) {
        o.backend = tool_parse_backend("demo gpt", optarg);
      } else { /* thread ranks, one GPU and NCCL communicator each */
        if (!mpu_nccl_available()) cli_usage_error("demo gpt", "%s", mpu_last_error());
        o.backend = TOOL_NCCL;
      }
      break;
    case 'h': help(); return 0;
    case ':': cli_usage_error("demo gpt", "option '%s' needs a value", argv[optind - 1]);
    default: cli_usage_error("demo gpt", "unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) cli_usage_error("demo gpt", "unexpected argument '%s'", argv[optind]);
  if (given['Y'] && given['f']) cli_usage_error("demo gpt", "--fsdp and --hsdp exclude each other");
  if (given['Y']) {
    if (given['d'] && o.dp != o.replicas * hsdp_shard)
      cli_usage_error("demo gpt", "--hsdp %ldx%ld makes dp %ld, but --dp is %ld", o.replicas,
                      hsdp_shard, o.replicas * hsdp_shard, o.dp);
    o.dp = o.replicas * hsdp_shard;
  }
  if (given['K'] && !o.save_dir) cli_usage_error("demo gpt", "--save-step needs --save DIR");
  if (o.save_step > o.steps)
    cli_usage_error("demo gpt", "--save-step %ld is past --steps %ld", o.save_step, o.steps);
  if (bench_mode && (o.save_dir || o.load_dir))
    cli_usage_error("demo gpt", "--bench does not save or load checkpoints");
  if (o.overlap) { /* the plain data-parallel optimizer's all-reduce only */
    if (bench_mode) cli_usage_error("demo gpt", "--overlap-grad-reduce goes with a training run, not --bench");
    if (o.dp < 2) cli_usage_error("demo gpt", "--overlap-grad-reduce needs --dp 2 or more");
    if (o.backend != TOOL_THREADS)
      cli_usage_error("demo gpt", "--overlap-grad-reduce needs --backend threads (whose non-blocking "
                      "calls progress without a wait)");
    if (o.shard || o.zero)
      cli_usage_error("demo gpt", "--overlap-grad-reduce overlaps the plain optimizer's all-reduce: "
                      "add --no-zero (ZeRO-1, --fsdp and --hsdp reduce their own way)");
    if (o.sp && o.tp > 1)
      cli_usage_error("demo gpt", "--overlap-grad-reduce with tp > 1 needs --no-sp (sequence "
                      "parallelism sums the norms' gradients over tp after the backward)");
  }
  openblas_set_num_threads(1); /* a rank is a core: its BLAS stays on it */
  if (bench_mode) { /* a bigger model unless given, and only its speed */
    if (!given['H']) o.hidden = 256;
    if (!given['A']) o.heads = 8;
    if (!given['L']) o.layers = 2;
    if (!given['q']) o.seq = 128;
    if (!given['s']) o.steps = 4;
    if (!given['R']) o.recompute = GPT_RECOMPUTE_NONE; /* the cheapest; it fits */
    if (o.heads % 2 || o.hidden % o.heads || o.seq % 2)
      cli_usage_error("demo gpt", "--bench runs tp 2: the heads and the sequence must be even");
    corpus text;
    if (load_text(&o, &text)) return 2;
    int status = bench(&o, &text);
    free(text.ids);
    return status;
  }
  long world = o.tp * o.pp * o.dp;
  if (world > 64) cli_usage_error("demo gpt", "tp x pp x dp = %ld ranks (at most 64)", world);
  if (o.layers > 256) cli_usage_error("demo gpt", "--layers %ld (at most 256)", o.layers);
  if (given['N'] && o.recompute != GPT_RECOMPUTE_FULL)
    cli_usage_error("demo gpt", "--recompute-layers goes with --recompute full");
  if (o.pp == 1) o.vp = 1;
  if (o.layers % (o.pp * o.vp))
    cli_usage_error("demo gpt", "--layers %ld is not a multiple of pp x vp = %ld", o.layers, o.pp * o.vp);
  if (o.heads % o.tp || o.hidden % o.heads || (o.sp && o.tp > 1 && o.seq % o.tp))
    cli_usage_error("demo gpt", "--tp %ld must divide the heads (%ld), the heads the hidden size "
                    "(%ld), and with sequence parallelism tp the sequence (%ld)", o.tp, o.heads,
                    o.hidden, o.seq);
  mpu_schedule_kind kind = o.pp == 1 ? MPU_SCHEDULE_NO_PIPELINING
                           : o.vp > 1 ? MPU_SCHEDULE_INTERLEAVED : MPU_SCHEDULE_1F1B;
  mpu_schedule_config sc = MPU_SCHEDULE_CONFIG_INIT;
  sc.kind = kind, sc.pp = (int)o.pp, sc.vp = (int)o.vp, sc.microbatches = (int)o.micro;
  int n, w;
  if (mpu_schedule_count(&sc, 0, &n, &w))
    cli_usage_error("demo gpt", "%s", mpu_last_error());
  mpu_result_t r = tool_check_size(o.backend, (int)world); /* before the single-rank work */
  if (r) {
    tool_report("demo gpt", r);
    tool_backend_done(o.backend);
    return 1;
  }
  corpus text;
  if (load_text(&o, &text)) return 2;
  double *loss = calloc((size_t)o.steps, sizeof(double)), *ref = calloc((size_t)o.steps, sizeof(double));
  named *kept = calloc(4096, sizeof *kept);
  if (!loss || !ref || !kept) {
    fprintf(stderr, "mpu demo gpt: out of memory\n");
    return 1;
  }
  /* the reference first, on one thread rank here (in every process under MPI):
   * every replica's micro-batches one after the other, no pipelining, plain AdamW */
  gpt_opts one = o;
  one.tp = one.pp = one.dp = one.vp = 1;
  one.backend = TOOL_THREADS;
  one.shard = 0;
  one.recompute = GPT_RECOMPUTE_FULL, one.recompute_layers = 0; /* what the others are checked against */
  mpu_layout_config cfg1 = MPU_LAYOUT_CONFIG_INIT;
  gpt_run run1 = {.o = &one, .text = &text, .dp = 1, .kind = MPU_SCHEDULE_NO_PIPELINING, .loss = ref,
                  .keep = kept};
  one.micro = o.micro * o.dp;
  r = mpu_with_state(1, &cfg1, (uint64_t)o.seed, gpt_rank, &run1, NULL, NULL);
  /* the parallel run */
  mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
  cfg.tp = (int)o.tp, cfg.pp = (int)o.pp;
  if (o.vp > 1) cfg.vp = (int)o.vp;
  gpt_run run = {.o = &o, .text = &text, .dp = (int)o.dp, .kind = kind, .loss = loss, .ref = kept,
                 .nref = run1.nkeep, .checkpoints = 1};
  int printer = 0;
  if (!r) r = tool_run(o.backend == TOOL_NCCL ? TOOL_THREADS : o.backend, (int)world, &cfg,
                       (uint64_t)o.seed, gpt_rank, &run, &printer);
  cli_progress_done();
  for (int i = 0; i < run1.nkeep; i++) free(kept[i].data);
  free(kept), free(text.ids);
  if (r || !printer) {
    tool_report("demo gpt", r);
    free(loss), free(ref);
    int status = tool_share_status(o.backend, r ? 1 : 0);
    tool_backend_done(o.backend);
    return status;
  }
  double makespan, bubble, analytic = (double)(o.pp - 1) / (double)(o.vp * o.micro);
  if (mpu_schedule_timeline(&sc, NULL, &makespan, &bubble)) bubble = NAN;
  double tokens = (double)(o.steps - run.start) * o.dp * o.micro * o.seq, tps = tokens / run.seconds;
  double ptol = 1e-3 * fmax(run.param_scale, 1.0);
  int params_ok = run.param_diff <= ptol;
  char phrase[48], phrase2[64];
  if (o.format == CLI_JSON) {
    printf("{\"tp\": %ld, \"pp\": %ld, \"dp\": %ld, \"vp\": %ld, \"ranks\": %ld, "
           "\"sequence_parallel\": %s, \"zero1\": %s, \"data_parallel\": \"%s\", \"schedule\": \"%s\", \"tokens_per_s\": %.6g, "
           "\"bubble\": %.6g, \"analytic_bubble\": %.6g, \"param_max_difference\": %.6g, "
           "\"param_tolerance\": %.6g, \"params_pass\": %s, \"recompute\": \"%s\", "
           "\"recompute_layers\": %ld, \"activation_bytes_per_micro_batch\": {\"full\": %.0f, "
           "\"selective\": %.0f, \"none\": %.0f},\n ",
           o.tp, o.pp, o.dp, o.vp, world, o.sp && o.tp > 1 ? "true" : "false",
           o.zero && o.dp > 1 && !o.shard ? "true" : "false", data_parallel_name(&o),
           mpu_schedule_name(kind), tps, bubble, analytic,
           run.param_diff, ptol, params_ok ? "true" : "false", gpt_recompute_name(o.recompute),
           o.recompute_layers, run.saved[0], run.saved[1], run.saved[2]);
  } else {
    /* Megatron's words, in plain ones, before they are used */
    printf("# tp, tensor parallel: each layer's weight matrices are split over tp ranks that "
           "compute the layer together\n"
           "# pp, pipeline parallel: the layers are cut into pp stages on different ranks; "
           "micro-batches flow through them in turn\n"
           "# vp, virtual pipeline: each stage holds vp separate chunks of layers (the interleaved "
           "schedule), so the pipeline fills sooner\n"
           "# dp, data parallel: dp copies of the model each take their own micro-batches and "
           "average their gradients (ZeRO-1: each copy keeps only its share of the optimizer "
           "state)\n"
           "# pipeline bubble: the share of a step that stages sit idle while the pipeline fills "
           "and drains, (pp-1)/(vp m) for m micro-batches\n");
    printf("# %s: tp %ld%s x pp %ld (vp %ld, %s) x dp %ld (%s); GPT of %ld blocks, hidden %ld, "
           "%ld heads, %ld tokens per micro-batch, %ld micro-batch%s per replica, vocabulary %d "
           "(padded %d), dropout %g, AdamW lr %g, %s\n",
           tool_ranks_phrase(o.backend, world, phrase, sizeof phrase), o.tp,
           o.sp && o.tp > 1 ? " with sequence parallelism" : "", o.pp, o.vp,
           mpu_schedule_name(kind), o.dp, data_parallel_name(&o), o.layers,
           o.hidden, o.heads, o.seq, o.micro, o.micro == 1 ? "" : "es", text.vocab,
           text.vocab_padded, o.dropout, o.lr, gpt_recompute_phrase(o.recompute, o.recompute_layers, phrase2, sizeof phrase2));
    if (o.backend == TOOL_NCCL)
      printf("# nccl: pipeline sends/receives and the loss's all-reduce on device buffers (NCCL); "
             "the layers and optimizer run on the CPU over the groups' host twins, and the "
             "pipeline stages activations host<->device\n");
    gpt_recompute_print(run.saved, o.recompute);
    printf("speed: %.0f tokens/s (%ld steps of %ld tokens in %.2f s); pipeline bubble %.3f of the "
           "ideal time (simulated, backward = 2 forwards), analytic (pp-1)/(vp m) = %.3f\n",
           tps, o.steps - run.start, (long)(o.dp * o.micro * o.seq), run.seconds, bubble, analytic);
    printf("check: the parameters at the end agree with one rank's to %.2e (largest difference "
           "%.2e): %s\n", ptol, run.param_diff, params_ok ? "PASS" : "FAIL");
  }
  if (o.overlap) print_overlap(&o, &run, world);
  int pass = cli_loss_check_from(o.format, "losses", "loss", loss, ref, run.start, o.steps, 1e-4) &&
             params_ok;
  free(loss), free(ref);
  int status = tool_share_status(o.backend, pass ? 0 : 1);
  tool_backend_done(o.backend);
  return status;
}
