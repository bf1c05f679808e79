/*
 * state_internal.h - one rank's parallel state, shared by the files of
 * src/state that do its jobs: lifecycle.c (init, config agreement, NCCL
 * groups, destroy, the registry of live states), getters.c (the getters and
 * setters with Megatron's rules), rng.c (random streams, the tracker and the
 * state's seeding), memory.c (the global memory buffer), testing.c (the
 * BioNeMo-style helpers).
 */
#ifndef MPU_STATE_INTERNAL_H
#define MPU_STATE_INTERNAL_H

#include <stdint.h>

#include "mpu/state.h"

#define STATE_MAGIC UINT64_C(0x6d70752d73746174) /* "mpu-stat" */

struct mpu_state {
  uint64_t magic;
  mpu_layout *layout;
  mpu_comm *world;
  int owns_world;                        /* the mock's fake world */
  mpu_rank_info base;                    /* the getters' answers at init */
  mpu_comm *comms[MPU_GROUP_KIND_COUNT]; /* NULL where this rank has no group */
  mpu_comm *nccl[MPU_GROUP_KIND_COUNT];  /* after mpu_state_enable_nccl: over comms[k] */
  unsigned char borrowed[MPU_GROUP_KIND_COUNT]; /* comms[k] is an alias's (mpu_layout_alias_of) */
  int *pipe;                             /* this rank's pipeline, global ranks */
  int vp_rank, vp_size, split_rank;      /* -1: None */
  int tp_size_ov, tp_rank_ov, pp_size_ov, pp_rank_ov; /* -1: not overridden */
  int sp_size_ov, sp_rank_ov, sdp_size_ov, sdp_rank_ov; /* Megatron-DeepSpeed's; -1: None */
  int training;                          /* Megatron-DeepSpeed's _TRAINING_MODE */
  mpu_rng default_rng;
  mpu_rng_tracker tracker;
  struct scratch *buffers, *retired;     /* mpu_state_memory_buffer's, by (name, dtype) */
  mpu_state *next_live;                  /* the registry of live states (lifecycle.c) */
};

/* One buffer of the global memory buffer. */
typedef struct scratch {
  struct scratch *next;
  char name[64];
  mpu_dtype dtype;
  size_t numel;
  void *data;
} scratch;

/* The calling thread's current state (mpu_state_current); may name a
 * destroyed one: check it with mpu__state_is_live before reading it. */
extern _Thread_local mpu_state *mpu__state_current;

/* ---- the registry of live states (lifecycle.c) ----
 * Every entry point looks its state up here, comparing pointers only, before
 * it reads anything through it: a destroyed state is an error, never read. */
void mpu__state_live_add(mpu_state *s);
int mpu__state_is_live(const mpu_state *s);

/* s, or the current state, when live; MPU_ERR_INVALID_USAGE if neither. */
mpu_result_t mpu__state_resolve(const char *fn, const mpu_state *s, const mpu_state **out);
mpu_result_t mpu__state_mutable(const char *fn, mpu_state *s, mpu_state **out);

/* memory.c: free a list of buffers */
void mpu__state_scratch_free(struct scratch *b);

/* getters.c: the tensor-parallel rank the getters answer (overrides applied) */
int mpu__state_tp_rank(const mpu_state *s);

#endif
