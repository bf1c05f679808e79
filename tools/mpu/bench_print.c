/*
 * bench_print.c - `mpu bench`'s tables: mpu's columns (nccl-tests' with the
 * median and roof beside them), nccl-tests' own exactly (--columns
 * nccl-tests), JSON (null where a value is absent) and CSV.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cmd.h"
#include "comm/base/collective.h"

const char *bench_type_name(mpu_dtype dt) {
  static const char *names[MPU_DTYPE_COUNT] = {
      [MPU_FLOAT32] = "float", [MPU_FLOAT64] = "double", [MPU_FLOAT16] = "half",
      [MPU_BFLOAT16] = "bfloat16", [MPU_INT32] = "int32", [MPU_INT64] = "int64",
      [MPU_UINT8] = "uint8", [MPU_INT8] = "int8", [MPU_UINT32] = "uint32",
      [MPU_UINT64] = "uint64"};
  return (unsigned)dt < MPU_DTYPE_COUNT && names[dt] ? names[dt] : "invalid";
}

int bench_rooted(mpu_collective c) { return mpu__coll_of(c) && mpu__coll_of(c)->has_root; }
int bench_reducing(mpu_collective c) { return mpu__coll_of(c) && mpu__coll_of(c)->has_op; }

static const char *backend_name(tool_backend b) {
  return b == TOOL_MPI ? "mpi" : b == TOOL_NCCL ? "nccl" : b == TOOL_GLOO ? "gloo" : "threads";
}

/* algbw from the mean time, as nccl-tests reports it (the library's
 * algbw_gbps is from the median) */
static double mean_algbw(const mpu_bench_result *x) {
  return x->mean_us > 0 ? (double)x->bytes / (x->mean_us * 1e3) : 0;
}

/* a value in at most width characters, as nccl-tests' getFloatStr (src/util.cu) */
static const char *fit(double value, int width, char *str) {
  if (snprintf(str, (size_t)width + 1, "%*.2f", width, value) <= width) return str;
  if (snprintf(str, (size_t)width + 1, "%*.1f", width, value) <= width) return str;
  if (snprintf(str, (size_t)width + 1, "%*.0f", width, value) <= width) return str;
  snprintf(str, (size_t)width + 1, width >= 7 ? "%*.1e" : "%*.0e", width, value);
  return str;
}

static double busbw(const bench_row *r, int ip) {
  return mean_algbw(&r->res[ip]) * mpu_bench_bus_factor(r->coll, r->ranks);
}

/* the wrong elements of both variants (and the raw MPI call's), and the average busbw */
static long long summary(const bench_run *run, double *avg_busbw) {
  long long wrong = 0;
  double sum = 0;
  int counted = 0;
  for (int i = 0; i < run->nrows; i++)
    for (int ip = 0; ip < 2; ip++) {
      const mpu_bench_result *x = &run->rows[i].res[ip];
      if (x->wrong > 0) wrong += x->wrong;
      if (x->native_wrong > 0) wrong += x->native_wrong;
      if (x->mean_us > 0) sum += busbw(&run->rows[i], ip), counted++;
    }
  *avg_busbw = counted ? sum / counted : 0;
  return wrong;
}

static const char *op_column(const bench_row *r) {
  return bench_reducing(r->coll) ? mpu_op_name(r->op) : "none";
}

static void print_block(const bench_row *r, int ip, int mpi) {
  const mpu_bench_result *x = &r->res[ip];
  char wrong[24];
  if (x->wrong < 0) snprintf(wrong, sizeof wrong, "N/A");
  else snprintf(wrong, sizeof wrong, "%lld", x->wrong);
  printf("  %9.2f %9.2f %7.2f %7.2f %6s %5.0f%%", x->mean_us, x->time_us, mean_algbw(x),
         busbw(r, ip), wrong, x->mean_us > 0 ? 100.0 * r->roof_us[ip] / x->mean_us : 0);
  if (mpi) {
    if (x->native_mean_us >= 0) printf(" %9.2f", x->native_mean_us);
    else printf(" %9s", "-");
    printf(" %9.2f", r->checked[ip].mean_us);
  }
}

/* which ranks a block of rows ran on: "# all_reduce, 4 thread ranks" */
static int new_block(const bench_run *run, int i) {
  const bench_row *r = &run->rows[i];
  if (i && r->coll == run->rows[i - 1].coll && r->ranks == run->rows[i - 1].ranks) return 0;
  char phrase[48];
  tool_backend b = run->o->backend == TOOL_NCCL ? TOOL_THREADS : run->o->backend;
  printf("#\n# %s, %s\n", mpu_collective_name(r->coll),
         tool_ranks_phrase(b, r->ranks, phrase, sizeof phrase));
  return 1;
}

static const char *time_what(const bench_opts *o) {
  static const char *nccl[] = {"rank 0's mean", "the average of the ranks' means",
                               "the least of the ranks' means", "the largest of the ranks' means"};
  return o->average == MPU_BENCH_SLOWEST ? "the slowest rank's timed loop over the iterations"
                                         : nccl[o->average];
}

/* nccl-tests' table exactly (src/util.cu: the header, each row's fields and widths, the
 * summary lines): a script that reads its fields by position reads mpu's */
int bench_print_nccl_tests(const bench_run *run) {
  const bench_opts *o = run->o;
  double avg;
  long long wrong = summary(run, &avg);
  printf("# mpu bench: %s backend, nccl-tests' columns (--columns nccl-tests); time: %s\n",
         backend_name(o->backend), time_what(o));
  for (int i = 0; i < run->nrows; i++) {
    const bench_row *r = &run->rows[i];
    if (new_block(run, i)) {
      printf("#\n");
      printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n",
             "", "", "", "", "");
      printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "size",
             "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
             "busbw", "#wrong", 0, "");
      printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "(B)",
             "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "",
             0, "");
    }
    printf("%12zu  %12zu  %8s  %6s  %6i", r->res[0].bytes, r->res[0].count, bench_type_name(r->dtype),
           op_column(r), bench_rooted(r->coll) ? 0 : -1);
    for (int ip = 0; ip < 2; ip++) {
      const mpu_bench_result *x = &r->res[ip];
      char t[16], a[16], b[16];
      fit(x->mean_us, 7, t), fit(mean_algbw(x), 6, a), fit(busbw(r, ip), 6, b);
      if (x->wrong >= 0) printf("  %7s  %6s  %6s  %6g", t, a, b, (double)x->wrong);
      else printf("  %7s  %6s  %6s    N/A", t, a, b);
    }
    printf("\n");
  }
  printf("# %-20s : %lld %s\n", "Out of bounds values", wrong, wrong ? "FAILED" : "OK");
  printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg, "");
  printf("#\n");
  return wrong ? 1 : 0;
}

int bench_print_text(const bench_run *run) {
  const bench_opts *o = run->o;
  int mpi = tool_is_process(o->backend);
  double avg;
  long long wrong = summary(run, &avg);
  printf("# mpu bench: %s backend; nccl-tests' columns, type names and summary, and mpu's\n",
         backend_name(o->backend));
  printf("# time: %s, median beside it; algbw = size / time;\n"
         "#   busbw = algbw x bus factor (GB/s = 1e9 bytes/s)\n"
         "# #wrong: output elements that differ from the expected ones, all ranks together%s\n"
         "# roof: the time of the collective's least data movement (every input it combines read\n"
         "#   once, every output written once) done by the threads backend's threads (one per rank,\n"
         "#   at most one per CPU) with no waiting between them (cached or streaming stores, pulled\n"
         "#   or pushed; each way's mean over iterations back to back, the best way's, timed in\n"
         "#   pauses of the row's loop), over the time\n",
         time_what(o), o->check ? "" : " (-c 0: not checked)");
  if (mpi)
    printf("# mpi: the raw MPI call (MPI_Allreduce, ...) timed interleaved with mpu on the same\n"
           "#   buffers; +chk: mpu with call checking on (the main columns have it off)\n");
  for (int i = 0; i < run->nrows; i++) {
    const bench_row *r = &run->rows[i];
    if (new_block(run, i)) {
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
    printf("  %12zu %12zu %9s %6s %5d", r->res[0].bytes, r->res[0].count, bench_type_name(r->dtype),
           op_column(r), bench_rooted(r->coll) ? 0 : -1);
    for (int ip = 0; ip < 2; ip++) print_block(r, ip, mpi);
    printf("\n");
  }
  printf("# Out of bounds values : %lld %s\n", wrong, wrong ? "FAILED" : "OK");
  printf("# Avg bus bandwidth    : %g\n#\n", avg);
  return wrong ? 1 : 0;
}

/* a number, or null where there is none (a negative time or count says "absent") */
static void json_number(const char *key, double v, const char *fmt) {
  printf(", \"%s\": ", key);
  if (v < 0) printf("null");
  else printf(fmt, v);
}

int bench_print_json(const bench_run *run) {
  const bench_opts *o = run->o;
  double avg;
  long long wrong = summary(run, &avg);
  printf("{\"backend\": \"%s\", \"ranks\": [", backend_name(o->backend));
  for (int i = 0; i < o->nranks; i++) printf("%s%ld", i ? ", " : "", o->ranks[i]);
  printf("]");
  if (o->ndtypes == 1) printf(", \"dtype\": \"%s\"", mpu_dtype_name(o->dtypes[0]));
  if (o->nops == 1) printf(", \"op\": \"%s\"", mpu_op_name(o->ops[0]));
  printf(", \"dtypes\": [");
  for (int d = 0; d < o->ndtypes; d++) printf("%s\"%s\"", d ? ", " : "", mpu_dtype_name(o->dtypes[d]));
  printf("], \"ops\": [");
  for (int k = 0; k < o->nops; k++) printf("%s\"%s\"", k ? ", " : "", mpu_op_name(o->ops[k]));
  printf("], \"time\": \"%s\", \"checked\": %s,\n \"rows\": [", time_what(o),
         o->check ? "true" : "false");
  for (int i = 0, first = 1; i < run->nrows; i++)
    for (int ip = 0; ip < 2; ip++, first = 0) {
      const bench_row *row = &run->rows[i];
      const mpu_bench_result *r = &row->res[ip];
      printf("%s\n  {\"collective\": \"%s\", \"ranks\": %d, \"in_place\": %s, \"dtype\": \"%s\", "
             "\"type\": \"%s\", \"op\": \"%s\", \"root\": ",
             first ? "" : ",", mpu_collective_name(row->coll), row->ranks, ip ? "true" : "false",
             mpu_dtype_name(row->dtype), bench_type_name(row->dtype), op_column(row));
      if (bench_rooted(row->coll)) printf("0");
      else printf("null");
      printf(", \"bytes\": %zu, \"count\": %zu", r->bytes, r->count);
      json_number("time_us", r->mean_us, "%.6g");
      json_number("mean_us", r->mean_us, "%.6g");
      json_number("median_us", r->time_us, "%.6g");
      json_number("min_us", r->min_us, "%.6g");
      json_number("algbw_gbps", mean_algbw(r), "%.6g");
      json_number("busbw_gbps", busbw(row, ip), "%.6g");
      json_number("wrong", (double)r->wrong, "%.0f");
      json_number("roofline_us", row->roof_us[ip], "%.6g");
      json_number("roofline_fraction", r->mean_us > 0 ? row->roof_us[ip] / r->mean_us : -1, "%.6g");
      json_number("raw_mpi_us", r->native_mean_us, "%.6g");
      json_number("checked_us", tool_is_process(o->backend) ? row->checked[ip].mean_us : -1, "%.6g");
      json_number("raw_mpi_median_us", r->native_us, "%.6g");
      json_number("checked_median_us", tool_is_process(o->backend) ? row->checked[ip].time_us : -1, "%.6g");
      printf("}");
    }
  printf("\n], \"wrong\": %lld, \"avg_busbw_gbps\": %.6g}\n", wrong, avg);
  return wrong ? 1 : 0;
}

int bench_write_csv(const bench_run *run) {
  const bench_opts *o = run->o;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len); /* then written by the tool's one rule for outputs */
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
      char wrong[24] = "", raw[32] = "", roof[32] = ""; /* empty where absent */
      if (r->wrong >= 0) snprintf(wrong, sizeof wrong, "%lld", r->wrong);
      if (row->roof_us[ip] >= 0) snprintf(roof, sizeof roof, "%.6g", row->roof_us[ip]);
      if (r->native_mean_us >= 0) snprintf(raw, sizeof raw, "%.6g", r->native_mean_us);
      fprintf(f, "%s,%s,%d,%s,%s,%d,%zu,%zu,%.6g,%.6g,%.6g,%.6g,%s,%s,%s\n",
              mpu_collective_name(row->coll), backend_name(o->backend), row->ranks,
              mpu_dtype_name(row->dtype), op_column(row), ip, r->bytes, r->count, r->mean_us,
              r->time_us, mean_algbw(r), busbw(row, ip), wrong, roof, raw);
    }
  int bad = fclose(f) || !text ? -1 : cli_write_output("bench", "--csv", o->csv, text, len);
  if (!text) fprintf(stderr, "mpu bench: --csv %s: out of memory\n", o->csv);
  free(text);
  return bad;
}
