/*
 * dtensor.c - placements on a device mesh and redistribute.
 *
 * One walk serves the move and its plan: the steps are those of torch 2.15's
 * redistribute (torch/distributed/tensor/_redistribute.py,
 * generate_greedy_transform_infos): when the source shards anything, the
 * mesh dims are visited innermost first and each goes to its target, or to
 * Replicate where its target shard would nest under different outer shards
 * than it will; then outermost first, each remaining dim goes to its
 * target. Each step is one collective on that dim's communicator or a local
 * step (placement_types.py: the Shard, Replicate and Partial methods), with
 * a dry mode that only computes shapes and bytes. Following torch's order
 * and steps gives every rank torch's local values, Partials included (a
 * Replicate -> Partial(sum) divides on every rank, so where it happens
 * matters).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/services.h"
#include "core/chunk.h"
#include "core/error.h"
#include "mpu/dtensor.h"
#include "mesh/mesh_internal.h"
#include "mpu/shard.h"
#include "shard/shard_internal.h"

#define MAXD MPU_TENSOR_MAX_DIMS

typedef struct walk {
  const mpu_mesh *mesh;
  mpu_device_mesh *dm;   /* NULL: dry (the plan only) */
  int mdim, ndim;
  int64_t msize[MPU_MESH_MAX_DIMS], coord[MPU_MESH_MAX_DIMS];
  const int64_t *gshape;
  mpu_placement cur[MPU_MESH_MAX_DIMS]; /* the placements now (shard dims normalized) */
  mpu_placement dst[MPU_MESH_MAX_DIMS]; /* the destination's (redistribute only) */
  int64_t lshape[MAXD];  /* the local piece's shape under cur */
  unsigned char *data;   /* the local piece (NULL when dry) */
  mpu_comm *mem;         /* device buffers: the mesh's communicator, in whose memory the
                            pieces are and whose copies and scaling move them; NULL: host */
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
  case MPU_PLACE_PARTIAL: snprintf(buf, len, "Partial(%s)", mpu_op_name(p.op)); break;
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

static int partial_op_ok(mpu_op op) {
  return op == MPU_SUM || op == MPU_AVG || op == MPU_MAX || op == MPU_MIN;
}

/* Check spec s for a mesh of mdim dims and write its placements to norm,
 * shard dims normalized as DTensor's from_local and redistribute do
 * (Shard(-1) is the last dim). Partial reductions mix only as torch's
 * assert_no_mixed_partial_types allows: sum with avg (both linear); max and
 * min do not commute with them, so the order of the reductions would matter. */
static mpu_result_t check_spec(const char *fn, const char *what, const mpu_dtensor_spec *s,
                               int mdim, mpu_placement *norm) {
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
  int ops = 0; /* a bit per Partial op present */
  for (int i = 0; i < mdim; i++) {
    mpu_placement p = s->placements[i];
    int ok = p.kind == MPU_PLACE_REPLICATE ||
             (p.kind == MPU_PLACE_SHARD && p.dim >= -s->ndim && p.dim < s->ndim) ||
             (p.kind == MPU_PLACE_PARTIAL && partial_op_ok(p.op));
    if (!ok)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: %s placement on mesh dim %d: kind %d dim %d op %d (want Replicate, "
                        "Shard(-%d..%d) or Partial(sum|avg|max|min))",
                        fn, what, i, (int)p.kind, p.dim, (int)p.op, s->ndim, s->ndim - 1);
    if (p.kind == MPU_PLACE_SHARD && p.dim < 0) p.dim += s->ndim;
    if (p.kind == MPU_PLACE_PARTIAL) ops |= 1 << p.op;
    norm[i] = p;
  }
  if (ops & (ops - 1) && ops != ((1 << MPU_SUM) | (1 << MPU_AVG))) {
    char list[64] = "";
    for (int op = 0; op < MPU_OP_COUNT; op++)
      if (ops & (1 << op))
        snprintf(list + strlen(list), sizeof list - strlen(list), "%sPartial(%s)", *list ? ", " : "",
                 mpu_op_name((mpu_op)op));
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: %s mixes %s: only sum and avg mix, as in DTensor (max and min do not "
                      "commute with other reductions)",
                      fn, what, list);
  }
  return MPU_SUCCESS;
}

/* Tensor dim d under placements pl, after the mesh dims before `upto`: its
 * offset and length on this rank. An empty piece starts at the dim's global
 * end, wherever its outer pieces start, as torch's
 * compute_local_shape_and_global_offset puts it (_utils.py: an empty shard's
 * offset is global_shape[dim]); DCP keys a rank's chunks by that offset. */
static void span(const walk *w, const mpu_placement *pl, int d, int upto, int64_t *off,
                 int64_t *len) {
  size_t o = 0, n = (size_t)w->gshape[d], lo, hi;
  for (int i = 0; i < upto; i++)
    if (shards(pl[i], d)) {
      mpu__chunk(n, (size_t)w->msize[i], (size_t)w->coord[i], &lo, &hi);
      n = hi - lo;
      o = n ? o + lo : (size_t)w->gshape[d];
    }
  *off = (int64_t)o, *len = (int64_t)n;
}

static mpu_result_t walk_init(const char *fn, walk *w, const mpu_mesh *mesh, int rank,
                              const mpu_dtensor_spec *spec) {
  memset(w, 0, sizeof *w);
  if (!mesh) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL mesh", fn);
  w->mesh = mesh, w->mdim = mpu_mesh_ndim(mesh);
  MPU_CHECK(check_spec(fn, "the", spec, w->mdim, w->cur));
  MPU_CHECK(mpu_mesh_coords(mesh, rank, w->coord));
  for (int i = 0; i < w->mdim; i++) MPU_CHECK(mpu_mesh_dim_size(mesh, i, &w->msize[i]));
  w->ndim = spec->ndim, w->gshape = spec->shape, w->dtype = spec->dtype;
  w->es = mpu_dtype_size(spec->dtype);
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

mpu_result_t mpu_dtensor_describe(const mpu_mesh *mesh, int rank, const mpu_dtensor_spec *spec,
                                  mpu_shard *out) {
  static const char fn[] = "mpu_dtensor_describe";
  if (!spec || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (spec->ndim > MPU_SHARD_MAX_DIMS)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d dims; a shard has at most %d", fn,
                      spec->ndim, MPU_SHARD_MAX_DIMS);
  int64_t shape[MAXD], offset[MAXD];
  MPU_CHECK(mpu_dtensor_local_shape(mesh, rank, spec, shape, offset));
  return mpu_shard_box_at(spec->ndim, spec->shape, shape, offset, out);
}

mpu_result_t mpu_dtensor_local_numel(const mpu_mesh *mesh, int rank, const mpu_dtensor_spec *spec,
                                     size_t *n) {
  int64_t shape[MAXD];
  MPU_CHECK(mpu_dtensor_local_shape(mesh, rank, spec, shape, NULL));
  if (n) *n = numel(shape, spec->ndim);
  return MPU_SUCCESS;
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

/* The pieces' memory. On the host: calloc, memcpy, the host's own scaling.
 * On device buffers (an NCCL mesh) the host never touches them: memory of
 * the mesh's communicator, copies by the communicator (cudaMemcpy2DAsync,
 * the host waiting), scaling on the device (mpu__comm_scale); each step's
 * collective runs on its dim's communicator, the host waiting, so the next
 * step, on another communicator's stream, finds the piece complete. */
static mpu_result_t piece_alloc(walk *w, unsigned char **p, size_t n, int zero) {
  if (!w->mem) return alloc_zero(p, n, w->es);
  void *q = NULL;
  MPU_CHECK(mpu_comm_mem_alloc(w->mem, (n ? n : 1) * w->es, &q));
  *p = q;
  if (!zero || !n) return MPU_SUCCESS;
  void *zeros = calloc(n, w->es); /* the device's zeros come by a copy */
  mpu_result_t r = zeros ? mpu_comm_copy2d(w->mem, q, n * w->es, zeros, n * w->es, n * w->es, 1)
                         : mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_redistribute: %zu zeros", n);
  free(zeros);
  if (r) {
    mpu_comm_mem_free(w->mem, q);
    *p = NULL;
  }
  return r;
}

static void piece_free(walk *w, void *p) {
  if (p && w->mem) mpu_comm_mem_free(w->mem, p);
  else free(p);
}

static mpu_result_t device_copy2d(void *ctx, void *dst, size_t dpitch, const void *src,
                                  size_t spitch, size_t width, size_t height) {
  return mpu_comm_copy2d(ctx, dst, dpitch, src, spitch, width, height);
}

/* mpu_shard_copy_box in the pieces' memory */
static mpu_result_t copy_box(walk *w, void *dst, const int64_t *dshape, const int64_t *doff,
                             const void *src, const int64_t *sshape, const int64_t *soff,
                             const int64_t *box) {
  if (!w->mem) {
    mpu_shard_copy_box(w->es, dst, dshape, doff, src, sshape, soff, box, w->ndim);
    return MPU_SUCCESS;
  }
  return mpu__shard_copy_box_with(w->es, dst, dshape, doff, src, sshape, soff, box, w->ndim,
                                  device_copy2d, w->mem);
}

/* Is a Partial of dtype dt rescaled by the dim's size in place? In the
 * float dtypes, rounded as torch's CPU kernels round (float16 and bfloat16
 * computed in float32 and rounded once). In an integer dtype the division
 * truncates (Partial(avg) [1, 1] over 2 ranks would become Partial(sum)
 * [0, 0]) and the multiplication can overflow: those changes go through
 * Replicate instead (a collective, then a local step that only copies or
 * zeroes), which is exact: see mpu/dtensor.h. */
static int scales_locally(mpu_dtype dt) { return mpu_dtype_is_float(dt); }

static int linear(mpu_op op) { return op == MPU_SUM || op == MPU_AVG; }

/* Does from -> to go through Replicate (two steps)? Only changes torch's
 * DTensor refuses do: Shard -> Partial(max|min) (no value is neutral to
 * fill the rest with), Shard -> Partial(avg) and Partial(sum) <->
 * Partial(avg) where the scale cannot be made in place, and a Partial of
 * max or min to or from another reduction. */
static int via_replicate(mpu_placement from, mpu_placement to, mpu_dtype dt) {
  if (to.kind != MPU_PLACE_PARTIAL) return 0;
  if (from.kind == MPU_PLACE_SHARD)
    return !linear(to.op) || (to.op == MPU_AVG && !scales_locally(dt));
  if (from.kind == MPU_PLACE_PARTIAL && from.op != to.op)
    return !linear(from.op) || !linear(to.op) || !scales_locally(dt);
  return 0;
}

/* p[0..n) *= num / den in place, a float dtype (scales_locally): (x * num)
 * / den, so a division alone (num 1) rounds as torch's `tensor / n` does;
 * on device buffers on the device (mpu__comm_scale says how it rounds). */
static mpu_result_t scale(walk *w, mpu_comm *comm, unsigned char *p, size_t n, int64_t num,
                          int64_t den) {
  return mpu__comm_scale(w->mem ? w->mem : comm, p, n, w->dtype, num, den);
}

/* Shard -> Partial(sum) adds the piece into zeros (torch's _to_partial_tensor
 * is an index_add), so a -0.0 of a float piece comes out +0.0. */
static void add_to_zeros(mpu_dtype dt, unsigned char *p, size_t n) {
  for (size_t k = 0; k < n; k++) switch (dt) {
    case MPU_FLOAT32: ((float *)p)[k] += 0.0f; break;
    case MPU_FLOAT64: ((double *)p)[k] += 0.0; break;
    case MPU_FLOAT16: case MPU_BFLOAT16:
      if (((uint16_t *)p)[k] == 0x8000) ((uint16_t *)p)[k] = 0;
      break;
    default: return;
    }
}

/* Change mesh dim i's placement to `to`: one collective or a local step. */
static mpu_result_t change(walk *w, int i, mpu_placement to) {
  mpu_placement from = w->cur[i];
  if (w->msize[i] == 1) { /* one piece: nothing moves or scales, as in torch */
    w->cur[i] = to;
    return MPU_SUCCESS;
  }
  if (via_replicate(from, to, w->dtype)) {
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
      MPU_CHECK_GOTO(piece_alloc(w, &blocks, n * nb, 0), r, out);
      MPU_CHECK_GOTO(piece_alloc(w, &next, numel(L, nd), 0), r, out);
      MPU_CHECK_GOTO(copy_box(w, blocks + c * nb * w->es, B, zero, w->data, w->lshape, zero, w->lshape), r, out);
      MPU_CHECK_GOTO(mpu_comm_all_gather(comm, blocks + c * nb * w->es, blocks, nb, w->dtype), r, out);
      for (size_t j = 0; j < n; j++) {
        int64_t box[MAXD];
        memcpy(box, L, sizeof box);
        mpu__chunk((size_t)full, n, j, &lo, &hi);
        box[d] = (int64_t)(hi - lo), off[d] = (int64_t)lo;
        MPU_CHECK_GOTO(copy_box(w, next, L, off, blocks + j * nb * w->es, B, zero, box), r, out);
      }
    }
  } else if (from.kind == MPU_PLACE_REPLICATE && to.kind == MPU_PLACE_SHARD) { /* local slice */
    int d = to.dim;
    mpu__chunk((size_t)L[d], n, c, &lo, &hi);
    say(w, i, from, to, "local slice", 0);
    L[d] = (int64_t)(hi - lo), off[d] = (int64_t)lo;
    if (!dry) {
      MPU_CHECK_GOTO(piece_alloc(w, &next, numel(L, nd), 0), r, out);
      MPU_CHECK_GOTO(copy_box(w, next, L, zero, w->data, w->lshape, off, L), r, out);
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
      MPU_CHECK_GOTO(piece_alloc(w, &blocks, n * nb, 0), r, out);
      MPU_CHECK_GOTO(piece_alloc(w, &next, numel(L, nd), 0), r, out);
      for (size_t j = 0; j < n; j++) {
        int64_t box[MAXD];
        memcpy(box, w->lshape, sizeof box);
        mpu__chunk((size_t)full, n, j, &elo, &ehi);
        box[d] = (int64_t)(ehi - elo), off[d] = (int64_t)elo;
        MPU_CHECK_GOTO(copy_box(w, blocks + j * nb * w->es, B, zero, w->data, w->lshape, off, box), r, out);
      }
      MPU_CHECK_GOTO(mpu_comm_reduce_scatter(comm, blocks, blocks + c * nb * w->es, nb, w->dtype,
                                             from.op), r, out);
      MPU_CHECK_GOTO(copy_box(w, next, L, zero, blocks + c * nb * w->es, B, zero, L), r, out);
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
      MPU_CHECK_GOTO(piece_alloc(w, &blocks, 2 * n * nb, 0), r, out);
      recv = blocks + n * nb * w->es;
      MPU_CHECK_GOTO(piece_alloc(w, &next, numel(L, nd), 0), r, out);
      for (size_t j = 0; j < n; j++) { /* to rank j: my rows of d, its columns of e */
        int64_t box[MAXD], soff[MAXD] = {0};
        memcpy(box, w->lshape, sizeof box);
        mpu__chunk((size_t)fulle, n, j, &lo, &hi);
        box[e] = (int64_t)(hi - lo), soff[e] = (int64_t)lo;
        MPU_CHECK_GOTO(copy_box(w, blocks + j * nb * w->es, B, zero, w->data, w->lshape, soff, box), r, out);
      }
      MPU_CHECK_GOTO(mpu_comm_all_to_all(comm, blocks, recv, nb, w->dtype), r, out);
      for (size_t j = 0; j < n; j++) { /* from rank j: its rows of d, my columns of e */
        int64_t box[MAXD], doff[MAXD] = {0};
        memcpy(box, L, sizeof box);
        mpu__chunk((size_t)fulld, n, j, &lo, &hi);
        box[d] = (int64_t)(hi - lo), doff[d] = (int64_t)lo;
        MPU_CHECK_GOTO(copy_box(w, next, L, doff, recv + j * nb * w->es, B, zero, box), r, out);
      }
    }
  } else if (from.kind == MPU_PLACE_SHARD && to.kind == MPU_PLACE_PARTIAL) { /* local */
    int d = from.dim;
    span(w, w->cur, d, i, &o, &full);
    mpu__chunk((size_t)full, n, c, &lo, &hi);
    say(w, i, from, to, "local", 0);
    L[d] = full, off[d] = (int64_t)lo;
    if (!dry) {
      MPU_CHECK_GOTO(piece_alloc(w, &next, numel(L, nd), 1), r, out);
      MPU_CHECK_GOTO(copy_box(w, next, L, off, w->data, w->lshape, zero, w->lshape), r, out);
      /* torch's index_add turns a -0.0 into +0.0; on device buffers the
       * piece is copied in, its -0.0 kept (no device addition to run) */
      if (!w->mem) add_to_zeros(w->dtype, next, numel(L, nd));
      if (to.op == MPU_AVG) MPU_CHECK_GOTO(scale(w, comm, next, numel(L, nd), (int64_t)n, 1), r, out);
    }
  } else { /* Replicate -> Partial, Partial(sum) <-> Partial(avg): local */
    say(w, i, from, to, "local", 0);
    if (!dry) {
      size_t m = numel(L, nd);
      /* torch's Partial._partition_value: sum divides by the dim's size on
       * every rank, avg, max and min keep the value. An integer tensor would
       * become a float one there; here the first rank keeps the value. */
      if (from.kind == MPU_PLACE_REPLICATE && to.op == MPU_SUM) {
        if (scales_locally(w->dtype)) MPU_CHECK_GOTO(scale(w, comm, w->data, m, 1, (int64_t)n), r, out);
        else if (c && !w->mem) memset(w->data, 0, m * w->es);
        else if (c) MPU_CHECK_GOTO(piece_alloc(w, &next, m, 1), r, out); /* zeros */
      }
      if (from.kind == MPU_PLACE_PARTIAL)
        MPU_CHECK_GOTO(scale(w, comm, w->data, m, from.op == MPU_SUM ? (int64_t)n : 1,
                             from.op == MPU_SUM ? 1 : (int64_t)n),
                       r, out);
    }
  }
  if (next) {
    piece_free(w, w->data);
    w->data = next, next = NULL;
  }
  memcpy(w->lshape, L, sizeof L);
  w->cur[i] = to;
out:
  piece_free(w, next);
  piece_free(w, blocks);
  return r;
}

/* ---- the walk ------------------------------------------------------------------------------------ */

/* torch's generate_greedy_transform_infos: when the source shards on a
 * mesh dim of more than one rank, visit the mesh dims innermost first: each
 * goes to its target, except a target Shard(d) whose outer mesh dims shard
 * d differently now than they will, which goes to Replicate (its shard
 * nests under theirs, so it is cut again once they are done). Then
 * outermost first, each dim still off its target goes there. Every step is
 * valid when taken: no inner mesh dim shards a tensor dim that it touches. */
static mpu_result_t run_walk(walk *w) {
  int64_t nshards = 1;
  for (int i = 0; i < w->mdim; i++)
    if (w->cur[i].kind == MPU_PLACE_SHARD) nshards *= w->msize[i];
  if (nshards > 1)
    for (int k = w->mdim - 1; k >= 0; k--) {
      mpu_placement to = w->dst[k];
      if (to.kind == MPU_PLACE_SHARD)
        for (int i = 0; i < k; i++)
          if (shards(w->cur[i], to.dim) != shards(w->dst[i], to.dim)) to = MPU_REPLICATE;
      if (!same(w->cur[k], to)) MPU_CHECK(change(w, k, to));
    }
  for (int k = 0; k < w->mdim; k++)
    if (!same(w->cur[k], w->dst[k])) MPU_CHECK(change(w, k, w->dst[k]));
  return MPU_SUCCESS;
}

static mpu_result_t start(const char *fn, walk *w, const mpu_device_mesh *dm,
                          const mpu_dtensor_spec *src, const mpu_dtensor_spec *dst) {
  if (!dm) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL device mesh", fn);
  const mpu_mesh *mesh = mpu_device_mesh_mesh(dm);
  MPU_CHECK(walk_init(fn, w, mesh, mpu_device_mesh_rank(dm), src));
  MPU_CHECK(check_spec(fn, "destination", dst, w->mdim, w->dst));
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
  /* device buffers where the mesh's communicator takes them (NCCL) */
  mpu_comm *base = mpu__device_mesh_base(dm);
  mpu_comm_caps caps = {.size = sizeof caps};
  MPU_CHECK(mpu_comm_capabilities(base, &caps));
  if (caps.memory == MPU_MEMORY_DEVICE) w.mem = base;
  size_t n = numel(w.lshape, w.ndim), bytes = n * w.es;
  MPU_CHECK(piece_alloc(&w, &w.data, n, 0));
  mpu_result_t r = MPU_SUCCESS;
  if (!w.mem) memcpy(w.data, in, bytes);
  else if (bytes) r = mpu_comm_copy2d(w.mem, w.data, bytes, in, bytes, bytes, 1);
  w.dm = dm;
  if (!r) r = run_walk(&w);
  bytes = numel(w.lshape, w.ndim) * w.es;
  if (!r && !w.mem) memcpy(out, w.data, bytes);
  else if (!r && bytes) r = mpu_comm_copy2d(w.mem, out, bytes, w.data, bytes, bytes, 1);
  piece_free(&w, w.data);
  return r;
}

mpu_result_t mpu_redistribute_plan(const mpu_device_mesh *dm, const mpu_dtensor_spec *src,
                                   const mpu_dtensor_spec *dst, char *buf, size_t len,
                                   int *ncollectives) {
  walk w;
  MPU_CHECK(start("mpu_redistribute_plan", &w, dm, src, dst));
  w.plan = buf, w.plan_len = len;
  if (buf && len) buf[0] = '\0';
  MPU_CHECK(run_walk(&w));
  if (buf && len && !w.used) snprintf(buf, len, "nothing to move");
  if (ncollectives) *ncollectives = w.ncoll;
  return MPU_SUCCESS;
}
