/*
 * describe.c - the set a rank saves and loads: its tensors (each a shard
 * of mpu/shard.h with the memory of what it keeps), its layout and
 * metadata. Whoever holds the tensors describes them (mpu_shard_list);
 * the set only checks and records them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt_internal.h"
#include "core/error.h"

/* ---- the set ---------------------------------------------------------------------------- */

void mpu_ckpt_set_init(mpu_ckpt_set *set) {
  if (!set) return;
  memset(set, 0, sizeof *set);
  set->strict = 1;
  set->layout.world = set->layout.tp = set->layout.pp = set->layout.dp = 1;
  set->layout.cp = set->layout.ep = 1;
  snprintf(set->layout.flavor, sizeof set->layout.flavor, "core");
}

void mpu_ckpt_set_free(mpu_ckpt_set *set) {
  if (!set) return;
  for (int i = 0; i < set->n; i++) free(set->t[i].spans), free(set->t[i].save);
  free(set->t);
  free(set->written);
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

/* ---- descriptions ----------------------------------------------------------------------- */

mpu_result_t mpu_ckpt_partition(int ndim, const int64_t *shape, mpu_param_attrs attrs,
                                int tp_size, int tp_rank, int64_t *local_shape,
                                mpu_shard_box *boxes, int *nboxes) {
  if (!local_shape || !boxes || !nboxes)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_ckpt_partition: NULL argument");
  mpu_shard s;
  MPU_CHECK(mpu_shard_megatron(ndim, shape, attrs.tensor_parallel ? attrs.partition_dim : -1,
                               attrs.stride, tp_size, tp_rank, &s));
  memcpy(local_shape, s.local_shape, (size_t)ndim * sizeof *local_shape);
  memcpy(boxes, s.boxes, (size_t)s.nboxes * sizeof *boxes);
  *nboxes = s.nboxes;
  return MPU_SUCCESS;
}

mpu_result_t mpu_ckpt_add(mpu_ckpt_set *set, const char *name, mpu_ckpt_kind kind, int ndim,
                          const int64_t *shape, const int64_t *local_shape,
                          const mpu_shard_box *boxes, int nboxes, const mpu_shard_mem *spans,
                          int nspans, const mpu_shard_mem *save, int nsave) {
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
  for (int d = 0; d < ndim; d++) /* a local size 0: the rank holds none of it (DTensor) */
    if (shape[d] < 1 || local_shape[d] < 0 || shape[d] > ((int64_t)1 << 40) ||
        local_shape[d] > shape[d])
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s': dim %d global %lld local %lld", fn,
                        name, d, (long long)shape[d], (long long)local_shape[d]);
  if (mpu__ckpt_numel(ndim, shape) > ((uint64_t)1 << 40))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s' has more than 2^40 elements", fn, name);
  uint64_t local = mpu__ckpt_numel(ndim, local_shape), inboxes = 0;
  for (int k = 0; k < nboxes; k++) {
    for (int d = 0; d < ndim; d++) {
      const mpu_shard_box *b = &boxes[k];
      /* sizes are at most 2^40: subtracting cannot overflow where adding could; a box is
       * empty only in an empty local tensor (its offset may be the dim's end, as torch's) */
      if (b->length[d] < (local ? 1 : 0) || b->local_offset[d] < 0 || b->global_offset[d] < 0 ||
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
  const mpu_shard_mem *lists[2] = {spans, save};
  int counts[2] = {nspans, nsave};
  for (int l = 0; l < 2; l++)
    for (int k = 0; k < counts[l]; k++) {
      const mpu_shard_mem *s = &lists[l][k];
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

mpu_result_t mpu_ckpt_add_shards(mpu_ckpt_set *set, const mpu_shard_list *l) {
  static const char fn[] = "mpu_ckpt_add_shards";
  if (!set || !l || (l->n && !l->t) || (l->nwritten && !l->written))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  mpu_shard_mem *mem = malloc(2 * MPU_SHARD_MAX_SPANS * sizeof *mem), *save = mem + MPU_SHARD_MAX_SPANS;
  if (!mem) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  mpu_result_t r = MPU_SUCCESS;
  for (int i = 0; !r && i < l->n; i++) {
    const mpu_shard_tensor *t = &l->t[i];
    const mpu_shard *s = &t->shard;
    if (s->nspans < 0 || s->nspans > MPU_SHARD_MAX_SPANS || t->nsave < 0 ||
        t->nsave > MPU_SHARD_MAX_SPANS || ((s->nspans || t->nsave) && !t->data)) {
      r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%.*s': %d spans over %s storage", fn,
                     MPU_SHARD_NAME_MAX, t->name, s->nspans, t->data ? "its" : "no");
      break;
    }
    if (strnlen(t->name, sizeof t->name) >= MPU_CKPT_NAME_MAX) {
      r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%.*s...' is too long a name", fn, 60,
                     t->name);
      break;
    }
    int n = mpu_shard_mem_of(s, t->data, mem);
    for (int k = 0; k < t->nsave; k++)
      save[k] = (mpu_shard_mem){t->save[k].lo, t->save[k].hi, t->data + t->save[k].at};
    r = mpu_ckpt_add(set, t->name, (mpu_ckpt_kind)t->kind, s->ndim, s->shape, s->local_shape,
                     s->boxes, s->nboxes, mem, n, save, t->nsave);
  }
  free(mem);
  if (r || !l->nwritten) return r;
  if (set->nwritten < 0 || set->nwritten > (1 << 20) - l->nwritten)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the set has %d holders", fn, set->nwritten);
  struct mpu_shard_written *grown =
      realloc(set->written, (size_t)(set->nwritten + l->nwritten) * sizeof *grown);
  if (!grown) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  memcpy(grown + set->nwritten, l->written, (size_t)l->nwritten * sizeof *grown);
  set->written = grown, set->nwritten += l->nwritten; /* told after a load that wrote */
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

