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
 * run can be checked against one rank, and a forward run again drops the
 * same. Activation recompute is Megatron's: full (the whole chunk from its
 * input, through mpu_recompute, or its first N blocks), selective (the
 * attention core) or none; a chunk that keeps activations keeps a frame of
 * them per micro-batch in flight.
 */
#ifndef MPU_TOOLS_GPT_H
#define MPU_TOOLS_GPT_H

#include <stddef.h>
#include <stdint.h>

#include "mpu.h"

/* Activation recompute, as Megatron's --recompute-granularity (gpt.c says
 * what each keeps). */
enum { GPT_RECOMPUTE_FULL = 0, GPT_RECOMPUTE_SELECTIVE, GPT_RECOMPUTE_NONE };

typedef struct gpt_config {
  int vocab;       /* padded to a multiple of 64 */
  int hidden, heads, layers, seq;
  float dropout;
  uint64_t seed;
  int recompute;        /* GPT_RECOMPUTE_* (0, full, unless set) */
  int recompute_layers; /* full: the first N blocks of each chunk (0: the whole chunk) */
} gpt_config;

/* A parameter's master shape and how a rank's slice is cut from it. */
typedef struct gpt_shape {
  char name[48];
  int rows, cols, dim, stride; /* dim -1: a duplicate */
} gpt_shape;

typedef struct gpt_block gpt_block;
struct gpt_frame;

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
  struct gpt_frame *frames;    /* per micro-batch in flight, unless the chunk is recomputed */
  int nframes, frame;          /* how many, and whose activations the layers hold now */
} gpt_chunk;

/* What every chunk of a rank shares. */
typedef struct gpt_ctx {
  gpt_config cfg;
  mpu_comm *tp;
  int tp_size, tp_rank, sp, T_local;
  uint64_t key;                /* this step's dropout key */
  /* called by the backward each time the chunk's gradients from element
   * `from` of its buffer to the end are final (the head's, then each block's,
   * then all), e.g. to start their data-parallel reduce; NULL: not called */
  mpu_result_t (*grads_final)(void *user, gpt_chunk *c, size_t from);
  void *grads_user;
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
/* Recompute: whether the caller runs the whole chunk forward again before
 * its backward (full recompute of every block: only the input is kept). */
int gpt_chunk_whole_recompute(const gpt_ctx *ctx, const gpt_chunk *c);
/* Otherwise n frames of activations (n: the micro-batches that may be in
 * flight), and which one the next forward or backward uses. */
mpu_result_t gpt_chunk_frames(const gpt_ctx *ctx, gpt_chunk *c, int n);
void gpt_chunk_use_frame(gpt_chunk *c, int k);
void gpt_frames_free(gpt_chunk *c);
/* what block i of a chunk of nlayers recomputes (GPT_RECOMPUTE_*) */
int gpt_block_recompute(const gpt_config *g, int i, int nlayers);
/* floats a micro-batch keeps between forward and backward in a chunk of
 * nlayers blocks (with the embedding if first, the head if last) */
size_t gpt_saved_floats(const gpt_ctx *ctx, int nlayers, int first, int last, int recompute,
                        int recompute_layers);
/* gpt_recompute.c: --recompute's words (-1: none of them), the phrase for
 * a run, and the bytes a micro-batch keeps per rank in each mode (by
 * GPT_RECOMPUTE_*, the most over the ranks of world) and their line. */
int gpt_recompute_parse(const char *word);
const char *gpt_recompute_name(int mode);
const char *gpt_recompute_phrase(int mode, long layers, char *buf, size_t size);
mpu_result_t gpt_recompute_report(const gpt_ctx *ctx, const gpt_chunk *chunks, int n,
                                  mpu_comm *world, double saved[3]);
void gpt_recompute_print(const double saved[3], int mode);
/* Sequence parallelism: the LayerNorm gradients summed over the group. */
mpu_result_t gpt_chunk_sync_sequence_grads(const gpt_ctx *ctx, gpt_chunk *c);

#endif
