/*
 * mpu/train.h - what a training loop needs around the layers: parameter and
 * gradient buffers, data-parallel gradient reduction in buckets, AdamW, the
 * distributed optimizer (ZeRO-1) and gradient-norm clipping, as Megatron
 * core's DistributedDataParallel (param and grad buffers), DistributedOptimizer
 * and clip_grad_norm do.
 *
 * A parameter buffer holds every parameter of one model chunk in one float32
 * allocation and every gradient in another (or in the caller's memory, as
 * llm.c keeps one allocation for all its parameters); each parameter is a
 * view with its tensor-parallel attributes (Megatron's
 * set_tensor_model_parallel_attributes), so that a gradient norm counts a
 * parameter duplicated across the tensor-parallel group once.
 *
 * Gradients are averaged over the data-parallel group as Megatron does by
 * default (each rank's gradient scaled by 1 / dp, then summed), one
 * collective per bucket. Pass the data-parallel-with-context-parallel group
 * when cp > 1, and give expert parameters their own buffer and the expert
 * data-parallel group.
 */
#ifndef MPU_TRAIN_H
#define MPU_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "mpu/comm.h"
#include "mpu/shard.h"
#include "mpu/state.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- parameters ------------------------------------------------------------------ */

/* set_tensor_model_parallel_attributes: partitioned across the tensor-
 * parallel group (along partition_dim, in stride interleaved pieces) or a
 * duplicate on every rank of it (biases of row-parallel layers, norms). */
typedef struct mpu_param_attrs {
  int tensor_parallel;  /* 1: partitioned, 0: a duplicate */
  int partition_dim;    /* -1 for duplicates */
  int stride;           /* 1, or 3 for a fused QKV weight */
} mpu_param_attrs;

#define MPU_PARAM_DUPLICATE ((mpu_param_attrs){0, -1, 1})
#define MPU_PARAM_PARTITIONED(dim, stride_) ((mpu_param_attrs){1, (dim), (stride_)})

typedef struct mpu_param {
  char name[48];
  size_t offset, numel;  /* in elements, into the buffer */
  mpu_param_attrs attrs;
  int decay;             /* weight decay applies (1, the default; 0 for biases and norms) */
  int ndim;              /* its local shape (mpu_param_buffer_set_shape); 0: 1-d of numel */
  int64_t shape[MPU_SHARD_MAX_DIMS];
} mpu_param;

/*
 * The buffer is the caller's storage, initialised in place. Its fields are
 * marked as libuv marks its handles': the public ones a caller may read at
 * any time and never writes (the calls below change them); the private ones
 * are mpu's own, may change meaning in any release and are not to be read;
 * the reserved room lets a later release add state without changing the
 * struct's size.
 */
typedef struct mpu_param_buffer {
  /* public, read-only */
  int nparams;
  mpu_param *params;     /* (nparams) */
  size_t numel;          /* every parameter's elements, each parameter 16-element aligned */
  float *data, *grad;    /* (numel) each, after finalize */
  int tp_rank;           /* for param_is_not_tensor_parallel_duplicate */
  /* private */
  int cap, owns_data, owns_grad, finalized;
  void *reserved[4];
} mpu_param_buffer;

/* Start an empty buffer for this rank (tp_rank: its tensor-parallel rank). */
MPU_API void mpu_param_buffer_init(mpu_param_buffer *b, int tp_rank);
/* Add a parameter of numel elements (before finalize); *index is its number.
 * The name has 1..47 characters (a longer one is refused, never cut) and
 * is not in the buffer already. */
MPU_API mpu_result_t mpu_param_buffer_add(mpu_param_buffer *b, const char *name, size_t numel,
                                          mpu_param_attrs attrs, int *index);
/* Lay the parameters out: data and grad are the caller's (b->numel floats
 * each, mpu_param_buffer_bytes) or NULL to allocate; allocated memory starts
 * zeroed, and from 2 MiB on it starts on a 2 MiB boundary, advised to
 * transparent huge pages (as the optimizer's moments). Afterwards no
 * parameter can be added. */
MPU_API mpu_result_t mpu_param_buffer_finalize(mpu_param_buffer *b, float *data, float *grad);
MPU_API size_t mpu_param_buffer_bytes(const mpu_param_buffer *b);
MPU_API float *mpu_param_data(const mpu_param_buffer *b, int index);
MPU_API float *mpu_param_grad(const mpu_param_buffer *b, int index);
MPU_API void mpu_param_buffer_zero_grad(mpu_param_buffer *b);
/* Give parameter `index` its local shape (what FSDP2's per-parameter
 * layout cuts along dim 0): ndim 1..MPU_SHARD_MAX_DIMS sizes whose product is
 * its numel, before mpu_param_buffer_finalize or after. */
MPU_API mpu_result_t mpu_param_buffer_set_shape(mpu_param_buffer *b, int index, int ndim,
                                                const int64_t *shape);
/* Exclude a parameter from weight decay (Megatron's default for biases and 1-d parameters). */
MPU_API mpu_result_t mpu_param_buffer_no_decay(mpu_param_buffer *b, int index);
MPU_API void mpu_param_buffer_free(mpu_param_buffer *b);
/* param_is_not_tensor_parallel_duplicate */
MPU_API int mpu_param_counts_in_norm(const mpu_param_buffer *b, int index);

/* ---- data-parallel gradients ------------------------------------------------------- */

typedef struct mpu_grad_sync_options {
  size_t size;           /* sizeof, set by the initializer */
  size_t bucket_bytes;   /* one collective per bucket (default 40 MB, as Megatron) */
  int sum;               /* 1: sum the gradients instead of averaging them */
} mpu_grad_sync_options;

#define MPU_GRAD_SYNC_OPTIONS_INIT \
  {.size = sizeof(mpu_grad_sync_options), .bucket_bytes = 40000000, .sum = 0}

/* All-reduce the buffer's gradients over dp in buckets (options NULL: defaults). */
MPU_API mpu_result_t mpu_grad_all_reduce(mpu_param_buffer *b, mpu_comm *dp,
                                         const mpu_grad_sync_options *options);
/*
 * Start the same reduce for the gradients [start, end) of the buffer (in
 * elements) without waiting: scale them as mpu_grad_all_reduce does, then a
 * non-blocking sum over dp (mpu_comm_iall_reduce; *req to wait on). For
 * Megatron's overlap_grad_reduce: start a range once the backward has
 * finished its gradients, wait before the step, and tell the optimizer
 * (mpu_optimizer_set_grads_reduced). Every rank must start the same ranges in the same order;
 * each element is summed over the same ranks as by mpu_grad_all_reduce.
 */
MPU_API mpu_result_t mpu_grad_all_reduce_start(mpu_param_buffer *b, mpu_comm *dp,
                                               const mpu_grad_sync_options *options,
                                               size_t start, size_t end, mpu_request **req);

/* ---- AdamW ----------------------------------------------------------------------------- */

typedef struct mpu_adamw_options {
  size_t size;           /* sizeof, set by the initializer */
  float lr, beta1, beta2, eps, weight_decay;
  float clip_grad;       /* clip the gradient norm to this (0: no clipping) */
  mpu_grad_sync_options sync;
} mpu_adamw_options;

#define MPU_ADAMW_OPTIONS_INIT                                                           \
  {.size = sizeof(mpu_adamw_options), .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f,       \
   .eps = 1e-8f, .weight_decay = 0.01f, .clip_grad = 1.0f, .sync = MPU_GRAD_SYNC_OPTIONS_INIT}

/*
 * The optimizer of one buffer over one data-parallel group, plain or
 * distributed:
 *   plain        every rank all-reduces the gradients and updates every
 *                parameter (its moments cover the whole buffer)
 *   distributed  ZeRO-1: each bucket is reduce-scattered over dp, each rank
 *                updates its shard (the moments of the shard only; the
 *                parameters are the float32 main weights, updated in
 *                place), then the buckets are all-gathered
 * Both apply the same clipping and the same AdamW to each element, so they
 * give the same parameters. Each step reads the float32 main weights from
 * the buffer's parameters, so a value the caller writes between steps (a
 * loaded checkpoint, an edit) is the one the step updates, as torch's AdamW
 * and Megatron's optimizers (which update the parameters in place) do.
 */
typedef struct mpu_optimizer {
  /* public, read-only (marked as mpu_param_buffer's fields are) */
  mpu_param_buffer *b;
  mpu_comm *dp;
  int dp_size, dp_rank, distributed;
  mpu_adamw_options o;
  size_t owned;          /* elements whose moments this rank keeps */
  float *m, *v;          /* (owned), indexed by mpu_optimizer_param_shard's `at` */
  /* public, read-write */
  int64_t step;          /* steps taken; a caller restoring a checkpoint sets it */
  /* private */
  size_t bucket;         /* elements per bucket, a multiple of dp_size */
  float *scratch;        /* one bucket */
  int grads_reduced;     /* mpu_optimizer_set_grads_reduced */
  void *reserved[4];
} mpu_optimizer;

/* Collective over dp: every float option must be finite and in range (lr,
 * weight_decay, clip_grad >= 0, betas in [0, 1), eps > 0), and every rank of
 * dp must pass the same options, distributed flag and buffer shape (one
 * all_gather of a small record compares them; a difference is
 * MPU_ERR_MISMATCH on every rank, naming the rank and the option). */
MPU_API mpu_result_t mpu_optimizer_init(mpu_optimizer *opt, mpu_param_buffer *b, mpu_comm *dp,
                                        int distributed, const mpu_adamw_options *options);
/*
 * One step: reduce the gradients over dp, clip their norm (the sum of
 * squares of the parameters that are not tensor-parallel duplicates,
 * all-reduced over norm_group: the model-parallel group for the plain
 * optimizer, the group of every rank of the instance (dp x model parallel)
 * for the distributed one; NULL: this rank alone), update, and (distributed)
 * gather the parameters. *grad_norm (may be NULL) gets the norm before
 * clipping.
 */
MPU_API mpu_result_t mpu_optimizer_step(mpu_optimizer *opt, mpu_comm *norm_group,
                                        float *grad_norm);
/* One step of several optimizers (a rank's model chunks, dense and expert
 * buffers) with one gradient norm over all of them, as Megatron clips the
 * whole model. Each keeps its own clip_grad and AdamW settings. Refused
 * (MPU_ERR_INVALID_ARGUMENT, before any gradient is reduced) if two of them
 * are over the same buffer (one given twice would reduce and update it twice
 * and count it twice in the norm) or a step count is negative or INT64_MAX. */
MPU_API mpu_result_t mpu_optimizer_step_all(mpu_optimizer *const *opts, int n,
                                            mpu_comm *norm_group, float *grad_norm);
MPU_API void mpu_optimizer_free(mpu_optimizer *opt);
/*
 * Say that the gradients are already all-reduced over dp (the requests of
 * mpu_grad_all_reduce_start waited on): the next step does not reduce them
 * again, and clears the mark. The plain optimizer only: a distributed one
 * reduce-scatters the gradients itself, and refuses the mark
 * (MPU_ERR_INVALID_USAGE, the optimizer unchanged). reduced = 0 takes the
 * mark back.
 */
MPU_API mpu_result_t mpu_optimizer_set_grads_reduced(mpu_optimizer *opt, int reduced);

/*
 * The elements of parameter `index` whose moments this rank keeps, as a
 * shard (mpu/shard.h) of the parameter's local tensor (its shape,
 * mpu_param_buffer_set_shape, or 1-d of numel, as one box at 0): spans [lo,
 * hi) of its elements, each with `at`, the index of element lo in the
 * optimizer's state (m and v). The whole parameter for the plain
 * optimizer, this rank's ZeRO-1 shard of each bucket for the distributed one
 * (mpu_param_buffer_describe gives the same spans within the global tensor).
 * MPU_ERR_INVALID_ARGUMENT, out unchanged, for no such parameter.
 */
MPU_API mpu_result_t mpu_optimizer_param_shard(const mpu_optimizer *opt, int index,
                                               mpu_shard *out);

/*
 * Describe what this rank holds of a buffer's parameters (globals[i]: the
 * global name and shape of parameter i, cut among tp_size ranks by its
 * attributes, mpu_shard_megatron) and, with opt, of their AdamW moments
 * ("<name>.exp_avg", "<name>.exp_avg_sq"), appended to out for a consumer
 * (mpu_ckpt_add_shards). Each parameter is kept whole; its moments where the
 * optimizer keeps them (the whole parameter plain, the ZeRO-1 shard of each
 * bucket distributed). One replica of each element is the writer: plain, the
 * data-parallel rank 0 (dp_rank; opt's own if given) and of a tensor-parallel
 * duplicate tensor-parallel rank 0; ZeRO-1, each rank for its shard (the
 * float32 main weights and moments; tp rank 0 for duplicates).
 */
MPU_API mpu_result_t mpu_param_buffer_describe(const mpu_param_buffer *b,
                                               const mpu_shard_global *globals,
                                               const mpu_optimizer *opt, int tp_size, int dp_rank,
                                               mpu_shard_list *out);

/* ---- activation recompute (Megatron's tensor_parallel.checkpoint) ----------------------- */

/*
 * Drop a block's activations in forward and recompute them in backward with
 * the random streams restored, so that dropout masks agree: recompute_forward
 * saves the state's streams (the default one and every tracked one) and runs
 * forward; recompute_replay puts the saved streams in place, runs forward
 * again (the caller keeps its activations this time and runs the block's
 * backward after), then puts back the streams it found, so randomness after
 * the backward is as without recompute (CheckpointFunction's fwd/bwd RNG
 * states). A refused replay (a record that was never filled, or whose
 * streams are not valid) changes no stream. (Distributed checkpoints, files
 * on disk, are mpu/checkpoint.h's mpu_ckpt_*.)
 */
typedef mpu_result_t (*mpu_block_fn)(void *user);

typedef struct mpu_recompute {
  mpu_rng default_rng;
  mpu_rng_states streams;
  int saved;
} mpu_recompute;

MPU_API mpu_result_t mpu_recompute_forward(mpu_recompute *rc, mpu_state *s, mpu_block_fn forward,
                                           void *user);
MPU_API mpu_result_t mpu_recompute_replay(mpu_recompute *rc, mpu_state *s, mpu_block_fn forward,
                                          void *user);

/* The names of mpu 0.2, kept for one release. */
typedef mpu_recompute mpu_checkpoint MPU_DEPRECATED("use mpu_recompute");
MPU_API mpu_result_t mpu_checkpoint_forward(mpu_recompute *ck, mpu_state *s, mpu_block_fn forward,
                                            void *user) MPU_DEPRECATED("use mpu_recompute_forward");
MPU_API mpu_result_t mpu_checkpoint_recompute(mpu_recompute *ck, mpu_state *s, mpu_block_fn forward,
                                              void *user) MPU_DEPRECATED("use mpu_recompute_replay");

#ifdef __cplusplus
}
#endif

#endif
