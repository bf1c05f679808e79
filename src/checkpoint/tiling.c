/*
 * tiling.c - whether the stored pieces of a tensor hold each of its elements
 * exactly once. Counting elements is not enough: two pieces that overlap
 * and leave a gap of the same size count right, open, verify, and then
 * every load fails (or, loading only the overlap, succeeds with a hole).
 *
 * A piece stores the span [flat_lo, flat_hi) of its box's elements in
 * row-major order; such a span is a union of at most 2 ndim - 1 boxes
 * (a partial row, whole rows, a partial row, one level per dim). With every
 * box inside the tensor and the spans' sizes summing to its element count
 * (the caller checks both), the pieces tile the tensor exactly when these
 * boxes are pairwise disjoint, which a sweep checks: boxes sorted by their
 * start along one dim, each compared with those before it that still reach
 * it along that dim. The sweep runs along the dim in which the boxes are
 * thinnest (a tensor-parallel split along dim 1 sweeps dim 1), so a layout's
 * boxes meet few others.
 */
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt_internal.h"
#include "core/error.h"

typedef struct sub {
  int64_t lo[MPU_CKPT_MAX_DIMS], hi[MPU_CKPT_MAX_DIMS];
  int64_t key; /* lo along the dim of the sweep */
  int piece;
} sub;

typedef struct cutter {
  int ndim;
  const ckpt_piece_view *p;
  int piece;
  int64_t at[MPU_CKPT_MAX_DIMS]; /* box coordinates of the dims above the current one */
  sub *out;
  size_t n;
} cutter;

/* One box: dims < d at at[], dim d [a, b), dims > d whole (box coordinates). */
static void emit(cutter *c, int d, int64_t a, int64_t b) {
  sub *s = &c->out[c->n++];
  memset(s, 0, sizeof *s);
  s->piece = c->piece;
  for (int e = 0; e < c->ndim; e++) {
    int64_t lo = e < d ? c->at[e] : e == d ? a : 0;
    int64_t hi = e < d ? c->at[e] + 1 : e == d ? b : c->p->length[e];
    s->lo[e] = c->p->offset[e] + lo, s->hi[e] = c->p->offset[e] + hi;
  }
}

/* The elements [lo, hi) of the sub-box of dims >= d (row-major) as boxes. */
static void cut(cutter *c, int d, uint64_t lo, uint64_t hi) {
  if (lo >= hi) return;
  if (d == c->ndim - 1) {
    emit(c, d, (int64_t)lo, (int64_t)hi);
    return;
  }
  uint64_t inner = 1; /* at most the box's element count: checked by the caller */
  for (int e = d + 1; e < c->ndim; e++) inner *= (uint64_t)c->p->length[e];
  uint64_t a = lo / inner, b = hi / inner, ra = lo % inner, rb = hi % inner;
  if (a == b) {
    c->at[d] = (int64_t)a;
    cut(c, d + 1, ra, rb);
    return;
  }
  if (ra) {
    c->at[d] = (int64_t)a++;
    cut(c, d + 1, ra, inner);
  }
  if (a < b) emit(c, d, (int64_t)a, (int64_t)b);
  if (rb) {
    c->at[d] = (int64_t)b;
    cut(c, d + 1, 0, rb);
  }
}

static int cmp_sub(const void *x, const void *y) {
  int64_t a = ((const sub *)x)->key, b = ((const sub *)y)->key;
  return (a > b) - (a < b);
}

mpu_result_t mpu__ckpt_tiles(int ndim, const int64_t *shape, const ckpt_piece_view *pieces,
                             int npieces, int *first, int *second) {
  *first = *second = -1;
  size_t cap = (size_t)npieces * (2 * (size_t)ndim - 1);
  sub *s = malloc((cap + 1) * sizeof *s);
  size_t *open = malloc((cap + 1) * sizeof *open);
  if (!s || !open) {
    free(s), free(open);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "checkpoint: the pieces of a tensor (%d)", npieces);
  }
  cutter c = {.ndim = ndim, .out = s};
  for (int k = 0; k < npieces; k++) {
    c.p = &pieces[k], c.piece = k;
    cut(&c, 0, pieces[k].flat_lo, pieces[k].flat_hi);
  }
  /* the dim along which the boxes are thinnest, relative to the tensor */
  double best = 0;
  int dim = 0;
  for (int d = 0; d < ndim; d++) {
    double sum = 0;
    for (size_t i = 0; i < c.n; i++) sum += (double)(s[i].hi[d] - s[i].lo[d]) / (double)shape[d];
    if (d == 0 || sum < best) best = sum, dim = d;
  }
  for (size_t i = 0; i < c.n; i++) s[i].key = s[i].lo[dim];
  qsort(s, c.n, sizeof *s, cmp_sub);
  size_t nopen = 0;
  for (size_t i = 0; i < c.n && *first < 0; i++) {
    size_t keep = 0;
    for (size_t j = 0; j < nopen && *first < 0; j++) {
      const sub *o = &s[open[j]];
      if (o->hi[dim] <= s[i].lo[dim]) continue; /* ends before: closed for good */
      open[keep++] = open[j];
      int meet = 1;
      for (int d = 0; d < ndim && meet; d++) meet = o->lo[d] < s[i].hi[d] && s[i].lo[d] < o->hi[d];
      if (meet) *first = o->piece, *second = s[i].piece;
    }
    if (*first < 0) nopen = keep, open[nopen++] = i;
  }
  free(s), free(open);
  return MPU_SUCCESS;
}
