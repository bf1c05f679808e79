/*
 * mpu/fsdp.h - sharded parameter buffers: ZeRO-2, ZeRO-3 (FSDP) and hybrid
 * sharding (HSDP) over a mesh dim or a group, as PyTorch's
 * FullyShardedDataParallel does with its ShardingStrategy.
 *
 * A parameter buffer (mpu_param_buffer, its parameters added) is cut into
 * buckets of whole parameters (up to bucket_bytes each; a larger parameter is
 * a bucket alone), as FSDP wraps units. Each of the S ranks of the shard
 * group keeps piece s of every bucket, laid out as FSDP1's flat parameter
 * or FSDP2's per-parameter dim-0 shards (mpu_fsdp_layout: torch.chunk's
 * pieces padded with zeros so the equal-count collectives move them), with
 * its gradient and its AdamW moments: parameters + gradients + optimizer
 * state per rank fall as 1/S.
 *
 *   strategy                FSDP's name             between forward  gradients reduced
 *                                                   and backward     over
 *   MPU_SHARD_GRAD_OP       SHARD_GRAD_OP (ZeRO-2)  params whole     shard
 *   MPU_SHARD_FULL          FULL_SHARD (ZeRO-3)     params sharded   shard
 *   MPU_SHARD_HYBRID_ZERO2  _HYBRID_SHARD_ZERO2     params whole     shard, then replicate
 *   MPU_SHARD_HYBRID        HYBRID_SHARD            params sharded   shard, then replicate
 *
 * (NO_SHARD is the plain mpu_optimizer, ZeRO-1 the distributed one.)
 *
 * A step, bucket by bucket as the layers run:
 *   forward   mpu_fsdp_unshard(f, k, k + 1)   gather bucket k (and start k + 1's)
 *             ... the layer reads mpu_fsdp_param(f, i) ...
 *             mpu_fsdp_forward_done(f, k)    FULL/HYBRID: free it again
 *   backward  mpu_fsdp_unshard(f, k, k - 1)   (a no-op for the ZeRO-2 strategies)
 *             ... the layer adds into mpu_fsdp_grad(f, i) ...
 *             mpu_fsdp_backward_done(f, k)   reduce-scatter k's gradient into the
 *                                            shard (non-blocking), free k
 *   mpu_fsdp_step(f, mp, &norm)              finish the reductions, clip, AdamW
 *                                            on the local shards
 *
 * Gradients are reduced as FSDP's default hook does: each rank's gradient is
 * divided by a pre-divide factor, reduce-scattered (summed) over the shard
 * group, all-reduced (summed) over the replicate group for the hybrid
 * strategies, then divided by a post-divide factor; pre x post = the
 * data-parallel world (shard x replicate), pre the power of two
 * _get_gradient_predivide_factor picks, so the sum stays in range.
 *
 * Storage of the whole buckets: if the buffer was finalized by the caller
 * (mpu_param_buffer_finalize), the gathered parameters land in its data and
 * the layers' gradients are read from its grad, so layers that keep pointers
 * into the buffer work unchanged (the shards still travel as above, but the
 * whole buffer stays allocated). If it was not finalized, each bucket's
 * whole parameters and gradient are allocated when it is unsharded and freed
 * when it is resharded: at most the unsharded buckets are whole at a time.
 */
#ifndef MPU_FSDP_H
#define MPU_FSDP_H

#include <stddef.h>
#include <stdint.h>

#include "mpu/comm.h"
#include "mpu/mesh.h"
#include "mpu/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mpu_shard_strategy {
  MPU_SHARD_FULL = 0,     /* FULL_SHARD: ZeRO-3 */
  MPU_SHARD_GRAD_OP,      /* SHARD_GRAD_OP: ZeRO-2 */
  MPU_SHARD_HYBRID,       /* HYBRID_SHARD: FULL_SHARD inside the shard group, replicas across */
  MPU_SHARD_HYBRID_ZERO2, /* _HYBRID_SHARD_ZERO2: SHARD_GRAD_OP inside, replicas across */
} mpu_shard_strategy;

/* "FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2" (NULL if unknown) */
MPU_API const char *mpu_shard_strategy_name(mpu_shard_strategy s);
/* Those names, or "zero3"/"fsdp", "zero2", "hsdp", "hsdp_zero2" (case-insensitive). */
MPU_API mpu_result_t mpu_shard_strategy_from_name(const char *name, mpu_shard_strategy *out);

/*
 * How a bucket is cut among the S ranks of the shard group:
 *   MPU_FSDP_FLAT       FSDP1's FlatParameter (FullyShardedDataParallel,
 *                       use_orig_params=False; torch/distributed/fsdp/
 *                       _flat_param.py): the bucket's parameters
 *                       concatenated, no gap between them, cut as torch.chunk
 *                       cuts (pieces of ceil(n / S), the last short or
 *                       empty), each piece padded with zeros at its end to
 *                       ceil(n / S): rank s holds flat elements
 *                       [s ceil(n/S), (s + 1) ceil(n/S)) of the bucket
 *   MPU_FSDP_PER_PARAM  FSDP2's fully_shard (torch/distributed/fsdp/
 *                       _fully_shard/_fsdp_param.py): each parameter a
 *                       DTensor Shard(0), its dim 0 (mpu_param_buffer_set_shape;
 *                       a parameter without a shape is 1-d) cut by torch.chunk
 *                       and padded to ceil(dim0 / S) rows; rank s's piece of
 *                       the bucket is its padded shard of each parameter in
 *                       order, as FSDP2's all-gather input
 * Both give the same values (gradients, parameters, moments); only which
 * rank holds which element differs.
 */
typedef enum mpu_fsdp_layout {
  MPU_FSDP_FLAT = 0,
  MPU_FSDP_PER_PARAM = 1,
} mpu_fsdp_layout;

/* "flat" (FSDP1), "per_param" (FSDP2), NULL if unknown */
MPU_API const char *mpu_fsdp_layout_name(mpu_fsdp_layout layout);
/* Those names, or "fsdp1", "fsdp2" (case-insensitive). */
MPU_API mpu_result_t mpu_fsdp_layout_from_name(const char *name, mpu_fsdp_layout *out);

typedef struct mpu_fsdp_options {
  size_t size;                  /* sizeof, set by the initializer */
  mpu_shard_strategy strategy;
  size_t bucket_bytes;          /* whole parameters per bucket, up to this (default 40 MB);
                                   counted without gaps, as a FlatParameter's numel */
  int sum;                      /* 1: sum the gradients instead of averaging them */
  mpu_adamw_options adamw;      /* its sync field is not used */
  mpu_fsdp_layout layout;       /* MPU_FSDP_FLAT (default) or MPU_FSDP_PER_PARAM */
} mpu_fsdp_options;

#define MPU_FSDP_OPTIONS_INIT                                                          \
  {.size = sizeof(mpu_fsdp_options), .strategy = MPU_SHARD_FULL, .bucket_bytes = 40000000, \
   .sum = 0, .adamw = MPU_ADAMW_OPTIONS_INIT, .layout = MPU_FSDP_FLAT}

typedef struct mpu_fsdp mpu_fsdp;

/*
 * Shard buffer b (parameters added; finalized by the caller or not) over
 * `shard`; `replicate` is the group the hybrid strategies average across
 * (NULL for the others, required for them). The buffer must stay alive and
 * unchanged in layout. If b is finalized, its data gives every rank's
 * starting parameters (they must agree); if not, they start at zero (set
 * them with mpu_fsdp_set_param).
 */
MPU_API mpu_result_t mpu_fsdp_create(mpu_param_buffer *b, mpu_comm *shard, mpu_comm *replicate,
                                     const mpu_fsdp_options *options, mpu_fsdp **out);
MPU_API void mpu_fsdp_free(mpu_fsdp *f);

/* The same over a device mesh: the group along shard_dim, and for the hybrid
 * strategies the group along replicate_dim (FSDP's device_mesh argument:
 * dim 0 replicate, dim 1 shard). */
MPU_API mpu_result_t mpu_fsdp_create_on_mesh(mpu_param_buffer *b, mpu_device_mesh *dm,
                                             int replicate_dim, int shard_dim,
                                             const mpu_fsdp_options *options, mpu_fsdp **out);

MPU_API int mpu_fsdp_nbuckets(const mpu_fsdp *f);
/* The bucket that holds parameter i (-1 if none). */
MPU_API int mpu_fsdp_bucket_of(const mpu_fsdp *f, int param);
/* Bucket k's elements [*start, *end) in the buffer (its first parameter's
 * offset, its last one's end), and the length of each rank's piece of it
 * (the padded shard: ceil(n / S) for MPU_FSDP_FLAT, n the bucket's
 * parameters' elements). */
MPU_API mpu_result_t mpu_fsdp_bucket_range(const mpu_fsdp *f, int k, size_t *start, size_t *end,
                                           size_t *piece);

/* Set parameter i from its whole value (numel floats; every rank the same):
 * this rank keeps its piece, and its bucket is resharded (mpu_fsdp_reshard),
 * so the next unshard gathers the new value. */
MPU_API mpu_result_t mpu_fsdp_set_param(mpu_fsdp *f, int param, const float *values);

/* Start the all-gather of bucket k without waiting (mpu_comm_iall_gather).
 * It gathers the pieces as they are now; whatever changes them before the
 * unshard that takes it (a step, mpu_fsdp_set_param, a checkpoint load,
 * mpu_fsdp_reshard) drops it, and that unshard gathers again. */
MPU_API mpu_result_t mpu_fsdp_prefetch(mpu_fsdp *f, int k);
/* Make bucket k whole (wait for its prefetch, or gather it now); then start
 * the gather of bucket `next` (-1: none). A no-op gather if k is whole. */
MPU_API mpu_result_t mpu_fsdp_unshard(mpu_fsdp *f, int k, int next);
/* After bucket k's forward: reshard it if the strategy reshards after the
 * forward (FULL, HYBRID). */
MPU_API mpu_result_t mpu_fsdp_forward_done(mpu_fsdp *f, int k);
/* After bucket k's backward: start the reduce-scatter of its gradient into
 * the shard (the reduction of the previous bucket is finished first) and
 * reshard it. */
MPU_API mpu_result_t mpu_fsdp_backward_done(mpu_fsdp *f, int k);
/* Free bucket k's whole parameters now, and drop a gather of them in flight
 * (waited for, what it brought discarded), so the next unshard gathers the
 * pieces as they are then (gradient reductions are unaffected). */
MPU_API mpu_result_t mpu_fsdp_reshard(mpu_fsdp *f, int k);

/* Parameter i's whole data and gradient: valid while its bucket is whole
 * (NULL otherwise). The gradient starts at zero and is accumulated into until
 * mpu_fsdp_backward_done reduces it (with a buffer the caller finalized:
 * b->grad, zeroed there after it is taken). */
MPU_API float *mpu_fsdp_param(const mpu_fsdp *f, int param);
MPU_API float *mpu_fsdp_grad(mpu_fsdp *f, int param);

/* This rank's piece of the buffer's parameters / reduced gradients, and its
 * length. A caller that writes the parameters' pieces (here, where
 * mpu_fsdp_param_shard says a parameter lies) reshards their buckets afterwards (mpu_fsdp_reshard,
 * or mpu_fsdp_sync_grads before the next unshard), since a gather started
 * before the write carries the old values. */
MPU_API float *mpu_fsdp_shard_params(const mpu_fsdp *f, size_t *numel);
MPU_API float *mpu_fsdp_shard_grads(const mpu_fsdp *f, size_t *numel);
/* This rank's pieces of AdamW's moments (the same length). */
MPU_API float *mpu_fsdp_shard_exp_avg(const mpu_fsdp *f, size_t *numel);
MPU_API float *mpu_fsdp_shard_exp_avg_sq(const mpu_fsdp *f, size_t *numel);
MPU_API void mpu_fsdp_zero_grad(mpu_fsdp *f);
/* Finish the gradient reductions in flight, so the pieces are complete (for
 * an optimizer of the caller's own on mpu_fsdp_shard_params/_grads; the next
 * unshard then gathers its updated pieces). mpu_fsdp_step does this itself. */
MPU_API mpu_result_t mpu_fsdp_sync_grads(mpu_fsdp *f);

/*
 * One optimizer step: finish the pending gradient reductions, the gradient
 * norm (squares of this rank's pieces of the parameters that count, summed
 * over the shard group and then over norm_group: the model-parallel group,
 * or NULL), clip, and AdamW on the local pieces. The whole parameters are
 * gathered again by the next unshard. *grad_norm (may be NULL) gets the norm.
 */
MPU_API mpu_result_t mpu_fsdp_step(mpu_fsdp *f, mpu_comm *norm_group, float *grad_norm);
/* One step of several sharded buffers over the same shard group (a rank's
 * model chunks) with one gradient norm over all of them, as Megatron clips
 * the whole model. Each keeps its own AdamW settings. Refused
 * (MPU_ERR_INVALID_ARGUMENT, nothing changed) if two of them shard the same
 * parameter buffer (one given twice would be updated twice and counted twice
 * in the norm) or one has done INT64_MAX steps. Every bucket is resharded
 * (a gather in flight dropped): the next unshard gathers the new pieces. */
MPU_API mpu_result_t mpu_fsdp_step_all(mpu_fsdp *const *fs, int n, mpu_comm *norm_group,
                                       float *grad_norm);

/* The elements of parameter i this rank holds in its pieces, as a shard
 * (mpu/shard.h) of the parameter's local tensor (its shape, or 1-d, as one
 * box at 0): one span [lo, hi) of its elements (a parameter lies in one
 * bucket; none if the rank holds none of it) with `at`, the index of element
 * lo in the pieces (mpu_fsdp_shard_params, _grads, _exp_avg, _exp_avg_sq). */
MPU_API mpu_result_t mpu_fsdp_param_shard(const mpu_fsdp *f, int param, mpu_shard *out);
/* Describe what this rank holds (mpu/shard.h): each parameter (globals[i]:
 * its global name and shape, cut among tp_size ranks by its attributes) with
 * the span of it in this rank's pieces, and its AdamW moments there
 * ("<name>.exp_avg", "<name>.exp_avg_sq"); the writers are one replica (tp
 * rank 0 for duplicates, replica 0 of the hybrid strategies). Asks to be
 * told when a consumer writes the pieces (mpu_shard_list_on_write): every
 * bucket is then resharded (a gather in flight dropped), so the next unshard
 * gathers what was written. */
MPU_API mpu_result_t mpu_fsdp_describe(mpu_fsdp *f, const mpu_shard_global *globals, int tp_size,
                                       mpu_shard_list *out);
/* AdamW's step count (steps done), and setting it (from a checkpoint). */
MPU_API int64_t mpu_fsdp_optimizer_step(const mpu_fsdp *f);
MPU_API mpu_result_t mpu_fsdp_set_optimizer_step(mpu_fsdp *f, int64_t step);
/* The options it was created with; this rank's index in the replicate group
 * (0 for the strategies without one); the buffer. */
MPU_API const mpu_fsdp_options *mpu_fsdp_get_options(const mpu_fsdp *f);
MPU_API int mpu_fsdp_replica(const mpu_fsdp *f);
MPU_API mpu_param_buffer *mpu_fsdp_buffer(const mpu_fsdp *f);

/* The whole buffer's parameters, gathered into out (b->numel floats). */
MPU_API mpu_result_t mpu_fsdp_gather_params(mpu_fsdp *f, float *out);

/* Bytes per rank: what the rank keeps between steps, what is whole now, and
 * the most it held at once since creation (or the last reset). */
typedef struct mpu_fsdp_memory {
  size_t params, grads, optimizer; /* the pieces: parameters, gradients, AdamW moments */
  size_t unsharded;                /* whole buckets (parameters and gradients) now */
  size_t peak;                     /* the largest params + grads + optimizer + unsharded seen */
  size_t largest_bucket;           /* one whole bucket of parameters, padded */
} mpu_fsdp_memory;

MPU_API mpu_result_t mpu_fsdp_memory_usage(const mpu_fsdp *f, mpu_fsdp_memory *m);
MPU_API void mpu_fsdp_reset_peak(mpu_fsdp *f);

#ifdef __cplusplus
}
#endif

#endif
