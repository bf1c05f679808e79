/*
 * gpt_fsdp.c - the GPT's chunks as sharded buffers (see gpt_fsdp.h).
 *
 * The layers keep pointers into their chunk's buffer, so the whole buckets
 * land in the buffer itself (mpu_fsdp's caller-storage mode): the pieces,
 * the gradient reduction and AdamW are sharded, the chunk stays whole during
 * the step because the pipeline runs several micro-batches' forwards and
 * recomputed backwards through it in between.
 */
#include <stdlib.h>

#include "gpt_fsdp.h"

const char *gpt_shard_name(int replicate) {
  return mpu_shard_strategy_name(replicate > 1 ? MPU_SHARD_HYBRID : MPU_SHARD_FULL);
}

mpu_result_t gpt_shard_init(gpt_sharding *g, gpt_chunk *chunks, int n, mpu_comm *dp,
                            int replicate, mpu_fsdp_layout layout,
                            const mpu_adamw_options *adamw) {
  int dp_size;
  mpu_result_t r = mpu_comm_size(dp, &dp_size);
  g->n = n, g->dm = NULL;
  g->f = calloc((size_t)n, sizeof *g->f);
  if (!g->f) return mpu_fail(MPU_ERR_OUT_OF_MEMORY, "gpt: sharded buffers");
  if (r) return r;
  if (replicate < 1 || dp_size % replicate)
    return mpu_fail(MPU_ERR_INVALID_ARGUMENT, "gpt: %d replicas do not divide dp %d", replicate,
                    dp_size);
  int64_t shape[2] = {replicate, dp_size / replicate};
  const char *names[2] = {"replicate", "shard"};
  if (replicate > 1 && (r = mpu_device_mesh_init(dp, 2, shape, names, MPU_MESH_EAGER, &g->dm)))
    return r;
  mpu_fsdp_options o = MPU_FSDP_OPTIONS_INIT;
  o.strategy = replicate > 1 ? MPU_SHARD_HYBRID : MPU_SHARD_FULL;
  o.adamw = *adamw, o.layout = layout;
  o.bucket_bytes = 64 * 1024; /* several buckets per chunk, so the prefetch overlaps */
  for (int c = 0; c < n && !r; c++)
    r = g->dm ? mpu_fsdp_create_on_mesh(&chunks[c].params, g->dm, 0, 1, &o, &g->f[c])
              : mpu_fsdp_create(&chunks[c].params, dp, NULL, &o, &g->f[c]);
  return r;
}

mpu_result_t gpt_shard_unshard(gpt_sharding *g) {
  for (int c = 0; c < g->n; c++) {
    int nb = mpu_fsdp_nbuckets(g->f[c]);
    for (int k = 0; k < nb; k++) {
      mpu_result_t r = mpu_fsdp_unshard(g->f[c], k, k + 1 < nb ? k + 1 : -1);
      if (r) return r;
    }
  }
  return MPU_SUCCESS;
}

mpu_result_t gpt_shard_step(gpt_sharding *g, mpu_comm *mp) {
  for (int c = g->n - 1; c >= 0; c--)
    for (int k = mpu_fsdp_nbuckets(g->f[c]) - 1; k >= 0; k--) {
      mpu_result_t r = mpu_fsdp_backward_done(g->f[c], k);
      if (r) return r;
    }
  mpu_result_t r = mpu_fsdp_step_all(g->f, g->n, mp, NULL);
  for (int c = 0; c < g->n && !r; c++) mpu_fsdp_zero_grad(g->f[c]);
  return r;
}

void gpt_shard_free(gpt_sharding *g) {
  for (int c = 0; g->f && c < g->n; c++) mpu_fsdp_free(g->f[c]);
  free(g->f);
  mpu_device_mesh_free(g->dm);
  g->f = NULL, g->dm = NULL;
}
