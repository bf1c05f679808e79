/*
 * bench_cmd.c - `mpu bench`: collective bandwidth and latency in nccl-tests'
 * flags and columns (out-of-place and in-place side by side, #wrong from
 * checking every result), each row against its roof timed in the row's own
 * pauses: the time of the collective's least data movement done by the
 * threads backend's threads with no waiting between them (mpu_bench_roof).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_cmd.h"

static void help(void) {
  printf(
      "usage: mpu bench [options]\n"
      "\n"
      "Time collectives on n ranks (thread ranks by default; MPI processes or NCCL with\n"
      "--backend) with nccl-tests' flags and columns: size is the whole buffer (all_gather:\n"
      "the output; reduce_scatter, all_to_all: the input), rounded to at least one element\n"
      "per rank; time is the slowest rank's time for the timed loop over the iterations\n"
      "(the median of each iteration's slowest rank beside it; -a gives nccl-tests' per-rank\n"
      "means instead); algbw = size / time, busbw = algbw\n"
      "x the collective's bus factor. Out-of-place and in-place run side by side; after the\n"
      "timing each is run once more on known inputs and #wrong counts the output elements\n"
      "that differ. roof is the roof's time over the time taken: the roof is the collective's\n"
      "least data movement (every input it combines read once, every output written once)\n"
      "cut into one task per rank's share and done by the threads backend's threads (one\n"
      "per rank, at most one per CPU) with no waiting between them, on buffers laid out as\n"
      "the row's (cached or streaming stores; pulled, pushed or the two alternating), timed\n"
      "a round at a time in pauses of the row's own timed loop, so that both see the same\n"
      "moments of the machine. The row is its mean over calls made back to back, and so is\n"
      "the roof: each way's mean over iterations made back to back after untimed ones, the\n"
      "best such mean of any way and round (a way's best single iteration can be a\n"
      "transient no loop sustains); after each pause the row makes untimed calls too. The\n"
      "roof's threads start each iteration together and never wait for each other, so a\n"
      "collective reaches 100%% only by noise. Each launch first runs 0.2 s of untimed 1 MiB\n"
      "all_reduces (memory copies run slower for the first milliseconds after a process\n"
      "starts or the machine idles). --columns nccl-tests prints nccl-tests' table and\n"
      "nothing else in its rows, for scripts that read its fields by position; its rows\n"
      "are timed without a roof (nor the pauses for its rounds), as nccl-tests times them.\n"
      "\n"
      "options (nccl-tests' letters and meanings):\n"
      "  -b, --minbytes SIZE     smallest size (default 8; K, M, G suffixes are powers of 1024)\n"
      "  -e, --maxbytes SIZE     largest size (default 64M)\n"
      "  -f, --stepfactor N      multiply the size by N each step (default 2)\n"
      "  -i, --stepbytes SIZE    add SIZE each step instead\n"
      "  -n, --iters N           timed iterations per size (default: 500 up to 64 KiB,\n"
      "                          100 up to 1 MiB, 20 above)\n"
      "  -w, --warmup_iters N    untimed iterations per size (default: iters / 5 + 1)\n"
      "  -m, --agg_iters 1       calls per timed iteration: 1 (mpu has no grouped launch, as\n"
      "                          nccl-tests' ncclGroupStart/End of N calls)\n"
      "  -c, --check 0|1         check every result (default 1)\n"
      "  -d, --datatype TYPE     int8, uint8, int32, uint32, int64, uint64, half, float, double,\n"
      "                          bfloat16 (or mpu's float32, float64, float16), or all (each in\n"
      "                          turn, in nccl-tests' order); mpu has no fp8 elements\n"
      "  -o, --op OP             sum, prod, max, min, avg, or all (default sum)\n"
      "  -a, --average 0|1|2|3   time over the ranks from each rank's mean: rank 0's (0),\n"
      "                          their average (1), least (2) or largest (3); default: the\n"
      "                          mean of every iteration's slowest rank\n"
      "  -z, --blocking 0|1|2|3  mpu's calls return when their result is there: 0 and 2 time\n"
      "                          them back to back, 1 and 3 start every call together after a\n"
      "                          barrier (default 0)\n"
      "  -G, --cudagraph 0       CUDA graph launches: 0 (mpu launches no graphs)\n"
      "  -t, --nthreads LIST     ranks as threads of this process, or a comma-separated list of\n"
      "                          counts measured one after the other (default 2)\n"
      "  -g, --ngpus 1           GPUs per rank: 1 (nccl: one GPU per thread rank)\n"
      "\n"
      "mpu's own:\n"
      "      --columns mpu|nccl-tests\n"
      "                          mpu's table (default: nccl-tests' columns with the median and\n"
      "                          roof, and under MPI the raw MPI call and +chk), or exactly\n"
      "                          nccl-tests' columns, type names and summary lines\n"
      "      --collective LIST   all_reduce, all_gather, reduce_scatter, broadcast, reduce,\n"
      "                          all_to_all, comma-separated, or all (default all_reduce)\n"
      "      --workers N         ranks that move data at once in large calls (default: CPUs)\n"
      "      --check-calls on|off\n"
      "                          threads: compare every call's signature across ranks\n"
      "                          (default on; run both to see what it costs)\n"
      "      --backend NAME      threads; mpi: this process is one rank of an MPI job\n"
      "                          (mpirun -n N mpu bench --backend mpi), and each block adds the\n"
      "                          raw MPI call timed interleaved on the same buffers and mpu with\n"
      "                          call checking on (the main columns have it off); gloo: the\n"
      "                          same for a job started by torchrun (its variables; mpu's\n"
      "                          checked calls beside the unchecked ones); nccl: -t\n"
      "                          thread ranks, each with one GPU and an NCCL communicator\n"
      "      --csv FILE          also write the rows as CSV (a regular file, written through\n"
      "                          FILE.tmp and renamed)\n"
      "      --format text|json  output format (default text; json has null where a value is\n"
      "                          absent)\n"
      "  -h, --help              this text\n"
      "\n"
      "mpu bench --block [--hidden LIST] [--tokens N] times a tensor-parallel MLP block instead\n"
      "(see 'mpu bench --block --help').\n"
      "\n");
  cli_help_exit_status("a result was wrong (#wrong above 0), or a run failed");
  printf("\n"
         "examples:\n"
         "  mpu bench -b 8 -e 128M -f 2 -t 4\n"
         "  mpu bench -d all -o all -e 1M --columns nccl-tests\n"
         "  mpirun -n 4 mpu bench --backend mpi --collective all\n");
}

/* -d: a type by nccl-tests' or mpu's name, or all of them */
static void parse_dtypes(const char *arg, bench_opts *o) {
  static const char *missing[] = {"f8e4m3", "f8e5m2"};
  o->ndtypes = 0;
  if (!strcmp(arg, "all")) { /* in nccl-tests' order (test_types) */
    static const mpu_dtype order[] = {MPU_INT8,    MPU_UINT8,   MPU_INT32,   MPU_UINT32,
                                      MPU_INT64,   MPU_UINT64,  MPU_FLOAT16, MPU_FLOAT32,
                                      MPU_FLOAT64, MPU_BFLOAT16};
    _Static_assert(sizeof order / sizeof order[0] == MPU_DTYPE_COUNT, "every dtype in -d all");
    for (int d = 0; d < MPU_DTYPE_COUNT; d++) o->dtypes[o->ndtypes++] = order[d];
    return;
  }
  for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++)
    if (!strcmp(arg, missing[i]))
      cli_usage_error("bench", "--datatype %s: mpu has no %s elements (it has the integer types, "
                      "half, float, double and bfloat16)", arg, arg);
  for (int d = 0; d < MPU_DTYPE_COUNT; d++)
    if (!strcmp(arg, bench_type_name((mpu_dtype)d))) {
      o->dtypes[o->ndtypes++] = (mpu_dtype)d;
      return;
    }
  if (mpu_dtype_from_name(arg, &o->dtypes[0]))
    cli_usage_error("bench", "unknown datatype '%s'", arg);
  o->ndtypes = 1;
}

/* -o: an op, or all of them in nccl-tests' order (sum, prod, max, min, avg) */
static void parse_ops(const char *arg, bench_opts *o) {
  static const mpu_op every[] = {MPU_SUM, MPU_PROD, MPU_MAX, MPU_MIN, MPU_AVG};
  o->nops = 0;
  if (!strcmp(arg, "all")) {
    for (size_t i = 0; i < sizeof every / sizeof every[0]; i++) o->ops[o->nops++] = every[i];
    return;
  }
  if (!strcmp(arg, "mulsum"))
    cli_usage_error("bench", "--op mulsum is NCCL's pre-multiplied sum (ncclRedOpCreatePreMulSum), "
                    "which mpu's communicators do not have");
  if (mpu_op_from_name(arg, &o->ops[0])) cli_usage_error("bench", "unknown op '%s'", arg);
  o->nops = 1;
}

static void parse_list(const char *what, const char *arg, long lo, long hi, long *out, int cap,
                       int *n) {
  if (cli_parse_int_list(arg, lo, hi, out, cap, n))
    cli_usage_error("bench", "%s wants up to %d whole numbers %ld..%ld separated by single commas, "
                    "not '%s'", what, cap, lo, hi, arg);
}

static int plan_sizes(const bench_opts *o, size_t *sizes);

/* the rows of the whole run: every size of every type, op (reducing collectives only),
 * collective and rank count */
static int planned_rows(const bench_opts *o, int nsizes) {
  int per_sweep = 0;
  for (int k = 0; k < o->ncolls; k++)
    per_sweep += o->ndtypes * (bench_reducing((mpu_collective)o->colls[k]) ? o->nops : 1);
  return nsizes * per_sweep * (tool_is_process(o->backend) ? 1 : o->nranks);
}

static void parse(int argc, char **argv, bench_opts *o) {
  static const struct option longs[] = {
      {"minbytes", required_argument, 0, 'b'},   {"maxbytes", required_argument, 0, 'e'},
      {"stepfactor", required_argument, 0, 'f'}, {"stepbytes", required_argument, 0, 'i'},
      {"iters", required_argument, 0, 'n'},      {"warmup_iters", required_argument, 0, 'w'},
      {"check", required_argument, 0, 'c'},      {"datatype", required_argument, 0, 'd'},
      {"op", required_argument, 0, 'o'},         {"nthreads", required_argument, 0, 't'},
      {"ngpus", required_argument, 0, 'g'},      {"collective", required_argument, 0, 'C'},
      {"backend", required_argument, 0, 'B'},    {"csv", required_argument, 0, 'S'},
      {"format", required_argument, 0, 'F'},     {"workers", required_argument, 0, 'W'},
      {"check-calls", required_argument, 0, 'K'}, {"help", no_argument, 0, 'h'},
      {"average", required_argument, 0, 'a'},    {"blocking", required_argument, 0, 'z'},
      {"agg_iters", required_argument, 0, 'm'},  {"cudagraph", required_argument, 0, 'G'},
      {"columns", required_argument, 0, 'L'},    {0, 0, 0, 0}};
  *o = (bench_opts){.min_bytes = 8, .max_bytes = 64 << 20, .factor = 2, .warmup = -1,
                    .iters = -1, .ranks = {2}, .nranks = 1, .colls = {MPU_COLL_ALL_REDUCE},
                    .ncolls = 1, .dtypes = {MPU_FLOAT32}, .ndtypes = 1, .ops = {MPU_SUM},
                    .nops = 1, .average = MPU_BENCH_SLOWEST, .check = 1,
                    .format = CLI_TEXT, .backend = TOOL_THREADS, .check_calls = MPU_CHECKS_DEFAULT};
  opterr = 0;
  int c;
  long v;
  while ((c = getopt_long(argc, argv, ":b:e:f:i:n:w:c:d:o:t:g:a:z:m:G:h", longs, NULL)) != -1) {
    switch (c) {
    case 'b':
      if (cli_parse_size(optarg, &o->min_bytes)) cli_usage_error("bench", "bad --minbytes '%s'", optarg);
      break;
    case 'e':
      if (cli_parse_size(optarg, &o->max_bytes)) cli_usage_error("bench", "bad --maxbytes '%s'", optarg);
      break;
    case 'f':
      if (cli_parse_int(optarg, 2, 1024, &o->factor))
        cli_usage_error("bench", "--stepfactor wants a whole number 2..1024, not '%s'", optarg);
      break;
    case 'i':
      if (cli_parse_size(optarg, &o->step_bytes) || !o->step_bytes)
        cli_usage_error("bench", "--stepbytes wants a size > 0, not '%s'", optarg);
      break;
    case 'n':
      if (cli_parse_int(optarg, 1, 100000, &o->iters))
        cli_usage_error("bench", "--iters wants 1..100000, not '%s'", optarg);
      break;
    case 'w':
      if (cli_parse_int(optarg, 0, 100000, &o->warmup))
        cli_usage_error("bench", "--warmup_iters wants 0..100000, not '%s'", optarg);
      break;
    case 'c':
      if (cli_parse_int(optarg, 0, 1, &v)) cli_usage_error("bench", "--check wants 0 or 1, not '%s'", optarg);
      o->check = (int)v;
      break;
    case 't':
      parse_list("--nthreads", optarg, 1, 1024, o->ranks, 16, &o->nranks);
      break;
    case 'g':
      if (cli_parse_int(optarg, 1, 1, &v))
        cli_usage_error("bench", "--ngpus wants 1 (one GPU per rank), not '%s'", optarg);
      break;
    case 'K':
      if (!strcmp(optarg, "on")) o->check_calls = MPU_CHECKS_ON;
      else if (!strcmp(optarg, "off")) o->check_calls = MPU_CHECKS_OFF;
      else cli_usage_error("bench", "--check-calls wants on or off, not '%s'", optarg);
      break;
    case 'W':
      if (cli_parse_int(optarg, 1, 1024, &o->workers))
        cli_usage_error("bench", "--workers wants 1..1024, not '%s'", optarg);
      break;
    case 'C': {
      o->ncolls = 0;
      if (!strcmp(optarg, "all")) {
        for (int k = 0; k < MPU_COLL_COUNT; k++) o->colls[o->ncolls++] = k;
        break;
      }
      if (cli_list_ok(optarg))
        cli_usage_error("bench", "--collective wants names separated by single commas, not '%s'",
                        optarg);
      char *list = strdup(optarg), *save = NULL;
      if (!list) cli_usage_error("bench", "out of memory");
      for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        mpu_collective k;
        int seen = 0;
        if (mpu_collective_from_name(t, &k))
          cli_usage_error("bench", "unknown collective '%s' in --collective", t);
        if ((unsigned)k >= MPU_COLL_COUNT) /* barrier and the uneven ones: no nccl-tests size */
          cli_usage_error("bench", "--collective: mpu bench measures all_reduce, all_gather, "
                          "reduce_scatter, broadcast, reduce and all_to_all, not '%s'", t);
        for (int i = 0; i < o->ncolls; i++) seen |= o->colls[i] == (int)k;
        if (seen) cli_usage_error("bench", "collective '%s' named twice in --collective", t);
        o->colls[o->ncolls++] = k;
      }
      free(list);
      break;
    }
    case 'd': parse_dtypes(optarg, o); break;
    case 'o': parse_ops(optarg, o); break;
    case 'a':
      if (cli_parse_int(optarg, 0, 3, &v))
        cli_usage_error("bench", "--average wants 0 (rank 0), 1 (average), 2 (min) or 3 (max), "
                        "not '%s'", optarg);
      o->average = (int)v;
      break;
    case 'z':
      if (cli_parse_int(optarg, 0, 3, &v))
        cli_usage_error("bench", "--blocking wants 0, 1, 2 or 3, not '%s'", optarg);
      o->blocking = (int)v;
      break;
    case 'm':
      if (cli_parse_int(optarg, 1, 1, &v))
        cli_usage_error("bench", "--agg_iters wants 1: mpu has no grouped launch to aggregate "
                        "calls in (nccl-tests' ncclGroupStart/End), not '%s'", optarg);
      break;
    case 'G':
      if (cli_parse_int(optarg, 0, 0, &v))
        cli_usage_error("bench", "--cudagraph wants 0: mpu bench launches no CUDA graphs, not "
                        "'%s'", optarg);
      break;
    case 'L':
      if (!strcmp(optarg, "mpu")) o->columns = COLUMNS_MPU;
      else if (!strcmp(optarg, "nccl-tests")) o->columns = COLUMNS_NCCL_TESTS;
      else cli_usage_error("bench", "--columns wants mpu or nccl-tests, not '%s'", optarg);
      break;
    case 'B':
      if (!strcmp(optarg, "nccl")) {
        if (!mpu_nccl_available())
          cli_usage_error("bench", "%s (on CPUs: --backend gloo, mpi or threads)", mpu_last_error());
        o->backend = TOOL_NCCL;
      } else {
        o->backend = tool_parse_backend("bench", optarg);
      }
      break;
    case 'S': o->csv = optarg; break;
    case 'F':
      if (cli_parse_format(optarg, &o->format)) cli_usage_error("bench", "--format wants text or json, not '%s'", optarg);
      break;
    case 'h': help(); exit(0);
    case ':': cli_usage_error("bench", "option '%s' needs a value", argv[optind - 1]);
    default: cli_usage_error("bench", "unknown option '%s'", argv[optind - 1]);
    }
  }
  if (optind < argc) cli_usage_error("bench", "unexpected argument '%s'", argv[optind]);
  if (o->columns == COLUMNS_NCCL_TESTS && o->format == CLI_JSON)
    cli_usage_error("bench", "--columns is for the text table (json has every field)");
  if (o->min_bytes > o->max_bytes)
    cli_usage_error("bench", "--minbytes is larger than --maxbytes");
  /* refuse what cannot fit before starting, not after an hour of swapping:
   * each rank holds a send and a receive buffer of up to --maxbytes */
  double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  long most = 1;
  for (int i = 0; i < o->nranks; i++) most = o->ranks[i] > most ? o->ranks[i] : most;
  if (tool_is_process(o->backend)) most = 1; /* this process is one rank */
  const double gib = 1024.0 * 1024 * 1024;
  if (mem > 0 && 2.0 * (double)o->max_bytes * (double)most > mem / 2)
    cli_usage_error("bench", "--maxbytes %.1f GiB needs about %.1f GiB for %ld rank(s), more than "
                    "half of this machine's %.1f GiB", (double)o->max_bytes / gib,
                    2.0 * (double)o->max_bytes * (double)most / gib, most, mem / gib);
  size_t sizes[MAX_SIZES];
  int rows = planned_rows(o, plan_sizes(o, sizes));
  if (rows > MAX_ROWS)
    cli_usage_error("bench", "%d rows to measure (at most %d): fewer sizes, types, ops, "
                    "collectives or rank counts", rows, MAX_ROWS);
  if (o->csv && cli_check_output("--csv", o->csv)) /* a bad output path fails now, before the work */
    cli_usage_error("bench", "cannot write %s", mpu_last_error());
}

/* The sizes of the sweep: -b to -e, times -f or plus -i. */
static int plan_sizes(const bench_opts *o, size_t *sizes) {
  int n = 0;
  for (size_t b = o->min_bytes; b <= o->max_bytes && n < MAX_SIZES;) {
    sizes[n++] = b;
    size_t next;
    if (o->step_bytes ? __builtin_add_overflow(b, o->step_bytes, &next)
                      : __builtin_mul_overflow(b, (size_t)o->factor, &next))
      break;
    if (next == b) break; /* -b 0 with a factor */
    b = next;
  }
  return n;
}

static int iters_for(const bench_opts *o, size_t bytes) {
  if (o->iters > 0) return (int)o->iters;
  return bytes <= (64 << 10) ? 500 : bytes <= (1 << 20) ? 100 : 20;
}

/* ---- the roof, timed in the row's pauses ----
 * A row's timed loop pauses as often as the roof has rounds
 * (mpu_bench_roof_rounds), spread over its iterations; in each pause every
 * rank waits while one round of the roof is timed. So the row and its roof
 * see the same moments of the machine: its memory runs at different rates
 * from one second to the next (docs/bench.md), and a roof timed after the
 * row met another. */

typedef struct rank_pause {
  bench_run *run;
  mpu_comm *host;
  int rank;
} rank_pause;

/* The ranks are threads of this process (threads, nccl): they sleep on the
 * gate, and the last to arrive times the round. */
static mpu_result_t gate_pause(void *arg) {
  rank_pause *rp = arg;
  roof_gate *g = &rp->run->gate;
  pthread_mutex_lock(&g->lock);
  unsigned long gen = g->generation;
  if (g->failed) {
    pthread_mutex_unlock(&g->lock);
    return mpu_fail(MPU_ERR_ABORTED, "mpu bench: another rank failed");
  }
  if (++g->arrived < rp->run->ranks) {
    while (gen == g->generation && !g->failed) pthread_cond_wait(&g->cond, &g->lock);
    mpu_result_t r = gen == g->generation ? mpu_fail(MPU_ERR_ABORTED, "mpu bench: another rank failed")
                                          : g->result;
    pthread_mutex_unlock(&g->lock);
    return r;
  }
  g->arrived = 0;
  pthread_mutex_unlock(&g->lock); /* the others sleep in the wait above */
  mpu_result_t r = mpu_bench_roof_round(g->roof);
  pthread_mutex_lock(&g->lock);
  g->result = r;
  g->generation++;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->lock);
  return r;
}

/* The ranks are threads of this process: each lends the roof its buffers,
 * so that the roof's rounds work on the row's own lines and leave the
 * caches as the row's calls find them. */
static void gate_lend(void *arg, int rank, void *send, void *recv) {
  rank_pause *rp = arg;
  roof_gate *g = &rp->run->gate;
  /* under the lock: rank 0 may end the run (and free it) when its row fails
   * before this rank has lent */
  pthread_mutex_lock(&g->lock);
  if (g->roof) mpu_bench_roof_lend(g->roof, rank, send, recv); /* refused: the roof keeps its own */
  pthread_mutex_unlock(&g->lock);
}

/* A rank leaves with an error: wake whoever waits for it at the gate. */
static void gate_fail(roof_gate *g) {
  pthread_mutex_lock(&g->lock);
  g->failed = 1;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->lock);
}

/* MPI: every rank done with the last call, then rank 0 times the round
 * while the others wait for its result (busy, in MPI's own wait). */
static mpu_result_t mpi_pause(void *arg) {
  rank_pause *rp = arg;
  mpu_result_t b = mpu_comm_barrier(rp->host);
  if (b) return b;
  int32_t r = rp->rank == 0 ? (int32_t)mpu_bench_roof_round(rp->run->gate.roof) : 0;
  if ((b = mpu_comm_broadcast(rp->host, &r, 1, MPU_INT32, 0))) return b;
  if (r && rp->rank) return mpu_fail((mpu_result_t)r, "mpu bench: the roof's round failed on rank 0");
  return (mpu_result_t)r;
}

/* One row: the collectives timed with the roof in their pauses; rank 0 gets
 * the roof's time. */
static mpu_result_t row_with_roof(mpu_comm *const *comms, int ncomms, mpu_comm *host, bench_run *run,
                                  int rank, mpu_bench_config *cfg, mpu_bench_result *res,
                                  double *roof_us) {
  roof_gate *g = &run->gate;
  int32_t begun = MPU_SUCCESS;
  if (rank == 0) {
    mpu_bench_roof_run *roof = NULL;
    begun = mpu_bench_roof_begin(cfg, run->ranks, (int)run->o->workers, &roof);
    pthread_mutex_lock(&g->lock);
    g->roof = roof;
    pthread_mutex_unlock(&g->lock);
  }
  /* every rank learns whether the roof could be laid out, so all go on or none */
  mpu_result_t b = mpu_comm_broadcast(host, &begun, 1, MPU_INT32, 0);
  if (!b && begun && rank)
    b = mpu_fail((mpu_result_t)begun, "mpu bench: rank 0 could not lay out the roof");
  if (b || begun) {
    if (rank == 0) mpu_bench_roof_end(g->roof, NULL), g->roof = NULL;
    return b ? b : (mpu_result_t)begun;
  }
  rank_pause rp = {run, host, rank};
  cfg->pause = tool_is_process(run->o->backend) ? mpi_pause : gate_pause;
  cfg->lend = tool_is_process(run->o->backend) ? NULL : gate_lend;
  cfg->pause_arg = &rp;
  cfg->pauses = mpu_bench_roof_rounds(cfg);
  mpu_result_t r = mpu_bench_collectives(comms, ncomms, cfg, res);
  cfg->pause = NULL, cfg->lend = NULL, cfg->pause_arg = NULL, cfg->pauses = 0;
  if (rank == 0) {
    pthread_mutex_lock(&g->lock);
    mpu_bench_roof_run *roof = g->roof;
    g->roof = NULL;
    pthread_mutex_unlock(&g->lock);
    mpu_result_t e = mpu_bench_roof_end(roof, r ? NULL : roof_us);
    if (!r) r = e;
  }
  return r;
}

/* Untimed 1 MiB all_reduces on host for SPIN_UP_S before the first row. On
 * the machines measured, memory copies run up to 2x slower for the first
 * ~20 ms after a process starts or the machine idles, plain memcpy loops as
 * much as mpu's calls (docs/bench.md), which the first row's few warm-up
 * iterations do not cover. Rank 0's clock decides when to stop, so every rank
 * makes the same calls. */
#define SPIN_UP_S 0.2
static mpu_result_t spin_up(mpu_comm *host, int rank) {
  mpu_bench_config cfg = MPU_BENCH_CONFIG_INIT;
  cfg.bytes = (size_t)1 << 20, cfg.iters = 1, cfg.warmup = 20;
  double t0 = cli_now();
  mpu_result_t r = MPU_SUCCESS;
  for (int more = 1; more && !r;) {
    mpu_bench_result res = MPU_BENCH_RESULT_INIT;
    r = mpu_bench_collective(host, &cfg, &res);
    more = rank == 0 && cli_now() - t0 < SPIN_UP_S;
    if (!r) r = mpu_comm_broadcast(host, &more, 1, MPU_INT32, 0);
  }
  return r;
}

/* The rows on comm; host (comm itself on a host backend) carries the
 * numbers the ranks agree on. */
static mpu_result_t bench_rows(mpu_comm *world, mpu_comm *host, bench_run *run) {
  const bench_opts *o = run->o;
  int rank;
  mpu_comm_rank(world, &rank);
  mpu_result_t up = spin_up(host, rank);
  if (up) return up;
  for (int k = 0; k < o->ncolls; k++)
    for (int d = 0; d < o->ndtypes; d++)
      for (int op = 0; op < (bench_reducing((mpu_collective)o->colls[k]) ? o->nops : 1); op++)
    for (int si = 0; si < run->nsizes; si++) {
      size_t bytes = run->sizes[si];
      bench_row row = {.ranks = run->ranks, .coll = (mpu_collective)o->colls[k],
                       .dtype = o->dtypes[d], .op = o->ops[op], .roof_us = {-1, -1}};
      for (int ip = 0; ip < 2; ip++) {
        mpu_bench_config cfg = MPU_BENCH_CONFIG_INIT;
        cfg.collective = row.coll;
        cfg.dtype = row.dtype;
        cfg.op = row.op;
        cfg.average = o->average;
        cfg.barrier = o->blocking == 1 || o->blocking == 3;
        cfg.bytes = bytes;
        cfg.iters = iters_for(o, bytes);
        cfg.warmup = o->warmup >= 0 ? (int)o->warmup : cfg.iters / 5 + 1;
        cfg.in_place = ip;
        cfg.native = o->backend == TOOL_MPI;
        cfg.check = o->check;
        mpu_bench_result res[2] = {MPU_BENCH_RESULT_INIT, MPU_BENCH_RESULT_INIT};
        mpu_comm *comms[2] = {world, run->checked};
        /* nccl-tests' table has no roof column: its rows are timed without one, and
         * without the pauses its rounds would take, as nccl-tests times them */
        mpu_result_t r =
            o->columns == COLUMNS_NCCL_TESTS
                ? mpu_bench_collectives(comms, run->checked ? 2 : 1, &cfg, res)
                : row_with_roof(comms, run->checked ? 2 : 1, host, run, rank, &cfg, res,
                                &row.roof_us[ip]);
        if (r) return r;
        row.res[ip] = res[0];
        row.checked[ip] = res[1];
      }
      if (rank == 0 && run->nrows < MAX_ROWS) {
        char sz[32];
        run->rows[run->nrows++] = row;
        cli_progress_share((double)run->nrows / run->total_rows);
        cli_progress("mpu bench: %d ranks, %s %s done", run->ranks, mpu_collective_name(row.coll),
                     cli_format_size(bytes, sz, sizeof sz));
      }
    }
  return MPU_SUCCESS;
}

static mpu_result_t bench_rank(mpu_comm *world, void *arg) {
  bench_run *run = arg;
  mpu_result_t r = bench_rows(world, world, run);
  if (r) gate_fail(&run->gate);
  return r;
}

/* --backend nccl: this thread rank's NCCL communicator (its buffers device
 * memory: mpu_bench_collectives allocates them from it), then the rows */
static mpu_result_t bench_rank_nccl(mpu_comm *world, void *arg) {
  mpu_comm *nc = NULL;
  mpu_result_t r = mpu_comm_nccl_create(world, NULL, &nc);
  if (!r) r = bench_rows(nc, world, arg);
  if (r) gate_fail(&((bench_run *)arg)->gate);
  mpu_result_t d = nc ? mpu_comm_destroy(nc) : MPU_SUCCESS;
  return r ? r : d;
}

int cmd_bench_block(int argc, char **argv);

static void run_free(bench_run *run) {
  pthread_mutex_destroy(&run->gate.lock);
  pthread_cond_destroy(&run->gate.cond);
  free(run);
}

int cmd_bench(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--block")) return cmd_bench_block(argc, argv);
  bench_opts o;
  parse(argc, argv, &o);
  mpu_comm *world = NULL;
  if (tool_is_process(o.backend) && !(world = tool_process_world_unchecked(o.backend))) return 1;
  bench_run *run = calloc(1, sizeof *run);
  if (!run) {
    fprintf(stderr, "mpu bench: out of memory\n");
    tool_backend_done(o.backend);
    return 1;
  }
  run->o = &o;
  pthread_mutex_init(&run->gate.lock, NULL);
  pthread_cond_init(&run->gate.cond, NULL);
  run->nsizes = plan_sizes(&o, run->sizes);
  run->total_rows = planned_rows(&o, run->nsizes);
  int printer = 1;
  mpu_result_t r = MPU_SUCCESS;
  if (tool_is_process(o.backend)) { /* this process is one rank of the job */
    mpu_comm_size(world, &run->ranks);
    int rank;
    mpu_comm_rank(world, &rank);
    printer = rank == 0;
    run->checked = tool_process_world(o.backend);
    r = bench_rank(world, run);
  } else {
    mpu_launch_options lo = MPU_LAUNCH_OPTIONS_INIT;
    lo.workers = (int)o.workers;
    lo.check_calls = o.check_calls;
    for (int i = 0; i < o.nranks && r == MPU_SUCCESS; i++) {
      run->ranks = (int)o.ranks[i];
        r = mpu_launch(run->ranks, o.backend == TOOL_NCCL ? bench_rank_nccl : bench_rank, run, NULL,
                     &lo);
    }
  }
  cli_progress_done();
  if (!printer) {
    run_free(run);
    tool_backend_done(o.backend);
    return r ? 1 : 0;
  }
  if (r) {
    fprintf(stderr, "mpu bench: %s: %s\n", mpu_result_name(r), mpu_last_error());
    run_free(run);
    tool_backend_done(o.backend);
    return 1;
  }
  int bad = o.format == CLI_JSON             ? bench_print_json(run)
            : o.columns == COLUMNS_NCCL_TESTS ? bench_print_nccl_tests(run)
                                              : bench_print_text(run);
  if (o.csv && bench_write_csv(run)) bad = 1;
  run_free(run);
  tool_backend_done(o.backend);
  return bad;
}
