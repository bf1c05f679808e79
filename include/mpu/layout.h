/*
 * mpu/layout.h - Megatron's rank groups, by arithmetic.
 *
 * From a world size and the parallel sizes, the exact groups Megatron builds,
 * in two flavours:
 *
 *   deepspeed  Megatron-DeepSpeed's parallel_state (the Habana/Intel fork):
 *              tensor, pipeline (virtual stages, encoder/decoder split rank),
 *              data, DeepSpeed-Ulysses sequence (sp) and sequence-data (sdp),
 *              model, embedding, position-embedding and FP8 amax groups.
 *   core       Megatron-LM core (core_v0.8.0): the RankGenerator over an order
 *              string (default "tp-cp-ep-dp-pp", first token varying fastest),
 *              with context (cp) and expert (ep) parallelism.
 *
 * Nothing here communicates. One rank's groups are computed in O(their
 * sizes), never by enumerating the world, so any rank of a million-rank
 * layout is answered in microseconds; the whole world is enumerated only by
 * mpu_layout_group_at, for tools that print every group.
 *
 * A group's members are listed in the order Megatron passes them to
 * new_group, so a rank's index in the list is its torch.distributed rank in
 * that group.
 */
#ifndef MPU_LAYOUT_H
#define MPU_LAYOUT_H

#include <stddef.h>

#include "mpu/result.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mpu_flavor { MPU_FLAVOR_DEEPSPEED = 0, MPU_FLAVOR_CORE = 1 } mpu_flavor;

typedef struct mpu_layout_config {
  size_t size;       /* sizeof(mpu_layout_config), set by the initializer */
  mpu_flavor flavor;
  int world_size;    /* 0 (the default): the communicator's size, in mpu_state_init;
                        mpu_layout_create, which has no communicator, needs it set */
  int tp;            /* tensor_model_parallel_size */
  int pp;            /* pipeline_model_parallel_size */
  int vp;            /* virtual_pipeline_model_parallel_size; 0 = None */
  int split_rank;    /* pipeline_model_parallel_split_rank; -1 = None */
  int sp;            /* deepspeed: sequence_parallel_size (DeepSpeed-Ulysses) */
  int cp;            /* core: context_parallel_size */
  int ep;            /* core: expert_model_parallel_size */
  int fp8;           /* deepspeed: build the FP8 amax reduction groups */
  char order[64];    /* core: "" means "tp-cp-ep-dp-pp" */
} mpu_layout_config;

/* The size of this struct's first version (every field up to order): a
 * program built against it keeps working; newer fields take their defaults. */
#define MPU_LAYOUT_CONFIG_MIN_SIZE sizeof(mpu_layout_config)

#define MPU_LAYOUT_CONFIG_INIT \
  {sizeof(mpu_layout_config), MPU_FLAVOR_CORE, 0, 1, 1, 0, -1, 1, 1, 1, 0, ""}

/* Group kinds. Each flavour builds some of them (mpu_layout_has). */
typedef enum mpu_group_kind {
  MPU_GROUP_DP = 0,             /* data parallel (both) */
  MPU_GROUP_TP,                 /* tensor model parallel (both) */
  MPU_GROUP_PP,                 /* pipeline model parallel (both) */
  MPU_GROUP_MP,                 /* model parallel: deepspeed "mp", core "tp_pp" */
  MPU_GROUP_EMBEDDING,          /* first, (split,) last stage of each pipeline (both) */
  MPU_GROUP_POSITION_EMBEDDING, /* first (and split) stage of each pipeline (both) */
  MPU_GROUP_SP,                 /* deepspeed: sequence parallel */
  MPU_GROUP_SDP,                /* deepspeed: sequence + data parallel */
  MPU_GROUP_AMAX,               /* deepspeed: FP8 amax reduction (only with fp8) */
  MPU_GROUP_DP_CP,              /* core: data + context parallel */
  MPU_GROUP_CP,                 /* core: context parallel */
  MPU_GROUP_TP_EP_PP,           /* core: model + expert parallel */
  MPU_GROUP_TP_DP_CP,           /* core: tensor + data + context (FP8 amax with cp) */
  MPU_GROUP_TP_DP,              /* core: tensor + data */
  MPU_GROUP_TP_CP,              /* core: tensor + context */
  MPU_GROUP_TP_EP,              /* core: tensor + expert */
  MPU_GROUP_EP,                 /* core: expert */
  MPU_GROUP_DP_MODULO_EP,       /* core: data modulo expert */
  MPU_GROUP_DP_CP_MODULO_EP,    /* core: data + context modulo expert */
  MPU_GROUP_KIND_COUNT
} mpu_group_kind;

/* "dp", "tp", ..., "tp_pp" for core's model-parallel group, "mp" for
 * deepspeed's: the names mpu plan prints. */
MPU_API const char *mpu_group_kind_name(mpu_flavor flavor, mpu_group_kind kind);

/* "deepspeed" / "core"; and back. */
MPU_API const char *mpu_flavor_name(mpu_flavor flavor);
MPU_API mpu_result_t mpu_flavor_from_name(const char *name, mpu_flavor *out);

typedef struct mpu_layout mpu_layout;

/*
 * Check cfg as the original initialize_model_parallel does, in the same
 * order and with its messages (the first failing check wins), then make the
 * layout. Also refused, where Python would fail later or not at all: sizes
 * below 1, a split rank outside 0..pp-1, an order string with unknown or
 * repeated tokens. On error *out is unchanged.
 */
MPU_API mpu_result_t mpu_layout_create(const mpu_layout_config *cfg, mpu_layout **out);
MPU_API void mpu_layout_free(mpu_layout *layout);

/* The config the layout was made from, with derived dp filled in. */
MPU_API const mpu_layout_config *mpu_layout_config_of(const mpu_layout *layout);
MPU_API int mpu_layout_dp(const mpu_layout *layout); /* data_parallel_size */

/* Does this flavour (and config: amax needs fp8) build groups of kind? */
MPU_API int mpu_layout_has(const mpu_layout *layout, mpu_group_kind kind);

/* The most members a group of kind can have (the size to give out[]). */
MPU_API int mpu_layout_max_group_size(const mpu_layout *layout, mpu_group_kind kind);

/*
 * The group of kind containing rank, in Megatron's member order; *n = 0 if
 * rank is in none (embedding groups hold only some ranks). O(group size).
 */
MPU_API mpu_result_t mpu_layout_group(const mpu_layout *layout, mpu_group_kind kind, int rank,
                                      int *out, size_t cap, int *n);

/* Where rank sits in its group of kind without listing it: *pos (its rank
 * in the group), *size, *first (the group's member 0). O(1) for deepspeed,
 * O(dims) for core. Not for the embedding kinds (use mpu_layout_group). */
MPU_API mpu_result_t mpu_layout_locate(const mpu_layout *layout, mpu_group_kind kind, int rank,
                                       int *pos, int *size, int *first);

/* Every group of kind, in the order Megatron creates them: count, then each. */
MPU_API mpu_result_t mpu_layout_num_groups(const mpu_layout *layout, mpu_group_kind kind,
                                           int *count);
MPU_API mpu_result_t mpu_layout_group_at(const mpu_layout *layout, mpu_group_kind kind,
                                         int index, int *out, size_t cap, int *n);

/* What every getter of parallel_state answers for one rank, right after
 * initialisation (virtual pipeline rank 0 where vp is set). */
typedef struct mpu_rank_info {
  size_t size;                             /* sizeof(mpu_rank_info): set it (MPU_RANK_INFO_INIT) */
  int rank;
  int tp_rank, tp_size, tp_src;
  int pp_rank, pp_size;
  int pp_first, pp_last, pp_next, pp_prev; /* global ranks in this rank's pipeline */
  int dp_rank, dp_size, dp_src;
  int vp_rank, vp_size;                    /* -1, -1 when vp is None */
  int embedding_global_ranks[3], n_embedding;
  int in_embedding_group;                  /* is_rank_in_embedding_group() */
  int position_embedding_global_ranks[2], n_position_embedding;
  int in_position_embedding_group;
  /* deepspeed */
  int is_first_stage, is_last_stage;       /* ignoring virtual stages */
  int sp_rank, sp_size, sp_src;
  int sdp_rank, sdp_size;
  int mp_rank, mp_size;
  int stage_before_split, stage_after_split, stage_at_split;
  /* core */
  int dp_cp_rank, dp_cp_size, dp_cp_src;
  int cp_rank, cp_size;
  int ep_rank, ep_size, tp_ep_rank;
  int dp_modulo_ep_rank, dp_modulo_ep_size;
} mpu_rank_info;

/* Start every mpu_rank_info from this: the library fills as much as the
 * caller's version of the struct holds, so it can grow. */
#define MPU_RANK_INFO_INIT {.size = sizeof(mpu_rank_info)}
#define MPU_RANK_INFO_MIN_SIZE sizeof(mpu_rank_info)

/* Every getter's answer for rank, in O(the sizes of its groups). */
MPU_API mpu_result_t mpu_layout_rank_info(const mpu_layout *layout, int rank,
                                          mpu_rank_info *info);

/* Parse "tp-cp-ep-dp-pp" style orders and the sizes of a config from
 * "key=value" text ("world_size=8 tp=2 pp=2 order=tp-dp-pp"), for tools and
 * the fuzz target. Unknown keys and malformed values are errors. */
MPU_API mpu_result_t mpu_layout_config_parse(const char *text, mpu_layout_config *cfg);

#ifdef __cplusplus
}
#endif

#endif
