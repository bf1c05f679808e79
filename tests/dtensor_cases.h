/*
 * dtensor_cases.h - one DTensor case as the torch comparisons run it (tests
 * only): a line
 *   ID MDIM M0.. NDIM S0.. DTYPE SRC0.. DST0..
 * (placements R, S<d> with d possibly negative, Psum, Pavg, Pmax, Pmin) is
 * run on an MDIM-dim mesh of thread ranks: every rank fills its piece of the
 * source (value() below, which test_dtensor_torch.py repeats for torch),
 * calls mpu_redistribute and writes
 *   ID RANK SRC_SHAPE SRC_OFFSET DST_SHAPE DST_OFFSET VALUES
 * (shapes and offsets comma-separated, values as the hex of their bits; int32
 * in decimal), or "ID RANK error" when mpu refuses the case.
 */
#ifndef MPU_TESTS_DTENSOR_CASES_H
#define MPU_TESTS_DTENSOR_CASES_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpu.h"

enum { MAXR = 16, LINE = 64 * 1024 };

typedef struct job {
  long id;
  int mdim;
  int64_t mshape[MPU_MESH_MAX_DIMS];
  mpu_dtensor_spec src, dst;
  char *out[MAXR]; /* each rank's line */
} job;

static int parse_placement(const char *t, mpu_placement *p) {
  if (!strcmp(t, "R")) return *p = MPU_REPLICATE, 0;
  if (t[0] == 'S') return *p = MPU_SHARD(atoi(t + 1)), 0;
  if (!strcmp(t, "Psum")) return *p = MPU_PARTIAL(MPU_SUM), 0;
  if (!strcmp(t, "Pavg")) return *p = MPU_PARTIAL(MPU_AVG), 0;
  if (!strcmp(t, "Pmax")) return *p = MPU_PARTIAL(MPU_MAX), 0;
  if (!strcmp(t, "Pmin")) return *p = MPU_PARTIAL(MPU_MIN), 0;
  return -1;
}

/* The source value at global flat index g on a rank whose coordinates on
 * the Partial mesh dims give pc: small multiples of 1/4 (exact in every
 * float dtype, sums exact in any order), -0.0 at some zeros. */
static double value(long id, int64_t g, int64_t pc, int *negzero) {
  int64_t base = (g * 7 + pc * 5 + id * 3) % 17 - 8;
  *negzero = base == 0 && (g & 1);
  return (double)base / 4.0;
}

static void store(mpu_dtype dt, void *p, int64_t k, double v, int negzero) {
  switch (dt) {
  case MPU_FLOAT32: ((float *)p)[k] = negzero ? -0.0f : (float)v; break;
  case MPU_FLOAT64: ((double *)p)[k] = negzero ? -0.0 : v; break;
  case MPU_BFLOAT16: ((uint16_t *)p)[k] = mpu_float_to_bfloat16(negzero ? -0.0f : (float)v); break;
  default: ((int32_t *)p)[k] = (int32_t)(v * 4); break;
  }
}

static int print_bits(char *s, size_t len, mpu_dtype dt, const void *p, int64_t k) {
  switch (dt) {
  case MPU_FLOAT32: {
    uint32_t u;
    memcpy(&u, (const float *)p + k, 4);
    return snprintf(s, len, " %08" PRIx32, u);
  }
  case MPU_FLOAT64: {
    uint64_t u;
    memcpy(&u, (const double *)p + k, 8);
    return snprintf(s, len, " %016" PRIx64, u);
  }
  case MPU_BFLOAT16: return snprintf(s, len, " %04x", ((const uint16_t *)p)[k]);
  default: return snprintf(s, len, " %" PRId32, ((const int32_t *)p)[k]);
  }
}

static int print_dims(char *s, size_t len, const int64_t *v, int n) {
  int w = snprintf(s, len, " ");
  for (int d = 0; d < n; d++) w += snprintf(s + w, len - (size_t)w, "%s%lld", d ? "," : "", (long long)v[d]);
  return w;
}

static mpu_result_t case_rank(mpu_comm *world, void *arg) {
  job *j = arg;
  int rank;
  mpu_comm_rank(world, &rank);
  const char *names[] = {"a", "b", "c", "d"};
  mpu_device_mesh *dm;
  mpu_result_t r = mpu_device_mesh_init(world, j->mdim, j->mshape, names, MPU_MESH_EAGER, &dm);
  if (r) return r;
  const mpu_mesh *mesh = mpu_device_mesh_mesh(dm);
  int64_t coord[MPU_MESH_MAX_DIMS], ss[MPU_TENSOR_MAX_DIMS], so[MPU_TENSOR_MAX_DIMS];
  int64_t ds[MPU_TENSOR_MAX_DIMS], dof[MPU_TENSOR_MAX_DIMS];
  char *line = j->out[rank];
  int nd = j->src.ndim;
  size_t es = mpu_dtype_size(j->src.dtype), total = 1, nin = 1, nout = 1;
  mpu_mesh_coords(mesh, rank, coord);
  for (int d = 0; d < nd; d++) total *= (size_t)j->src.shape[d];
  if (mpu_dtensor_local_shape(mesh, rank, &j->src, ss, so) ||
      mpu_dtensor_local_shape(mesh, rank, &j->dst, ds, dof)) {
    snprintf(line, LINE, "%ld %d error", j->id, rank);
    goto done;
  }
  for (int d = 0; d < nd; d++) nin *= (size_t)ss[d], nout *= (size_t)ds[d];
  void *in = calloc(nin + 1, es), *out = calloc(total + 1, es); /* out: room for any piece */
  if (!in || !out) {
    free(in), free(out);
    mpu_device_mesh_free(dm);
    return MPU_ERR_OUT_OF_MEMORY;
  }
  int64_t pc = 0;
  for (int i = 0; i < j->mdim; i++)
    if (j->src.placements[i].kind == MPU_PLACE_PARTIAL) pc += coord[i] * (2 * i + 1);
  for (size_t k = 0; k < nin; k++) { /* element k of the piece: its global flat index */
    int64_t g = 0, rest = (int64_t)k, idx[MPU_TENSOR_MAX_DIMS];
    for (int d = nd - 1; d >= 0; d--) idx[d] = rest % ss[d], rest /= ss[d];
    for (int d = 0; d < nd; d++) g = g * j->src.shape[d] + so[d] + idx[d];
    int nz;
    double v = value(j->id, g, pc, &nz);
    store(j->src.dtype, in, (int64_t)k, v, nz);
  }
  if (mpu_redistribute(dm, &j->src, in, &j->dst, out)) {
    snprintf(line, LINE, "%ld %d error", j->id, rank);
  } else {
    int w = snprintf(line, LINE, "%ld %d", j->id, rank);
    w += print_dims(line + w, LINE - (size_t)w, ss, nd);
    w += print_dims(line + w, LINE - (size_t)w, so, nd);
    w += print_dims(line + w, LINE - (size_t)w, ds, nd);
    w += print_dims(line + w, LINE - (size_t)w, dof, nd);
    for (size_t k = 0; k < nout && w < LINE - 24; k++)
      w += print_bits(line + w, LINE - (size_t)w, j->src.dtype, out, (int64_t)k);
  }
  free(in);
  free(out);
done:
  mpu_device_mesh_free(dm);
  return MPU_SUCCESS;
}

/* Parse a case line into j; -1 when it is malformed. */
static int case_parse(const char *text, job *j, int *ranks) {
  char buf[1024], *save, *t;
  snprintf(buf, sizeof buf, "%s", text);
  memset(&j->src, 0, sizeof j->src);
#define NEXT() ((t = strtok_r(NULL, " \n", &save)) ? t : "")
  if (!(t = strtok_r(buf, " \n", &save))) return -1;
  j->id = atol(t);
  j->mdim = atoi(NEXT());
  if (j->mdim < 1 || j->mdim > MPU_MESH_MAX_DIMS) return -1;
  *ranks = 1;
  for (int i = 0; i < j->mdim; i++) *ranks *= (int)(j->mshape[i] = atoll(NEXT()));
  j->src.ndim = atoi(NEXT());
  if (j->src.ndim < 1 || j->src.ndim > MPU_TENSOR_MAX_DIMS || *ranks < 1 || *ranks > MAXR) return -1;
  for (int d = 0; d < j->src.ndim; d++) j->src.shape[d] = atoll(NEXT());
  if (mpu_dtype_from_name(NEXT(), &j->src.dtype)) return -1;
  j->dst = j->src;
  for (int i = 0; i < j->mdim; i++)
    if (parse_placement(NEXT(), &j->src.placements[i])) return -1;
  for (int i = 0; i < j->mdim; i++)
    if (parse_placement(NEXT(), &j->dst.placements[i])) return -1;
#undef NEXT
  return 0;
}

/* Run the case: j->out[r] gets rank r's line. */
static mpu_result_t case_run(job *j, int ranks) {
  for (int k = 0; k < ranks; k++)
    if (!j->out[k] && !(j->out[k] = malloc(LINE))) return MPU_ERR_OUT_OF_MEMORY;
  return mpu_launch(ranks, case_rank, j, NULL, NULL);
}

static void case_free(job *j) {
  for (int k = 0; k < MAXR; k++) free(j->out[k]), j->out[k] = NULL;
}

#endif
