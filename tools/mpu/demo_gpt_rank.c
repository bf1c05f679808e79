/*
 * demo_gpt_rank.c - one rank of `mpu demo gpt` (demo_gpt.c says what the run
 * is): its model chunks, one parameter buffer and one optimizer each (or
 * FSDP's shards), the pipeline's forward and backward with activation
 * recompute, the data-parallel reduces (overlapped with the backward when
 * asked), the optimizer step, checkpoints, and the check of its parameters
 * against the reference's at the end.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gpt_device.h"
#include "cli.h"
#include "gpt.h"
#include "gpt_fsdp.h"
#include "gpt_ckpt.h"
#include "demo_gpt.h"
#include "mpu.h"

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
  int frames;                /* activation frames per chunk: micro-batch mb uses mb % frames */
  int64_t *ids, *targets;    /* [micro][seq] */
  float *inputs;             /* [vp][micro][T_local x hidden]: each chunk's saved input */
  mpu_recompute *ck;        /* [vp][micro] */
  double loss_sum;
  /* the forward being run (for mpu_recompute's callback) */
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
  gpt_chunk_use_frame(&m->chunks[chunk], mb % m->frames); /* (no frames: the chunk is recomputed) */
  /* the data (this replica's share of the global batch): the first stage reads the
   * tokens, the last the targets */
  if (m->chunks[chunk].first || m->chunks[chunk].last)
    make_batch(m->o, m->run->text, m->step, m->dp_rank * m->micro + mb,
               m->ids + (size_t)mb * m->o->seq, m->targets + (size_t)mb * m->o->seq);
  if (input) memcpy(m->inputs + ((size_t)chunk * m->micro + mb) * act_size(m), input,
                    act_size(m) * sizeof(float));
  m->cur_mb = mb, m->cur_chunk = chunk, m->cur_out = output, m->counting = 1;
  if (!gpt_chunk_whole_recompute(&m->ctx, &m->chunks[chunk])) return run_chunk(m);
  return mpu_recompute_forward(&m->ck[(size_t)chunk * m->micro + mb], m->s, run_chunk, m);
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
  gpt_chunk_use_frame(&m->chunks[chunk], mb % m->frames);
  mpu_result_t r = MPU_SUCCESS;
  if (gpt_chunk_whole_recompute(&m->ctx, &m->chunks[chunk]))
    r = mpu_recompute_replay(&m->ck[(size_t)chunk * m->micro + mb], m->s, run_chunk, m);
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

/* The step's gradient reduces under --overlap-grad-reduce: the overlapped
 * step waits for the reduces its backward started; the blocking one makes the
 * optimizer's all-reduces itself, timed (blocking_s), and tells the optimizer. */
static mpu_result_t overlap_reduces(rank_model *m, mpu_optimizer *opts, int overlapped,
                                    double *complete, double *reduces, double *blocking_s) {
  mpu_result_t r = MPU_SUCCESS;
  if (overlapped) {
    r = finish_reduces(m, opts, complete);
    for (int c = 0; !r && c < m->vp; c++) *reduces += m->nreqs[c];
    return r;
  }
  double t1 = cli_now();
  for (int c = 0; !r && c < m->vp; c++) {
    r = mpu_grad_all_reduce(&m->chunks[c].params, m->dp, &m->sync);
    if (!r) r = mpu_optimizer_set_grads_reduced(&opts[c], 1);
  }
  *blocking_s += cli_now() - t1;
  return r;
}

/* The last stage's step loss, averaged over dp, into run->loss (and the
 * progress line) on its first tensor and data rank. */
static mpu_result_t record_loss(rank_model *m, gpt_device *dev, mpu_comm *dpc, int tp_rank) {
  const gpt_opts *o = m->o;
  gpt_run *run = m->run;
  double loss = m->loss_sum / (double)(o->seq * m->micro);
  mpu_result_t r = o->backend == TOOL_NCCL
                       ? gpt_device_loss_avg(dev, &loss)
                       : mpu_comm_all_reduce(dpc, &loss, &loss, 1, MPU_FLOAT64, MPU_AVG);
  if (r || tp_rank != 0 || m->dp_rank != 0) return r;
  run->loss[m->step] = loss;
  if (!run->quiet && (run->dp > 1 || o->tp * o->pp * o->dp == 1)) {
    cli_progress_share(0.5 * (m->step + 1) / (double)o->steps);
    cli_progress("mpu demo gpt: step %d of %ld, loss %.4f", m->step + 1, o->steps, loss);
  }
  return MPU_SUCCESS;
}

/* The reference's parameters, by name, into run->keep (the parallel run's
 * ranks check their slices against them). */
static mpu_result_t keep_params(gpt_run *run, const gpt_chunk *ch) {
  if (ch->params.nparams > 4096)
    return mpu_fail(MPU_ERR_INVALID_ARGUMENT, "gpt: %d parameters to keep (at most 4096)",
                    ch->params.nparams);
  run->nkeep = ch->params.nparams;
  for (int i = 0; i < ch->params.nparams; i++) {
    named *k = &run->keep[i];
    snprintf(k->name, sizeof k->name, "%s", ch->shapes[i].name);
    k->numel = ch->params.params[i].numel;
    k->data = malloc(k->numel * sizeof(float));
    if (!k->data) return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "gpt: reference parameters");
    memcpy(k->data, mpu_param_data(&ch->params, i), k->numel * sizeof(float));
  }
  return MPU_SUCCESS;
}

/* --overlap-grad-reduce's times and counts (sums: blocking, exposed, reduces,
 * complete, the blocking and the overlapped steps' wall time), every rank's
 * summed into run on rank 0 (the threads backend: one process). */
static mpu_result_t sum_overlap(gpt_run *run, mpu_comm *world, int rank, double sums[6],
                                long steps) {
  mpu_result_t r = mpu_comm_all_reduce(world, sums, sums, 6, MPU_FLOAT64, MPU_SUM);
  if (r || rank != 0) return r;
  run->blocking_s = sums[0], run->exposed_s = sums[1], run->reduces = sums[2];
  run->complete = sums[3], run->step_s[0] = sums[4], run->step_s[1] = sums[5];
  run->overlapped_steps = 0;
  for (long k = 0; k < steps; k++) run->overlapped_steps += overlap_step((int)k, (int)steps);
  run->blocking_steps = steps - run->overlapped_steps;
  return MPU_SUCCESS;
}

mpu_result_t demo_gpt_rank(mpu_state *s, void *arg) {
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
  /* no pipelining runs each micro-batch's forward and backward in turn: one in flight, so one
   * set of activations serves them all (and stays in the caches); a pipeline keeps one per
   * micro-batch, the most it can have in flight */
  m.frames = run->kind == MPU_SCHEDULE_NO_PIPELINING ? 1 : m.micro;
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
    TRY(gpt_chunk_frames(&m.ctx, &m.chunks[c], m.frames));
    if (!o->shard)
      TRY(mpu_optimizer_init(&opts[c], &m.chunks[c].params, dpc, o->zero && run->dp > 1, &ao));
    optp[c] = &opts[c];
  }
  if (o->shard)
    TRY(gpt_shard_init(&sharding, m.chunks, m.vp, dpc, (int)o->replicas,
                       (mpu_fsdp_layout)o->fsdp_layout, &ao));
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
  if (rank == 0 || tool_is_process(o->backend)) memcpy(run->saved, saved, sizeof saved);
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
    if (overlap) TRY(overlap_reduces(&m, opts, overlapped, &complete, &reduces, &blocking_s));
    /* one norm over the whole model: every rank's shard (ZeRO-1) or every model-parallel rank */
    if (o->shard) TRY(gpt_shard_step(&sharding, mp));
    else TRY(mpu_optimizer_step_all(optp, m.vp, opts[0].distributed ? world : mp, NULL));
    if (last_stage) TRY(record_loss(&m, &dev, dpc, tp_rank));
    if (run->checkpoints && o->save_dir && m.step + 1 == (o->save_step ? o->save_step : o->steps))
      TRY(gpt_ckpt_save(o->save_dir, s, &m.ctx, m.chunks, m.vp, &gp, m.micro, m.step + 1));
    step_s[overlapped] += cli_now() - step_t0;
  }
  if (o->shard) TRY(gpt_shard_unshard(&sharding)); /* the trained parameters, whole */
  TRY(mpu_comm_barrier(world));
  if (rank == 0) run->seconds = cli_now() - t0;
  if (run->comm) mpu_comm_clock(&run->comm[rank], NULL);
  if (overlap) {
    double sums[6] = {blocking_s, m.exposed_s, reduces, complete, step_s[0], step_s[1]};
    TRY(sum_overlap(run, world, rank, sums, o->steps - start));
  }
  if (tool_is_process(o->backend)) /* the losses live in one process (the last stage's): give them to all */
    TRY(mpu_comm_all_reduce(world, run->loss, run->loss, (size_t)o->steps, MPU_FLOAT64, MPU_SUM));
  if (run->keep) TRY(keep_params(run, &m.chunks[0])); /* the reference keeps its parameters */
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
