/*
 * mpu/schedule.h - Megatron's pipeline schedules as orders of work.
 *
 * What each pipeline rank runs, in order, under the three schedules of
 * megatron/core/pipeline_parallel/schedules.py (core_v0.19.0):
 *
 *   no pipelining  forward_backward_no_pipelining: F0 B0 F1 B1 ... (gradient accumulation)
 *   1F1B           forward_backward_pipelining_without_interleaving: pp - rank - 1
 *                  warm-up forwards, then one forward and one backward at a
 *                  time, then the cool-down backwards
 *   interleaved    forward_backward_pipelining_with_interleaving: vp model
 *                  chunks per rank, micro-batches taken in groups of
 *                  group_size per chunk (get_schedule_table), 2 (pp - rank - 1)
 *                  + (vp - 1) group_size warm-up forwards, backwards on the
 *                  chunks in reverse
 *
 * and a timeline of them (each rank runs its order, a step starting once the
 * steps it needs are done: a forward the previous virtual stage's forward of
 * the same micro-batch, a backward the next virtual stage's backward and its
 * own forward), with the bubble it leaves. Nothing here communicates; the
 * order is what a schedule runner (or a test) follows.
 */
#ifndef MPU_SCHEDULE_H
#define MPU_SCHEDULE_H

#include <stddef.h>
#include <stdio.h>

#include "mpu/comm.h"
#include "mpu/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mpu_schedule_kind {
  MPU_SCHEDULE_NO_PIPELINING = 0,
  MPU_SCHEDULE_1F1B = 1,
  MPU_SCHEDULE_INTERLEAVED = 2
} mpu_schedule_kind;

typedef struct mpu_schedule_config {
  size_t size;            /* sizeof(mpu_schedule_config), set by the initializer */
  mpu_schedule_kind kind;
  int pp;                 /* pipeline stages (no pipelining: 1) */
  int vp;                 /* model chunks per rank (interleaved; others: 1) */
  int microbatches;       /* num_microbatches */
  int group_size;         /* microbatch_group_size_per_vp_stage; 0 = pp (Megatron's default) */
  int forward_only;
  double backward_cost;   /* the timeline's backward time, forward = 1 (default 2) */
} mpu_schedule_config;

#define MPU_SCHEDULE_CONFIG_INIT                                                    \
  {.size = sizeof(mpu_schedule_config), .kind = MPU_SCHEDULE_1F1B, .pp = 1, .vp = 1, \
   .microbatches = 1, .backward_cost = 2.0}

/* The most steps (forwards and backwards of every stage together) a
 * schedule may have: more than Megatron's large runs take (pp 32 x vp 4 x 4096
 * micro-batches is 2^20), and a timeline of 8 MiB. Larger configs are refused,
 * before any allocation. */
#define MPU_SCHEDULE_MAX_STEPS (1 << 20)

/* One step of a rank's order. */
typedef struct mpu_schedule_step {
  char phase;             /* 'F' forward or 'B' backward */
  int microbatch;         /* the micro-batch's number, 0..microbatches-1 */
  int chunk;              /* the model chunk on this rank, 0..vp-1 */
} mpu_schedule_step;

/* "no-pipelining", "1f1b", "interleaved"; and back. */
MPU_API const char *mpu_schedule_name(mpu_schedule_kind kind);
MPU_API mpu_result_t mpu_schedule_from_name(const char *name, mpu_schedule_kind *out);

/*
 * Check cfg as Megatron does (its messages; the interleaved schedule's
 * group_size must lie in pp..microbatches, and the last group hold 0 or at
 * least pp micro-batches) and count pp_rank's steps: *n (2 microbatches x vp,
 * or microbatches x vp forward only) and *warmup (the forwards before the
 * first backward).
 */
MPU_API mpu_result_t mpu_schedule_count(const mpu_schedule_config *cfg, int pp_rank, int *n,
                                        int *warmup);

/* pp_rank's steps in the order the schedule runs them; out holds cap. */
MPU_API mpu_result_t mpu_schedule_order(const mpu_schedule_config *cfg, int pp_rank,
                                        mpu_schedule_step *out, size_t cap, int *n);

/*
 * Every rank's timeline: start[r][i] is when rank r starts its step i
 * (arrays of pp pointers, each to mpu_schedule_count's n values; NULL
 * skips), *makespan when the last step ends, *bubble the idle share of the
 * ideal time ((makespan - busy) / busy, busy = one rank's work), to compare
 * with the analytic (pp - 1) / (vp * microbatches).
 */
MPU_API mpu_result_t mpu_schedule_timeline(const mpu_schedule_config *cfg, double **start,
                                           double *makespan, double *bubble);

/* ---- running a schedule over the pipeline group ---------------------------------------- */

/*
 * The model's side of a schedule, called in the schedule's order. chunk c on
 * pipeline rank r is virtual stage c x pp + r of V = pp x vp.
 *   forward   input is the previous virtual stage's output for this
 *             micro-batch (NULL on virtual stage 0: the callback reads its own
 *             data); fill output (ignored on the last virtual stage, whose
 *             callback computes the loss)
 *   backward  grad_output is the gradient of this stage's output (NULL on the
 *             last virtual stage: the loss's own); fill grad_input (NULL on
 *             virtual stage 0), and accumulate the parameters' gradients
 * The callbacks keep what backward needs per (micro-batch, chunk); a
 * micro-batch's backward on a chunk comes after its forward, and each
 * chunk's backwards come in micro-batch order. These take float32 buffers
 * of the pipeline's count (mpu_pipeline_create); mpu_pipeline_tensor_callbacks
 * take any dtype and shape.
 */
typedef struct mpu_pipeline_callbacks {
  mpu_result_t (*forward)(void *user, int microbatch, int chunk, const float *input,
                          float *output);
  mpu_result_t (*backward)(void *user, int microbatch, int chunk, const float *grad_output,
                           float *grad_input);
  void *user;
} mpu_pipeline_callbacks;

/*
 * The same, with views: each tensor's data is the pipeline's buffer, its
 * dtype and shape those of the boundary it crosses (mpu_pipeline_config).
 * Virtual stage v reads boundary v - 1 (input, grad_input's shape) and writes
 * boundary v (output, grad_output's shape). input and grad_input are NULL on
 * virtual stage 0, output and grad_output NULL on the last. The callback
 * fills output's (grad_input's) data and must not change the view itself.
 */
typedef struct mpu_pipeline_tensor_callbacks {
  mpu_result_t (*forward)(void *user, int microbatch, int chunk, const mpu_tensor *input,
                          const mpu_tensor *output);
  mpu_result_t (*backward)(void *user, int microbatch, int chunk, const mpu_tensor *grad_output,
                           const mpu_tensor *grad_input);
  void *user;
} mpu_pipeline_tensor_callbacks;

/*
 * What crosses the boundaries between virtual stages (Megatron's
 * tensor_shape and pipeline_dtype): one dtype and shape for every boundary
 * (nboundaries 0), or one per boundary, boundaries[b] for virtual stage b to
 * b + 1 (nboundaries = pp x vp - 1 of the schedule it runs; only each
 * view's dtype, ndim and shape are read). Every boundary carries 1 to 2^34
 * elements; activations and gradients of a boundary are alike.
 */
typedef struct mpu_pipeline_config {
  size_t size;                        /* sizeof(mpu_pipeline_config), set by the initializer */
  mpu_dtype dtype;                    /* every boundary's (nboundaries 0) */
  int ndim;                           /* 1..MPU_TENSOR_MAX_DIMS */
  int64_t shape[MPU_TENSOR_MAX_DIMS]; /* e.g. (seq_length, micro_batch_size, hidden_size) */
  int nboundaries;                    /* 0, or the schedule's pp x vp - 1 (at most 4096) */
  const mpu_tensor *boundaries;       /* [nboundaries], copied by mpu_pipeline_create_ex */
} mpu_pipeline_config;

#define MPU_PIPELINE_CONFIG_INIT {.size = sizeof(mpu_pipeline_config), .dtype = MPU_FLOAT32}

typedef struct mpu_pipeline mpu_pipeline;

/*
 * Collective over the pipeline group: a runner whose stages exchange
 * activations and gradients as cfg describes, over two communicators of the
 * group's members (one for activations, one for gradients, so each direction
 * between two ranks carries one stream in order). Any backend: a step's
 * send and the next step's receive are one group (mpu_group_start/end), so
 * NCCL's sends, which complete only when the peer receives, cannot wait on
 * each other. The buffers are the group's memory (mpu_comm_mem_alloc), as
 * large as the largest boundary: on an NCCL group the callbacks' tensors
 * are device memory on the rank's GPU, moved by ncclSend/ncclRecv of their
 * own dtype on the group's stream.
 * mpu_pipeline_create(g, count, out) is the float32 pipeline of `count`
 * elements at every boundary (shape (count)).
 */
MPU_API mpu_result_t mpu_pipeline_create(mpu_comm *pp_group, size_t count, mpu_pipeline **out);
MPU_API mpu_result_t mpu_pipeline_create_ex(mpu_comm *pp_group, const mpu_pipeline_config *cfg,
                                            mpu_pipeline **out);

/*
 * Run cfg's schedule on this rank (cfg->pp must be the group's size): its
 * order (mpu_schedule_order), receiving before and sending after each step.
 * trace, if not NULL, gets a line per step ("stage 1: F 3.0 recv 0 send 2").
 * mpu_pipeline_run takes float callbacks and a pipeline whose boundaries
 * are all float32; mpu_pipeline_run_tensors any pipeline. A pipeline made
 * with one entry per boundary runs schedules of that many boundaries only.
 */
MPU_API mpu_result_t mpu_pipeline_run(mpu_pipeline *p, const mpu_schedule_config *cfg,
                                      const mpu_pipeline_callbacks *cb, FILE *trace);
MPU_API mpu_result_t mpu_pipeline_run_tensors(mpu_pipeline *p, const mpu_schedule_config *cfg,
                                              const mpu_pipeline_tensor_callbacks *cb,
                                              FILE *trace);
MPU_API void mpu_pipeline_free(mpu_pipeline *p);

#ifdef __cplusplus
}
#endif

#endif
