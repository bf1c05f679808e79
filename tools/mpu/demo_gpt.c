/*
 * demo_gpt.c - `mpu demo gpt`, the main job: a small GPT (gpt.h) trained on
 * the text that ships with mpu (data/tiny_corpus.txt, a character model) with
 * tensor (and sequence), pipeline (interleaved 1F1B over virtual stages) and
 * data parallelism, ZeRO-1 AdamW and full activation recompute, then checked
 * against the same model trained on one rank: every step's loss, and every
 * parameter at the end.
 *
 * Each rank (demo_gpt_rank.c) builds its model chunks (virtual stages rank, rank + pp, ...),
 * one parameter buffer and one optimizer each; mpu_pipeline runs the
 * schedule's order over the pipeline group, calling forward (which keeps only
 * the chunk's input, mpu_recompute_forward) and backward (which recomputes
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
#include "demo_gpt.h"
#include "mpu.h"

extern const unsigned char gpt_corpus[];
extern const size_t gpt_corpus_len;

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
         "  --fsdp-layout flat|per_param  how --fsdp / --hsdp cut the parameters: FSDP1's\n"
         "                          FlatParameter (flat, the default) or FSDP2's fully_shard,\n"
         "                          each parameter sharded on dim 0 (per_param)\n"
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
         "  --backend threads|mpi|gloo|nccl  thread ranks (default), the processes of an MPI\n"
         "                          job (mpirun -n TPxPPxDP mpu demo gpt --backend mpi), of a\n"
         "                          torchrun job (torchrun --standalone --nproc_per_node\n"
         "                          TPxPPxDP --no-python $(which mpu) demo gpt --backend\n"
         "                          gloo), or thread\n"
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
         "                          measured in the same run (--tp 1 or --tp 2: that one only)\n"
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
  static char name[96];
  const char *per_param = o->fsdp_layout == MPU_FSDP_PER_PARAM ? ", FSDP2 per-parameter" : "";
  if (o->shard && o->replicas > 1) {
    snprintf(name, sizeof name, "%s, replicate %ld x shard %ld%s",
             gpt_shard_name((int)o->replicas), o->replicas, o->dp / o->replicas, per_param);
    return name;
  }
  if (o->shard) {
    snprintf(name, sizeof name, "%s%s", gpt_shard_name(1), per_param);
    return name;
  }
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

/* The command line into o, bench and given (the options given, by their
 * letters); a bad one is a usage error (exit 2). 1: --help was printed. */
static int parse(int argc, char **argv, gpt_opts *out, int *bench, int *given, long *hsdp_shard) {
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
      {"hsdp", required_argument, 0, 'Y'},     {"fsdp-layout", required_argument, 0, 'G'},     {"recompute", required_argument, 0, 'R'},
      {"recompute-layers", required_argument, 0, 'N'}, {"save", required_argument, 0, 'C'},
      {"load", required_argument, 0, 'W'},     {"save-step", required_argument, 0, 'K'},
      {"overlap-grad-reduce", no_argument, 0, 'O'},
      {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
  gpt_opts o = {2, 2, 2, 2, 40, 4, 32, 64, 4, 4, 1234, 0.003, 0.1, 1, 1, NULL, NULL, NULL, 0,
                CLI_TEXT, TOOL_THREADS, 0, 1, 0, GPT_RECOMPUTE_FULL, 0, 0};
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
    case 'b': *bench = 1; break;
    case 'R':
      if ((o.recompute = gpt_recompute_parse(optarg)) < 0)
        cli_usage_error("demo gpt", "--recompute wants none, selective or full, not '%s'", optarg);
      break;
    case 'n': o.sp = 0; break;
    case 'z': o.zero = 0; break;
    case 'O': o.overlap = 1; break;
    case 'f': o.shard = 1, o.replicas = 1; break;
    case 'Y':
      if (cli_parse_rxs(optarg, 64, &o.replicas, hsdp_shard))
        cli_usage_error("demo gpt", "--hsdp wants RxS with R*S in 1..64, not '%s'", optarg);
      o.shard = 1;
      break;
    case 'G': {
      mpu_fsdp_layout l;
      if (mpu_fsdp_layout_from_name(optarg, &l))
        cli_usage_error("demo gpt", "--fsdp-layout wants flat (FSDP1) or per_param (FSDP2), not "
                        "'%s'", optarg);
      o.fsdp_layout = (int)l;
      break;
    }
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
        if (!mpu_nccl_available())
          cli_usage_error("demo gpt", "%s (on CPUs: --backend gloo, mpi or threads)",
                          mpu_last_error());
        o.backend = TOOL_NCCL;
      }
      break;
    case 'h': help(); return 1;
    case ':': cli_usage_error("demo gpt", "option '%s' needs a value", argv[optind - 1]);
    default: cli_usage_error("demo gpt", "unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) cli_usage_error("demo gpt", "unexpected argument '%s'", argv[optind]);
  *out = o;
  return 0;
}

/* The combinations that cannot run, each a usage error (exit 2). */
static void check(gpt_opts *o, const int *given, long hsdp_shard, int bench_mode) {
  if (given['Y'] && given['f']) cli_usage_error("demo gpt", "--fsdp and --hsdp exclude each other");
  if (given['G'] && !given['Y'] && !given['f'])
    cli_usage_error("demo gpt", "--fsdp-layout goes with --fsdp or --hsdp");
  if (given['Y']) {
    if (given['d'] && o->dp != o->replicas * hsdp_shard)
      cli_usage_error("demo gpt", "--hsdp %ldx%ld makes dp %ld, but --dp is %ld", o->replicas,
                      hsdp_shard, o->replicas * hsdp_shard, o->dp);
    o->dp = o->replicas * hsdp_shard;
  }
  if (given['K'] && !o->save_dir) cli_usage_error("demo gpt", "--save-step needs --save DIR");
  if (o->save_step > o->steps)
    cli_usage_error("demo gpt", "--save-step %ld is past --steps %ld", o->save_step, o->steps);
  if (bench_mode && (o->save_dir || o->load_dir))
    cli_usage_error("demo gpt", "--bench does not save or load checkpoints");
  if (o->overlap) { /* the plain data-parallel optimizer's all-reduce only */
    if (bench_mode) cli_usage_error("demo gpt", "--overlap-grad-reduce goes with a training run, not --bench");
    if (o->dp < 2) cli_usage_error("demo gpt", "--overlap-grad-reduce needs --dp 2 or more");
    if (o->backend != TOOL_THREADS)
      cli_usage_error("demo gpt", "--overlap-grad-reduce needs --backend threads (whose non-blocking "
                      "calls progress without a wait)");
    if (o->shard || o->zero)
      cli_usage_error("demo gpt", "--overlap-grad-reduce overlaps the plain optimizer's all-reduce: "
                      "add --no-zero (ZeRO-1, --fsdp and --hsdp reduce their own way)");
    if (o->sp && o->tp > 1)
      cli_usage_error("demo gpt", "--overlap-grad-reduce with tp > 1 needs --no-sp (sequence "
                      "parallelism sums the norms' gradients over tp after the backward)");
  }
}

/* --bench: a bigger model unless given, and only its speed */
static int run_bench(gpt_opts *o, const int *given) {
  if (!given['H']) o->hidden = 256;
  if (!given['A']) o->heads = 8;
  if (!given['L']) o->layers = 2;
  if (!given['q']) o->seq = 128;
  if (!given['s']) o->steps = 4;
  if (!given['R']) o->recompute = GPT_RECOMPUTE_NONE; /* the cheapest; it fits */
  if (o->heads % 2 || o->hidden % o->heads || o->seq % 2)
    cli_usage_error("demo gpt", "--bench runs tp 2: the heads and the sequence must be even");
  int only_tp = given['t'] ? (int)o->tp : 0; /* one of the two, for a profiler */
  if (given['t'] && o->tp != 1 && o->tp != 2)
    cli_usage_error("demo gpt", "--bench runs tp 1 and tp 2 (--tp 1 or --tp 2: that one only), not --tp %ld",
                    o->tp);
  corpus text;
  if (load_text(o, &text)) return 2;
  int status = demo_gpt_bench(o, &text, only_tp);
  free(text.ids);
  return status;
}

/* The run's report: what ran, its speed and bubble, and the check of its
 * parameters (the losses are cli_loss_check_from's). */
static void report(const gpt_opts *o, const gpt_run *run, const corpus *text, mpu_schedule_kind kind,
                   long world, double bubble, double analytic, double tps, double ptol,
                   int params_ok) {
  char phrase[48], phrase2[64];
  if (o->format == CLI_JSON) {
    printf("{\"tp\": %ld, \"pp\": %ld, \"dp\": %ld, \"vp\": %ld, \"ranks\": %ld, "
           "\"sequence_parallel\": %s, \"zero1\": %s, \"data_parallel\": \"%s\", \"schedule\": \"%s\", \"tokens_per_s\": %.6g, "
           "\"bubble\": %.6g, \"analytic_bubble\": %.6g, \"param_max_difference\": %.6g, "
           "\"param_tolerance\": %.6g, \"params_pass\": %s, \"recompute\": \"%s\", "
           "\"recompute_layers\": %ld, \"activation_bytes_per_micro_batch\": {\"full\": %.0f, "
           "\"selective\": %.0f, \"none\": %.0f},\n ",
           o->tp, o->pp, o->dp, o->vp, world, o->sp && o->tp > 1 ? "true" : "false",
           o->zero && o->dp > 1 && !o->shard ? "true" : "false", data_parallel_name(o),
           mpu_schedule_name(kind), tps, bubble, analytic,
           run->param_diff, ptol, params_ok ? "true" : "false", gpt_recompute_name(o->recompute),
           o->recompute_layers, run->saved[0], run->saved[1], run->saved[2]);
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
           tool_ranks_phrase(o->backend, world, phrase, sizeof phrase), o->tp,
           o->sp && o->tp > 1 ? " with sequence parallelism" : "", o->pp, o->vp,
           mpu_schedule_name(kind), o->dp, data_parallel_name(o), o->layers,
           o->hidden, o->heads, o->seq, o->micro, o->micro == 1 ? "" : "es", text->vocab,
           text->vocab_padded, o->dropout, o->lr, gpt_recompute_phrase(o->recompute, o->recompute_layers, phrase2, sizeof phrase2));
    if (o->backend == TOOL_NCCL)
      printf("# nccl: pipeline sends/receives and the loss's all-reduce on device buffers (NCCL); "
             "the layers and optimizer run on the CPU over the groups' host twins, and the "
             "pipeline stages activations host<->device\n");
    gpt_recompute_print(run->saved, o->recompute);
    printf("speed: %.0f tokens/s (%ld steps of %ld tokens in %.2f s); pipeline bubble %.3f of the "
           "ideal time (simulated, backward = 2 forwards), analytic (pp-1)/(vp m) = %.3f\n",
           tps, o->steps - run->start, (long)(o->dp * o->micro * o->seq), run->seconds, bubble, analytic);
    printf("check: the parameters at the end agree with one rank's to %.2e (largest difference "
           "%.2e): %s\n", ptol, run->param_diff, params_ok ? "PASS" : "FAIL");
  }
}

int cmd_demo_gpt(int argc, char **argv) {
  int bench_mode = 0, given[128] = {0};
  long hsdp_shard = 1;
  gpt_opts o;
  if (parse(argc, argv, &o, &bench_mode, given, &hsdp_shard)) return 0;
  check(&o, given, hsdp_shard, bench_mode);
  openblas_set_num_threads(1); /* a rank is a core: its BLAS stays on it */
  if (bench_mode) return run_bench(&o, given);
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
  r = mpu_with_state(1, &cfg1, (uint64_t)o.seed, demo_gpt_rank, &run1, NULL, NULL);
  /* the parallel run */
  mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
  cfg.tp = (int)o.tp, cfg.pp = (int)o.pp;
  if (o.vp > 1) cfg.vp = (int)o.vp;
  gpt_run run = {.o = &o, .text = &text, .dp = (int)o.dp, .kind = kind, .loss = loss, .ref = kept,
                 .nref = run1.nkeep, .checkpoints = 1};
  int printer = 0;
  if (!r) r = tool_run(o.backend == TOOL_NCCL ? TOOL_THREADS : o.backend, (int)world, &cfg,
                       (uint64_t)o.seed, demo_gpt_rank, &run, &printer);
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
  report(&o, &run, &text, kind, world, bubble, analytic, tps, ptol, params_ok);
  if (o.overlap) print_overlap(&o, &run, world);
  int pass = cli_loss_check_from(o.format, "losses", "loss", loss, ref, run.start, o.steps, 1e-4) &&
             params_ok;
  free(loss), free(ref);
  int status = tool_share_status(o.backend, pass ? 0 : 1);
  tool_backend_done(o.backend);
  return status;
}
