/*
 * mpu/state.h - Megatron's parallel state: the layout's groups as real
 * communicators, every getter a training loop asks, seeded random streams,
 * and BioNeMo's testing helpers.
 *
 * A state belongs to one rank. mpu_state_init is collective over the world
 * communicator and makes a communicator for each group this rank belongs to,
 * among that group's members only. The calling thread's "current" state is
 * the one getters use when passed NULL, so code written in Megatron's style
 * (global getters) works after init; a getter with no state returns
 * MPU_ERR_INVALID_USAGE ("not initialized"), never garbage.
 *
 * Answers are those of the original getters right after initialize_model_parallel,
 * with its quirks (docs/state.md lists them). Where Megatron-DeepSpeed's parallel_state.py is plainly buggy
 * this library does what a user expects: get_model_parallel_world_size
 * returns the model-parallel group's size (not None) and get_model_parallel_rank
 * the rank in it (not 0).
 */
#ifndef MPU_STATE_H
#define MPU_STATE_H

#include <stdint.h>

#include "mpu/comm.h"
#include "mpu/layout.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- random streams ------------------------------------------------------------ */

/* A counter-free generator (xoshiro256**), seeded by splitmix64: the same seed
 * gives the same numbers on every backend and machine. */
typedef struct mpu_rng {
  uint64_t s[4];
} mpu_rng;

MPU_API void mpu_rng_seed(mpu_rng *g, uint64_t seed);
MPU_API uint64_t mpu_rng_next(mpu_rng *g);
MPU_API float mpu_rng_uniform(mpu_rng *g);                 /* [0, 1), 24 random bits */
MPU_API float mpu_rng_normal(mpu_rng *g, float mean, float std);

#define MPU_RNG_TRACKER_MAX 8
#define MPU_MODEL_PARALLEL_RNG "model-parallel-rng"   /* seed + 2718 + tp rank */
#define MPU_DATA_PARALLEL_RNG "data-parallel-rng"     /* core: the seed itself */
#define MPU_EXPERT_PARALLEL_RNG "expert-parallel-rng" /* core: seed + 1024 + 100 ep rank + tp rank
                                                        (core-0.19: + the expert tensor rank) */

/* Megatron's RNG state tracker: named streams, each with its own seed. The
 * seeds ever added are remembered apart from the streams (set_states replaces
 * the streams, not the seeds), as Megatron's tracker does. */
typedef struct mpu_rng_tracker {
  int n;
  char names[MPU_RNG_TRACKER_MAX][48];
  mpu_rng rngs[MPU_RNG_TRACKER_MAX];
  int nseeds;
  uint64_t seeds[MPU_RNG_TRACKER_MAX];
} mpu_rng_tracker;

/* Every stream's state by name (Megatron's get_states()/set_states()): what a
 * checkpoint saves, and what recomputing activations restores so that the
 * recomputed dropout masks are the ones of the first pass. */
typedef struct mpu_rng_states {
  int n;
  char names[MPU_RNG_TRACKER_MAX][48];
  mpu_rng rngs[MPU_RNG_TRACKER_MAX];
} mpu_rng_states;

MPU_API void mpu_rng_tracker_reset(mpu_rng_tracker *t);
/* Add a stream; fails if the name or the seed is already there (as Megatron's). */
MPU_API mpu_result_t mpu_rng_tracker_add(mpu_rng_tracker *t, const char *name, uint64_t seed);
/* The stream called name (Megatron's fork(name)); fails if there is none. */
MPU_API mpu_result_t mpu_rng_tracker_fork(mpu_rng_tracker *t, const char *name, mpu_rng **out);
/* A copy of every stream's state; set_states makes the tracker's streams
 * exactly those (the seeds stay remembered). */
MPU_API mpu_result_t mpu_rng_tracker_get_states(const mpu_rng_tracker *t, mpu_rng_states *out);
MPU_API mpu_result_t mpu_rng_tracker_set_states(mpu_rng_tracker *t, const mpu_rng_states *states);

/* ---- the state ------------------------------------------------------------------ */

typedef struct mpu_state mpu_state;

/*
 * initialize_model_parallel: collective over world. cfg->world_size must be
 * world's size (0 takes it from world). The new state becomes this thread's
 * current one. On error nothing is left behind (and every rank fails the same
 * way for a bad config, since the checks are arithmetic).
 */
MPU_API mpu_result_t mpu_state_init(mpu_comm *world, const mpu_layout_config *cfg,
                                    mpu_state **out);

/* destroy_model_parallel: free the communicators and the state (NULL
 * accepted); the thread's current state is cleared if it was this one. */
MPU_API void mpu_state_destroy(mpu_state *s);

/* This thread's current state (NULL if none) and setting it. */
MPU_API mpu_state *mpu_state_current(void);
MPU_API void mpu_state_set_current(mpu_state *s);

/* model_parallel_is_initialized(): is there a state (s, or the current one)? */
MPU_API int mpu_state_is_initialized(const mpu_state *s);

MPU_API const mpu_layout *mpu_state_layout(const mpu_state *s);
MPU_API mpu_comm *mpu_state_world(const mpu_state *s);

/* Everything the getters answer now (overrides and virtual rank applied). */
MPU_API mpu_result_t mpu_state_info(const mpu_state *s, mpu_rank_info *info);

/* The communicator of this rank's group of kind (get_*_group()). Fails if the
 * flavour has no such kind or this rank is in none (embedding groups). */
MPU_API mpu_result_t mpu_state_comm(const mpu_state *s, mpu_group_kind kind, mpu_comm **out);

/* The deepspeed flavour answers MPU_GROUP_DP with the sequence-data group,
 * as Megatron-DeepSpeed's get_data_parallel_group() does (the same group when sp is 1),
 * so the communicator, mpu_state_dp_size and mpu_state_dp_rank agree (the
 * dp src rank stays the plain group's first, as get_data_parallel_src_rank
 * reads _DATA_PARALLEL_GLOBAL_RANKS); this is the plain data-parallel group
 * (_DATA_PARALLEL_GROUP) under its own name. */
MPU_API mpu_result_t mpu_state_plain_dp_comm(const mpu_state *s, mpu_comm **out);

/*
 * Give every group of this rank an NCCL communicator over its host one (the
 * collective of all ranks of the state's world, as init is): afterwards
 * mpu_state_comm returns the NCCL communicators (device buffers) and
 * mpu_state_host_comm the host twins ("gloo" groups, for CPU-side work).
 * options may be NULL; its device, if set, is this rank's device for every
 * group. On failure no NCCL communicator is left. MPU_ERR_UNSUPPORTED
 * without the NCCL backend.
 */
MPU_API mpu_result_t mpu_state_enable_nccl(mpu_state *s, const mpu_nccl_options *options);

/* The host communicator of this rank's group of kind (the one mpu_state_comm
 * returns when NCCL is not enabled). */
MPU_API mpu_result_t mpu_state_host_comm(const mpu_state *s, mpu_group_kind kind, mpu_comm **out);

/* Rank and size in this rank's group of kind (torch's get_rank/get_world_size(group)). */
MPU_API mpu_result_t mpu_state_group_rank(const mpu_state *s, mpu_group_kind kind, int *rank);
MPU_API mpu_result_t mpu_state_group_size(const mpu_state *s, mpu_group_kind kind, int *size);

/* The source rank of this rank's group of kind: the global rank broadcasts
 * start from (get_*_src_rank). As the originals compute it: the group's first
 * member, except deepspeed's tp and sp, which are (rank // size) * size. */
MPU_API mpu_result_t mpu_state_src_rank(const mpu_state *s, mpu_group_kind kind, int *rank);

/* The getters, Megatron's names in C (s may be NULL: the current state). */
MPU_API mpu_result_t mpu_state_tp_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_tp_size(const mpu_state *s, int *size);
MPU_API mpu_result_t mpu_state_tp_src_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_pp_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_pp_size(const mpu_state *s, int *size);
MPU_API mpu_result_t mpu_state_dp_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_dp_size(const mpu_state *s, int *size);
MPU_API mpu_result_t mpu_state_dp_src_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_mp_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_mp_size(const mpu_state *s, int *size);
/* core flavours: context, expert, expert tensor (core_v0.8.0: the tensor
 * group's, as its fallback) and expert data parallel rank and size */
MPU_API mpu_result_t mpu_state_cp_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_cp_size(const mpu_state *s, int *size);
MPU_API mpu_result_t mpu_state_ep_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_ep_size(const mpu_state *s, int *size);
MPU_API mpu_result_t mpu_state_etp_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_etp_size(const mpu_state *s, int *size);
MPU_API mpu_result_t mpu_state_edp_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_edp_size(const mpu_state *s, int *size);
MPU_API mpu_result_t mpu_state_is_pp_first_stage(const mpu_state *s, int ignore_virtual, int *yes);
MPU_API mpu_result_t mpu_state_is_pp_last_stage(const mpu_state *s, int ignore_virtual, int *yes);
MPU_API mpu_result_t mpu_state_pp_first_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_pp_last_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_pp_next_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_pp_prev_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_is_stage_before_split(const mpu_state *s, int stage, int *yes);
MPU_API mpu_result_t mpu_state_is_stage_after_split(const mpu_state *s, int stage, int *yes);
MPU_API mpu_result_t mpu_state_is_stage_at_split(const mpu_state *s, int *yes);
MPU_API mpu_result_t mpu_state_in_embedding_group(const mpu_state *s, int ignore_virtual, int *yes);
MPU_API mpu_result_t mpu_state_in_position_embedding_group(const mpu_state *s, int *yes);

/* Virtual pipeline rank and size (-1: none) and their setters. */
MPU_API mpu_result_t mpu_state_vp_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_vp_size(const mpu_state *s, int *size);
MPU_API mpu_result_t mpu_state_set_vp_rank(mpu_state *s, int rank);
MPU_API mpu_result_t mpu_state_set_vp_size(mpu_state *s, int size);
MPU_API mpu_result_t mpu_state_split_rank(const mpu_state *s, int *rank); /* -1: none */
MPU_API mpu_result_t mpu_state_set_split_rank(mpu_state *s, int rank);

/* The _MPU_* overrides Megatron keeps for changing sizes on the fly: once
 * set, the tp/pp rank and size getters (and what derives from them) answer
 * with them. -1 clears an override. */
MPU_API mpu_result_t mpu_state_set_tp_size(mpu_state *s, int size);
MPU_API mpu_result_t mpu_state_set_tp_rank(mpu_state *s, int rank);
MPU_API mpu_result_t mpu_state_set_pp_size(mpu_state *s, int size);
MPU_API mpu_result_t mpu_state_set_pp_rank(mpu_state *s, int rank);

/*
 * Megatron-DeepSpeed's parallel_state.py: sequence parallelism, training and eval mode.
 * initialize_model_parallel leaves training mode on and sets the sequence-
 * parallel size override to sp (every rank: the assignment follows the group
 * loop), so:
 *   sp_size   the override if set, else training ? the sp group's size : 1
 *   sp_rank   the override if set (none at init), else training ? the rank in the sp group : 0
 *   sdp_size, sdp_rank   the override if set, else the sequence-data group's
 *             (mpu_state_dp_size follows the sdp size override, as
 *             get_data_parallel_world_size does)
 *   sp_src_rank   (rank / sp_size) * sp_size, with sp_size as above
 * so eval mode answers sp rank 0 but still the sp size, until
 * mpu_state_set_sp_size(s, -1) clears the override (-1 is Python's None for
 * every setter here). The sp/sdp calls are the deepspeed flavour's; on a
 * core state they return MPU_ERR_INVALID_ARGUMENT. Training mode is kept for
 * either flavour.
 */
MPU_API mpu_result_t mpu_state_is_training_mode(const mpu_state *s, int *yes);
MPU_API mpu_result_t mpu_state_set_training_mode(mpu_state *s);
MPU_API mpu_result_t mpu_state_set_eval_mode(mpu_state *s);
MPU_API mpu_result_t mpu_state_sp_size(const mpu_state *s, int *size);
MPU_API mpu_result_t mpu_state_sp_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_sp_src_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_sdp_size(const mpu_state *s, int *size);
MPU_API mpu_result_t mpu_state_sdp_rank(const mpu_state *s, int *rank);
MPU_API mpu_result_t mpu_state_set_sp_size(mpu_state *s, int size);
MPU_API mpu_result_t mpu_state_set_sp_rank(mpu_state *s, int rank);
MPU_API mpu_result_t mpu_state_set_sdp_size(mpu_state *s, int size);
MPU_API mpu_result_t mpu_state_set_sdp_rank(mpu_state *s, int rank);
/* sequence_parallel_is_initialized / sequence_data_parallel_is_initialized:
 * 1 for a live deepspeed state (s or the current one), else 0.
 * is_unitialized (sic): 1 when there is no live state to answer. */
MPU_API int mpu_state_sp_is_initialized(const mpu_state *s);
MPU_API int mpu_state_sdp_is_initialized(const mpu_state *s);
MPU_API int mpu_state_is_uninitialized(const mpu_state *s);

/* model_parallel_cuda_manual_seed, on CPU streams: the default stream gets
 * seed (equal on all ranks of a tensor-parallel group), the tracker's
 * "model-parallel-rng" stream seed + 2718 + tp rank (and, for the core
 * flavour, the data- and expert-parallel streams; docs/state.md). */
MPU_API mpu_result_t mpu_state_manual_seed(mpu_state *s, uint64_t seed);

/*
 * get_global_memory_buffer().get_tensor(shape, dtype, name): a per-state
 * scratch arena. The buffer for (name, dtype) is reused across calls and
 * grows when a larger shape asks; *out is a view of its first elements with
 * that shape (owns_data 0, contents whatever was there). A grown buffer's old
 * memory stays valid until mpu_state_destroy, so earlier views never dangle
 * (Megatron's old tensor lives on while referenced). name: 1..63 characters.
 */
MPU_API mpu_result_t mpu_state_memory_buffer(mpu_state *s, const char *name, mpu_dtype dtype,
                                             int ndim, const int64_t *shape, mpu_tensor *out);
MPU_API mpu_rng *mpu_state_default_rng(mpu_state *s);
MPU_API mpu_rng_tracker *mpu_state_rng_tracker(mpu_state *s);

/* ---- testing helpers (BioNeMo's megatron_parallel_state_utils) -------------------- */

/* The function a with-state test runs on each rank, inside a fresh state. */
typedef mpu_result_t (*mpu_state_fn)(mpu_state *state, void *arg);

/*
 * distributed_model_parallel_state: run fn on nranks thread ranks, each inside
 * a freshly initialised state of cfg seeded with seed (cfg->world_size 0 or
 * nranks: a config that names another world is MPU_ERR_INVALID_ARGUMENT),
 * and always destroy it afterwards, whether fn succeeds, fails or a rank
 * aborts, so the next test starts clean. Returns as mpu_launch does.
 */
MPU_API mpu_result_t mpu_with_state(int nranks, const mpu_layout_config *cfg, uint64_t seed,
                                    mpu_state_fn fn, void *arg, mpu_result_t *results,
                                    const mpu_launch_options *options);

/*
 * The same around ranks that already run (the processes of an MPI job, the
 * caller's own threads): collective over world, every rank calls it with the
 * same config. Builds a state over world (cfg->world_size 0 takes world's
 * size), seeds it, runs fn, destroys the state whatever fn returned, and
 * gives back the state that was current on this thread before, with its
 * random streams (default and tracked) as they were, as BioNeMo's helpers
 * restore the RNG state they found (fn must not destroy that state). Both
 * helpers do. world stays the caller's.
 */
MPU_API mpu_result_t mpu_with_state_on(mpu_comm *world, const mpu_layout_config *cfg,
                                       uint64_t seed, mpu_state_fn fn, void *arg);

/*
 * mock_distributed_parallel_state: this thread becomes rank `rank` of a world
 * of cfg->world_size on the fake backend (no data moves), with a state whose
 * getters answer as that rank would; it becomes the current state. Free it
 * with mpu_state_destroy (which also frees the fake world).
 */
MPU_API mpu_result_t mpu_state_mock(int rank, const mpu_layout_config *cfg, uint64_t seed,
                                    mpu_state **out);

/* clean_parallel_state_context: destroy this thread's current state, if any. */
MPU_API void mpu_state_reset(void);

#ifdef __cplusplus
}
#endif

#endif
