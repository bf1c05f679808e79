/*
 * describe.c - what the train layer holds, as shards (mpu/shard.h): a
 * buffer's parameters and the plain or ZeRO-1 optimizer's moments of them
 * (FSDP's pieces are described in fsdp.c, beside its layout rule). A
 * consumer (the checkpoint) takes the list and never looks inside the
 * optimizer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "mpu/checkpoint.h"
#include "mpu/fsdp.h"
#include "mpu/shard.h"
#include "train/adamw.h"

mpu_result_t mpu__param_shard(const char *fn, const mpu_param_buffer *b, int i,
                              const mpu_shard_global *g, int tp_size, mpu_shard *out) {
  const mpu_param *p = &b->params[i];
  if (!g->name) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: parameter %d has no name", fn, i);
  MPU_CHECK(mpu_shard_megatron(g->ndim, g->shape,
                               p->attrs.tensor_parallel ? p->attrs.partition_dim : -1,
                               p->attrs.stride, tp_size, b->tp_rank, out));
  size_t local = mpu_shard_numel(out->ndim, out->local_shape);
  if (local != p->numel)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: '%s': the global shape gives %zu local elements, the buffer has %zu",
                      fn, g->name, local, p->numel);
  out->nspans = 0;
  return MPU_SUCCESS;
}

mpu_result_t mpu__param_local_shard(const char *fn, const mpu_param_buffer *b, int i,
                                    mpu_shard *out) {
  if (i < 0 || i >= b->nparams)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: no parameter %d (the buffer has %d)", fn, i,
                      b->nparams);
  const mpu_param *p = &b->params[i];
  int64_t flat = (int64_t)p->numel, zero[MPU_SHARD_MAX_DIMS] = {0};
  const int64_t *shape = p->ndim ? p->shape : &flat;
  MPU_CHECK(mpu_shard_box_at(p->ndim ? p->ndim : 1, shape, shape, zero, out));
  out->nspans = 0;
  return MPU_SUCCESS;
}

mpu_result_t mpu__describe(const char *fn, mpu_shard_list *out, const char *name,
                           const char *suffix, mpu_shard_kind kind, const mpu_shard *keep,
                           float *data, const mpu_shard *save) {
  mpu_shard_tensor *t = malloc(sizeof *t); /* large (its spans): off the stack */
  if (!t) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  memset(t, 0, sizeof *t);
  int n = snprintf(t->name, sizeof t->name, "%s%s", name, suffix);
  mpu_result_t r = MPU_SUCCESS;
  if (n < 0 || (size_t)n >= sizeof t->name)
    r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: '%s%s' is too long a name", fn, name, suffix);
  t->kind = kind, t->shard = *keep, t->data = data;
  if (save) {
    t->nsave = save->nspans;
    memcpy(t->save, save->spans, (size_t)save->nspans * sizeof *t->save);
  }
  if (!r) r = mpu_shard_list_add(out, t);
  free(t);
  return r;
}

mpu_result_t mpu_param_buffer_describe(const mpu_param_buffer *b, const mpu_shard_global *globals,
                                       const mpu_optimizer *opt, int tp_size, int dp_rank,
                                       mpu_shard_list *out) {
  static const char fn[] = "mpu_param_buffer_describe";
  if (!b || !globals || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (!b->finalized) return mpu__error(MPU_ERR_INVALID_USAGE, "%s: buffer not finalized", fn);
  if (opt && opt->b != b)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the optimizer is another buffer's", fn);
  if (opt) dp_rank = opt->dp_rank;
  int zero1 = opt && opt->distributed;
  mpu_shard *s = malloc(3 * sizeof *s); /* whole, the optimizer's state, its elements in data */
  if (!s) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  mpu_shard *whole = &s[0], *state = &s[1], *shard = &s[2];
  mpu_result_t r = MPU_SUCCESS;
  for (int i = 0; !r && i < b->nparams; i++) {
    const mpu_param *p = &b->params[i];
    const char *name = globals[i].name;
    int writer = p->attrs.tensor_parallel || b->tp_rank == 0; /* one replica across tp */
    if ((r = mpu__param_shard(fn, b, i, &globals[i], tp_size, whole))) break;
    *state = *shard = *whole;
    if ((r = mpu_shard_keep(whole, 0, p->numel, 0))) break;
    if (opt) { /* the spans the optimizer keeps, over its state and over the parameter */
      mpu_shard held;
      r = mpu_optimizer_param_shard(opt, i, &held);
      for (int k = 0; !r && k < held.nspans; k++) {
        const mpu_shard_span *sp = &held.spans[k];
        r = mpu_shard_keep(state, sp->lo, sp->hi, sp->at);
        if (!r) r = mpu_shard_keep(shard, sp->lo, sp->hi, sp->lo);
      }
      if (r) break;
    }
    /* the parameter: loaded whole; saved from the ZeRO-1 shard (the main weights) or by dp
     * rank 0; the moments where the optimizer keeps them */
    const mpu_shard *save = !writer ? NULL : zero1 ? shard : dp_rank == 0 ? whole : NULL;
    r = mpu__describe(fn, out, name, "", MPU_SHARD_PARAM, whole, b->data + p->offset, save);
    save = writer && (zero1 || dp_rank == 0) ? state : NULL;
    if (!r && opt) r = mpu__describe(fn, out, name, ".exp_avg", MPU_SHARD_EXP_AVG, state, opt->m, save);
    if (!r && opt)
      r = mpu__describe(fn, out, name, ".exp_avg_sq", MPU_SHARD_EXP_AVG_SQ, state, opt->v, save);
  }
  free(s);
  return r;
}

/* ---- the checkpoint's one-call forms, kept for one release -------------------------------- */

static mpu_result_t add_list(mpu_ckpt_set *set, mpu_shard_list *l, mpu_result_t r) {
  if (!r) r = mpu_ckpt_add_shards(set, l);
  mpu_shard_list_free(l);
  return r;
}

mpu_result_t mpu_ckpt_add_buffer(mpu_ckpt_set *set, const mpu_param_buffer *b,
                                 const mpu_shard_global *globals, const mpu_optimizer *opt,
                                 int tp_size, int dp_rank) {
  if (!set) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_ckpt_add_buffer: NULL set");
  mpu_shard_list l;
  mpu_shard_list_init(&l);
  return add_list(set, &l, mpu_param_buffer_describe(b, globals, opt, tp_size, dp_rank, &l));
}

mpu_result_t mpu_ckpt_add_fsdp(mpu_ckpt_set *set, mpu_fsdp *f, const mpu_shard_global *globals,
                               int tp_size) {
  if (!set) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_ckpt_add_fsdp: NULL set");
  mpu_shard_list l;
  mpu_shard_list_init(&l);
  return add_list(set, &l, mpu_fsdp_describe(f, globals, tp_size, &l));
}
