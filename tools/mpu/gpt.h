/*
 * gpt.h - the small GPT of `mpu demo gpt`, one virtual pipeline stage (a
 * model chunk) at a time.
 *
 * Pre-LayerNorm blocks: x + dropout(proj(attention(qkv(ln1(x))))), then
 * + dropout(fc2(gelu(fc1(ln2(.))))); qkv is column-parallel with stride 3
 * (a fused Q, K, V weight), proj and fc2 row-parallel. The first chunk adds
 * the vocab-parallel word embedding, a position embedding and dropout; the
 * last a final LayerNorm, a column-parallel head and the vocab-parallel
 * cross entropy. With sequence parallelism the activations between the
 * tensor-parallel layers are split along the sequence.
 *
 * Every parameter lives in its chunk's buffer (mpu_param_buffer) and its
 * master value is drawn from a seed named by the parameter, so any layout
 * holds slices of the same model. Dropout masks come from a counter-based
 * generator keyed by the step's draw from the RNG tracker's data-parallel
 * stream and by the global place of each element (layer, site, micro-batch,
 * global token and head), so every layout drops what one rank drops and the
 * run can be checked against one rank. The chunk keeps no activations
 * between its forward and its backward: backward recomputes the forward from
 * the saved chunk input (full activation recompute, through mpu_checkpoint),
 * which is also what lets many micro-batches be in flight per chunk.
 */
#ifndef MPU_TOOLS_GPT_H
#define MPU_TOOLS_GPT_H

#include <stdint.h>

#include "mpu.h"

typedef struct gpt_config {
  int vocab;       /* padded to a multiple of 64 */
  int hidden, heads, layers, seq;
  float dropout;
  uint64_t seed;
} gpt_config;

/* A parameter's master shape and how a rank's slice is cut from it. */
typedef struct gpt_shape {
  char name[48];
  int rows, cols, dim, stride; /* dim -1: a duplicate */
} gpt_shape;

typedef struct gpt_block gpt_block;

typedef struct gpt_chunk {
  int vs, first, last, layer0, nlayers;
  mpu_param_buffer params;
  gpt_shape *shapes;           /* by parameter index */
  gpt_block *blocks;
  mpu_vocab_embedding wte;
  float *wpe, *dwpe;           /* (seq, hidden), views */
  mpu_layer_norm lnf;
  mpu_column_linear head;
  mpu_vocab_cross_entropy ce;
  float *emb, *emb_mask, *act, *dact, *logits, *dlogits, *loss, *dloss, *tmp;
} gpt_chunk;

/* What every chunk of a rank shares. */
typedef struct gpt_ctx {
  gpt_config cfg;
  mpu_comm *tp;
  int tp_size, tp_rank, sp, T_local;
  uint64_t key;                /* this step's dropout key */
} gpt_ctx;

mpu_result_t gpt_ctx_init(gpt_ctx *ctx, const gpt_config *cfg, mpu_comm *tp, int sp);
/* Chunk vs of pp x vp virtual stages (layers / (pp x vp) blocks each). */
mpu_result_t gpt_chunk_create(const gpt_ctx *ctx, gpt_chunk *c, int vs, int nvs);
void gpt_chunk_free(gpt_chunk *c);
/* ids, targets (seq): the micro-batch (used by the first and last chunks);
 * in (T_local, hidden) or NULL on the first; out (T_local, hidden) unless
 * last; *loss_sum += the micro-batch's summed token losses on the last. */
mpu_result_t gpt_chunk_forward(const gpt_ctx *ctx, gpt_chunk *c, int mb, const int64_t *ids,
                               const int64_t *targets, const float *in, float *out,
                               double *loss_sum);
/* After a forward of the same micro-batch: gout (T_local, hidden), or NULL on
 * the last chunk, whose loss gradient is loss_scale per token; gin
 * (T_local, hidden) unless first. Adds to the parameters' gradients. */
mpu_result_t gpt_chunk_backward(const gpt_ctx *ctx, gpt_chunk *c, const float *gout, float *gin,
                                float loss_scale);
/* Sequence parallelism: the LayerNorm gradients summed over the group. */
mpu_result_t gpt_chunk_sync_sequence_grads(const gpt_ctx *ctx, gpt_chunk *c);

#endif
