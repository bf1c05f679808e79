/*
 * gpt_ckpt.c - the GPT demo's checkpoints: each chunk's parameters (global
 * names "layer<L>.qkv.weight", ... with global layer numbers) and AdamW
 * moments, from plain, ZeRO-1 or sharded (--fsdp, --hsdp) buffers alike
 * (each describes its shards, mpu/shard.h), the model's config as metadata,
 * every rank's random streams.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_ckpt.h"

/* the config keys a checkpoint must match (heads change no shape; the
 * global batch in micro-batches, dp x micro, decides what a step does) */
enum { NKEYS = 6 };
static const char *const config_keys[NKEYS] = {"vocab", "hidden", "heads", "layers", "seq",
                                               "global_batch"};

static void config_values(const gpt_config *g, long global_batch, long v[NKEYS]) {
  v[0] = g->vocab, v[1] = g->hidden, v[2] = g->heads, v[3] = g->layers, v[4] = g->seq;
  v[5] = global_batch;
}

static mpu_result_t describe(mpu_ckpt_set *set, mpu_state *s, const gpt_ctx *ctx,
                             gpt_chunk *chunks, int vp, const gpt_params *gp, int micro) {
  int dp_rank, dp, pp, world;
  mpu_optimizer *opts = gp->opts;
  mpu_fsdp **fs = gp->sharded ? gp->sharded->f : NULL;
  mpu_result_t r = mpu_state_dp_rank(s, &dp_rank);
  if (!r) r = mpu_state_dp_size(s, &dp);
  if (!r) r = mpu_state_pp_size(s, &pp);
  if (!r) r = mpu_comm_size(mpu_state_world(s), &world);
  for (int c = 0; c < vp && !r; c++) {
    const gpt_chunk *ch = &chunks[c];
    int n = ch->params.nparams;
    mpu_shard_global *g = calloc((size_t)n, sizeof *g);
    if (!g) return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "gpt: checkpoint names");
    for (int i = 0; i < n; i++) {
      const gpt_shape *sh = &ch->shapes[i];
      g[i].name = sh->name;
      g[i].ndim = sh->cols == 1 ? 1 : 2; /* biases and norms are vectors */
      g[i].shape[0] = sh->rows, g[i].shape[1] = sh->cols;
    }
    /* the holder describes what it holds; the set takes the shards */
    mpu_shard_list l;
    mpu_shard_list_init(&l);
    r = fs ? mpu_fsdp_describe(fs[c], g, ctx->tp_size, &l)
           : mpu_param_buffer_describe(&ch->params, g, &opts[c], ctx->tp_size, dp_rank, &l);
    if (!r) r = mpu_ckpt_add_shards(set, &l);
    mpu_shard_list_free(&l);
    free(g);
  }
  if (r) return r;
  set->layout.world = world, set->layout.tp = ctx->tp_size, set->layout.pp = pp;
  set->layout.vp = pp > 1 ? vp : 0;
  set->layout.dp = dp, set->layout.zero1 = !fs && opts[0].distributed;
  set->has_adamw = 1;
  set->adamw = fs ? mpu_fsdp_get_options(fs[0])->adamw : opts[0].o;
  set->optimizer_step = fs ? mpu_fsdp_optimizer_step(fs[0]) : opts[0].step;
  long v[NKEYS];
  config_values(&ctx->cfg, (long)dp * micro, v);
  char text[32];
  for (int i = 0; i < NKEYS && !r; i++) {
    snprintf(text, sizeof text, "%ld", v[i]);
    r = mpu_ckpt_set_meta(set, config_keys[i], text);
  }
  if (!r) r = mpu_ckpt_set_meta(set, "model", "mpu demo gpt");
  if (!r) r = mpu_rng_tracker_get_states(mpu_state_rng_tracker(s), &set->rng);
  if (!r) set->default_rng = *mpu_state_default_rng(s);
  return r;
}

mpu_result_t gpt_ckpt_save(const char *dir, mpu_state *s, const gpt_ctx *ctx, gpt_chunk *chunks,
                           int vp, const gpt_params *gp, int micro, long step) {
  mpu_ckpt_set set;
  mpu_ckpt_set_init(&set);
  set.step = step;
  mpu_result_t r = describe(&set, s, ctx, chunks, vp, gp, micro);
  if (!r) r = mpu_ckpt_save(dir, mpu_state_world(s), &set);
  mpu_ckpt_set_free(&set);
  return r;
}

mpu_result_t gpt_ckpt_load(const char *dir, mpu_state *s, const gpt_ctx *ctx, gpt_chunk *chunks,
                           int vp, const gpt_params *gp, int micro, long *step) {
  mpu_ckpt_set set;
  mpu_ckpt_set_init(&set);
  mpu_ckpt *ck = NULL;
  int dp = 1;
  mpu_result_t r = describe(&set, s, ctx, chunks, vp, gp, micro);
  if (!r) r = mpu_state_dp_size(s, &dp);
  /* every rank opens the index; a rank that cannot still joins the agreement in load */
  mpu_result_t open = r ? r : mpu_ckpt_open(dir, &ck);
  long v[NKEYS];
  config_values(&ctx->cfg, (long)dp * micro, v);
  for (int i = 0; i < NKEYS && !open; i++) {
    const char *saved = mpu_ckpt_meta(ck, config_keys[i]);
    if (!saved || strtol(saved, NULL, 10) != v[i])
      open = mpu_fail(MPU_ERR_INVALID_ARGUMENT, "checkpoint %s: the model was saved with %s %s, "
                      "this run has %ld%s", dir, config_keys[i], saved ? saved : "(none)", v[i],
                      i == 5 ? " (dp x --micro-batches)" : "");
  }
  mpu_rng_states saved;
  memset(&saved, 0, sizeof saved);
  if (!open) open = mpu_ckpt_rng(ck, 0, &saved, NULL);
  if (open) { /* still take part in the agreement (as a rank without a checkpoint), then fail */
    char why[1024];
    snprintf(why, sizeof why, "%s", mpu_last_error());
    mpu_ckpt_free(ck);
    ck = NULL;
    mpu_ckpt_load(NULL, mpu_state_world(s), &set);
    r = mpu_fail(open, "%s", why);
  } else {
    r = mpu_ckpt_load(ck, mpu_state_world(s), &set);
  }
  if (!r) {
    for (int c = 0; c < vp && !r; c++)
      if (gp->sharded) r = mpu_fsdp_set_optimizer_step(gp->sharded->f[c], set.optimizer_step);
      else gp->opts[c].step = set.optimizer_step;
    /* the data-parallel stream (the dropout keys) is the same on every rank: rank 0's */
    mpu_rng *dp_rng = NULL;
    r = mpu_rng_tracker_fork(mpu_state_rng_tracker(s), MPU_DATA_PARALLEL_RNG, &dp_rng);
    int found = 0;
    for (int i = 0; !r && i < saved.n; i++)
      if (!strcmp(saved.names[i], MPU_DATA_PARALLEL_RNG)) *dp_rng = saved.rngs[i], found = 1;
    if (!r && !found)
      r = mpu_fail(MPU_ERR_INVALID_ARGUMENT, "checkpoint %s: no %s stream", dir, MPU_DATA_PARALLEL_RNG);
    *step = (long)set.step;
  }
  mpu_ckpt_free(ck);
  mpu_ckpt_set_free(&set);
  return r;
}
