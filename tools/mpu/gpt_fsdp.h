/*
 * gpt_fsdp.h - `mpu demo gpt --fsdp / --hsdp RxS`: the GPT's model chunks
 * sharded along the data-parallel group (mpu/fsdp.h) while their layers stay
 * column/row-parallel along tp: 2-D parallelism on one (dp, tp) mesh.
 */
#ifndef MPU_TOOLS_GPT_FSDP_H
#define MPU_TOOLS_GPT_FSDP_H

#include "gpt.h"
#include "mpu.h"

typedef struct gpt_sharding {
  int n;                 /* chunks */
  mpu_fsdp **f;          /* one sharded buffer per chunk */
  mpu_device_mesh *dm;   /* (replicate, shard) over dp, for --hsdp */
} gpt_sharding;

/* Shard the chunks' buffers over dp: FULL_SHARD when replicate is 1, else
 * HYBRID_SHARD on a (replicate, dp / replicate) mesh of the dp group; laid
 * out as FSDP1's flat parameter or FSDP2's per-parameter dim-0 shards. */
mpu_result_t gpt_shard_init(gpt_sharding *g, gpt_chunk *chunks, int n, mpu_comm *dp,
                            int replicate, mpu_fsdp_layout layout,
                            const mpu_adamw_options *adamw);
/* Before the step's pipeline: every bucket whole (gathered, the next one
 * prefetched while the previous lands). */
mpu_result_t gpt_shard_unshard(gpt_sharding *g);
/* After it: the gradients reduce-scattered into the pieces (last bucket
 * first, as the backward leaves them), one norm over the model (mp: the
 * model-parallel group), AdamW on the pieces. */
mpu_result_t gpt_shard_step(gpt_sharding *g, mpu_comm *mp);
void gpt_shard_free(gpt_sharding *g);
/* "FULL_SHARD" or "HYBRID_SHARD" */
const char *gpt_shard_name(int replicate);

#endif
