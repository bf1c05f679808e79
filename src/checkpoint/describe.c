/*
 * describe.c - sharded tensor descriptions: a rank's local tensors as boxes
 * of global tensors and spans of memory (parameters, ZeRO-1 shards), and the
 * geometry that copies between a stored piece and a local tensor.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint/ckpt_internal.h"
#include "core/error.h"
#include "core/files.h"

/* ---- the set ---------------------------------------------------------------------------- */

void mpu_ckpt_set_init(mpu_ckpt_set *set) {
  if (!set) return;
  memset(set, 0, sizeof *set);
  set->strict = 1;
  set->layout.world = set->layout.tp = set->layout.pp = set->layout.dp = 1;
  set->layout.cp = set->layout.ep = 1;
  snprintf(set->layout.flavor, sizeof set->layout.flavor, "core");
}

mpu_result_t mpu__ckpt_layout_check(const char *fn, const mpu_ckpt_layout *l) {
  const int sizes[7] = {l->world, l->tp, l->pp, l->vp, l->dp, l->cp, l->ep};
  static const char *const names[7] = {"world", "tp", "pp", "vp", "dp", "cp", "ep"};
  for (int i = 0; i < 7; i++) {
    int least = i == 3 ? 0 : 1; /* vp 0: no virtual stages */
    if (sizes[i] < least || sizes[i] > CKPT_SIZE_MAX)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: layout %s %d out of range (%d..%d)", fn,
                        names[i], sizes[i], least, CKPT_SIZE_MAX);
  }
  return MPU_SUCCESS;
}

void mpu_ckpt_set_free(mpu_ckpt_set *set) {
  if (!set) return;
  for (int i = 0; i < set->n; i++) free(set->t[i].spans), free(set->t[i].save);
  free(set->t);
  free(set->fsdp);
  memset(set, 0, sizeof *set);
}

mpu_result_t mpu_ckpt_set_meta(mpu_ckpt_set *set, const char *key, const char *value) {
  static const char fn[] = "mpu_ckpt_set_meta";
  if (!set || !key || !value) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  MPU_CHECK(mpu__ckpt_meta_check(fn, key, strlen(key) + 1, value, strlen(value) + 1));
  int i = 0;
  while (i < set->n_meta && strcmp(set->meta[i][0], key)) i++;
  if (i == MPU_CKPT_META_MAX)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: more than %d keys", fn, MPU_CKPT_META_MAX);
  snprintf(set->meta[i][0], sizeof set->meta[i][0], "%s", key);
  snprintf(set->meta[i][1], sizeof set->meta[i][1], "%s", value);
  if (i == set->n_meta) set->n_meta++;
  return MPU_SUCCESS;
}

mpu_result_t mpu__ckpt_meta_check(const char *fn, const char *key, size_t key_cap,
                                  const char *value, size_t value_cap) {
  static const size_t most = sizeof ((mpu_ckpt_set *)0)->meta[0][0];
  size_t kn = strnlen(key, key_cap), vn = strnlen(value, value_cap);
  if (kn == key_cap || vn == value_cap || kn >= most || vn >= most || mpu__ckpt_name_ok(key))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: metadata key '%.*s' or its value too long (%zu bytes) or not printable",
                      fn, (int)(kn < most ? kn : most - 1), key, most - 1);
  for (size_t c = 0; c < vn; c++)
    if (value[c] < 0x20 || value[c] > 0x7e)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the value of metadata key '%s' is not printable",
                        fn, key);
  return MPU_SUCCESS;
}

int mpu__ckpt_name_ok(const char *name) {
  if (!name || !*name || strlen(name) >= MPU_CKPT_NAME_MAX) return -1;
  for (const char *c = name; *c; c++)
    if (*c <= 0x20 || *c > 0x7e || *c == '"' || *c == '\\') return -1;
  return 0;
}

static const char *const kind_names[] = {"param", "exp_avg", "exp_avg_sq"};

const char *mpu_ckpt_kind_name(mpu_ckpt_kind kind) {
  return (unsigned)kind < 3 ? kind_names[kind] : "?";
}

int mpu__ckpt_kind_from_name(const char *name, mpu_ckpt_kind *out) {
  for (int k = 0; k < 3; k++)
    if (name && !strcmp(name, kind_names[k])) return *out = (mpu_ckpt_kind)k, 0;
  return -1;
}

uint64_t mpu__ckpt_numel(int ndim, const int64_t *shape) {
  uint64_t n = 1;
  for (int d = 0; d < ndim; d++) /* four sizes of 2^40 would wrap to 0 */
    if (shape[d] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[d], &n)) return UINT64_MAX;
  return n;
}

/* ---- descriptions ----------------------------------------------------------------------- */

mpu_result_t mpu_ckpt_partition(int ndim, const int64_t *shape, mpu_param_attrs attrs,
                                int tp_size, int tp_rank, int64_t *local_shape,
                                mpu_ckpt_box *boxes, int *nboxes) {
  static const char fn[] = "mpu_ckpt_partition";
  if (!shape || !local_shape || !boxes || !nboxes)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (ndim < 1 || ndim > MPU_CKPT_MAX_DIMS)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d dims (1..%d)", fn, ndim, MPU_CKPT_MAX_DIMS);
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: tp rank %d of %d", fn, tp_rank, tp_size);
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 1 || shape[d] > ((int64_t)1 << 40))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: size %lld in dim %d", fn,
                        (long long)shape[d], d);
  memcpy(local_shape, shape, (size_t)ndim * sizeof *shape);
  int split = attrs.tensor_parallel && tp_size > 1;
  int dim = attrs.partition_dim, stride = split ? attrs.stride : 1;
  if (split && (dim < 0 || dim >= ndim || stride < 1 || stride > MPU_CKPT_MAX_BOXES ||
                shape[dim] % ((int64_t)tp_size * stride)))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: partition dim %d with stride %d: tp %d x stride must divide size %lld "
                      "(stride at most %d)",
                      fn, dim, attrs.stride, tp_size, dim >= 0 && dim < ndim ? (long long)shape[dim] : -1LL,
                      MPU_CKPT_MAX_BOXES);
  int64_t piece = split ? shape[dim] / ((int64_t)tp_size * stride) : 0;
  if (split) local_shape[dim] = shape[dim] / tp_size;
  for (int k = 0; k < stride; k++) {
    mpu_ckpt_box *b = &boxes[k];
    memset(b, 0, sizeof *b);
    for (int d = 0; d < ndim; d++) b->length[d] = local_shape[d];
    if (split) { /* piece k of this rank: global piece tp_rank + k x tp */
      b->length[dim] = piece;
      b->local_offset[dim] = k * piece;
      b->global_offset[dim] = ((int64_t)tp_rank + (int64_t)k * tp_size) * piece;
    }
  }
  *nboxes = stride;
  return MPU_SUCCESS;
}

mpu_result_t mpu_ckpt_add(mpu_ckpt_set *set, const char *name, mpu_ckpt_kind kind, int ndim,
                          const int64_t *shape, const int64_t *local_shape,
                          const mpu_ckpt_box *boxes, int nboxes, const mpu_ckpt_span *spans,
                          int nspans, const mpu_ckpt_span *save, int nsave) {
  static const char fn[] = "mpu_ckpt_add";
  if (!set || !name || !shape || !local_shape || !boxes || (nspans && !spans) || (nsave && !save))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (mpu__ckpt_name_ok(name))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: tensor name '%.*s' is empty, longer than %d bytes, or has a space, a "
                      "quote, a backslash or a byte outside printable ASCII",
                      fn, MPU_CKPT_NAME_MAX, name, MPU_CKPT_NAME_MAX - 1);
  if ((unsigned)kind > MPU_CKPT_EXP_AVG_SQ || ndim < 1 || ndim > MPU_CKPT_MAX_DIMS ||
      nboxes < 1 || nboxes > MPU_CKPT_MAX_BOXES || nspans < 0 || nsave < 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s': kind %d, %d dims, %d boxes", fn, name,
                      (int)kind, ndim, nboxes);
  for (int d = 0; d < ndim; d++)
    if (shape[d] < 1 || local_shape[d] < 1 || shape[d] > ((int64_t)1 << 40) ||
        local_shape[d] > shape[d])
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s': dim %d global %lld local %lld", fn,
                        name, d, (long long)shape[d], (long long)local_shape[d]);
  if (mpu__ckpt_numel(ndim, shape) > ((uint64_t)1 << 40))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s' has more than 2^40 elements", fn, name);
  uint64_t local = mpu__ckpt_numel(ndim, local_shape), inboxes = 0;
  for (int k = 0; k < nboxes; k++) {
    for (int d = 0; d < ndim; d++) {
      const mpu_ckpt_box *b = &boxes[k];
      /* sizes are at most 2^40: subtracting cannot overflow where adding could */
      if (b->length[d] < 1 || b->local_offset[d] < 0 || b->global_offset[d] < 0 ||
          b->length[d] > local_shape[d] || b->local_offset[d] > local_shape[d] - b->length[d] ||
          b->global_offset[d] > shape[d] - b->length[d])
        return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                          "%s: '%s': box %d leaves the local or the global tensor in dim %d", fn,
                          name, k, d);
    }
    inboxes += mpu__ckpt_numel(ndim, boxes[k].length);
  }
  if (inboxes != local)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: '%s': the boxes hold %llu elements, the local tensor %llu", fn, name,
                      (unsigned long long)inboxes, (unsigned long long)local);
  const mpu_ckpt_span *lists[2] = {spans, save};
  int counts[2] = {nspans, nsave};
  for (int l = 0; l < 2; l++)
    for (int k = 0; k < counts[l]; k++) {
      const mpu_ckpt_span *s = &lists[l][k];
      if (s->lo >= s->hi || s->hi > local || !s->data || (k && s->lo < lists[l][k - 1].hi))
        return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                          "%s: '%s': span %d [%zu, %zu) is empty, past the %llu local elements, "
                          "out of order or without memory",
                          fn, name, k, s->lo, s->hi, (unsigned long long)local);
    }
  for (int i = 0; i < set->n; i++)
    if (!strcmp(set->t[i].name, name))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s' is in the set already", fn, name);
  if (set->n == set->cap) {
    int cap = set->cap ? 2 * set->cap : 32;
    mpu_ckpt_tensor *t = realloc(set->t, (size_t)cap * sizeof *t);
    if (!t) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d tensors", fn, cap);
    set->t = t, set->cap = cap;
  }
  mpu_ckpt_tensor *t = &set->t[set->n];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->kind = kind, t->ndim = ndim, t->nboxes = nboxes;
  memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  memcpy(t->local_shape, local_shape, (size_t)ndim * sizeof *shape);
  memcpy(t->boxes, boxes, (size_t)nboxes * sizeof *boxes);
  t->spans = malloc(((size_t)nspans + 1) * sizeof *spans);
  t->save = malloc(((size_t)nsave + 1) * sizeof *save);
  if (!t->spans || !t->save) {
    free(t->spans), free(t->save);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: spans of '%s'", fn, name);
  }
  if (nspans) memcpy(t->spans, spans, (size_t)nspans * sizeof *spans);
  if (nsave) memcpy(t->save, save, (size_t)nsave * sizeof *save);
  t->nspans = nspans, t->nsave = nsave;
  set->n++;
  return MPU_SUCCESS;
}

#define MAX_SPANS 64 /* a parameter over at most 64 buckets */

/* One parameter of a buffer (its local shape from the global one and its tp
 * attributes) with the spans it loads and saves, and (ms, vs non-NULL) its
 * AdamW moments over `nos` spans, saved if save_moments. */
static mpu_result_t add_param(mpu_ckpt_set *set, const char *fn, const mpu_ckpt_global *g,
                              const mpu_param *p, int tp_size, int tp_rank,
                              const mpu_ckpt_span *load, int nload, const mpu_ckpt_span *save,
                              int nsave, const mpu_ckpt_span *ms, const mpu_ckpt_span *vs,
                              int nos, int save_moments) {
  int64_t local_shape[MPU_CKPT_MAX_DIMS];
  mpu_ckpt_box boxes[MPU_CKPT_MAX_BOXES];
  int nboxes;
  MPU_CHECK(mpu_ckpt_partition(g->ndim, g->shape, p->attrs, tp_size, tp_rank, local_shape, boxes,
                               &nboxes));
  if (mpu__ckpt_numel(g->ndim, local_shape) != p->numel)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: '%s': the global shape gives %llu local elements, the buffer has %zu",
                      fn, g->name, (unsigned long long)mpu__ckpt_numel(g->ndim, local_shape),
                      p->numel);
  MPU_CHECK(mpu_ckpt_add(set, g->name, MPU_CKPT_PARAM, g->ndim, g->shape, local_shape, boxes,
                         nboxes, load, nload, save, nsave));
  if (!ms) return MPU_SUCCESS;
  char name[MPU_CKPT_NAME_MAX + 16];
  const mpu_ckpt_span *st[2] = {ms, vs};
  static const char *const suffix[2] = {"exp_avg", "exp_avg_sq"};
  for (int s = 0; s < 2; s++) {
    snprintf(name, sizeof name, "%s.%s", g->name, suffix[s]);
    if (strlen(name) >= MPU_CKPT_NAME_MAX)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s' is too long a name", fn, name);
    MPU_CHECK(mpu_ckpt_add(set, name, (mpu_ckpt_kind)(MPU_CKPT_EXP_AVG + s), g->ndim, g->shape,
                           local_shape, boxes, nboxes, st[s], nos, st[s], save_moments ? nos : 0));
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_ckpt_add_buffer(mpu_ckpt_set *set, const mpu_param_buffer *b,
                                 const mpu_ckpt_global *globals, const mpu_optimizer *opt,
                                 int tp_size, int dp_rank) {
  static const char fn[] = "mpu_ckpt_add_buffer";
  if (!set || !b || !globals) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (!b->finalized) return mpu__error(MPU_ERR_INVALID_USAGE, "%s: buffer not finalized", fn);
  if (opt && opt->b != b)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the optimizer is another buffer's", fn);
  if (opt) dp_rank = opt->dp_rank;
  int zero1 = opt && opt->distributed;
  for (int i = 0; i < b->nparams; i++) {
    const mpu_param *p = &b->params[i];
    int writer = p->attrs.tensor_parallel || b->tp_rank == 0; /* one replica across tp */
    mpu_optimizer_span os[MAX_SPANS];
    int nos = 0;
    if (opt) MPU_CHECK(mpu_optimizer_param_spans(opt, i, os, MAX_SPANS, &nos));
    float *data = b->data + p->offset;
    mpu_ckpt_span whole = {0, p->numel, data}, shard[MAX_SPANS], ms[MAX_SPANS], vs[MAX_SPANS];
    for (int k = 0; k < nos; k++) {
      shard[k] = (mpu_ckpt_span){os[k].lo, os[k].hi, data + os[k].lo};
      ms[k] = (mpu_ckpt_span){os[k].lo, os[k].hi, opt->m + os[k].state};
      vs[k] = (mpu_ckpt_span){os[k].lo, os[k].hi, opt->v + os[k].state};
    }
    /* parameters: loaded whole; saved from the ZeRO-1 shard (the main weights) or by dp rank 0 */
    const mpu_ckpt_span *save = zero1 ? shard : &whole;
    int nsave = !writer ? 0 : zero1 ? nos : dp_rank == 0;
    MPU_CHECK(add_param(set, fn, &globals[i], p, tp_size, b->tp_rank, &whole, 1, save, nsave,
                        opt ? ms : NULL, vs, nos, writer && (zero1 || dp_rank == 0)));
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_ckpt_add_fsdp(mpu_ckpt_set *set, mpu_fsdp *f, const mpu_ckpt_global *globals,
                               int tp_size) {
  static const char fn[] = "mpu_ckpt_add_fsdp";
  const mpu_param_buffer *b = mpu_fsdp_buffer(f);
  if (!set || !b || !globals) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (set->nfsdp < 0 || set->nfsdp >= INT_MAX / 2)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the set has %d sharded buffers", fn,
                      set->nfsdp);
  mpu_fsdp **grown = realloc(set->fsdp, (size_t)(set->nfsdp + 1) * sizeof *grown);
  if (!grown) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  set->fsdp = grown;
  set->fsdp[set->nfsdp++] = f; /* resharded by a load that writes its pieces */
  int replica0 = mpu_fsdp_replica(f) == 0;
  for (int i = 0; i < b->nparams; i++) {
    const mpu_param *p = &b->params[i];
    int writer = (p->attrs.tensor_parallel || b->tp_rank == 0) && replica0;
    mpu_fsdp_span sp;
    MPU_CHECK(mpu_fsdp_param_span(f, i, &sp));
    int n = sp.hi > sp.lo;
    mpu_ckpt_span ps = {sp.lo, sp.hi, sp.param}, ms = {sp.lo, sp.hi, sp.exp_avg},
                  vs = {sp.lo, sp.hi, sp.exp_avg_sq};
    MPU_CHECK(add_param(set, fn, &globals[i], p, tp_size, b->tp_rank, &ps, n, &ps,
                        writer ? n : 0, &ms, &vs, n, writer));
  }
  return MPU_SUCCESS;
}

mpu_result_t mpu_ckpt_chunk_layers(int layers, int pp, int vp, int pp_rank, int chunk, int *first,
                                   int *count) {
  /* pp x vp in 64 bits: in int it wraps (to 0 for 65536 x 65536, a division by zero) */
  int64_t stages = (int64_t)pp * vp;
  if (!first || !count || layers < 1 || pp < 1 || vp < 1 || pp_rank < 0 || pp_rank >= pp ||
      chunk < 0 || chunk >= vp || stages > layers || layers % stages)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "mpu_ckpt_chunk_layers: %d layers over pp %d x vp %d (rank %d, chunk %d): "
                      "pp x vp must divide the layers",
                      layers, pp, vp, pp_rank, chunk);
  /* below layers: (chunk x pp + pp_rank) < pp x vp, times layers / (pp x vp) */
  *count = (int)(layers / stages);
  *first = (int)(((int64_t)chunk * pp + pp_rank) * *count);
  return MPU_SUCCESS;
}

/* ---- geometry -------------------------------------------------------------------------- */

uint64_t mpu__ckpt_box_count_below(int ndim, const int64_t *local_shape, const mpu_ckpt_box *box,
                                   uint64_t x) {
  int64_t c[MPU_CKPT_MAX_DIMS];
  uint64_t total = mpu__ckpt_numel(ndim, local_shape);
  if (x >= total) return mpu__ckpt_numel(ndim, box->length);
  for (int d = ndim - 1; d >= 0; d--) c[d] = (int64_t)(x % (uint64_t)local_shape[d]), x /= (uint64_t)local_shape[d];
  /* box elements lexicographically below c (row-major order is lexicographic) */
  uint64_t count = 0, rest = mpu__ckpt_numel(ndim, box->length);
  for (int d = 0; d < ndim; d++) {
    rest /= (uint64_t)box->length[d];
    int64_t rel = c[d] - box->local_offset[d];
    if (rel < 0) return count;
    if (rel >= box->length[d]) return count + (uint64_t)box->length[d] * rest;
    count += (uint64_t)rel * rest;
  }
  return count;
}

static uint64_t ravel(int ndim, const int64_t *c, const int64_t *shape) {
  uint64_t x = 0;
  for (int d = 0; d < ndim; d++) x = x * (uint64_t)shape[d] + (uint64_t)c[d];
  return x;
}

uint64_t mpu__ckpt_transfer(const ckpt_piece_view *piece, int ndim, const int64_t *local_shape,
                            const mpu_ckpt_box *boxes, int nboxes, const mpu_ckpt_span *spans,
                            int nspans, int to_local, uint8_t *const *hits) {
  uint64_t moved = 0;
  int last = ndim - 1;
  for (int k = 0; k < nboxes; k++) {
    const mpu_ckpt_box *tb = &boxes[k];
    int64_t lo[MPU_CKPT_MAX_DIMS], hi[MPU_CKPT_MAX_DIMS], g[MPU_CKPT_MAX_DIMS];
    int empty = 0;
    for (int d = 0; d < ndim; d++) {
      int64_t a = piece->offset[d], b = tb->global_offset[d];
      lo[d] = a > b ? a : b;
      a += piece->length[d], b += tb->length[d];
      hi[d] = a < b ? a : b;
      empty |= lo[d] >= hi[d];
    }
    if (empty) continue;
    memcpy(g, lo, sizeof g);
    int64_t run = hi[last] - lo[last];
    for (;;) { /* every run along the last dim of the intersection */
      int64_t pc[MPU_CKPT_MAX_DIMS], lc[MPU_CKPT_MAX_DIMS];
      for (int d = 0; d < ndim; d++) {
        pc[d] = g[d] - piece->offset[d];
        lc[d] = g[d] - tb->global_offset[d] + tb->local_offset[d];
      }
      uint64_t s0 = ravel(ndim, pc, piece->length), l0 = ravel(ndim, lc, local_shape);
      /* k in [k0, k1): in the piece's stored span ... */
      uint64_t k0 = piece->flat_lo > s0 ? piece->flat_lo - s0 : 0;
      uint64_t k1 = piece->flat_hi > s0 ? piece->flat_hi - s0 : 0;
      if (k1 > (uint64_t)run) k1 = (uint64_t)run;
      for (int s = 0; s < nspans && k0 < k1; s++) { /* ... and in one of the rank's spans */
        const mpu_ckpt_span *sp = &spans[s];
        uint64_t a = sp->lo > l0 ? sp->lo - l0 : 0, z = sp->hi > l0 ? sp->hi - l0 : 0;
        if (a < k0) a = k0;
        if (z > k1) z = k1;
        if (a >= z) continue;
        float *mem = sp->data + (l0 + a - sp->lo);
        float *st = piece->data ? piece->data + (s0 + a - piece->flat_lo) : NULL;
        if (st) {
          if (to_local) memcpy(mem, st, (z - a) * sizeof(float));
          else memcpy(st, mem, (z - a) * sizeof(float));
        }
        if (hits && hits[s])
          for (uint64_t e = l0 + a - sp->lo; e < l0 + z - sp->lo; e++)
            if (hits[s][e] < 255) hits[s][e]++;
        moved += z - a;
      }
      int d = last - 1; /* the odometer over the other dims */
      while (d >= 0 && ++g[d] == hi[d]) g[d] = lo[d], d--;
      if (d < 0) break;
    }
  }
  return moved;
}

/* ---- CRC-32 (IEEE 802.3, as zlib's crc32) and files ------------------------------------ */

uint32_t mpu__ckpt_crc32(uint32_t crc, const void *data, size_t n) {
  static uint32_t table[256];
  static int ready; /* idempotent: racing threads write the same values */
  if (!__atomic_load_n(&ready, __ATOMIC_ACQUIRE)) {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      __atomic_store_n(&table[i], c, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
  }
  const unsigned char *p = data;
  crc = ~crc;
  for (size_t i = 0; i < n; i++)
    crc = __atomic_load_n(&table[(crc ^ p[i]) & 0xFF], __ATOMIC_RELAXED) ^ (crc >> 8);
  return ~crc;
}

ssize_t mpu__ckpt_pread_all(int fd, void *buf, size_t n, uint64_t offset) {
  char *p = buf;
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, p + got, n - got, (off_t)(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

int mpu__ckpt_path(char *out, size_t cap, const char *dir, const char *name) {
  int n = snprintf(out, cap, "%s/%s", dir, name);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

mpu_result_t mpu__ckpt_write_file(const char *dir, const char *name, const void *const *parts,
                                  const size_t *lens, int nparts) {
  char path[4096];
  if (mpu__ckpt_path(path, sizeof path, dir, name))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "checkpoint: the path %s/%s is too long", dir, name);
  return mpu__output_write("checkpoint", path, parts, lens, nparts, NULL, 0);
}
