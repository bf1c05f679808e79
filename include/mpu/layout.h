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
 *   core-0.19  Megatron-LM core_v0.19.0 (the layout since core_v0.10): two rank
 *              generators over one order, the dense one (tp, cp, dp, pp) and
 *              the expert one (etp, ep, expert dp, pp), hierarchical context
 *              parallelism, distributed-optimizer instances, gloo twins of
 *              the data-parallel groups, and grids at a rank offset.
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

typedef enum mpu_flavor {
  MPU_FLAVOR_DEEPSPEED = 0,
  MPU_FLAVOR_CORE = 1,
  MPU_FLAVOR_CORE_019 = 2
} mpu_flavor;

#define MPU_HCP_MAX_LEVELS 8

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
  /* core-0.19 only (the other flavours refuse values other than these defaults) */
  int etp;                      /* expert_tensor_parallel_size; 0 = None (= tp) */
  int hcp[MPU_HCP_MAX_LEVELS];  /* hierarchical_context_parallel_sizes ... */
  int n_hcp;                    /* ... how many; 0 = None */
  int dist_opt_instances;       /* num_distributed_optimizer_instances (1) */
  int gloo;                     /* create_gloo_process_groups (1 = True) */
  int rank_offset;              /* the grid's first rank (0; <= 0 means none, as the original) */
  int local_world_size;         /* the grid's size; 0 = None (the world size) */
} mpu_layout_config;

/* The size of this struct's first version (every field up to order): a
 * program built against it keeps working; newer fields take their defaults. */
#define MPU_LAYOUT_CONFIG_MIN_SIZE offsetof(mpu_layout_config, etp)

#define MPU_LAYOUT_CONFIG_INIT                                                           \
  {.size = sizeof(mpu_layout_config), .flavor = MPU_FLAVOR_CORE, .tp = 1, .pp = 1,       \
   .split_rank = -1, .sp = 1, .cp = 1, .ep = 1, .dist_opt_instances = 1, .gloo = 1}

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
  /* core-0.19. It reuses TP_EP ("etp_ep"), TP_EP_PP ("etp_ep_pp") and
   * DP_MODULO_EP ("edp") for the expert generator's groups, MP ("mp") */
  MPU_GROUP_ETP,                      /* expert tensor parallel */
  MPU_GROUP_INTRA_PARTIAL_DP_CP,      /* a distributed-optimizer instance's share of dp_cp */
  MPU_GROUP_INTRA_PARTIAL_EDP,        /* ... of the expert data-parallel group */
  MPU_GROUP_INTER_PARTIAL_EDP,        /* across instances (only with more than one) */
  MPU_GROUP_INTRA_DIST_OPT_INSTANCE,  /* every rank of one instance */
  MPU_GROUP_HCP_L0,                   /* hierarchical context parallel, level 0 ... */
  MPU_GROUP_HCP_LAST = MPU_GROUP_HCP_L0 + MPU_HCP_MAX_LEVELS - 1,
  MPU_GROUP_DP_GLOO,                  /* gloo twins: host groups of the same members */
  MPU_GROUP_DP_CP_GLOO,
  MPU_GROUP_INTRA_PARTIAL_DP_CP_GLOO,
  MPU_GROUP_EDP_GLOO,
  MPU_GROUP_INTRA_PARTIAL_EDP_GLOO,
  MPU_GROUP_KIND_COUNT
} mpu_group_kind;

/* Is kind a gloo twin (a host-memory group that a device backend leaves on
 * the host)? */
MPU_API int mpu_group_kind_is_gloo(mpu_group_kind kind);

/* "dp", "tp", ..., "tp_pp" for core's model-parallel group, "mp" for
 * deepspeed's and core-0.19's: the names mpu plan prints. */
MPU_API const char *mpu_group_kind_name(mpu_flavor flavor, mpu_group_kind kind);

/* "deepspeed" / "core" / "core-0.19"; and back. */
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

/* The grid the groups cover: world ranks *first .. *first + *size - 1
 * (core-0.19's rank_offset and local_world_size; the whole world otherwise). */
MPU_API void mpu_layout_grid(const mpu_layout *layout, int *first, int *size);

/* The expert grid's tensor and data parallel sizes: core-0.19's expert
 * generator (etp, edp); core's tp and dp / ep; 0 and 0 for deepspeed. */
MPU_API void mpu_layout_experts(const mpu_layout *layout, int *etp, int *edp);

/* Does this flavour (and config: amax needs fp8, inter_partial_edp more than
 * one distributed-optimizer instance, hcp_lK K+1 levels, gloo twins gloo)
 * build groups of kind? */
MPU_API int mpu_layout_has(const mpu_layout *layout, mpu_group_kind kind);

/* The kind whose process groups kind's are (the original assigns one global
 * to another: with one distributed-optimizer instance the intra-partial
 * groups are the full data-parallel ones); kind itself otherwise. A state
 * gives both kinds one communicator. */
MPU_API mpu_group_kind mpu_layout_alias_of(const mpu_layout *layout, mpu_group_kind kind);

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
  /* core and core-0.19 (added later: fill as much as info->size holds) */
  int in_grid;                             /* core-0.19: is rank in [offset, offset + grid)? */
  int mp_src, ep_src;
  int tp_cp_rank, tp_cp_size, tp_dp_rank, tp_dp_size, tp_dp_cp_rank, tp_dp_cp_size;
  int etp_rank, etp_size, etp_ep_rank, etp_ep_size, etp_ep_pp_rank, etp_ep_pp_size;
  int edp_rank, edp_size;                  /* core: dp_modulo_ep */
  int partial_dp_cp_rank, partial_dp_cp_size, partial_edp_rank, partial_edp_size;
  int intra_dist_opt_rank, intra_dist_opt_size;
  int inter_dist_opt_rank, inter_dist_opt_size; /* -1: None (one instance) */
} mpu_rank_info;

/* Start every mpu_rank_info from this: the library fills as much as the
 * caller's version of the struct holds, so it can grow. */
#define MPU_RANK_INFO_INIT {.size = sizeof(mpu_rank_info)}
#define MPU_RANK_INFO_MIN_SIZE offsetof(mpu_rank_info, in_grid)

/* Every getter's answer for rank, in O(the sizes of its groups). */
MPU_API mpu_result_t mpu_layout_rank_info(const mpu_layout *layout, int rank,
                                          mpu_rank_info *info);

/* Parse "tp-cp-ep-dp-pp" style orders and the sizes of a config from
 * "key=value" text ("world_size=8 tp=2 pp=2 order=tp-dp-pp"), for tools and
 * the fuzz target; core-0.19's keys are etp, hcp (levels joined by 'x':
 * hcp=2x4), dist_opt_instances, gloo, rank_offset, local_world_size.
 * Unknown keys, a key given twice, a negative size (split_rank alone takes
 * -1, Megatron's None), malformed values and text without entries are
 * errors; *cfg is untouched then. */
MPU_API mpu_result_t mpu_layout_config_parse(const char *text, mpu_layout_config *cfg);

/* "2,4" (sep ',') or "2x4" (sep 'x'): hierarchical_context_parallel_sizes
 * into cfg->hcp and cfg->n_hcp; every size at least 1, at most
 * MPU_HCP_MAX_LEVELS of them. The one parser the CLI and the config text use. */
MPU_API mpu_result_t mpu_layout_parse_hcp(const char *text, char sep, mpu_layout_config *cfg);

#ifdef __cplusplus
}
#endif

#endif
