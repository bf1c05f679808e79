/*
 * demo_train.c - `mpu demo train`: a small model trained with tensor,
 * pipeline and data parallelism on thread ranks, checked against the same
 * model trained on one rank.
 *
 * Model: vocab-parallel embedding -> L blocks (column-parallel H->4H, GeLU,
 * row-parallel 4H->H, residual) -> column-parallel H->V -> vocab-parallel
 * cross entropy. The blocks are spread over the pipeline stages; activations
 * and their gradients cross stages with send/recv to the next/previous rank,
 * one micro-batch at a time (forward then backward: no pipelining overlap,
 * which keeps each layer's saved activation single). Each data-parallel
 * replica trains on its own micro-batches, gradients are averaged over the
 * data-parallel group, and SGD updates every rank's slices. tp rank 0 makes
 * each micro-batch and broadcast_data sends it to its tensor-parallel group.
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

/* The micro-batch for (step, global micro-batch index): ids and targets. */
static void make_batch(const train_opts *o, int step, int mb, int64_t *ids, int64_t *targets) {
  mpu_rng g;
  mpu_rng_seed(&g, (uint64_t)o->seed * 1000003u + (uint64_t)step * 9176u + (uint64_t)mb);
  for (int t = 0; t < o->tokens; t++) {
    ids[t] = (int64_t)(mpu_rng_next(&g) % (uint64_t)o->vocab);
    targets[t] = (ids[t] * 3 + 1) % o->vocab; /* something learnable */
  }
}

#define TRY(call)                         \
  do {                                    \
    if ((r = (call)) != MPU_SUCCESS) goto out; \
  } while (0)

static mpu_result_t dp_average(mpu_comm *dp, float *g, size_t n) {
  return n ? mpu_comm_all_reduce(dp, g, g, n, MPU_FLOAT32, MPU_AVG) : MPU_SUCCESS;
}

static void sgd(float *w, const float *g, size_t n, float lr) {
  for (size_t i = 0; i < n; i++) w[i] -= lr * g[i];
}

static mpu_result_t train_rank(mpu_state *s, void *arg) {
  train_run *run = arg;
  const train_opts *o = run->o;
  mpu_result_t r = MPU_SUCCESS;
  mpu_comm *world = mpu_state_world(s), *tp, *dpc;
  int rank, tp_size, pp_rank, pp_size, dp_rank, next, prev, first, last, tp_rank;
  mpu_comm_rank(world, &rank);
  mpu_state_tp_size(s, &tp_size);
  mpu_state_tp_rank(s, &tp_rank);
  mpu_state_pp_rank(s, &pp_rank);
  mpu_state_pp_size(s, &pp_size);
  mpu_state_dp_rank(s, &dp_rank);
  mpu_state_pp_next_rank(s, &next);
  mpu_state_pp_prev_rank(s, &prev);
  mpu_state_is_pp_first_stage(s, 1, &first);
  mpu_state_is_pp_last_stage(s, 1, &last);
  if ((r = mpu_state_comm(s, MPU_GROUP_TP, &tp)) || (r = mpu_state_comm(s, MPU_GROUP_DP, &dpc)))
    return r;
  int T = (int)o->tokens, H = (int)o->hidden, F = 4 * H, V = (int)o->vocab;
  int nblocks = (int)(o->layers / pp_size), b0 = pp_rank * nblocks, Vl = V / tp_size;
  uint64_t seed = (uint64_t)o->seed;
  float std = 0.1f;

  mpu_vocab_embedding emb = {0};
  mpu_column_linear head = {0};
  mpu_vocab_cross_entropy ce = {0};
  block *blocks = calloc((size_t)nblocks, sizeof *blocks);
  float *x = malloc((size_t)(nblocks + 1) * T * H * sizeof(float)); /* stage input + block outputs */
  float *dx = malloc((size_t)T * H * sizeof(float)), *dbuf = malloc((size_t)T * H * sizeof(float));
  float *logits = malloc((size_t)T * Vl * sizeof(float)), *dlogits = malloc((size_t)T * Vl * sizeof(float));
  float *loss = malloc((size_t)T * sizeof(float)), *dloss = malloc((size_t)T * sizeof(float));
  int64_t *ids = malloc((size_t)T * sizeof(int64_t)), *targets = malloc((size_t)T * sizeof(int64_t));
  if (!blocks || !x || !dx || !dbuf || !logits || !dlogits || !loss || !dloss || !ids || !targets) {
    r = MPU_ERR_OUT_OF_MEMORY;
    goto out;
  }
  /* parameters: every one drawn from its own seed, whatever the layout */
  if (first) TRY(mpu_vocab_embedding_init(&emb, tp, V, H, seed + 1, std));
  for (int b = 0; b < nblocks; b++) {
    TRY(mpu_column_linear_init(&blocks[b].fc1, tp, H, F, 1, 0, 0, seed + 100 + (uint64_t)(b0 + b), std));
    TRY(mpu_row_linear_init(&blocks[b].fc2, tp, F, H, 1, 1, 0, seed + 200 + (uint64_t)(b0 + b), std));
    blocks[b].h = malloc((size_t)T * (F / tp_size) * sizeof(float));
    blocks[b].g = malloc((size_t)T * (F / tp_size) * sizeof(float));
    blocks[b].dg = malloc((size_t)T * (F / tp_size) * sizeof(float));
    blocks[b].dh = malloc((size_t)T * (F / tp_size) * sizeof(float));
    if (!blocks[b].h || !blocks[b].g || !blocks[b].dg || !blocks[b].dh) {
      r = MPU_ERR_OUT_OF_MEMORY;
      goto out;
    }
  }
  if (last) TRY(mpu_column_linear_init(&head, tp, H, V, 0, 0, 0, seed + 3, std));

  int fl = F / tp_size;
  for (int step = 0; step < o->steps; step++) {
    double step_loss = 0;
    if (first) mpu_vocab_embedding_zero_grad(&emb);
    for (int b = 0; b < nblocks; b++) {
      mpu_column_linear_zero_grad(&blocks[b].fc1);
      mpu_row_linear_zero_grad(&blocks[b].fc2);
    }
    if (last) mpu_column_linear_zero_grad(&head);
    for (int m = 0; m < o->micro; m++) {
      /* the batch: made by tp rank 0, broadcast to the tensor-parallel group */
      int global_mb = dp_rank * (int)o->micro + m;
      mpu_tensor data[2];
      const char *keys[2] = {"tokens", "labels"};
      if (tp_rank == 0) {
        make_batch(o, step, global_mb, ids, targets);
        int64_t shape[1] = {T};
        mpu_tensor_init(&data[0], ids, MPU_INT64, 1, shape);
        mpu_tensor_init(&data[1], targets, MPU_INT64, 1, shape);
      }
      TRY(mpu_broadcast_data(tp, 2, keys, data));
      if (tp_rank != 0) {
        memcpy(ids, data[0].data, (size_t)T * sizeof(int64_t));
        memcpy(targets, data[1].data, (size_t)T * sizeof(int64_t));
        mpu_tensor_free(&data[0]);
        mpu_tensor_free(&data[1]);
      }
      /* forward */
      float *in = x;
      if (first) TRY(mpu_vocab_embedding_forward(&emb, ids, T, in));
      else TRY(mpu_comm_recv(world, in, (size_t)T * H, MPU_FLOAT32, prev));
      for (int b = 0; b < nblocks; b++) {
        float *bi = x + (size_t)b * T * H, *bo = x + (size_t)(b + 1) * T * H;
        TRY(mpu_column_linear_forward(&blocks[b].fc1, bi, T, blocks[b].h));
        mpu_gelu_forward(blocks[b].h, blocks[b].g, (size_t)T * fl);
        TRY(mpu_row_linear_forward(&blocks[b].fc2, blocks[b].g, T, bo));
        for (size_t i = 0; i < (size_t)T * H; i++) bo[i] += bi[i]; /* residual */
      }
      float *out = x + (size_t)nblocks * T * H;
      if (!last) {
        TRY(mpu_comm_send(world, out, (size_t)T * H, MPU_FLOAT32, next));
        TRY(mpu_comm_recv(world, dx, (size_t)T * H, MPU_FLOAT32, next));
      } else {
        TRY(mpu_column_linear_forward(&head, out, T, logits));
        TRY(mpu_vocab_cross_entropy_forward(&ce, tp, logits, targets, T, Vl, 0, loss));
        for (int t = 0; t < T; t++) step_loss += loss[t] / (double)(T * o->micro);
        /* the step's loss is the mean over tokens and micro-batches */
        for (int t = 0; t < T; t++) dloss[t] = 1.0f / (float)(T * o->micro);
        TRY(mpu_vocab_cross_entropy_backward(&ce, dloss, dlogits));
        TRY(mpu_column_linear_backward(&head, dlogits, dx));
      }
      /* backward through this stage's blocks */
      for (int b = nblocks - 1; b >= 0; b--) {
        TRY(mpu_row_linear_backward(&blocks[b].fc2, dx, blocks[b].dg));
        mpu_gelu_backward(blocks[b].h, blocks[b].dg, blocks[b].dh, (size_t)T * fl);
        TRY(mpu_column_linear_backward(&blocks[b].fc1, blocks[b].dh, dbuf));
        for (size_t i = 0; i < (size_t)T * H; i++) dx[i] += dbuf[i]; /* residual */
      }
      if (first) TRY(mpu_vocab_embedding_backward(&emb, dx));
      else TRY(mpu_comm_send(world, dx, (size_t)T * H, MPU_FLOAT32, prev));
    }
    /* data parallel: average the gradients, then SGD on every slice */
    float lr = (float)o->lr;
    if (first) {
      size_t n = (size_t)(emb.vocab_end - emb.vocab_start) * H;
      TRY(dp_average(dpc, emb.dweight, n));
      sgd(emb.weight, emb.dweight, n, lr);
    }
    for (int b = 0; b < nblocks; b++) {
      mpu_column_linear *c = &blocks[b].fc1;
      mpu_row_linear *w = &blocks[b].fc2;
      TRY(dp_average(dpc, c->dweight, (size_t)c->out_local * c->in));
      TRY(dp_average(dpc, c->dbias, (size_t)c->out_local));
      TRY(dp_average(dpc, w->dweight, (size_t)w->out * w->in_local));
      TRY(dp_average(dpc, w->dbias, (size_t)w->out));
      sgd(c->weight, c->dweight, (size_t)c->out_local * c->in, lr);
      sgd(c->bias, c->dbias, (size_t)c->out_local, lr);
      sgd(w->weight, w->dweight, (size_t)w->out * w->in_local, lr);
      sgd(w->bias, w->dbias, (size_t)w->out, lr);
    }
    if (last) {
      TRY(dp_average(dpc, head.dweight, (size_t)head.out_local * head.in));
      sgd(head.weight, head.dweight, (size_t)head.out_local * head.in, lr);
      TRY(mpu_comm_all_reduce(dpc, &step_loss, &step_loss, 1, MPU_FLOAT64, MPU_AVG));
      if (dp_rank == 0 && tp_rank == 0) {
        run->loss[step] = step_loss; /* other processes' copies stay 0 (MPI: summed below) */
        cli_progress_share((double)(step + 1) / o->steps);
        cli_progress("mpu demo train: step %d of %ld, loss %.6f", step + 1, o->steps, step_loss);
      }
    }
  }
  if (o->backend == TOOL_MPI) /* the losses live in one process: give them to all */
    TRY(mpu_comm_all_reduce(world, run->loss, run->loss, (size_t)o->steps, MPU_FLOAT64, MPU_SUM));
out:
  mpu_vocab_embedding_free(&emb);
  mpu_column_linear_free(&head);
  mpu_vocab_cross_entropy_free(&ce);
  for (int b = 0; blocks && b < nblocks; b++) {
    mpu_column_linear_free(&blocks[b].fc1);
    mpu_row_linear_free(&blocks[b].fc2);
    free(blocks[b].h), free(blocks[b].g), free(blocks[b].dg), free(blocks[b].dh);
  }
  free(blocks), free(x), free(dx), free(dbuf), free(logits), free(dlogits), free(loss);
  free(dloss), free(ids), free(targets);
  return r;
}

static void help(void) {
  printf("usage: mpu demo train [options]\n"
         "\n"
         "Train a small model (vocab-parallel embedding, L blocks of column-parallel -> GeLU ->\n"
         "row-parallel, vocab-parallel output and cross entropy) with tensor, pipeline and data\n"
         "parallelism on tp x pp x dp thread ranks, and check every step's loss against the same\n"
         "model trained on one rank with the same global batch (1e-4 relative). Exits 1 if they\n"
         "differ.\n"
         "\n"
         "options:\n"
         "  --tp T, --pp P, --dp D  parallel sizes (default 2, 2, 2: seed 001's 8 ranks)\n"
         "  --steps N               SGD steps (default 60)\n"
         "  --micro-batches M       micro-batches per replica per step (default 4)\n"
         "  --tokens K              tokens per micro-batch (default 16)\n"
         "  --hidden H              hidden size (default 32; the blocks use 4H)\n"
         "  --vocab V               vocabulary (default 64)\n"
         "  --layers L              blocks, a multiple of P (default 2)\n"
         "  --lr LR                 learning rate (default 1.0)\n"
         "  --seed S                seed of parameters and data (default 1234)\n"
         "  --backend threads|mpi   thread ranks (default), or the processes of an MPI job\n"
         "                          (mpirun -n TPxPPxDP mpu demo train --backend mpi)\n"
         "  --format text|json      output format (default text)\n"
         "  -h, --help              this text\n");
}

int cmd_demo_train(int argc, char **argv) {
  static const struct option longs[] = {
      {"tp", required_argument, 0, 't'},     {"pp", required_argument, 0, 'p'},
      {"dp", required_argument, 0, 'd'},     {"steps", required_argument, 0, 's'},
      {"micro-batches", required_argument, 0, 'm'}, {"tokens", required_argument, 0, 'k'},
      {"hidden", required_argument, 0, 'H'}, {"vocab", required_argument, 0, 'V'},
      {"layers", required_argument, 0, 'L'}, {"lr", required_argument, 0, 'l'},
      {"seed", required_argument, 0, 'S'},   {"format", required_argument, 0, 'F'},
      {"backend", required_argument, 0, 'B'}, {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  train_opts o = {2, 2, 2, 60, 4, 16, 32, 64, 2, 1.0, 1234, CLI_TEXT, TOOL_THREADS};
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
    if (r) fprintf(stderr, "mpu demo train: %s: %s\n", mpu_result_name(r), mpu_last_error());
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
           "%ld micro-batch%s of %ld tokens per replica; SGD lr %g\n",
           tool_ranks_phrase(o.backend, world, phrase, sizeof phrase), o.tp, o.pp, o.dp, o.layers, o.hidden, o.vocab, o.micro, o.micro == 1 ? "" : "es", o.tokens, o.lr);
  int pass = cli_loss_check(o.format, "losses", "loss", loss, ref, o.steps, 1e-4);
  free(loss), free(ref);
  int status = tool_share_status(o.backend, pass ? 0 : 1);
  tool_backend_done(o.backend);
  return status;
}
