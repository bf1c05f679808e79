/*
 * demo_train.c - `mpu demo train`: a small model trained with tensor,
 * pipeline and data parallelism on the library's training blocks, checked
 * against the same model trained on one rank.
 *
 * Model: vocab-parallel embedding -> L blocks (column-parallel H->4H, GeLU,
 * row-parallel 4H->H, residual) -> column-parallel H->V -> vocab-parallel
 * cross entropy. Each rank's parameters live in one mpu_param_buffer (the
 * layers are views into it); mpu_pipeline runs Megatron's 1F1B schedule
 * over the pipeline group, the stages exchanging activations and their
 * gradients; mpu_optimizer averages the gradients over the data-parallel
 * group and applies AdamW (ZeRO-1 with --zero). A layer keeps only its last
 * forward's input, so backward recomputes the micro-batch's stage forward
 * from its saved input first. tp rank 0 makes each micro-batch and
 * broadcast_data sends it to its tensor-parallel group.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cli.h"
#include "mpu.h"

typedef struct train_opts {
  long tp, pp, dp, steps, micro, tokens, hidden, vocab, layers;
  double lr;
  long seed;
  int zero;
  cli_format format;
  tool_backend backend;
} train_opts;

typedef struct train_run {
  const train_opts *o;
  int dp;          /* data-parallel replicas of this run (1 for the reference) */
  double *loss;    /* [steps], recorded by the last stage's first rank of replica 0 */
} train_run;

typedef struct block {
  mpu_column_linear fc1;
  mpu_row_linear fc2;
  float *h, *g, *dg, *dh; /* (T, 4H) activations and gradients */
} block;

/* One rank's part of the model and of the step being run. */
typedef struct stage {
  const train_opts *o;
  mpu_comm *tp;
  int first, last, nblocks, T, H, Fl, Vl, micro, dp_rank, tp_rank, step;
  mpu_param_buffer params;
  mpu_vocab_embedding emb;
  mpu_column_linear head;
  mpu_vocab_cross_entropy ce;
  block *blocks;
  float *inputs;               /* [micro][T x H]: each micro-batch's stage input */
  float *x;                    /* (nblocks + 1) x T x H: the blocks' inputs and output */
  float *dx, *dbuf, *logits, *dlogits, *loss, *dloss;
  int64_t *ids, *targets;      /* [micro][T] */
  double loss_sum;             /* this step's, over this replica's micro-batches */
} stage;

/* The micro-batch for (step, global micro-batch index): ids and targets. */
static void make_batch(const train_opts *o, int step, int mb, int64_t *ids, int64_t *targets) {
  mpu_rng g;
  mpu_rng_seed(&g, (uint64_t)o->seed * 1000003u + (uint64_t)step * 9176u + (uint64_t)mb);
  for (int t = 0; t < o->tokens; t++) {
    ids[t] = (int64_t)(mpu_rng_next(&g) % (uint64_t)o->vocab);
    targets[t] = (ids[t] * 3 + 1) % o->vocab; /* something learnable */
  }
}

#define TRY(call)                              \
  do {                                         \
    if ((r = (call)) != MPU_SUCCESS) goto out; \
  } while (0)

/* The micro-batch mb of this step: made by tp rank 0, broadcast to the
 * tensor-parallel group (the stages that read data: the first and the last). */
static mpu_result_t fetch_batch(stage *st, int mb) {
  int64_t *ids = st->ids + (size_t)mb * st->T, *targets = st->targets + (size_t)mb * st->T;
  mpu_tensor data[2];
  const char *keys[2] = {"tokens", "labels"};
  if (st->tp_rank == 0) {
    make_batch(st->o, st->step, st->dp_rank * st->micro + mb, ids, targets);
    int64_t shape[1] = {st->T};
    mpu_tensor_init(&data[0], ids, MPU_INT64, 1, shape);
    mpu_tensor_init(&data[1], targets, MPU_INT64, 1, shape);
  }
  mpu_result_t r = mpu_broadcast_data(st->tp, 2, keys, data);
  if (r) return r;
  if (st->tp_rank != 0) {
    memcpy(ids, data[0].data, (size_t)st->T * sizeof(int64_t));
    memcpy(targets, data[1].data, (size_t)st->T * sizeof(int64_t));
    mpu_tensor_free(&data[0]);
    mpu_tensor_free(&data[1]);
  }
  return MPU_SUCCESS;
}

/* This stage's forward of micro-batch mb from its saved input: the blocks'
 * output in st->x's last slot, and on the last stage the loss (added to the
 * step's sum when count is set). */
static mpu_result_t stage_forward(stage *st, int mb, int count) {
  size_t TH = (size_t)st->T * st->H;
  mpu_result_t r = MPU_SUCCESS;
  if (st->first) TRY(mpu_vocab_embedding_forward(&st->emb, st->ids + (size_t)mb * st->T, st->T, st->x));
  else memcpy(st->x, st->inputs + (size_t)mb * TH, TH * sizeof(float));
  for (int b = 0; b < st->nblocks; b++) {
    block *k = &st->blocks[b];
    float *bi = st->x + (size_t)b * TH, *bo = st->x + (size_t)(b + 1) * TH;
    TRY(mpu_column_linear_forward(&k->fc1, bi, st->T, k->h));
    mpu_gelu_forward(k->h, k->g, (size_t)st->T * st->Fl);
    TRY(mpu_row_linear_forward(&k->fc2, k->g, st->T, bo));
    for (size_t i = 0; i < TH; i++) bo[i] += bi[i]; /* residual */
  }
  if (st->last) {
    TRY(mpu_column_linear_forward(&st->head, st->x + (size_t)st->nblocks * TH, st->T, st->logits));
    TRY(mpu_vocab_cross_entropy_forward(&st->ce, st->tp, st->logits,
                                        st->targets + (size_t)mb * st->T, st->T, st->Vl, 0,
                                        st->loss));
    for (int t = 0; count && t < st->T; t++) st->loss_sum += st->loss[t];
  }
out:
  return r;
}

static mpu_result_t on_forward(void *user, int mb, int chunk, const float *input, float *output) {
  stage *st = user;
  (void)chunk;
  size_t TH = (size_t)st->T * st->H;
  mpu_result_t r = st->first || st->last ? fetch_batch(st, mb) : MPU_SUCCESS;
  if (input) memcpy(st->inputs + (size_t)mb * TH, input, TH * sizeof(float));
  if (!r) r = stage_forward(st, mb, 1);
  if (r) return r;
  if (!st->last) memcpy(output, st->x + (size_t)st->nblocks * TH, TH * sizeof(float));
  return MPU_SUCCESS;
}

static mpu_result_t on_backward(void *user, int mb, int chunk, const float *grad_output,
                                float *grad_input) {
  stage *st = user;
  (void)chunk;
  size_t TH = (size_t)st->T * st->H;
  mpu_result_t r = MPU_SUCCESS;
  TRY(stage_forward(st, mb, 0)); /* the layers' saved inputs are this micro-batch's again */
  if (st->last) { /* the step's loss is the mean over tokens and micro-batches */
    for (int t = 0; t < st->T; t++) st->dloss[t] = 1.0f / (float)(st->T * st->micro);
    TRY(mpu_vocab_cross_entropy_backward(&st->ce, st->dloss, st->dlogits));
    TRY(mpu_column_linear_backward(&st->head, st->dlogits, st->dx));
  } else {
    memcpy(st->dx, grad_output, TH * sizeof(float));
  }
  for (int b = st->nblocks - 1; b >= 0; b--) {
    block *k = &st->blocks[b];
    TRY(mpu_row_linear_backward(&k->fc2, st->dx, k->dg));
    mpu_gelu_backward(k->h, k->dg, k->dh, (size_t)st->T * st->Fl);
    TRY(mpu_column_linear_backward(&k->fc1, k->dh, st->dbuf));
    for (size_t i = 0; i < TH; i++) st->dx[i] += st->dbuf[i]; /* residual */
  }
  if (st->first) TRY(mpu_vocab_embedding_backward(&st->emb, st->dx));
  else memcpy(grad_input, st->dx, TH * sizeof(float));
out:
  return r;
}

/* A parameter of the buffer: its index, partitioned along dim (or -1). */
static mpu_result_t add(stage *st, const char *name, size_t numel, int dim, int decay, int *index) {
  mpu_param_attrs a = dim < 0 ? MPU_PARAM_DUPLICATE : MPU_PARAM_PARTITIONED(dim, 1);
  mpu_result_t r = mpu_param_buffer_add(&st->params, name, numel, a, index);
  if (r) return r;
  return decay ? MPU_SUCCESS : mpu_param_buffer_no_decay(&st->params, *index);
}

/* The stage's parameters in one buffer, the layers as views into it; every
 * weight drawn whole from its own seed, whatever the layout. */
static mpu_result_t stage_create(stage *st, int tp_size, int b0) {
  const train_opts *o = st->o;
  int H = st->H, F = 4 * H, V = (int)o->vocab, tps = tp_size, nb = st->nblocks;
  uint64_t seed = (uint64_t)o->seed;
  static float std = 0.1f;
  int emb = -1, head = -1, *idx = malloc((size_t)(4 * nb + 1) * sizeof(int));
  mpu_result_t r = MPU_SUCCESS;
  char name[48];
  if (!idx) return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "demo train: parameters");
  mpu_param_buffer_init(&st->params, st->tp_rank);
  if (st->first) TRY(add(st, "embedding.weight", (size_t)V / tps * H, 0, 1, &emb));
  for (int b = 0; b < nb; b++) {
    snprintf(name, sizeof name, "blocks.%d.fc1.weight", b0 + b);
    TRY(add(st, name, (size_t)F / tps * H, 0, 1, &idx[4 * b]));
    snprintf(name, sizeof name, "blocks.%d.fc1.bias", b0 + b);
    TRY(add(st, name, (size_t)F / tps, 0, 0, &idx[4 * b + 1]));
    snprintf(name, sizeof name, "blocks.%d.fc2.weight", b0 + b);
    TRY(add(st, name, (size_t)H * (F / tps), 1, 1, &idx[4 * b + 2]));
    snprintf(name, sizeof name, "blocks.%d.fc2.bias", b0 + b);
    TRY(add(st, name, (size_t)H, -1, 0, &idx[4 * b + 3]));
  }
  if (st->last) TRY(add(st, "head.weight", (size_t)V / tps * H, 0, 1, &head));
  TRY(mpu_param_buffer_finalize(&st->params, NULL, NULL));
#define VIEW(opt, w, b)                                                                   \
  do {                                                                                    \
    (opt).weight = mpu_param_data(&st->params, w), (opt).weight_grad = mpu_param_grad(&st->params, w); \
    if ((b) >= 0) (opt).bias_data = mpu_param_data(&st->params, b), (opt).bias_grad = mpu_param_grad(&st->params, b); \
  } while (0)
  if (st->first) {
    mpu_embedding_options eo = MPU_EMBEDDING_OPTIONS_INIT;
    eo.seed = seed + 1, eo.init_method = mpu_init_normal, eo.init_arg = &std;
    eo.weight = mpu_param_data(&st->params, emb), eo.weight_grad = mpu_param_grad(&st->params, emb);
    TRY(mpu_vocab_embedding_create(&st->emb, st->tp, V, H, &eo));
  }
  for (int b = 0; b < nb; b++) {
    mpu_linear_options c1 = MPU_LINEAR_OPTIONS_INIT, c2 = MPU_LINEAR_OPTIONS_INIT;
    c1.gather_output = 0, c1.seed = seed + 100 + (uint64_t)(b0 + b);
    c1.init_method = mpu_init_normal, c1.init_arg = &std;
    VIEW(c1, idx[4 * b], idx[4 * b + 1]);
    TRY(mpu_column_linear_create(&st->blocks[b].fc1, st->tp, H, F, &c1));
    c2.input_is_parallel = 1, c2.seed = seed + 200 + (uint64_t)(b0 + b);
    c2.init_method = mpu_init_normal, c2.init_arg = &std;
    VIEW(c2, idx[4 * b + 2], idx[4 * b + 3]);
    TRY(mpu_row_linear_create(&st->blocks[b].fc2, st->tp, F, H, &c2));
  }
  if (st->last) {
    mpu_linear_options ho = MPU_LINEAR_OPTIONS_INIT;
    ho.bias = 0, ho.gather_output = 0, ho.seed = seed + 3;
    ho.init_method = mpu_init_normal, ho.init_arg = &std;
    VIEW(ho, head, -1);
    TRY(mpu_column_linear_create(&st->head, st->tp, H, V, &ho));
  }
#undef VIEW
out:
  free(idx);
  return r;
}

static void stage_free(stage *st) {
  mpu_vocab_embedding_free(&st->emb);
  mpu_column_linear_free(&st->head);
  mpu_vocab_cross_entropy_free(&st->ce);
  for (int b = 0; st->blocks && b < st->nblocks; b++) {
    mpu_column_linear_free(&st->blocks[b].fc1);
    mpu_row_linear_free(&st->blocks[b].fc2);
    free(st->blocks[b].h), free(st->blocks[b].g), free(st->blocks[b].dg), free(st->blocks[b].dh);
  }
  mpu_param_buffer_free(&st->params);
  free(st->blocks), free(st->inputs), free(st->x), free(st->dx), free(st->dbuf), free(st->logits);
  free(st->dlogits), free(st->loss), free(st->dloss), free(st->ids), free(st->targets);
}

static mpu_result_t train_rank(mpu_state *s, void *arg) {
  train_run *run = arg;
  const train_opts *o = run->o;
  mpu_result_t r = MPU_SUCCESS;
  mpu_comm *world = mpu_state_world(s), *tp, *pp, *dpc, *mp;
  int rank, tp_size, pp_rank, pp_size;
  stage st;
  memset(&st, 0, sizeof st);
  mpu_pipeline *pipe = NULL;
  mpu_optimizer opt;
  memset(&opt, 0, sizeof opt);
  mpu_comm_rank(world, &rank);
  mpu_state_tp_size(s, &tp_size);
  mpu_state_pp_rank(s, &pp_rank);
  mpu_state_pp_size(s, &pp_size);
  if ((r = mpu_state_comm(s, MPU_GROUP_TP, &tp)) || (r = mpu_state_comm(s, MPU_GROUP_PP, &pp)) ||
      (r = mpu_state_comm(s, MPU_GROUP_DP, &dpc)) || (r = mpu_state_comm(s, MPU_GROUP_MP, &mp)))
    return r;
  st.o = o, st.tp = tp, st.micro = (int)o->micro;
  mpu_state_tp_rank(s, &st.tp_rank);
  mpu_state_dp_rank(s, &st.dp_rank);
  mpu_state_is_pp_first_stage(s, 1, &st.first);
  mpu_state_is_pp_last_stage(s, 1, &st.last);
  st.T = (int)o->tokens, st.H = (int)o->hidden, st.Fl = 4 * st.H / tp_size;
  st.Vl = (int)o->vocab / tp_size, st.nblocks = (int)(o->layers / pp_size);
  size_t TH = (size_t)st.T * st.H, TF = (size_t)st.T * st.Fl;
  st.blocks = calloc((size_t)st.nblocks, sizeof *st.blocks);
  st.inputs = malloc((size_t)st.micro * TH * sizeof(float));
  st.x = malloc((size_t)(st.nblocks + 1) * TH * sizeof(float));
  st.dx = malloc(TH * sizeof(float)), st.dbuf = malloc(TH * sizeof(float));
  st.logits = malloc((size_t)st.T * st.Vl * sizeof(float));
  st.dlogits = malloc((size_t)st.T * st.Vl * sizeof(float));
  st.loss = malloc((size_t)st.T * sizeof(float)), st.dloss = malloc((size_t)st.T * sizeof(float));
  st.ids = malloc((size_t)st.micro * st.T * sizeof(int64_t));
  st.targets = malloc((size_t)st.micro * st.T * sizeof(int64_t));
  int failed = !st.blocks || !st.inputs || !st.x || !st.dx || !st.dbuf || !st.logits ||
               !st.dlogits || !st.loss || !st.dloss || !st.ids || !st.targets;
  for (int b = 0; !failed && b < st.nblocks; b++) {
    block *k = &st.blocks[b];
    k->h = malloc(TF * sizeof(float)), k->g = malloc(TF * sizeof(float));
    k->dg = malloc(TF * sizeof(float)), k->dh = malloc(TF * sizeof(float));
    failed = !k->h || !k->g || !k->dg || !k->dh;
  }
  if (failed) {
    r = mpu_fail(MPU_ERR_OUT_OF_MEMORY, "demo train: activations");
    goto out;
  }
  TRY(stage_create(&st, tp_size, pp_rank * st.nblocks));
  mpu_adamw_options ao = MPU_ADAMW_OPTIONS_INIT;
  ao.lr = (float)o->lr, ao.weight_decay = 0, ao.clip_grad = 0;
  int zero = o->zero && run->dp > 1;
  TRY(mpu_optimizer_init(&opt, &st.params, dpc, zero, &ao));
  TRY(mpu_pipeline_create(pp, TH, &pipe));
  mpu_schedule_config sc = MPU_SCHEDULE_CONFIG_INIT;
  sc.kind = MPU_SCHEDULE_1F1B, sc.pp = pp_size, sc.vp = 1, sc.microbatches = st.micro;
  mpu_pipeline_callbacks cb = {on_forward, on_backward, &st};
  for (st.step = 0; st.step < o->steps; st.step++) {
    mpu_param_buffer_zero_grad(&st.params);
    st.loss_sum = 0;
    TRY(mpu_pipeline_run(pipe, &sc, &cb, NULL));
    TRY(mpu_optimizer_step(&opt, zero ? world : mp, NULL));
    if (st.last) {
      double step_loss = st.loss_sum / (double)(st.T * st.micro);
      TRY(mpu_comm_all_reduce(dpc, &step_loss, &step_loss, 1, MPU_FLOAT64, MPU_AVG));
      if (st.dp_rank == 0 && st.tp_rank == 0) {
        run->loss[st.step] = step_loss; /* other processes' copies stay 0 (MPI: summed below) */
        cli_progress_share((double)(st.step + 1) / o->steps);
        cli_progress("mpu demo train: step %d of %ld, loss %.6f", st.step + 1, o->steps, step_loss);
      }
    }
  }
  if (tool_is_process(o->backend)) /* the losses live in one process: give them to all */
    TRY(mpu_comm_all_reduce(world, run->loss, run->loss, (size_t)o->steps, MPU_FLOAT64, MPU_SUM));
out:
  mpu_pipeline_free(pipe);
  mpu_optimizer_free(&opt);
  stage_free(&st);
  return r;
}

static void help(void) {
  printf("usage: mpu demo train [options]\n"
         "\n"
         "Train a small model (vocab-parallel embedding, L blocks of column-parallel -> GeLU ->\n"
         "row-parallel, vocab-parallel output and cross entropy) with tensor, pipeline and data\n"
         "parallelism on tp x pp x dp thread ranks, on the library's parameter buffer, AdamW\n"
         "optimizer (ZeRO-1 with --zero) and 1F1B pipeline runner, and check every step's loss\n"
         "against the same model trained on one rank with the same global batch (1e-4\n"
         "relative). Exits 1 if they differ.\n"
         "\n"
         "options:\n"
         "  --tp T, --pp P, --dp D  parallel sizes (default 2, 2, 2: the mpu/mappings.py walkthrough's 8 ranks)\n"
         "  --steps N               optimizer steps (default 60)\n"
         "  --micro-batches M       micro-batches per replica per step (default 4)\n"
         "  --tokens K              tokens per micro-batch (default 16)\n"
         "  --hidden H              hidden size (default 32; the blocks use 4H)\n"
         "  --vocab V               vocabulary (default 64)\n"
         "  --layers L              blocks, a multiple of P (default 2)\n"
         "  --lr LR                 AdamW learning rate (default 0.002)\n"
         "  --zero                  shard the optimizer state over dp (ZeRO-1)\n"
         "  --seed S                seed of parameters and data (default 1234)\n"
         "  --backend threads|mpi   thread ranks (default), or the processes of an MPI job\n"
         "                          (mpirun -n TPxPPxDP mpu demo train --backend mpi)\n"
         "  --format text|json      output format (default text)\n"
         "  -h, --help              this text\n"
         "\n");
  cli_help_exit_status("the losses differ from one rank's, or a run failed");
  printf("\n"
         "examples:\n"
         "  mpu demo train --steps 20\n"
         "  mpu demo train --tp 1 --pp 4 --dp 1 --layers 4\n"
         "  mpirun -n 8 mpu demo train --backend mpi\n");
}

int cmd_demo_train(int argc, char **argv) {
  static const struct option longs[] = {
      {"tp", required_argument, 0, 't'},     {"pp", required_argument, 0, 'p'},
      {"dp", required_argument, 0, 'd'},     {"steps", required_argument, 0, 's'},
      {"micro-batches", required_argument, 0, 'm'}, {"tokens", required_argument, 0, 'k'},
      {"hidden", required_argument, 0, 'H'}, {"vocab", required_argument, 0, 'V'},
      {"layers", required_argument, 0, 'L'}, {"lr", required_argument, 0, 'l'},
      {"seed", required_argument, 0, 'S'},   {"format", required_argument, 0, 'F'},
      {"backend", required_argument, 0, 'B'}, {"zero", no_argument, 0, 'z'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  train_opts o = {2, 2, 2, 60, 4, 16, 32, 64, 2, 0.002, 1234, 0, CLI_TEXT, TOOL_THREADS};
  long *fields[128] = {0};
  fields['t'] = &o.tp, fields['p'] = &o.pp, fields['d'] = &o.dp, fields['s'] = &o.steps;
  fields['m'] = &o.micro, fields['k'] = &o.tokens, fields['H'] = &o.hidden;
  fields['V'] = &o.vocab, fields['L'] = &o.layers, fields['S'] = &o.seed;
  int c;
  opterr = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    if (c > 0 && c < 128 && fields[c]) {
      const char *name = "?";
      for (const struct option *l = longs; l->name; l++)
        if (l->val == c) name = l->name;
      if (cli_parse_int(optarg, c == 'S' ? 0 : 1, 1 << 20, fields[c]))
        cli_usage_error("demo train", "--%s wants a whole number %d..%d, not '%s'", name,
                        c == 'S' ? 0 : 1, 1 << 20, optarg);
      continue;
    }
    switch (c) {
    case 'l':
      if (cli_parse_double(optarg, 0, 100, &o.lr))
        cli_usage_error("demo train", "--lr wants a number in (0, 100], not '%s'", optarg);
      break;
    case 'F':
      if (cli_parse_format(optarg, &o.format))
        cli_usage_error("demo train", "--format wants text or json, not '%s'", optarg);
      break;
    case 'B': o.backend = tool_parse_backend("demo train", optarg); break;
    case 'z': o.zero = 1; break;
    case 'h': help(); return 0;
    case ':': cli_usage_error("demo train", "option '%s' needs a value", argv[optind - 1]);
    default: cli_usage_error("demo train", "unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) cli_usage_error("demo train", "unexpected argument '%s'", argv[optind]);
  long world = o.tp * o.pp * o.dp;
  if (world > 64) cli_usage_error("demo train", "tp x pp x dp = %ld ranks (at most 64)", world);
  if (o.layers % o.pp) cli_usage_error("demo train", "--layers %ld is not a multiple of --pp %ld", o.layers, o.pp);
  if ((4 * o.hidden) % o.tp || o.vocab % o.tp)
    cli_usage_error("demo train", "--tp %ld must divide 4 x hidden (%ld) and the vocabulary (%ld)",
                    o.tp, 4 * o.hidden, o.vocab);
  double *loss = calloc((size_t)o.steps, sizeof(double)), *ref = calloc((size_t)o.steps, sizeof(double));
  if (!loss || !ref) {
    fprintf(stderr, "mpu demo train: out of memory\n");
    return 1;
  }
  mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
  cfg.flavor = MPU_FLAVOR_DEEPSPEED;
  cfg.tp = (int)o.tp, cfg.pp = (int)o.pp;
  train_run run = {&o, (int)o.dp, loss};
  int printer = 0;
  mpu_result_t r = tool_run(o.backend, (int)world, &cfg, (uint64_t)o.seed, train_rank, &run, &printer);
  /* the reference: one rank, every replica's micro-batches one after the other */
  train_opts one = o;
  one.tp = one.pp = one.dp = 1;
  one.backend = TOOL_THREADS; /* the reference always runs here, on one thread rank */
  one.micro = o.micro * o.dp;
  mpu_layout_config cfg1 = MPU_LAYOUT_CONFIG_INIT;
  cfg1.flavor = MPU_FLAVOR_DEEPSPEED;
  train_run run1 = {&one, 1, ref};
  if (!r && printer) r = mpu_with_state(1, &cfg1, (uint64_t)o.seed, train_rank, &run1, NULL, NULL);
  cli_progress_done();
  if (r || !printer) {
    tool_report("demo train", r);
    free(loss), free(ref);
    int status = tool_share_status(o.backend, r ? 1 : 0);
    tool_backend_done(o.backend);
    return status;
  }
  char phrase[48];
  if (o.format == CLI_JSON)
    printf("{\"tp\": %ld, \"pp\": %ld, \"dp\": %ld, \"ranks\": %ld,\n ", o.tp, o.pp, o.dp, world);
  else
    printf("# %s: tp %ld x pp %ld x dp %ld; %ld blocks, hidden %ld, vocab %ld; "
           "%ld micro-batch%s of %ld tokens per replica; AdamW lr %g%s\n",
           tool_ranks_phrase(o.backend, world, phrase, sizeof phrase), o.tp, o.pp, o.dp, o.layers, o.hidden, o.vocab, o.micro, o.micro == 1 ? "" : "es", o.tokens, o.lr, o.zero ? ", ZeRO-1" : "");
  int pass = cli_loss_check(o.format, "losses", "loss", loss, ref, o.steps, 1e-4);
  free(loss), free(ref);
  int status = tool_share_status(o.backend, pass ? 0 : 1);
  tool_backend_done(o.backend);
  return status;
}
