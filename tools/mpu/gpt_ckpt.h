/*
 * gpt_ckpt.h - `mpu demo gpt --save DIR / --load DIR`: a rank's model chunks
 * and their optimizers as one checkpoint set (mpu/checkpoint.h), so that a
 * run of any layout continues a run saved by any other.
 */
#ifndef MPU_TOOLS_GPT_CKPT_H
#define MPU_TOOLS_GPT_CKPT_H

#include "gpt.h"
#include "gpt_fsdp.h"
#include "mpu.h"

/* Where a rank's chunks keep their optimizer state: sharded (--fsdp, --hsdp)
 * if `sharded` is non-NULL, else the plain or ZeRO-1 optimizers opts[0, vp). */
typedef struct gpt_params {
  mpu_optimizer *opts;
  gpt_sharding *sharded;
} gpt_params;

/* Save the rank's chunks[0, vp) with their optimizer state after `step` steps
 * (collective over the state's world). */
mpu_result_t gpt_ckpt_save(const char *dir, mpu_state *s, const gpt_ctx *ctx, gpt_chunk *chunks,
                           int vp, const gpt_params *gp, int micro, long step);

/* Load them (collective): parameters, moments, the optimizers' step and the
 * data-parallel random stream; *step gets the steps the checkpoint had done.
 * The global batch (dp x micro, micro-batches per replica) must be the
 * saver's: the same steps then follow. */
mpu_result_t gpt_ckpt_load(const char *dir, mpu_state *s, const gpt_ctx *ctx, gpt_chunk *chunks,
                           int vp, const gpt_params *gp, int micro, long *step);

#endif
