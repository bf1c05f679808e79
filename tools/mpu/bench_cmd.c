/*
 * bench_cmd.c - `mpu bench`: collective bandwidth and latency, nccl-tests
 * style, against this machine's single-thread memcpy bandwidth measured in
 * the same run.
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

typedef struct bench_opts {
  size_t min_bytes, max_bytes, memcpy_bytes;
  long factor, warmup, iters, workers;
  long ranks[16];
  int nranks;
  int colls[MPU_COLL_COUNT], ncolls;
  mpu_dtype dtype;
  mpu_op op;
  int in_place;
  cli_format format;
  const char *csv;
  tool_backend backend;
  int check_calls; /* threads: MPU_CHECKS_DEFAULT, _ON or _OFF */
} bench_opts;

typedef struct bench_row {
  int ranks;
  mpu_collective coll;
  mpu_bench_result res;    /* MPI: call checking off, with the raw MPI call interleaved */
  mpu_bench_result checked; /* MPI: the same call with call checking on */
} bench_row;

typedef struct bench_run {
  const bench_opts *o;
  int cpus;
  double memcpy_all_gbps; /* one thread's memcpy bandwidth while every CPU copies */
  int ranks; /* of the launch in progress */
  mpu_comm *checked; /* MPI: the world with call checking on (bench_rank gets the unchecked one) */
  bench_row rows[MAX_ROWS];
  int nrows, total_rows; /* done and planned (the progress line's time left) */
} bench_run;

static void help(void) {
  printf(
      "usage: mpu bench [options]\n"
      "\n"
      "Time collectives on n ranks (thread ranks by default; MPI processes or NCCL with\n"
      "--backend), as nccl-tests does:\n"
      "size is the whole buffer (all_gather: the output; reduce_scatter, all_to_all: the input),\n"
      "time the median over iterations of the slowest rank, algbw = size / time,\n"
      "busbw = algbw x the collective's bus factor. The same run measures one thread's memcpy\n"
      "bandwidth and prints each busbw as a fraction of it.\n"
      "\n"
      "options:\n"
      "  -b, --minbytes SIZE     smallest size (default 8; K, M, G suffixes are powers of 1024)\n"
      "  -e, --maxbytes SIZE     largest size (default 64M)\n"
      "  -f, --stepfactor N      multiply the size by N each step (default 2)\n"
      "  -n, --ranks LIST        thread ranks, or a comma-separated list of counts measured\n"
      "                          one after the other in this run (default 2)\n"
      "  -c, --collective LIST   all_reduce, all_gather, reduce_scatter, broadcast, reduce,\n"
      "                          all_to_all, comma-separated, or all (default all_reduce)\n"
      "  -d, --dtype TYPE        float32, float64, float16, bfloat16, int32, int64, uint8\n"
      "  -o, --op OP             sum, prod, min, max, avg (default sum)\n"
      "  -w, --warmup N          untimed iterations per size (default: by size)\n"
      "  -i, --iters N           timed iterations per size (default: 500 up to 64 KiB,\n"
      "                          100 up to 1 MiB, 20 above)\n"
      "      --in-place          use the in-place form of each collective\n"
      "      --workers N         ranks that move data at once in large calls (default: CPUs)\n"
      "      --check-calls on|off threads: compare every call's signature across ranks\n"
      "                          (default on; run both to see what it costs)\n"
      "      --backend NAME      threads, or mpi: this process is one rank of an MPI job\n"
      "                          (mpirun -n N mpu bench --backend mpi); each row is mpu with\n"
      "                          call checking off, the raw MPI call timed interleaved with it\n"
      "                          on the same buffers, and mpu with call checking on\n"
      "                          nccl: -n thread ranks, each with one GPU and an NCCL\n"
      "                          communicator (device buffers; nccl-tests -t N -g 1)\n"
      "      --memcpy-bytes SIZE buffer size of the memcpy reference (default 64M)\n"
      "      --csv FILE          also write the rows as CSV\n"
      "      --format text|json  output format (default text)\n"
      "  -h, --help              this text\n"
      "\n"
      "mpu bench --block [--hidden LIST] [--tokens N] times a tensor-parallel MLP block instead\n"
      "(see 'mpu bench --block --help').\n");
}

static void parse(int argc, char **argv, bench_opts *o) {
  static const struct option longs[] = {
      {"minbytes", required_argument, 0, 'b'},  {"maxbytes", required_argument, 0, 'e'},
      {"stepfactor", required_argument, 0, 'f'}, {"ranks", required_argument, 0, 'n'},
      {"collective", required_argument, 0, 'c'}, {"dtype", required_argument, 0, 'd'},
      {"op", required_argument, 0, 'o'},         {"warmup", required_argument, 0, 'w'},
      {"iters", required_argument, 0, 'i'},      {"in-place", no_argument, 0, 'I'},
      {"backend", required_argument, 0, 'B'},    {"memcpy-bytes", required_argument, 0, 'M'},
      {"csv", required_argument, 0, 'C'},        {"format", required_argument, 0, 'F'},
      {"workers", required_argument, 0, 'W'},    {"help", no_argument, 0, 'h'},
      {"check-calls", required_argument, 0, 'K'},
      {0, 0, 0, 0}};
  *o = (bench_opts){8, 64 << 20, 64 << 20, 2, -1, -1, 0, {2}, 1, {MPU_COLL_ALL_REDUCE}, 1,
                    MPU_FLOAT32, MPU_SUM, 0, CLI_TEXT, NULL, TOOL_THREADS, MPU_CHECKS_DEFAULT};
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":b:e:f:n:c:d:o:w:i:h", longs, NULL)) != -1) {
    switch (c) {
    case 'b':
      if (cli_parse_size(optarg, &o->min_bytes)) cli_usage_error("bench", "bad --minbytes '%s'", optarg);
      break;
    case 'e':
      if (cli_parse_size(optarg, &o->max_bytes)) cli_usage_error("bench", "bad --maxbytes '%s'", optarg);
      break;
    case 'M':
      if (cli_parse_size(optarg, &o->memcpy_bytes) || !o->memcpy_bytes)
        cli_usage_error("bench", "bad --memcpy-bytes '%s'", optarg);
      break;
    case 'f':
      if (cli_parse_int(optarg, 2, 1024, &o->factor))
        cli_usage_error("bench", "--stepfactor wants a whole number 2..1024, not '%s'", optarg);
      break;
    case 'n': {
      if (cli_list_ok(optarg))
        cli_usage_error("bench", "--ranks wants counts separated by single commas, not '%s'", optarg);
      char *list = strdup(optarg), *save = NULL;
      o->nranks = 0;
      for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (o->nranks == 16 || cli_parse_int(t, 1, 1024, &o->ranks[o->nranks++]))
          cli_usage_error("bench", "--ranks wants up to 16 counts of 1..1024, not '%s'", optarg);
      free(list);
      if (!o->nranks) cli_usage_error("bench", "--ranks names no count");
      break;
    }
    case 'K':
      if (!strcmp(optarg, "on")) o->check_calls = MPU_CHECKS_ON;
      else if (!strcmp(optarg, "off")) o->check_calls = MPU_CHECKS_OFF;
      else cli_usage_error("bench", "--check-calls wants on or off, not '%s'", optarg);
      break;
    case 'W':
      if (cli_parse_int(optarg, 1, 1024, &o->workers))
        cli_usage_error("bench", "--workers wants 1..1024, not '%s'", optarg);
      break;
    case 'w':
      if (cli_parse_int(optarg, 0, 100000, &o->warmup))
        cli_usage_error("bench", "--warmup wants 0..100000, not '%s'", optarg);
      break;
    case 'i':
      if (cli_parse_int(optarg, 1, 100000, &o->iters))
        cli_usage_error("bench", "--iters wants 1..100000, not '%s'", optarg);
      break;
    case 'c': {
      o->ncolls = 0;
      if (!strcmp(optarg, "all")) {
        for (int k = 0; k < MPU_COLL_COUNT; k++) o->colls[o->ncolls++] = k;
        break;
      }
      if (cli_list_ok(optarg))
        cli_usage_error("bench", "--collective wants names separated by single commas, not '%s'",
                        optarg);
      char *list = strdup(optarg), *save = NULL;
      for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        mpu_collective k;
        if (mpu_collective_from_name(t, &k) || o->ncolls == MPU_COLL_COUNT)
          cli_usage_error("bench", "unknown or repeated collective '%s' in --collective", t);
        o->colls[o->ncolls++] = k;
      }
      free(list);
      if (!o->ncolls) cli_usage_error("bench", "--collective names no collective");
      break;
    }
    case 'd':
      if (mpu_dtype_from_name(optarg, &o->dtype)) cli_usage_error("bench", "unknown dtype '%s'", optarg);
      break;
    case 'o':
      if (mpu_op_from_name(optarg, &o->op)) cli_usage_error("bench", "unknown op '%s'", optarg);
      break;
    case 'I': o->in_place = 1; break;
    case 'B':
      if (!strcmp(optarg, "nccl")) {
        if (!mpu_nccl_available()) cli_usage_error("bench", "this build has no NCCL backend");
        o->backend = TOOL_NCCL;
      } else {
        o->backend = tool_parse_backend("bench", optarg);
      }
      break;
    case 'C': o->csv = optarg; break;
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
  long most = 1, cpus = sysconf(_SC_NPROCESSORS_ONLN);
  for (int i = 0; i < o->nranks; i++) most = o->ranks[i] > most ? o->ranks[i] : most;
  if (o->backend == TOOL_MPI) most = 1; /* this process is one rank */
  const double gib = 1024.0 * 1024 * 1024;
  if (mem > 0 && 2.0 * (double)o->max_bytes * (double)most > mem / 2)
    cli_usage_error("bench", "--maxbytes %.1f GiB needs about %.1f GiB for %ld rank(s), more than "
                    "half of this machine's %.1f GiB", (double)o->max_bytes / gib,
                    2.0 * (double)o->max_bytes * (double)most / gib, most, mem / gib);
  if (mem > 0 && 2.0 * (double)o->memcpy_bytes * (double)(cpus < 1 ? 1 : cpus) > mem / 2)
    cli_usage_error("bench", "--memcpy-bytes %.1f GiB copied by %ld threads needs more than half of "
                    "this machine's %.1f GiB", (double)o->memcpy_bytes / gib, cpus, mem / gib);
  if (o->csv) { /* a bad output path fails now, before the work */
    FILE *f = *o->csv ? fopen(o->csv, "a") : NULL;
    if (!f) cli_usage_error("bench", "cannot write --csv '%s'", o->csv);
    fclose(f);
  }
}

static int iters_for(const bench_opts *o, size_t bytes) {
  if (o->iters > 0) return (int)o->iters;
  return bytes <= (64 << 10) ? 500 : bytes <= (1 << 20) ? 100 : 20;
}

static mpu_result_t bench_rank(mpu_comm *world, void *arg) {
  bench_run *run = arg;
  const bench_opts *o = run->o;
  int rank;
  mpu_comm_rank(world, &rank);
  for (int k = 0; k < o->ncolls; k++)
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes;
         bytes = bytes > o->max_bytes / (size_t)o->factor ? o->max_bytes + 1 : bytes * (size_t)o->factor) {
      mpu_bench_config cfg = MPU_BENCH_CONFIG_INIT;
      cfg.collective = (mpu_collective)o->colls[k];
      cfg.dtype = o->dtype;
      cfg.op = o->op;
      cfg.bytes = bytes;
      cfg.iters = iters_for(o, bytes);
      cfg.warmup = o->warmup >= 0 ? (int)o->warmup : cfg.iters / 5 + 1;
      cfg.in_place = o->in_place;
      cfg.native = o->backend == TOOL_MPI;
      mpu_bench_result res[2] = {MPU_BENCH_RESULT_INIT, MPU_BENCH_RESULT_INIT};
      mpu_comm *comms[2] = {world, run->checked};
      mpu_result_t r = mpu_bench_collectives(comms, run->checked ? 2 : 1, &cfg, res);
      if (r) return r;
      mpu_bench_result checked = res[1];
      if (rank == 0 && run->nrows < MAX_ROWS) {
        char sz[32];
        run->rows[run->nrows++] = (bench_row){run->ranks, cfg.collective, res[0], checked};
        cli_progress_share((double)run->nrows / run->total_rows);
        cli_progress("mpu bench: %d ranks, %s %s done", run->ranks,
                     mpu_collective_name(cfg.collective), cli_format_size(bytes, sz, sizeof sz));
      }
      if (bytes == 0) break;
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

static void print_text(const bench_run *run, double memcpy_gbps) {
  const bench_opts *o = run->o;
  char sz[32];
  int mpi = o->backend == TOOL_MPI;
  printf("# mpu bench: %s backend, %s, op %s, %s\n", backend_name(o->backend), mpu_dtype_name(o->dtype),
         mpu_op_name(o->op), o->in_place ? "in place" : "out of place");
  printf("# reference: memcpy, 1 thread, %s buffers: %.2f GB/s\n",
         cli_format_size(o->memcpy_bytes, sz, sizeof sz), memcpy_gbps);
  printf("#   (%d threads copying at once: %.2f GB/s each, %.2f GB/s together)\n", run->cpus,
         run->memcpy_all_gbps, run->memcpy_all_gbps * run->cpus);
  printf("# time: median over iterations of the slowest rank; GB/s = 1e9 bytes/s\n");
  if (mpi)
    printf("# mpu: call checking off; mpi: the raw MPI call (MPI_Allreduce, ...); checked: mpu with\n"
           "#   call checking on (the default); the three timed interleaved on the same buffers\n");
  printf("#\n");
  printf("# %-14s %5s %12s %12s %11s %11s %11s %11s %9s%s\n", "collective", "ranks", "size(B)",
         "count", "time(us)", "mean(us)", "algbw(GB/s)", "busbw(GB/s)", "busbw/mem",
         mpi ? "     mpi(us)   overhead  checked(us)  +check" : "");
  for (int i = 0; i < run->nrows; i++) {
    const mpu_bench_result *r = &run->rows[i].res;
    printf("  %-14s %5d %12zu %12zu %11.2f %11.2f %11.3f %11.3f %8.1f%%",
           mpu_collective_name(run->rows[i].coll), run->rows[i].ranks, r->bytes, r->count,
           r->time_us, r->mean_us, r->algbw_gbps, r->busbw_gbps, 100.0 * r->busbw_gbps / memcpy_gbps);
    double raw = r->native_us, chk = run->rows[i].checked.time_us;
    if (mpi && raw >= 0)
      printf(" %11.2f %+8.2fus %+6.1f%%", raw, r->time_us - raw, 100.0 * (r->time_us - raw) / raw);
    else if (mpi)
      printf(" %11s %10s %7s", "-", "-", "-");
    if (mpi) printf(" %12.2f %+6.1f%%", chk, 100.0 * (chk - r->time_us) / r->time_us);
    printf("\n");
  }
}

static void print_json(const bench_run *run, double memcpy_gbps) {
  const bench_opts *o = run->o;
  printf("{\"backend\": \"%s\", \"ranks\": [", backend_name(o->backend));
  for (int i = 0; i < o->nranks; i++) printf("%s%ld", i ? ", " : "", o->ranks[i]);
  printf("], \"dtype\": \"%s\", \"op\": \"%s\", \"in_place\": %s,\n \"memcpy\": {\"bytes\": "
         "%zu, \"gbps\": %.4f, \"concurrent_threads\": %d, \"concurrent_gbps_each\": %.4f},\n"
         " \"rows\": [",
         mpu_dtype_name(o->dtype), mpu_op_name(o->op), o->in_place ? "true" : "false",
         o->memcpy_bytes, memcpy_gbps, run->cpus, run->memcpy_all_gbps);
  for (int i = 0; i < run->nrows; i++) {
    const mpu_bench_result *r = &run->rows[i].res;
    printf("%s\n  {\"collective\": \"%s\", \"ranks\": %d, \"bytes\": %zu, \"count\": %zu, "
           "\"time_us\": %.3f, \"mean_us\": %.3f, \"min_us\": %.3f, \"algbw_gbps\": %.4f, "
           "\"busbw_gbps\": %.4f, \"busbw_fraction_of_memcpy\": %.4f, \"raw_mpi_us\": %.3f, "
           "\"checked_us\": %.3f}",
           i ? "," : "", mpu_collective_name(run->rows[i].coll), run->rows[i].ranks, r->bytes,
           r->count, r->time_us, r->mean_us, r->min_us, r->algbw_gbps, r->busbw_gbps,
           r->busbw_gbps / memcpy_gbps, r->native_us,
           o->backend == TOOL_MPI ? run->rows[i].checked.time_us : -1.0);
  }
  printf("\n]}\n");
}

static int write_csv(const bench_run *run, double memcpy_gbps) {
  const bench_opts *o = run->o;
  FILE *f = fopen(o->csv, "w");
  if (!f) {
    perror(o->csv);
    return -1;
  }
  fprintf(f, "collective,backend,ranks,dtype,bytes,time_us,algbw_gbps,busbw_gbps\n");
  fprintf(f, "memcpy,threads,1,%s,%zu,%.3f,%.4f,%.4f\n", mpu_dtype_name(o->dtype),
          o->memcpy_bytes, (double)o->memcpy_bytes / (memcpy_gbps * 1e3), memcpy_gbps,
          memcpy_gbps);
  for (int i = 0; i < run->nrows; i++) {
    const mpu_bench_result *r = &run->rows[i].res;
    fprintf(f, "%s,%s,%d,%s,%zu,%.3f,%.4f,%.4f\n", mpu_collective_name(run->rows[i].coll),
            backend_name(o->backend), run->rows[i].ranks, mpu_dtype_name(o->dtype), r->bytes, r->time_us, r->algbw_gbps,
            r->busbw_gbps);
  }
  return fclose(f);
}

int cmd_bench_block(int argc, char **argv);

int cmd_bench(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--block")) return cmd_bench_block(argc, argv);
  bench_opts o;
  parse(argc, argv, &o);
  /* the memcpy reference is measured by one process (rank 0 of an MPI job,
   * the others waiting), so the copies do not compete with each other */
  int measure = 1;
  mpu_comm *world = NULL;
  if (o.backend == TOOL_MPI) {
    if (!(world = tool_mpi_world_unchecked())) return 1;
    int rank;
    mpu_comm_rank(world, &rank);
    measure = rank == 0;
  }
  double memcpy_gbps = 0;
  bench_run *run = calloc(1, sizeof *run);
  mpu_result_t r = run ? MPU_SUCCESS : MPU_ERR_OUT_OF_MEMORY;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (run) run->cpus = cpus < 1 ? 1 : cpus > 64 ? 64 : (int)cpus;
  if (!r && measure) r = mpu_bench_memcpy(o.memcpy_bytes, 11, &memcpy_gbps);
  if (!r && measure)
    r = mpu_bench_memcpy_concurrent(o.memcpy_bytes, 11, run->cpus, &run->memcpy_all_gbps);
  if (world) mpu_comm_barrier(world);
  if (r) {
    fprintf(stderr, "mpu bench: memcpy reference: %s\n", run ? mpu_last_error() : "out of memory");
    free(run);
    tool_backend_done(o.backend);
    return 1;
  }
  run->o = &o;
  int sizes = 0;
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes;
       bytes = bytes > o.max_bytes / (size_t)o.factor ? o.max_bytes + 1 : bytes * (size_t)o.factor) {
    sizes++;
    if (bytes == 0) break;
  }
  run->total_rows = sizes * o.ncolls * (o.backend == TOOL_MPI ? 1 : o.nranks);
  int printer = 1;
  if (o.backend == TOOL_MPI) { /* this process is one rank of the job */
    mpu_comm_size(world, &run->ranks);
    int rank;
    mpu_comm_rank(world, &rank);
    printer = rank == 0;
    run->checked = tool_mpi_world();
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
    free(run);
    tool_backend_done(o.backend);
    return r ? 1 : 0;
  }
  if (r) {
    fprintf(stderr, "mpu bench: %s: %s\n", mpu_result_name(r), mpu_last_error());
    free(run);
    return 1;
  }
  if (o.format == CLI_JSON) print_json(run, memcpy_gbps);
  else print_text(run, memcpy_gbps);
  int bad = o.csv && write_csv(run, memcpy_gbps);
  free(run);
  tool_backend_done(o.backend);
  return bad ? 1 : 0;
}
