/*
 * demo_hsdp.c - `mpu demo hsdp`: the DeviceMesh tutorial's HSDP example in C.
 *
 * ToyModel trained on a (replicate, shard) mesh of thread ranks with hybrid
 * sharding, as FSDP's HYBRID_SHARD does it (mpu/fsdp.h): inside each "shard"
 * group the flat parameter vector is sharded (gathered before the forward,
 * the gradients reduce-scattered after the backward), and the gradient
 * pieces are averaged across the "replicate" group; SGD updates each piece.
 * The loss, a Partial(avg) on both mesh dims, is made Replicate with
 * mpu_redistribute. Every rank trains on its own slice of the global batch. The same
 * model trained on one rank with the whole batch gives the reference losses.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cli.h"
#include "mpu.h"
#include "toy_model.h"

typedef struct hsdp_opts {
  long replicate, shard, steps, batch;
  double lr;
  long seed;
  cli_format format;
  tool_backend backend;
} hsdp_opts;

typedef struct hsdp_run {
  const hsdp_opts *o;
  const float *x, *y;  /* the global batch: (batch, IN), (batch, OUT) */
  double *loss;        /* [steps], recorded by rank 0 (the printing process under MPI) */
  size_t chunk;        /* parameters per shard (set by rank 0's sharded buffer) */
} hsdp_run;

static void help(void) {
  printf("usage: mpu demo hsdp [options]\n"
         "\n"
         "Hybrid sharded data parallel (HSDP) on a 2-d device mesh of ranks, as in\n"
         "PyTorch's DeviceMesh tutorial: ToyModel (Linear 10->10, ReLU, Linear 10->5), parameters\n"
         "and gradients sharded within each 'shard' group, gradients averaged across the\n"
         "'replicate' group. Checks every step's loss against the same model trained on one\n"
         "rank with the whole batch (1e-5 relative) and exits 1 if they differ.\n"
         "\n"
         "options:\n"
         "  --mesh RxS          replicate x shard mesh (default 2x4: 8 ranks)\n"
         "  --steps N           training steps (default 10)\n"
         "  --batch B           global batch, a multiple of R*S (default 64)\n"
         "  --lr LR             SGD learning rate (default 0.1)\n"
         "  --seed S            parameter and data seed (default 42)\n"
         "  --backend threads|mpi  thread ranks (default), or the processes of an MPI job\n"
         "                      (mpirun -n R*S mpu demo hsdp --backend mpi)\n"
         "  --format text|json  output format (default text)\n"
         "  -h, --help          this text\n"
         "\n");
  cli_help_exit_status("the losses differ from one rank's, or a run failed");
  printf("\n"
         "examples:\n"
         "  mpu demo hsdp\n"
         "  mpu demo hsdp --mesh 3x2 --batch 24 --format json\n"
         "  mpirun -n 8 mpu demo hsdp --backend mpi\n");
}

static void parse(int argc, char **argv, hsdp_opts *o) {
  static const struct option longs[] = {
      {"mesh", required_argument, 0, 'm'}, {"steps", required_argument, 0, 's'},
      {"batch", required_argument, 0, 'b'}, {"lr", required_argument, 0, 'l'},
      {"seed", required_argument, 0, 'S'}, {"format", required_argument, 0, 'F'},
      {"backend", required_argument, 0, 'B'}, {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  *o = (hsdp_opts){2, 4, 10, 64, 0.1, 42, CLI_TEXT, TOOL_THREADS};
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    switch (c) {
    case 'm':
      if (cli_parse_rxs(optarg, 256, &o->replicate, &o->shard))
        cli_usage_error("demo hsdp", "--mesh wants RxS with R*S in 1..256, not '%s'", optarg);
      break;
    case 's':
      if (cli_parse_int(optarg, 1, 100000, &o->steps))
        cli_usage_error("demo hsdp", "--steps wants 1..100000, not '%s'", optarg);
      break;
    case 'b':
      if (cli_parse_int(optarg, 1, 1 << 20, &o->batch))
        cli_usage_error("demo hsdp", "--batch wants 1..1048576, not '%s'", optarg);
      break;
    case 'l':
      if (cli_parse_double(optarg, 0, 100, &o->lr))
        cli_usage_error("demo hsdp", "--lr wants a number in (0, 100], not '%s'", optarg);
      break;
    case 'S':
      if (cli_parse_int(optarg, 0, 1L << 30, &o->seed))
        cli_usage_error("demo hsdp", "--seed wants 0..2^30, not '%s'", optarg);
      break;
    case 'F':
      if (cli_parse_format(optarg, &o->format))
        cli_usage_error("demo hsdp", "--format wants text or json, not '%s'", optarg);
      break;
    case 'B': o->backend = tool_parse_backend("demo hsdp", optarg); break;
    case 'h': help(); exit(0);
    case ':': cli_usage_error("demo hsdp", "option '%s' needs a value", argv[optind - 1]);
    default: cli_usage_error("demo hsdp", "unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) cli_usage_error("demo hsdp", "unexpected argument '%s'", argv[optind]);
  if (o->batch % (o->replicate * o->shard))
    cli_usage_error("demo hsdp", "--batch %ld is not a multiple of the %ld ranks", o->batch,
                    o->replicate * o->shard);
}

#define TRY(call)                      \
  do {                                 \
    if ((r = (call)) != MPU_SUCCESS) { \
      goto out;                        \
    }                                  \
  } while (0)

static mpu_result_t hsdp_rank(mpu_comm *world, void *arg) {
  hsdp_run *run = arg;
  const hsdp_opts *o = run->o;
  int rank, nranks;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &nranks);
  const char *names[] = {"replicate", "shard"};
  int64_t shape[] = {o->replicate, o->shard};
  mpu_device_mesh *dm = NULL;
  mpu_param_buffer b;
  mpu_fsdp *f = NULL;
  toy_acts acts = {0};
  int local = (int)(o->batch / nranks), toy;
  float *full = malloc(TOY_NPARAMS * sizeof(float));
  mpu_param_buffer_init(&b, 0);
  mpu_result_t r = MPU_SUCCESS;
  if (!full || toy_acts_alloc(&acts, local)) {
    r = MPU_ERR_OUT_OF_MEMORY;
    goto out;
  }
  /* the flat parameter vector, sharded along "shard" and replicated along
   * "replicate": FSDP's HYBRID_SHARD on the tutorial's mesh */
  TRY(mpu_param_buffer_add(&b, "toy", TOY_NPARAMS, MPU_PARAM_DUPLICATE, &toy));
  TRY(mpu_device_mesh_init(world, 2, shape, names, MPU_MESH_EAGER, &dm));
  mpu_fsdp_options fo = MPU_FSDP_OPTIONS_INIT;
  fo.strategy = MPU_SHARD_HYBRID;
  TRY(mpu_fsdp_create_on_mesh(&b, dm, 0, 1, &fo, &f));
  toy_init_params(full, (uint64_t)o->seed); /* every rank draws the same; keeps its piece */
  TRY(mpu_fsdp_set_param(f, toy, full));
  if (rank == 0) TRY(mpu_fsdp_bucket_range(f, 0, NULL, NULL, &run->chunk));
  const float *x = run->x + (size_t)rank * local * TOY_IN, *y = run->y + (size_t)rank * local * TOY_OUT;
  /* the loss: each rank's mean, Partial(avg) on both dims, made Replicate */
  mpu_dtensor_spec partial = {1, {1}, {MPU_PARTIAL(MPU_AVG), MPU_PARTIAL(MPU_AVG)}, MPU_FLOAT64};
  mpu_dtensor_spec whole = {1, {1}, {MPU_REPLICATE, MPU_REPLICATE}, MPU_FLOAT64};

  for (int step = 0; step < o->steps; step++) {
    TRY(mpu_fsdp_unshard(f, 0, -1));
    const float *params = mpu_fsdp_param(f, toy);
    float *grads = mpu_fsdp_grad(f, toy);
    if (!grads) {
      r = MPU_ERR_OUT_OF_MEMORY;
      goto out;
    }
    double loss = toy_forward(params, x, y, &acts), mean;
    if (toy_backward(params, x, y, &acts, grads)) {
      r = MPU_ERR_OUT_OF_MEMORY;
      goto out;
    }
    /* gradient piece: reduce-scattered over "shard", averaged over "replicate" */
    TRY(mpu_fsdp_backward_done(f, 0));
    TRY(mpu_fsdp_sync_grads(f));
    size_t held;
    float *mine = mpu_fsdp_shard_params(f, &held);
    const float *gmine = mpu_fsdp_shard_grads(f, NULL);
    for (size_t i = 0; i < held; i++) mine[i] -= (float)o->lr * gmine[i]; /* SGD on the piece */
    mpu_fsdp_zero_grad(f);
    TRY(mpu_redistribute(dm, &partial, &loss, &whole, &mean));
    if (rank == 0) {
      run->loss[step] = mean;
      cli_progress_share((double)(step + 1) / o->steps);
      cli_progress("mpu demo hsdp: step %d of %ld", step + 1, o->steps);
    }
  }
out:
  toy_acts_free(&acts);
  mpu_fsdp_free(f);
  mpu_param_buffer_free(&b);
  mpu_device_mesh_free(dm);
  free(full);
  return r;
}

/* The reference: one rank, the whole batch, plain SGD. */
static int train_alone(const hsdp_opts *o, const float *x, const float *y, double *loss) {
  float params[TOY_NPARAMS], grads[TOY_NPARAMS];
  toy_acts acts;
  if (toy_acts_alloc(&acts, (int)o->batch)) return -1;
  toy_init_params(params, (uint64_t)o->seed);
  int bad = 0;
  for (int step = 0; step < o->steps && !bad; step++) {
    loss[step] = toy_forward(params, x, y, &acts);
    bad = toy_backward(params, x, y, &acts, grads);
    for (int i = 0; i < TOY_NPARAMS; i++) params[i] -= (float)o->lr * grads[i];
  }
  toy_acts_free(&acts);
  return bad;
}

int cmd_demo_hsdp(int argc, char **argv) {
  hsdp_opts o;
  parse(argc, argv, &o);
  int nranks = (int)(o.replicate * o.shard);
  float *x = malloc((size_t)o.batch * TOY_IN * sizeof(float));
  float *y = malloc((size_t)o.batch * TOY_OUT * sizeof(float));
  double *loss = calloc((size_t)o.steps, sizeof(double)), *ref = calloc((size_t)o.steps, sizeof(double));
  int status = 1;
  char phrase[48];
  if (!x || !y || !loss || !ref) {
    fprintf(stderr, "mpu demo hsdp: out of memory\n");
    goto out;
  }
  toy_make_data(x, y, (int)o.batch, (uint64_t)o.seed);
  hsdp_run run = {&o, x, y, loss, 0};
  int printer = 0;
  mpu_result_t r = tool_launch(o.backend, nranks, hsdp_rank, &run, &printer);
  cli_progress_done();
  if (r || !printer) { /* under MPI the other processes only wait for rank 0's verdict */
    tool_report("demo hsdp", r);
    status = r ? 1 : 0;
    goto out;
  }
  if (train_alone(&o, x, y, ref)) {
    fprintf(stderr, "mpu demo hsdp: out of memory\n");
    goto out;
  }
  if (o.format == CLI_JSON)
    printf("{\"mesh\": {\"replicate\": %ld, \"shard\": %ld}, \"ranks\": %d, \"parameters\": %d, "
           "\"parameters_per_shard\": %zu, \"batch\": %ld, \"lr\": %g, \"seed\": %ld,\n ",
           o.replicate, o.shard, nranks, TOY_NPARAMS, run.chunk, o.batch, o.lr, o.seed);
  else
    printf("# HSDP on a (replicate=%ld, shard=%ld) mesh of %s\n"
           "# ToyModel 10->10->5: %d parameters, %zu per shard; batch %ld (%ld per rank); SGD lr "
           "%g; seed %ld\n",
           o.replicate, o.shard, tool_ranks_phrase(o.backend, nranks, phrase, sizeof phrase),
           TOY_NPARAMS, run.chunk, o.batch, o.batch / nranks, o.lr, o.seed);
  int pass = cli_loss_check(o.format, "HSDP losses", "hsdp_loss", loss, ref, o.steps, 1e-5);
  status = pass ? 0 : 1;
out:
  free(x);
  free(y);
  free(loss);
  free(ref);
  status = tool_share_status(o.backend, status);
  tool_backend_done(o.backend);
  return status;
}
