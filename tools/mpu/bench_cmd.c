/*
 * bench_cmd.c - `mpu bench`: collective bandwidth and latency in nccl-tests'
 * flags and columns (out-of-place and in-place side by side, #wrong from
 * checking every result), each row against a roofline measured in the same
 * run: the least memory traffic the collective must move, at the best rate
 * of several ways of copying the same footprint (mpu_bench_copy_ceiling).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cli.h"
#include "mpu.h"

#define MAX_ROWS 4096
#define MAX_SIZES 64

typedef struct bench_opts {
  size_t min_bytes, max_bytes, step_bytes;
  long factor, warmup, iters, workers;
  long ranks[16];
  int nranks;
  int colls[MPU_COLL_COUNT], ncolls;
  mpu_dtype dtype;
  mpu_op op;
  int check;
  cli_format format;
  const char *csv;
  tool_backend backend;
  int check_calls; /* threads: MPU_CHECKS_DEFAULT, _ON or _OFF */
} bench_opts;

typedef struct bench_row {
  int ranks;
  mpu_collective coll;
  mpu_bench_result res[2];     /* [in_place]; MPI: call checking off, raw MPI interleaved */
  mpu_bench_result checked[2]; /* MPI: the same call with call checking on */
  double roof_us;              /* the roofline time of this row (see the top of the file) */
} bench_row;

typedef struct bench_run {
  const bench_opts *o;
  int ranks;         /* of the launch in progress */
  int copiers;       /* threads of the roofline copies: the ranks that work at once */
  mpu_comm *checked; /* MPI: the world with call checking on (bench_rank gets the unchecked one) */
  size_t sizes[MAX_SIZES];
  int nsizes;
  bench_row rows[MAX_ROWS];
  int nrows, total_rows; /* done and planned (the progress line's time left) */
} bench_run;

static void help(void) {
  printf(
      "usage: mpu bench [options]\n"
      "\n"
      "Time collectives on n ranks (thread ranks by default; MPI processes or NCCL with\n"
      "--backend) with nccl-tests' flags and columns: size is the whole buffer (all_gather:\n"
      "the output; reduce_scatter, all_to_all: the input), rounded to at least one element\n"
      "per rank; time is the mean over iterations of the slowest rank (the median beside\n"
      "it); algbw = size / time, busbw = algbw x the collective's bus factor. Out-of-place\n"
      "and in-place run side by side; after the timing each is run once more on known\n"
      "inputs and #wrong counts the output elements that differ. roof is the share of the\n"
      "roofline reached: the least memory traffic the collective must move (every input read\n"
      "and every output written once) at the best copy rate of the same footprint measured\n"
      "in this run (as many threads as ranks work, or one; streaming or cached stores; the\n"
      "best iteration of each), as a fraction of the time taken.\n"
      "\n"
      "options (nccl-tests' letters and meanings):\n"
      "  -b, --minbytes SIZE     smallest size (default 8; K, M, G suffixes are powers of 1024)\n"
      "  -e, --maxbytes SIZE     largest size (default 64M)\n"
      "  -f, --stepfactor N      multiply the size by N each step (default 2)\n"
      "  -i, --stepbytes SIZE    add SIZE each step instead\n"
      "  -n, --iters N           timed iterations per size (default: 500 up to 64 KiB,\n"
      "                          100 up to 1 MiB, 20 above)\n"
      "  -w, --warmup_iters N    untimed iterations per size (default: iters / 5 + 1)\n"
      "  -c, --check 0|1         check every result (default 1)\n"
      "  -d, --datatype TYPE     float32, float64, float16, bfloat16, int32, int64, uint8\n"
      "  -o, --op OP             sum, prod, min, max, avg (default sum)\n"
      "  -t, --nthreads LIST     ranks as threads of this process, or a comma-separated list of\n"
      "                          counts measured one after the other (default 2)\n"
      "  -g, --ngpus 1           GPUs per rank: 1 (nccl: one GPU per thread rank)\n"
      "\n"
      "mpu's own:\n"
      "      --collective LIST   all_reduce, all_gather, reduce_scatter, broadcast, reduce,\n"
      "                          all_to_all, comma-separated, or all (default all_reduce)\n"
      "      --workers N         ranks that move data at once in large calls (default: CPUs)\n"
      "      --check-calls on|off threads: compare every call's signature across ranks\n"
      "                          (default on; run both to see what it costs)\n"
      "      --backend NAME      threads; mpi: this process is one rank of an MPI job\n"
      "                          (mpirun -n N mpu bench --backend mpi), and each block adds the\n"
      "                          raw MPI call timed interleaved on the same buffers and mpu with\n"
      "                          call checking on (the main columns have it off); nccl: -t\n"
      "                          thread ranks, each with one GPU and an NCCL communicator\n"
      "      --csv FILE          also write the rows as CSV\n"
      "      --format text|json  output format (default text)\n"
      "  -h, --help              this text\n"
      "\n"
      "mpu bench --block [--hidden LIST] [--tokens N] times a tensor-parallel MLP block instead\n"
      "(see 'mpu bench --block --help').\n");
}

static void parse_list(const char *what, const char *arg, long lo, long hi, long *out, int cap,
                       int *n) {
  if (cli_parse_int_list(arg, lo, hi, out, cap, n))
    cli_usage_error("bench", "%s wants up to %d whole numbers %ld..%ld separated by single commas, "
                    "not '%s'", what, cap, lo, hi, arg);
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
      {0, 0, 0, 0}};
  *o = (bench_opts){.min_bytes = 8, .max_bytes = 64 << 20, .factor = 2, .warmup = -1,
                    .iters = -1, .ranks = {2}, .nranks = 1, .colls = {MPU_COLL_ALL_REDUCE},
                    .ncolls = 1, .dtype = MPU_FLOAT32, .op = MPU_SUM, .check = 1,
                    .format = CLI_TEXT, .backend = TOOL_THREADS, .check_calls = MPU_CHECKS_DEFAULT};
  opterr = 0;
  int c;
  long v;
  while ((c = getopt_long(argc, argv, ":b:e:f:i:n:w:c:d:o:t:g:h", longs, NULL)) != -1) {
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
    case 'd':
      if (mpu_dtype_from_name(optarg, &o->dtype)) cli_usage_error("bench", "unknown datatype '%s'", optarg);
      break;
    case 'o':
      if (mpu_op_from_name(optarg, &o->op)) cli_usage_error("bench", "unknown op '%s'", optarg);
      break;
    case 'B':
      if (!strcmp(optarg, "nccl")) {
        if (!mpu_nccl_available()) cli_usage_error("bench", "%s", mpu_last_error());
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
  if (o->min_bytes > o->max_bytes)
    cli_usage_error("bench", "--minbytes is larger than --maxbytes");
  /* refuse what cannot fit before starting, not after an hour of swapping:
   * each rank holds a send and a receive buffer of up to --maxbytes */
  double mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
  long most = 1;
  for (int i = 0; i < o->nranks; i++) most = o->ranks[i] > most ? o->ranks[i] : most;
  if (o->backend == TOOL_MPI) most = 1; /* this process is one rank */
  const double gib = 1024.0 * 1024 * 1024;
  if (mem > 0 && 2.0 * (double)o->max_bytes * (double)most > mem / 2)
    cli_usage_error("bench", "--maxbytes %.1f GiB needs about %.1f GiB for %ld rank(s), more than "
                    "half of this machine's %.1f GiB", (double)o->max_bytes / gib,
                    2.0 * (double)o->max_bytes * (double)most / gib, most, mem / gib);
  if (o->csv) { /* a bad output path fails now, before the work */
    FILE *f = *o->csv ? fopen(o->csv, "a") : NULL;
    if (!f) cli_usage_error("bench", "cannot write --csv '%s'", o->csv);
    fclose(f);
  }
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

/* The roofline's copy bandwidth for one size, measured by rank 0 while the
 * others wait (so the copies have the machine to themselves, as the
 * collective had), once per size and launch; every rank keeps its own copy
 * of the answer (copy_gbps, the rank's own array), so all make the same
 * calls. */
static mpu_result_t copy_rate(mpu_comm *world, const bench_run *run, double *copy_gbps,
                              int size_index, int rank) {
  if (copy_gbps[size_index] > 0) return MPU_SUCCESS;
  size_t bytes = run->sizes[size_index] ? run->sizes[size_index] : 1;
  double gbps = 0;
  mpu_result_t r = MPU_SUCCESS;
  if (rank == 0) {
    int iters = iters_for(run->o, bytes);
    r = mpu_bench_copy_ceiling(bytes, iters > 50 ? 50 : iters, run->copiers, &gbps);
  }
  mpu_result_t b = mpu_comm_broadcast(world, &gbps, 1, MPU_FLOAT64, 0);
  if (!r) r = b;
  if (!r) copy_gbps[size_index] = gbps;
  return r;
}

static mpu_result_t bench_rank(mpu_comm *world, void *arg) {
  bench_run *run = arg;
  const bench_opts *o = run->o;
  int rank;
  double copy_gbps[MAX_SIZES] = {0}; /* all copiers together, for sizes[i]; 0: not yet */
  mpu_comm_rank(world, &rank);
  for (int k = 0; k < o->ncolls; k++)
    for (int si = 0; si < run->nsizes; si++) {
      size_t bytes = run->sizes[si];
      bench_row row = {.ranks = run->ranks, .coll = (mpu_collective)o->colls[k]};
      for (int ip = 0; ip < 2; ip++) {
        mpu_bench_config cfg = MPU_BENCH_CONFIG_INIT;
        cfg.collective = row.coll;
        cfg.dtype = o->dtype;
        cfg.op = o->op;
        cfg.bytes = bytes;
        cfg.iters = iters_for(o, bytes);
        cfg.warmup = o->warmup >= 0 ? (int)o->warmup : cfg.iters / 5 + 1;
        cfg.in_place = ip;
        cfg.native = o->backend == TOOL_MPI;
        cfg.check = o->check;
        mpu_bench_result res[2] = {MPU_BENCH_RESULT_INIT, MPU_BENCH_RESULT_INIT};
        mpu_comm *comms[2] = {world, run->checked};
        mpu_result_t r = mpu_bench_collectives(comms, run->checked ? 2 : 1, &cfg, res);
        if (r) return r;
        row.res[ip] = res[0];
        row.checked[ip] = res[1];
      }
      mpu_result_t r = copy_rate(world, run, copy_gbps, si, rank);
      if (r) return r;
      /* copy_gbps is what all copiers copy per second: 2x that in traffic */
      double traffic = mpu_bench_traffic(row.coll, run->ranks, row.res[0].bytes);
      row.roof_us = traffic / (2.0 * copy_gbps[si] * 1e3);
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

/* --backend nccl: this thread rank's NCCL communicator, then the rows */
static mpu_result_t bench_rank_nccl(mpu_comm *world, void *arg) {
  mpu_comm *nc = NULL;
  mpu_result_t r = mpu_comm_nccl_create(world, NULL, &nc);
  if (r) return r;
  r = bench_rank(nc, arg);
  mpu_result_t d = mpu_comm_destroy(nc);
  return r ? r : d;
}

static const char *backend_name(tool_backend b) {
  return b == TOOL_MPI ? "mpi" : b == TOOL_NCCL ? "nccl" : "threads";
}

static int rooted(mpu_collective c) { return c == MPU_COLL_BROADCAST || c == MPU_COLL_REDUCE; }
static int reducing(mpu_collective c) {
  return c == MPU_COLL_ALL_REDUCE || c == MPU_COLL_REDUCE_SCATTER || c == MPU_COLL_REDUCE;
}

/* algbw from the mean time, as nccl-tests reports it (the library's
 * algbw_gbps is from the median) */
static double mean_algbw(const mpu_bench_result *x) {
  return x->mean_us > 0 ? (double)x->bytes / (x->mean_us * 1e3) : 0;
}

static void print_block(const bench_row *r, int ip, int mpi) {
  const mpu_bench_result *x = &r->res[ip];
  char wrong[24];
  if (x->wrong < 0) snprintf(wrong, sizeof wrong, "N/A");
  else snprintf(wrong, sizeof wrong, "%lld", x->wrong);
  printf("  %9.2f %9.2f %7.2f %7.2f %6s %5.0f%%", x->mean_us, x->time_us, mean_algbw(x),
         mean_algbw(x) * mpu_bench_bus_factor(r->coll, r->ranks), wrong, x->mean_us > 0 ? 100.0 * r->roof_us / x->mean_us : 0);
  if (mpi) {
    if (x->native_mean_us >= 0) printf(" %9.2f", x->native_mean_us);
    else printf(" %9s", "-");
    printf(" %9.2f", r->checked[ip].mean_us);
  }
}

static int print_text(const bench_run *run) {
  const bench_opts *o = run->o;
  int mpi = o->backend == TOOL_MPI;
  long long wrong = 0;
  double busbw_sum = 0;
  int counted = 0;
  printf("# mpu bench: %s backend, %s, op %s; nccl-tests' columns\n", backend_name(o->backend),
         mpu_dtype_name(o->dtype), mpu_op_name(o->op));
  printf("# time: mean over iterations of the slowest rank, median beside it; algbw = size / time;\n"
         "#   busbw = algbw x bus factor (GB/s = 1e9 bytes/s)\n"
         "# #wrong: output elements that differ from the expected ones, all ranks together%s\n"
         "# roof: the collective's least memory traffic at the best copy rate of the same\n"
         "#   footprint (threads or one, streaming or cached; measured in this run), over the time\n",
         o->check ? "" : " (-c 0: not checked)");
  if (mpi)
    printf("# mpi: the raw MPI call (MPI_Allreduce, ...) timed interleaved with mpu on the same\n"
           "#   buffers; +chk: mpu with call checking on (the main columns have it off)\n");
  for (int i = 0; i < run->nrows; i++) {
    const bench_row *r = &run->rows[i];
    if (i == 0 || r->coll != run->rows[i - 1].coll || r->ranks != run->rows[i - 1].ranks) {
      char phrase[48];
      printf("#\n# %s, %s\n", mpu_collective_name(r->coll),
             tool_ranks_phrase(o->backend == TOOL_NCCL ? TOOL_THREADS : o->backend, r->ranks,
                               phrase, sizeof phrase));
      printf("# %52s%s %-*s %s\n", "", "out-of-place", mpi ? 54 : 34, "", "in-place");
      printf("# %12s %12s %9s %6s %5s", "size", "count", "type", "redop", "root");
      for (int ip = 0; ip < 2; ip++)
        printf("  %9s %9s %7s %7s %6s %6s%s", "time", "median", "algbw", "busbw", "#wrong",
               "roof", mpi ? "       mpi      +chk" : "");
      printf("\n# %12s %12s %9s %6s %5s", "(B)", "(elements)", "", "", "");
      for (int ip = 0; ip < 2; ip++)
        printf("  %9s %9s %7s %7s %6s %6s%s", "(us)", "(us)", "(GB/s)", "(GB/s)", "", "",
               mpi ? "      (us)      (us)" : "");
      printf("\n");
    }
    printf("  %12zu %12zu %9s %6s %5d", r->res[0].bytes, r->res[0].count,
           mpu_dtype_name(o->dtype), reducing(r->coll) ? mpu_op_name(o->op) : "none",
           rooted(r->coll) ? 0 : -1);
    for (int ip = 0; ip < 2; ip++) {
      print_block(r, ip, mpi);
      if (r->res[ip].wrong > 0) wrong += r->res[ip].wrong;
      if (r->res[ip].native_wrong > 0) wrong += r->res[ip].native_wrong;
      if (r->res[ip].mean_us > 0) {
        busbw_sum += mean_algbw(&r->res[ip]) * mpu_bench_bus_factor(r->coll, r->ranks);
        counted++;
      }
    }
    printf("\n");
  }
  printf("# Out of bounds values : %lld %s\n", wrong, wrong ? "FAILED" : "OK");
  printf("# Avg bus bandwidth    : %g\n#\n", counted ? busbw_sum / counted : 0);
  return wrong ? 1 : 0;
}

static int print_json(const bench_run *run) {
  const bench_opts *o = run->o;
  long long wrong = 0;
  printf("{\"backend\": \"%s\", \"ranks\": [", backend_name(o->backend));
  for (int i = 0; i < o->nranks; i++) printf("%s%ld", i ? ", " : "", o->ranks[i]);
  printf("], \"dtype\": \"%s\", \"op\": \"%s\", \"checked\": %s,\n \"rows\": [",
         mpu_dtype_name(o->dtype), mpu_op_name(o->op), o->check ? "true" : "false");
  for (int i = 0, first = 1; i < run->nrows; i++)
    for (int ip = 0; ip < 2; ip++, first = 0) {
      const bench_row *row = &run->rows[i];
      const mpu_bench_result *r = &row->res[ip];
      double algbw = mean_algbw(r);
      if (r->wrong > 0) wrong += r->wrong;
      printf("%s\n  {\"collective\": \"%s\", \"ranks\": %d, \"in_place\": %s, \"op\": \"%s\", "
             "\"root\": %d, \"bytes\": %zu, \"count\": %zu, \"time_us\": %.6g, \"mean_us\": %.6g, "
             "\"median_us\": %.6g, \"min_us\": %.6g, \"algbw_gbps\": %.6g, \"busbw_gbps\": %.6g, "
             "\"wrong\": %lld, \"roofline_us\": %.6g, \"roofline_fraction\": %.6g, "
             "\"raw_mpi_us\": %.6g, \"checked_us\": %.6g, \"raw_mpi_median_us\": %.6g, "
             "\"checked_median_us\": %.6g}",
             first ? "" : ",", mpu_collective_name(row->coll), row->ranks, ip ? "true" : "false",
             reducing(row->coll) ? mpu_op_name(o->op) : "none", rooted(row->coll) ? 0 : -1,
             r->bytes, r->count, r->mean_us, r->mean_us, r->time_us, r->min_us, algbw,
             algbw * mpu_bench_bus_factor(row->coll, row->ranks), r->wrong, row->roof_us,
             r->mean_us > 0 ? row->roof_us / r->mean_us : 0, r->native_mean_us,
             o->backend == TOOL_MPI ? row->checked[ip].mean_us : -1.0, r->native_us,
             o->backend == TOOL_MPI ? row->checked[ip].time_us : -1.0);
    }
  printf("\n], \"wrong\": %lld}\n", wrong);
  return wrong ? 1 : 0;
}

static int write_csv(const bench_run *run) {
  const bench_opts *o = run->o;
  FILE *f = fopen(o->csv, "w");
  if (!f) {
    perror(o->csv);
    return -1;
  }
  fprintf(f, "collective,backend,ranks,dtype,op,in_place,bytes,count,mean_us,median_us,"
             "algbw_gbps,busbw_gbps,wrong,roofline_us,raw_mpi_us\n");
  for (int i = 0; i < run->nrows; i++)
    for (int ip = 0; ip < 2; ip++) {
      const bench_row *row = &run->rows[i];
      const mpu_bench_result *r = &row->res[ip];
      double algbw = mean_algbw(r);
      fprintf(f, "%s,%s,%d,%s,%s,%d,%zu,%zu,%.6g,%.6g,%.6g,%.6g,%lld,%.6g,%.6g\n",
              mpu_collective_name(row->coll), backend_name(o->backend), row->ranks,
              mpu_dtype_name(o->dtype), reducing(row->coll) ? mpu_op_name(o->op) : "none", ip,
              r->bytes, r->count, r->mean_us, r->time_us, algbw,
              algbw * mpu_bench_bus_factor(row->coll, row->ranks), r->wrong, row->roof_us,
              r->native_mean_us);
    }
  return fclose(f);
}

int cmd_bench_block(int argc, char **argv);

int cmd_bench(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--block")) return cmd_bench_block(argc, argv);
  bench_opts o;
  parse(argc, argv, &o);
  mpu_comm *world = NULL;
  if (o.backend == TOOL_MPI && !(world = tool_mpi_world_unchecked())) return 1;
  bench_run *run = calloc(1, sizeof *run);
  if (!run) {
    fprintf(stderr, "mpu bench: out of memory\n");
    tool_backend_done(o.backend);
    return 1;
  }
  run->o = &o;
  run->nsizes = plan_sizes(&o, run->sizes);
  run->total_rows = run->nsizes * o.ncolls * (o.backend == TOOL_MPI ? 1 : o.nranks);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (cpus < 1) cpus = 1;
  if (o.workers > 0 && o.workers < cpus) cpus = o.workers;
  int printer = 1;
  mpu_result_t r = MPU_SUCCESS;
  if (o.backend == TOOL_MPI) { /* this process is one rank of the job */
    mpu_comm_size(world, &run->ranks);
    int rank;
    mpu_comm_rank(world, &rank);
    printer = rank == 0;
    run->copiers = run->ranks < cpus ? run->ranks : (int)cpus;
    run->checked = tool_mpi_world();
    r = bench_rank(world, run);
  } else {
    mpu_launch_options lo = MPU_LAUNCH_OPTIONS_INIT;
    lo.workers = (int)o.workers;
    lo.check_calls = o.check_calls;
    for (int i = 0; i < o.nranks && r == MPU_SUCCESS; i++) {
      run->ranks = (int)o.ranks[i];
      run->copiers = run->ranks < cpus ? run->ranks : (int)cpus;
      r = mpu_launch(run->ranks, o.backend == TOOL_NCCL ? bench_rank_nccl : bench_rank, run, NULL,
                     &lo);
    }
  }
  cli_progress_done();
  if (!printer) {
    free(run);
    tool_backend_done(o.backend);
    return r ? 1 : 0;
  }
  if (r) {
    fprintf(stderr, "mpu bench: %s: %s\n", mpu_result_name(r), mpu_last_error());
    free(run);
    tool_backend_done(o.backend);
    return 1;
  }
  int bad = o.format == CLI_JSON ? print_json(run) : print_text(run);
  if (o.csv && write_csv(run)) bad = 1;
  free(run);
  tool_backend_done(o.backend);
  return bad;
}
