/*
 * dtensor.c - placements on a device mesh and redistribute.
 *
 * One walk serves the move and its plan: change one mesh dim's placement at
 * a time (the innermost that can change first), each change one collective
 * on that dim's communicator or a local step, with a dry mode that only
 * computes shapes and bytes. Shards of one tensor dim on several mesh dims
 * nest in mesh-dim order, so a mesh dim can change only when no inner mesh
 * dim shards the tensor dims it touches, and a shard is added on an inner
 * mesh dim only after the outer ones that still change that tensor dim have
 * (otherwise the nesting would come out in the wrong order).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/chunk.h"
#include "core/error.h"
#include "mpu/dtensor.h"

#define MAXD MPU_TENSOR_MAX_DIMS

typedef struct walk {
  const mpu_mesh *mesh;
  mpu_device_mesh *dm;   /* NULL: dry (the plan only) */
  int mdim, ndim;
  int64_t msize[MPU_MESH_MAX_DIMS], coord[MPU_MESH_MAX_DIMS];
  const int64_t *gshape;
  mpu_placement cur[MPU_MESH_MAX_DIMS];
  int64_t lshape[MAXD];  /* the local piece's shape under cur */
  unsigned char *data;   /* the local piece (NULL when dry) */
  mpu_dtype dtype;
  size_t es;             /* bytes per element */
  char *plan;            /* the plan's text, or NULL */
  size_t plan_len, used;
  int ncoll;
} walk;

char *mpu_placement_describe(mpu_placement p, char *buf, size_t len) {
  if (!buf || !len) return buf;
  switch (p.kind) {
  case MPU_PLACE_REPLICATE: snprintf(buf, len, "Replicate"); break;
  case MPU_PLACE_SHARD: snprintf(buf, len, "Shard(%d)", p.dim); break;
  case MPU_PLACE_PARTIAL: snprintf(buf, len, "Partial(%s)", p.op == MPU_AVG ? "avg" : "sum"); break;
  default: snprintf(buf, len, "?"); break;
  }
  return buf;
}

static int same(mpu_placement a, mpu_placement b) {
  if (a.kind != b.kind) return 0;
  if (a.kind == MPU_PLACE_SHARD) return a.dim == b.dim;
  if (a.kind == MPU_PLACE_PARTIAL) return a.op == b.op;
  return 1;
}

static int shards(mpu_placement p, int d) { return p.kind == MPU_PLACE_SHARD && p.dim == d; }

static size_t numel(const int64_t *shape, int ndim) {
  size_t n = 1;
  for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
  return n;
}

/* ---- checks and shapes --------------------------------------------------------------------- */

static mpu_result_t check_spec(const char *fn, const char *what, const mpu_dtensor_spec *s,
                               int mdim) {
  if (!s) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL %s spec", fn, what);
  if (s->ndim < 1 || s->ndim > MAXD)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s has %d dims (want 1..%d)", fn, what,
                      s->ndim, MAXD);
  size_t n = 1;
  for (int d = 0; d < s->ndim; d++) {
    if (s->shape[d] < 0 || s->shape[d] > ((int64_t)1 << 40))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s dim %d is %lld", fn, what, d,
                        (long long)s->shape[d]);
    if (s->shape[d] && n > ((size_t)1 << 40) / (size_t)s->shape[d])
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s has more than 2^40 elements", fn, what);
    n *= (size_t)s->shape[d];
  }
  if ((unsigned)s->dtype >= MPU_DTYPE_COUNT)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s dtype %d", fn, what, (int)s->dtype);
  for (int i = 0; i < mdim; i++) {
    mpu_placement p = s->placements[i];
    int ok = p.kind == MPU_PLACE_REPLICATE ||
             (p.kind == MPU_PLACE_SHARD && p.dim >= 0 && p.dim < s->ndim) ||
             (p.kind == MPU_PLACE_PARTIAL && (p.op == MPU_SUM || p.op == MPU_AVG));
    if (!ok)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: %s placement on mesh dim %d: kind %d dim %d op %d (want Replicate, "
                        "Shard(0..%d) or Partial(sum|avg))",
                        fn, what, i, (int)p.kind, p.dim, (int)p.op, s->ndim - 1);
  }
  return MPU_SUCCESS;
}

/* Tensor dim d under placements pl, after the mesh dims before `upto`: its
 * offset and length on this rank. */
static void span(const walk *w, const mpu_placement *pl, int d, int upto, int64_t *off,
                 int64_t *len) {
  size_t o = 0, n = (size_t)w->gshape[d], lo, hi;
  for (int i = 0; i < upto; i++)
    if (shards(pl[i], d)) {
      mpu__chunk(n, (size_t)w->msize[i], (size_t)w->coord[i], &lo, &hi);
      o += lo, n = hi - lo;
    }
  *off = (int64_t)o, *len = (int64_t)n;
}

static mpu_result_t walk_init(const char *fn, walk *w, const mpu_mesh *mesh, int rank,
                              const mpu_dtensor_spec *spec) {
  memset(w, 0, sizeof *w);
  if (!mesh) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL mesh", fn);
  w->mesh = mesh, w->mdim = mpu_mesh_ndim(mesh);
  MPU_CHECK(check_spec(fn, "the", spec, w->mdim));
  MPU_CHECK(mpu_mesh_coords(mesh, rank, w->coord));
  for (int i = 0; i < w->mdim; i++) MPU_CHECK(mpu_mesh_dim_size(mesh, i, &w->msize[i]));
  w->ndim = spec->ndim, w->gshape = spec->shape, w->dtype = spec->dtype;
  w->es = mpu_dtype_size(spec->dtype);
  memcpy(w->cur, spec->placements, sizeof w->cur);
  for (int d = 0; d < w->ndim; d++) {
    int64_t off;
    span(w, w->cur, d, w->mdim, &off, &w->lshape[d]);
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_dtensor_local_shape(const mpu_mesh *mesh, int rank, const mpu_dtensor_spec *spec,
                                     int64_t *shape, int64_t *offset) {
  walk w;
  MPU_CHECK(walk_init("mpu_dtensor_local_shape", &w, mesh, rank, spec));
  for (int d = 0; d < w.ndim; d++) {
    int64_t off, len;
    span(&w, w.cur, d, w.mdim, &off, &len);
    if (shape) shape[d] = len;
    if (offset) offset[d] = off;
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_dtensor_local_numel(const mpu_mesh *mesh, int rank, const mpu_dtensor_spec *spec,
                                     size_t *n) {
  int64_t shape[MAXD];
  MPU_CHECK(mpu_dtensor_local_shape(mesh, rank, spec, shape, NULL));
  if (n) *n = numel(shape, spec->ndim);
  return MPU_SUCCESS;
}

/* ---- moving boxes ------------------------------------------------------------------------------ */

/* Copy the box of shape box[] at soff in src (shape sshape) to doff in dst (shape dshape). */
static void copy_box(size_t es, unsigned char *dst, const int64_t *dshape, const int64_t *doff,
                     const unsigned char *src, const int64_t *sshape, const int64_t *soff,
                     const int64_t *box, int ndim) {
  for (int d = 0; d < ndim; d++)
    if (box[d] <= 0) return;
  int64_t idx[MAXD] = {0};
  for (;;) {
    size_t si = 0, di = 0;
    for (int d = 0; d < ndim; d++) {
      si = si * (size_t)sshape[d] + (size_t)(soff[d] + (d < ndim - 1 ? idx[d] : 0));
      di = di * (size_t)dshape[d] + (size_t)(doff[d] + (d < ndim - 1 ? idx[d] : 0));
    }
    memcpy(dst + di * es, src + si * es, (size_t)box[ndim - 1] * es);
    int d = ndim - 2;
    while (d >= 0 && ++idx[d] == box[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

/* ---- the plan's text ---------------------------------------------------------------------------- */

static void say(walk *w, int i, mpu_placement from, mpu_placement to, const char *what,
                size_t bytes) {
  if (strcmp(what, "local slice") && strcmp(what, "local")) w->ncoll++;
  if (!w->plan || w->used + 1 >= w->plan_len) return;
  char a[32], b[32], dim[48], size[32] = "";
  const char *name = mpu_mesh_dim_name(w->mesh, i);
  if (name && *name) snprintf(dim, sizeof dim, "dim '%s'", name);
  else snprintf(dim, sizeof dim, "dim %d", i);
  if (bytes >= ((size_t)1 << 20)) snprintf(size, sizeof size, " of %.3g MiB", bytes / 1048576.0);
  else if (bytes >= 1024) snprintf(size, sizeof size, " of %.3g KiB", bytes / 1024.0);
  else if (strcmp(what, "local slice") && strcmp(what, "local"))
    snprintf(size, sizeof size, " of %zu bytes", bytes);
  int n = snprintf(w->plan + w->used, w->plan_len - w->used, "%s%s -> %s on %s: %s%s",
                   w->used ? "\n" : "", mpu_placement_describe(from, a, sizeof a),
                   mpu_placement_describe(to, b, sizeof b), dim, what, size);
  if (n > 0) w->used += (size_t)n < w->plan_len - w->used ? (size_t)n : w->plan_len - w->used - 1;
}

/* ---- one change on one mesh dim ----------------------------------------------------------------- */

static mpu_result_t alloc_zero(unsigned char **p, size_t n, size_t es) {
  *p = calloc(n ? n : 1, es);
  return *p ? MPU_SUCCESS
            : mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_redistribute: %zu elements of %zu bytes", n, es);
}

/* Is a Partial of dtype dt rescaled by the dim's size in place? Only in
 * float32 and float64 (rounded as any float is). In an integer dtype the
 * division truncates (Partial(avg) [1, 1] over 2 ranks would become
 * Partial(sum) [0, 0]) and the multiplication can overflow; float16 and
 * bfloat16 have no local arithmetic here. Those changes go through
 * Replicate instead (a collective, then a local step that only copies or
 * zeroes), which is exact: see mpu/dtensor.h. */
static int scales_locally(mpu_dtype dt) { return dt == MPU_FLOAT32 || dt == MPU_FLOAT64; }

/* The changes that rescale: Shard -> Partial(avg) (x size) and Partial(sum) <-> Partial(avg). */
static int rescales(mpu_placement from, mpu_placement to) {
  return to.kind == MPU_PLACE_PARTIAL &&
         ((from.kind == MPU_PLACE_SHARD && to.op == MPU_AVG) ||
          (from.kind == MPU_PLACE_PARTIAL && from.op != to.op));
}

/* p[0..n) *= num / den, in float32 or float64 (scales_locally) */
static void scale(mpu_dtype dt, unsigned char *p, size_t n, int64_t num, int64_t den) {
  if (dt == MPU_FLOAT32)
    for (size_t k = 0; k < n; k++) ((float *)p)[k] = ((float *)p)[k] * (float)num / (float)den;
  else
    for (size_t k = 0; k < n; k++) ((double *)p)[k] = ((double *)p)[k] * (double)num / (double)den;
}

/* Change mesh dim i's placement to `to`: one collective or a local step. */
static mpu_result_t change(walk *w, int i, mpu_placement to) {
  mpu_placement from = w->cur[i];
  if (rescales(from, to) && !scales_locally(w->dtype)) { /* exact, through Replicate */
    MPU_CHECK(change(w, i, MPU_REPLICATE));
    return change(w, i, to);
  }
  int dry = !w->dm, nd = w->ndim;
  size_t n = (size_t)w->msize[i], c = (size_t)w->coord[i];
  int64_t L[MAXD], B[MAXD], zero[MAXD] = {0}, off[MAXD] = {0};
  memcpy(L, w->lshape, sizeof L);
  memcpy(B, L, sizeof B);
  mpu_comm *comm = NULL;
  if (!dry) MPU_CHECK(mpu_device_mesh_comm(w->dm, i, &comm));
  unsigned char *next = NULL, *blocks = NULL;
  mpu_result_t r = MPU_SUCCESS;
  size_t lo, hi, elo, ehi;
  int64_t full, o;

  if (from.kind == MPU_PLACE_SHARD && to.kind == MPU_PLACE_REPLICATE) { /* all_gather */
    int d = from.dim;
    span(w, w->cur, d, i, &o, &full);
    B[d] = (int64_t)mpu__chunk((size_t)full, n, 0, NULL, NULL);
    size_t nb = numel(B, nd);
    say(w, i, from, to, "all_gather", n * nb * w->es);
    L[d] = full;
    if (!dry) {
      MPU_CHECK_GOTO(alloc_zero(&blocks, n * nb, w->es), r, out);
      MPU_CHECK_GOTO(alloc_zero(&next, numel(L, nd), w->es), r, out);
      copy_box(w->es, blocks + c * nb * w->es, B, zero, w->data, w->lshape, zero, w->lshape, nd);
      MPU_CHECK_GOTO(mpu_comm_all_gather(comm, blocks + c * nb * w->es, blocks, nb, w->dtype), r, out);
      for (size_t j = 0; j < n; j++) {
        int64_t box[MAXD];
        memcpy(box, L, sizeof box);
        mpu__chunk((size_t)full, n, j, &lo, &hi);
        box[d] = (int64_t)(hi - lo), off[d] = (int64_t)lo;
        copy_box(w->es, next, L, off, blocks + j * nb * w->es, B, zero, box, nd);
      }
    }
  } else if (from.kind == MPU_PLACE_REPLICATE && to.kind == MPU_PLACE_SHARD) { /* local slice */
    int d = to.dim;
    mpu__chunk((size_t)L[d], n, c, &lo, &hi);
    say(w, i, from, to, "local slice", 0);
    L[d] = (int64_t)(hi - lo), off[d] = (int64_t)lo;
    if (!dry) {
      MPU_CHECK_GOTO(alloc_zero(&next, numel(L, nd), w->es), r, out);
      copy_box(w->es, next, L, zero, w->data, w->lshape, off, L, nd);
    }
  } else if (from.kind == MPU_PLACE_PARTIAL && to.kind == MPU_PLACE_REPLICATE) { /* all_reduce */
    say(w, i, from, to, "all_reduce", numel(L, nd) * w->es);
    if (!dry)
      MPU_CHECK_GOTO(mpu_comm_all_reduce(comm, w->data, w->data, numel(L, nd), w->dtype,
                                         from.op), r, out);
  } else if (from.kind == MPU_PLACE_PARTIAL && to.kind == MPU_PLACE_SHARD) { /* reduce_scatter */
    int d = to.dim;
    full = L[d];
    B[d] = (int64_t)mpu__chunk((size_t)full, n, 0, NULL, NULL);
    size_t nb = numel(B, nd);
    say(w, i, from, to, "reduce_scatter", n * nb * w->es);
    mpu__chunk((size_t)full, n, c, &lo, &hi);
    L[d] = (int64_t)(hi - lo);
    if (!dry) {
      MPU_CHECK_GOTO(alloc_zero(&blocks, n * nb, w->es), r, out);
      MPU_CHECK_GOTO(alloc_zero(&next, numel(L, nd), w->es), r, out);
      for (size_t j = 0; j < n; j++) {
        int64_t box[MAXD];
        memcpy(box, w->lshape, sizeof box);
        mpu__chunk((size_t)full, n, j, &elo, &ehi);
        box[d] = (int64_t)(ehi - elo), off[d] = (int64_t)elo;
        copy_box(w->es, blocks + j * nb * w->es, B, zero, w->data, w->lshape, off, box, nd);
      }
      MPU_CHECK_GOTO(mpu_comm_reduce_scatter(comm, blocks, blocks + c * nb * w->es, nb, w->dtype,
                                             from.op), r, out);
      copy_box(w->es, next, L, zero, blocks + c * nb * w->es, B, zero, L, nd);
    }
  } else if (from.kind == MPU_PLACE_SHARD && to.kind == MPU_PLACE_SHARD) { /* all_to_all */
    int d = from.dim, e = to.dim;
    int64_t fulld, fulle = L[e];
    span(w, w->cur, d, i, &o, &fulld);
    B[d] = (int64_t)mpu__chunk((size_t)fulld, n, 0, NULL, NULL);
    B[e] = (int64_t)mpu__chunk((size_t)fulle, n, 0, NULL, NULL);
    size_t nb = numel(B, nd);
    say(w, i, from, to, "all_to_all", n * nb * w->es);
    mpu__chunk((size_t)fulle, n, c, &elo, &ehi);
    L[d] = fulld, L[e] = (int64_t)(ehi - elo);
    if (!dry) {
      unsigned char *recv = NULL;
      MPU_CHECK_GOTO(alloc_zero(&blocks, 2 * n * nb, w->es), r, out);
      recv = blocks + n * nb * w->es;
      MPU_CHECK_GOTO(alloc_zero(&next, numel(L, nd), w->es), r, out);
      for (size_t j = 0; j < n; j++) { /* to rank j: my rows of d, its columns of e */
        int64_t box[MAXD], soff[MAXD] = {0};
        memcpy(box, w->lshape, sizeof box);
        mpu__chunk((size_t)fulle, n, j, &lo, &hi);
        box[e] = (int64_t)(hi - lo), soff[e] = (int64_t)lo;
        copy_box(w->es, blocks + j * nb * w->es, B, zero, w->data, w->lshape, soff, box, nd);
      }
      MPU_CHECK_GOTO(mpu_comm_all_to_all(comm, blocks, recv, nb, w->dtype), r, out);
      for (size_t j = 0; j < n; j++) { /* from rank j: its rows of d, my columns of e */
        int64_t box[MAXD], doff[MAXD] = {0};
        memcpy(box, L, sizeof box);
        mpu__chunk((size_t)fulld, n, j, &lo, &hi);
        box[d] = (int64_t)(hi - lo), doff[d] = (int64_t)lo;
        copy_box(w->es, next, L, doff, recv + j * nb * w->es, B, zero, box, nd);
      }
    }
  } else if (from.kind == MPU_PLACE_SHARD && to.kind == MPU_PLACE_PARTIAL) { /* local */
    int d = from.dim;
    span(w, w->cur, d, i, &o, &full);
    mpu__chunk((size_t)full, n, c, &lo, &hi);
    say(w, i, from, to, "local", 0);
    L[d] = full, off[d] = (int64_t)lo;
    if (!dry) {
      MPU_CHECK_GOTO(alloc_zero(&next, numel(L, nd), w->es), r, out);
      copy_box(w->es, next, L, off, w->data, w->lshape, zero, w->lshape, nd);
      if (to.op == MPU_AVG) scale(w->dtype, next, numel(L, nd), (int64_t)n, 1);
    }
  } else { /* Replicate -> Partial, Partial(sum) <-> Partial(avg): local */
    say(w, i, from, to, "local", 0);
    if (!dry) {
      size_t m = numel(L, nd);
      if (from.kind == MPU_PLACE_REPLICATE && to.op == MPU_SUM && c) memset(w->data, 0, m * w->es);
      if (from.kind == MPU_PLACE_PARTIAL)
        scale(w->dtype, w->data, m, from.op == MPU_SUM ? (int64_t)n : 1,
              from.op == MPU_SUM ? 1 : (int64_t)n);
    }
  }
  if (next) {
    free(w->data);
    w->data = next, next = NULL;
  }
  memcpy(w->lshape, L, sizeof L);
  w->cur[i] = to;
out:
  free(next);
  free(blocks);
  return r;
}

/* ---- the walk ------------------------------------------------------------------------------------ */

/* May mesh dim i change to `to` now? Not if an inner mesh dim shards a
 * tensor dim this change touches, nor (for a new shard) while an outer mesh
 * dim still has to change that tensor dim. */
static int may_change(const walk *w, const mpu_placement *dst, int i, mpu_placement to) {
  int dims[2] = {w->cur[i].kind == MPU_PLACE_SHARD ? w->cur[i].dim : -1,
                 to.kind == MPU_PLACE_SHARD ? to.dim : -1};
  for (int j = i + 1; j < w->mdim; j++)
    for (int k = 0; k < 2; k++)
      if (dims[k] >= 0 && shards(w->cur[j], dims[k])) return 0;
  if (dims[1] >= 0)
    for (int k = 0; k < i; k++)
      if (!same(w->cur[k], dst[k]) && (shards(w->cur[k], dims[1]) || shards(dst[k], dims[1])))
        return 0;
  return 1;
}

static mpu_result_t run_walk(walk *w, const mpu_placement *dst) {
  for (int guard = 0; guard < 8 * MPU_MESH_MAX_DIMS * MPU_MESH_MAX_DIMS; guard++) {
    int outer = -1, done = 0;
    for (int i = w->mdim - 1; i >= 0 && !done; i--) {
      if (same(w->cur[i], dst[i])) continue;
      outer = i;
      if (may_change(w, dst, i, dst[i])) {
        MPU_CHECK(change(w, i, dst[i]));
        done = 1;
      }
    }
    if (done) continue;
    if (outer < 0) return MPU_SUCCESS;
    /* blocked: gather the innermost mesh dim that shards a tensor dim the
     * outermost pending change touches */
    int j = -1;
    for (int k = w->mdim - 1; k > outer && j < 0; k--)
      if (w->cur[k].kind == MPU_PLACE_SHARD &&
          (shards(w->cur[outer], w->cur[k].dim) || shards(dst[outer], w->cur[k].dim)))
        j = k;
    if (j < 0) break;
    MPU_CHECK(change(w, j, MPU_REPLICATE));
  }
  return mpu__error(MPU_ERR_INTERNAL, "mpu_redistribute: no order of steps found");
}

static mpu_result_t start(const char *fn, walk *w, const mpu_device_mesh *dm,
                          const mpu_dtensor_spec *src, const mpu_dtensor_spec *dst) {
  if (!dm) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL device mesh", fn);
  const mpu_mesh *mesh = mpu_device_mesh_mesh(dm);
  MPU_CHECK(walk_init(fn, w, mesh, mpu_device_mesh_rank(dm), src));
  MPU_CHECK(check_spec(fn, "destination", dst, w->mdim));
  if (dst->ndim != src->ndim || memcmp(dst->shape, src->shape, (size_t)src->ndim * sizeof(int64_t)) ||
      dst->dtype != src->dtype)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: the source and destination shapes or dtypes differ", fn);
  return MPU_SUCCESS;
}

mpu_result_t mpu_redistribute(mpu_device_mesh *dm, const mpu_dtensor_spec *src, const void *in,
                              const mpu_dtensor_spec *dst, void *out) {
  static const char fn[] = "mpu_redistribute";
  walk w;
  MPU_CHECK(start(fn, &w, dm, src, dst));
  if (!in || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL buffer", fn);
  size_t n = numel(w.lshape, w.ndim);
  MPU_CHECK(alloc_zero(&w.data, n, w.es));
  memcpy(w.data, in, n * w.es);
  w.dm = dm;
  mpu_result_t r = run_walk(&w, dst->placements);
  if (!r) memcpy(out, w.data, numel(w.lshape, w.ndim) * w.es);
  free(w.data);
  return r;
}

mpu_result_t mpu_redistribute_plan(const mpu_device_mesh *dm, const mpu_dtensor_spec *src,
                                   const mpu_dtensor_spec *dst, char *buf, size_t len,
                                   int *ncollectives) {
  walk w;
  MPU_CHECK(start("mpu_redistribute_plan", &w, dm, src, dst));
  w.plan = buf, w.plan_len = len;
  if (buf && len) buf[0] = '\0';
  MPU_CHECK(run_walk(&w, dst->placements));
  if (buf && len && !w.used) snprintf(buf, len, "nothing to move");
  if (ncollectives) *ncollectives = w.ncoll;
  return MPU_SUCCESS;
}
