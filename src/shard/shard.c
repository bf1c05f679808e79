/*
 * shard.c - who holds which part of a tensor: torch.chunk's cut, Megatron's
 * strided partition, the spans a holder keeps, and the one box copy that
 * moves them (mpu/shard.h). Pure arithmetic: no communication, no other
 * layer's state.
 *
 * The box copy walks the runs along the last dim of a box with an odometer
 * over the other dims; a transfer between a stored piece and a local tensor
 * is that walk over their intersection, each run clipped to the piece's
 * stored span and to the local spans held in memory.
 */
#include <stdlib.h>
#include <string.h>

#include "shard/shard_internal.h"

#include "core/chunk.h"
#include "core/error.h"
#include "mpu/shard.h"

#define MAXD MPU_SHARD_MAX_DIMS
#define SIZE_LIMIT ((int64_t)1 << 40)

size_t mpu_shard_chunk(size_t start, size_t end, size_t n, size_t i, size_t *lo, size_t *hi) {
  size_t a, z, piece = mpu__chunk(end > start ? end - start : 0, n, i, &a, &z);
  if (lo) *lo = start + a;
  if (hi) *hi = start + z;
  return piece;
}

size_t mpu_shard_numel(int ndim, const int64_t *shape) {
  size_t n = 1;
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 0 || __builtin_mul_overflow(n, (size_t)shape[d], &n)) return SIZE_MAX;
  return n;
}

mpu_result_t mpu_shard_megatron(int ndim, const int64_t *shape, int dim, int stride, int tp_size,
                                int tp_rank, mpu_shard *out) {
  static const char fn[] = "mpu_shard_megatron";
  if (!shape || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (ndim < 1 || ndim > MAXD)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d dims (1..%d)", fn, ndim, MAXD);
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: tp rank %d of %d", fn, tp_rank, tp_size);
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 1 || shape[d] > SIZE_LIMIT)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: size %lld in dim %d", fn,
                        (long long)shape[d], d);
  int split = dim >= 0 && tp_size > 1;
  if (!split) stride = 1;
  if (split && (dim >= ndim || stride < 1 || stride > MPU_SHARD_MAX_BOXES ||
                shape[dim] % ((int64_t)tp_size * stride)))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: partition dim %d with stride %d: tp %d x stride must divide size %lld "
                      "(stride at most %d)",
                      fn, dim, stride, tp_size, dim < ndim ? (long long)shape[dim] : -1LL,
                      MPU_SHARD_MAX_BOXES);
  if (mpu_shard_numel(ndim, shape) > ((size_t)1 << 40))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: more than 2^40 elements", fn);
  mpu_shard s;
  memset(&s, 0, sizeof s);
  s.ndim = ndim;
  memcpy(s.shape, shape, (size_t)ndim * sizeof *shape);
  memcpy(s.local_shape, shape, (size_t)ndim * sizeof *shape);
  int64_t piece = split ? shape[dim] / ((int64_t)tp_size * stride) : 0;
  if (split) s.local_shape[dim] = shape[dim] / tp_size;
  for (int k = 0; k < stride; k++) {
    mpu_shard_box *b = &s.boxes[k];
    for (int d = 0; d < ndim; d++) b->length[d] = s.local_shape[d];
    if (split) { /* piece k of this rank: global piece tp_rank + k x tp */
      b->length[dim] = piece;
      b->local_offset[dim] = k * piece;
      b->global_offset[dim] = ((int64_t)tp_rank + (int64_t)k * tp_size) * piece;
    }
  }
  s.nboxes = stride;
  s.nspans = 1;
  s.spans[0] = (mpu_shard_span){0, mpu_shard_numel(ndim, s.local_shape), 0};
  *out = s;
  return MPU_SUCCESS;
}

mpu_result_t mpu_shard_box_at(int ndim, const int64_t *shape, const int64_t *local_shape,
                              const int64_t *offset, mpu_shard *out) {
  static const char fn[] = "mpu_shard_box_at";
  if (!shape || !local_shape || !offset || !out)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (ndim < 1 || ndim > MAXD)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d dims (1..%d)", fn, ndim, MAXD);
  for (int d = 0; d < ndim; d++) /* sizes at most 2^40: the subtraction cannot overflow */
    if (shape[d] < 1 || shape[d] > SIZE_LIMIT || local_shape[d] < 0 || offset[d] < 0 ||
        local_shape[d] > shape[d] || offset[d] > shape[d] - local_shape[d])
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: dim %d: a box of %lld at %lld in a size of %lld (an outlying box)",
                        fn, d, (long long)local_shape[d], (long long)offset[d],
                        (long long)shape[d]);
  if (mpu_shard_numel(ndim, shape) > ((size_t)1 << 40))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: more than 2^40 elements", fn);
  mpu_shard s;
  memset(&s, 0, sizeof s);
  s.ndim = ndim, s.nboxes = 1, s.nspans = 1;
  memcpy(s.shape, shape, (size_t)ndim * sizeof *shape);
  memcpy(s.local_shape, local_shape, (size_t)ndim * sizeof *shape);
  memcpy(s.boxes[0].global_offset, offset, (size_t)ndim * sizeof *shape);
  memcpy(s.boxes[0].length, local_shape, (size_t)ndim * sizeof *shape);
  s.spans[0] = (mpu_shard_span){0, mpu_shard_numel(ndim, local_shape), 0};
  if (!s.spans[0].hi) s.nspans = 0; /* an empty piece keeps nothing */
  *out = s;
  return MPU_SUCCESS;
}

mpu_result_t mpu_shard_keep(mpu_shard *s, size_t lo, size_t hi, size_t at) {
  static const char fn[] = "mpu_shard_keep";
  if (!s) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL shard", fn);
  if (lo >= hi) return MPU_SUCCESS;
  size_t local = mpu_shard_numel(s->ndim, s->local_shape);
  if (s->nspans < 0 || s->nspans >= MPU_SHARD_MAX_SPANS || hi > local ||
      (s->nspans && lo < s->spans[s->nspans - 1].hi))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: span [%zu, %zu) after %d spans of a local tensor of %zu elements (in "
                      "order, at most %d)",
                      fn, lo, hi, s->nspans, local, MPU_SHARD_MAX_SPANS);
  s->spans[s->nspans++] = (mpu_shard_span){lo, hi, at};
  return MPU_SUCCESS;
}

int mpu_shard_mem_of(const mpu_shard *s, float *data, mpu_shard_mem *out) {
  for (int k = 0; k < s->nspans; k++)
    out[k] = (mpu_shard_mem){s->spans[k].lo, s->spans[k].hi, data + s->spans[k].at};
  return s->nspans;
}

/* ---- the box walk ------------------------------------------------------------------------------ */

static uint64_t ravel(int ndim, const int64_t *c, const int64_t *shape) {
  uint64_t x = 0;
  for (int d = 0; d < ndim; d++) x = x * (uint64_t)shape[d] + (uint64_t)c[d];
  return x;
}

/* Visit every run along the last dim of the box [lo, hi) (coordinates g of
 * its first element, length hi[last] - lo[last]); nothing if it is empty. */
typedef void (*run_fn)(const int64_t *g, int64_t run, void *arg);

static void each_run(int ndim, const int64_t *lo, const int64_t *hi, run_fn f, void *arg) {
  int64_t g[MAXD];
  for (int d = 0; d < ndim; d++)
    if (lo[d] >= hi[d]) return;
  memcpy(g, lo, (size_t)ndim * sizeof *g);
  int last = ndim - 1;
  for (;;) {
    f(g, hi[last] - lo[last], arg);
    int d = last - 1; /* the odometer over the other dims */
    while (d >= 0 && ++g[d] == hi[d]) g[d] = lo[d], d--;
    if (d < 0) return;
  }
}

static mpu_result_t host_copy2d(void *ctx, void *dst, size_t dpitch, const void *src,
                                size_t spitch, size_t width, size_t height) {
  (void)ctx;
  for (size_t i = 0; i < height; i++)
    memcpy((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
  return MPU_SUCCESS;
}

mpu_result_t mpu__shard_copy_box_with(size_t es, void *dst, const int64_t *dshape,
                                      const int64_t *doff, const void *src, const int64_t *sshape,
                                      const int64_t *soff, const int64_t *box, int ndim,
                                      mpu__copy2d_fn copy2d, void *ctx) {
  if (ndim < 1 || ndim > MAXD || !dst || !src) return MPU_SUCCESS;
  for (int d = 0; d < ndim; d++)
    if (box[d] <= 0) return MPU_SUCCESS;
  int last = ndim - 1, outer = ndim - 2; /* planes over dims [0, outer) */
  size_t width = (size_t)box[last] * es, height = ndim > 1 ? (size_t)box[outer] : 1;
  size_t dpitch = (size_t)dshape[last] * es, spitch = (size_t)sshape[last] * es;
  int64_t g[MAXD] = {0}, dc[MAXD], sc[MAXD];
  for (;;) {
    for (int d = 0; d < ndim; d++) dc[d] = doff[d] + g[d], sc[d] = soff[d] + g[d];
    MPU_CHECK(copy2d(ctx, (unsigned char *)dst + ravel(ndim, dc, dshape) * es, dpitch,
                     (const unsigned char *)src + ravel(ndim, sc, sshape) * es, spitch, width,
                     height));
    int d = outer - 1; /* the odometer over the outer dims */
    while (d >= 0 && ++g[d] == box[d]) g[d] = 0, d--;
    if (d < 0) return MPU_SUCCESS;
  }
}

void mpu_shard_copy_box(size_t es, void *dst, const int64_t *dshape, const int64_t *doff,
                        const void *src, const int64_t *sshape, const int64_t *soff,
                        const int64_t *box, int ndim) {
  mpu__shard_copy_box_with(es, dst, dshape, doff, src, sshape, soff, box, ndim, host_copy2d, NULL);
}

typedef struct transfer_args {
  const mpu_shard_piece *piece;
  int ndim;
  const int64_t *local_shape;
  const mpu_shard_box *tb;
  const mpu_shard_mem *mem;
  int nmem, to_local;
  uint8_t *const *hits;
  uint64_t moved;
} transfer_args;

static void transfer_run(const int64_t *g, int64_t run, void *arg) {
  transfer_args *a = arg;
  const mpu_shard_piece *piece = a->piece;
  int64_t pc[MAXD], lc[MAXD];
  for (int d = 0; d < a->ndim; d++) {
    pc[d] = g[d] - piece->offset[d];
    lc[d] = g[d] - a->tb->global_offset[d] + a->tb->local_offset[d];
  }
  uint64_t s0 = ravel(a->ndim, pc, piece->length), l0 = ravel(a->ndim, lc, a->local_shape);
  /* k in [k0, k1): in the piece's stored span ... */
  uint64_t k0 = piece->flat_lo > s0 ? piece->flat_lo - s0 : 0;
  uint64_t k1 = piece->flat_hi > s0 ? piece->flat_hi - s0 : 0;
  if (k1 > (uint64_t)run) k1 = (uint64_t)run;
  for (int s = 0; s < a->nmem && k0 < k1; s++) { /* ... and in one of the spans in memory */
    const mpu_shard_mem *sp = &a->mem[s];
    uint64_t lo = sp->lo > l0 ? sp->lo - l0 : 0, hi = sp->hi > l0 ? sp->hi - l0 : 0;
    if (lo < k0) lo = k0;
    if (hi > k1) hi = k1;
    if (lo >= hi) continue;
    float *m = sp->data + (l0 + lo - sp->lo);
    float *st = piece->data ? piece->data + (s0 + lo - piece->flat_lo) : NULL;
    if (st) {
      if (a->to_local) memcpy(m, st, (hi - lo) * sizeof(float));
      else memcpy(st, m, (hi - lo) * sizeof(float));
    }
    if (a->hits && a->hits[s])
      for (uint64_t e = l0 + lo - sp->lo; e < l0 + hi - sp->lo; e++)
        if (a->hits[s][e] < 255) a->hits[s][e]++;
    a->moved += hi - lo;
  }
}

uint64_t mpu_shard_transfer(const mpu_shard_piece *piece, int ndim, const int64_t *local_shape,
                            const mpu_shard_box *boxes, int nboxes, const mpu_shard_mem *mem,
                            int nmem, int to_local, uint8_t *const *hits) {
  if (!piece || ndim < 1 || ndim > MAXD) return 0;
  transfer_args a = {piece, ndim, local_shape, NULL, mem, nmem, to_local, hits, 0};
  for (int k = 0; k < nboxes; k++) {
    const mpu_shard_box *tb = &boxes[k];
    int64_t lo[MAXD], hi[MAXD];
    for (int d = 0; d < ndim; d++) { /* the intersection of the piece and box k */
      int64_t p = piece->offset[d], b = tb->global_offset[d];
      lo[d] = p > b ? p : b;
      p += piece->length[d], b += tb->length[d];
      hi[d] = p < b ? p : b;
    }
    a.tb = tb;
    each_run(ndim, lo, hi, transfer_run, &a);
  }
  return a.moved;
}

uint64_t mpu_shard_box_count_below(int ndim, const int64_t *local_shape, const mpu_shard_box *box,
                                   uint64_t x) {
  int64_t c[MAXD];
  uint64_t total = mpu_shard_numel(ndim, local_shape);
  if (x >= total) return mpu_shard_numel(ndim, box->length);
  for (int d = ndim - 1; d >= 0; d--)
    c[d] = (int64_t)(x % (uint64_t)local_shape[d]), x /= (uint64_t)local_shape[d];
  /* box elements lexicographically below c (row-major order is lexicographic) */
  uint64_t count = 0, rest = mpu_shard_numel(ndim, box->length);
  for (int d = 0; d < ndim; d++) {
    rest /= (uint64_t)box->length[d];
    int64_t rel = c[d] - box->local_offset[d];
    if (rel < 0) return count;
    if (rel >= box->length[d]) return count + (uint64_t)box->length[d] * rest;
    count += (uint64_t)rel * rest;
  }
  return count;
}

int mpu_shard_span_box(int ndim, const mpu_shard_box *box, uint64_t lo, uint64_t hi,
                       int64_t *offset, int64_t *length) {
  if (!box || ndim < 1 || ndim > MAXD || lo >= hi) return 0;
  uint64_t n = mpu_shard_numel(ndim, box->length);
  if (hi > n) return 0;
  /* [lo, hi) is a box when, for some dim d, it is the rows [a, b) of dim d
   * under one fixed index of the dims before d: inner = the elements of one
   * row of dim d, outer = of one whole slab of it */
  uint64_t inner = n;
  for (int d = 0; d < ndim; d++) {
    uint64_t outer = inner;
    inner /= (uint64_t)box->length[d];
    if (lo % inner || hi % inner || lo / outer != (hi - 1) / outer) continue;
    uint64_t x = lo / outer; /* the fixed index of dims [0, d) */
    for (int e = d - 1; e >= 0; e--) {
      offset[e] = box->global_offset[e] + (int64_t)(x % (uint64_t)box->length[e]);
      length[e] = 1;
      x /= (uint64_t)box->length[e];
    }
    offset[d] = box->global_offset[d] + (int64_t)((lo % outer) / inner);
    length[d] = (int64_t)((hi - lo) / inner);
    for (int e = d + 1; e < ndim; e++)
      offset[e] = box->global_offset[e], length[e] = box->length[e];
    return 1;
  }
  return 0;
}

/* ---- lists -------------------------------------------------------------------------------------- */

void mpu_shard_list_init(mpu_shard_list *l) {
  if (l) memset(l, 0, sizeof *l);
}

void mpu_shard_list_free(mpu_shard_list *l) {
  if (!l) return;
  free(l->t);
  free(l->written);
  memset(l, 0, sizeof *l);
}

mpu_result_t mpu_shard_list_add(mpu_shard_list *l, const mpu_shard_tensor *t) {
  static const char fn[] = "mpu_shard_list_add";
  if (!l || !t) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  size_t len = strnlen(t->name, sizeof t->name);
  if (!len || len == sizeof t->name)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: a name of 1..%d bytes", fn,
                      MPU_SHARD_NAME_MAX - 1);
  for (int i = 0; i < l->n; i++)
    if (!strcmp(l->t[i].name, t->name))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s' is in the list already", fn, t->name);
  if (l->n == l->cap) {
    if (l->cap > (1 << 24)) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: too many", fn);
    int cap = l->cap ? 2 * l->cap : 16;
    mpu_shard_tensor *grown = realloc(l->t, (size_t)cap * sizeof *grown);
    if (!grown) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d tensors", fn, cap);
    l->t = grown, l->cap = cap;
  }
  l->t[l->n++] = *t;
  return MPU_SUCCESS;
}

mpu_result_t mpu_shard_list_on_write(mpu_shard_list *l, mpu_shard_written_fn f, void *holder) {
  static const char fn[] = "mpu_shard_list_on_write";
  if (!l || !f) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (l->nwritten < 0 || l->nwritten >= (1 << 20))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d holders", fn, l->nwritten);
  struct mpu_shard_written *grown =
      realloc(l->written, (size_t)(l->nwritten + 1) * sizeof *grown);
  if (!grown) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  l->written = grown;
  l->written[l->nwritten++] = (struct mpu_shard_written){f, holder};
  return MPU_SUCCESS;
}
