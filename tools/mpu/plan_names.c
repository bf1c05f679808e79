/*
 * plan_names.c - how `mpu plan`'s pictures name things for a person: what
 * each kind of group is, and the parallel_state getter behind each key of
 * the per-rank JSON.
 */
#include <stdio.h>

#include "plan_names.h"

/* what each kind of group is, for legends and captions (core-0.19 names
 * some kinds for its expert generator: tp_ep is etp_ep, tp_ep_pp etp_ep_pp,
 * dp_modulo_ep edp) */
const char *plan_kind_caption(mpu_flavor flavor, mpu_group_kind k, char *buf, size_t len) {
  int c019 = flavor == MPU_FLAVOR_CORE_019;
  if (k >= MPU_GROUP_HCP_L0 && k <= MPU_GROUP_HCP_LAST) {
    snprintf(buf, len, "hierarchical context-parallel group, level %d", (int)(k - MPU_GROUP_HCP_L0));
    return buf;
  }
  switch (k) {
  case MPU_GROUP_DP: return "data-parallel group";
  case MPU_GROUP_TP: return "tensor-parallel group";
  case MPU_GROUP_PP: return "pipeline";
  case MPU_GROUP_MP: return "model-parallel group (tp x pp)";
  case MPU_GROUP_EMBEDDING: return "embedding group (first and last stage)";
  case MPU_GROUP_POSITION_EMBEDDING: return "position-embedding group (first stage)";
  case MPU_GROUP_SP: return "sequence-parallel group (Ulysses)";
  case MPU_GROUP_SDP: return "sequence + data-parallel group";
  case MPU_GROUP_AMAX: return "FP8 amax reduction group";
  case MPU_GROUP_DP_CP: return "data + context-parallel group";
  case MPU_GROUP_CP: return "context-parallel group";
  case MPU_GROUP_TP_EP_PP:
    return c019 ? "expert tensor + expert + pipeline group" : "model + expert-parallel group";
  case MPU_GROUP_TP_DP_CP: return "tensor + data + context group";
  case MPU_GROUP_TP_DP: return "tensor + data group";
  case MPU_GROUP_TP_CP: return "tensor + context group";
  case MPU_GROUP_TP_EP: return c019 ? "expert tensor + expert group" : "tensor + expert group";
  case MPU_GROUP_EP: return "expert-parallel group";
  case MPU_GROUP_DP_MODULO_EP:
    return c019 ? "expert data-parallel group" : "expert data-parallel group (dp modulo ep)";
  case MPU_GROUP_DP_CP_MODULO_EP: return "expert data + context group (dp_cp modulo ep)";
  case MPU_GROUP_ETP: return "expert tensor-parallel group";
  case MPU_GROUP_INTRA_PARTIAL_DP_CP:
    return "a distributed-optimizer instance's share of the data + context group";
  case MPU_GROUP_INTRA_PARTIAL_EDP:
    return "a distributed-optimizer instance's share of the expert data group";
  case MPU_GROUP_INTER_PARTIAL_EDP: return "expert data ranks at one place across instances";
  case MPU_GROUP_INTRA_DIST_OPT_INSTANCE: return "every rank of one distributed-optimizer instance";
  case MPU_GROUP_DP_GLOO: return "gloo (host) twin of the data-parallel group";
  case MPU_GROUP_DP_CP_GLOO: return "gloo (host) twin of the data + context group";
  case MPU_GROUP_INTRA_PARTIAL_DP_CP_GLOO: return "gloo (host) twin of an instance's dp_cp share";
  case MPU_GROUP_EDP_GLOO: return "gloo (host) twin of the expert data-parallel group";
  case MPU_GROUP_INTRA_PARTIAL_EDP_GLOO: return "gloo (host) twin of an instance's edp share";
  default: return "group";
  }
}

/* The per-rank JSON's keys by the parallel_state getters that answer them
 * (Megatron-LM core's names; deepspeed's where only it has one), for the
 * HTML page's table. */
const pic_name plan_getter_names[] = {
    {"rank", "torch.distributed.get_rank()"},
    {"tp_rank", "get_tensor_model_parallel_rank()"},
    {"tp_size", "get_tensor_model_parallel_world_size()"},
    {"tp_src", "get_tensor_model_parallel_src_rank()"},
    {"pp_rank", "get_pipeline_model_parallel_rank()"},
    {"pp_size", "get_pipeline_model_parallel_world_size()"},
    {"pp_first", "get_pipeline_model_parallel_first_rank()"},
    {"pp_last", "get_pipeline_model_parallel_last_rank()"},
    {"pp_next", "get_pipeline_model_parallel_next_rank()"},
    {"pp_prev", "get_pipeline_model_parallel_prev_rank()"},
    {"is_first_stage", "is_pipeline_first_stage(ignore_virtual=True)"},
    {"is_last_stage", "is_pipeline_last_stage(ignore_virtual=True)"},
    {"vp_rank", "get_virtual_pipeline_model_parallel_rank()"},
    {"vp_size", "get_virtual_pipeline_model_parallel_world_size()"},
    {"dp_rank", "get_data_parallel_rank()"},
    {"dp_size", "get_data_parallel_world_size()"},
    {"dp_src", "get_data_parallel_src_rank()"},
    {"dp_cp_rank", "get_data_parallel_rank(with_context_parallel=True)"},
    {"dp_cp_size", "get_data_parallel_world_size(with_context_parallel=True)"},
    {"dp_cp_src", "get_data_parallel_src_rank(with_context_parallel=True)"},
    {"partial_dp_cp_rank", "get_data_parallel_rank(True, partial_data_parallel=True)"},
    {"partial_dp_cp_size", "get_data_parallel_world_size(True, partial_data_parallel=True)"},
    {"cp_rank", "get_context_parallel_rank()"},
    {"cp_size", "get_context_parallel_world_size()"},
    {"cp_global_ranks", "get_context_parallel_global_ranks()"},
    {"hcp_groups", "get_hierarchical_context_parallel_groups()"},
    {"tp_cp_rank", "get_tensor_and_context_parallel_rank()"},
    {"tp_cp_size", "get_tensor_and_context_parallel_world_size()"},
    {"mp_rank", "get_model_parallel_group().rank()"},
    {"mp_size", "get_model_parallel_group().size()"},
    {"tp_dp_rank", "get_tensor_and_data_parallel_group().rank()"},
    {"tp_dp_size", "get_tensor_and_data_parallel_group().size()"},
    {"tp_dp_cp_rank", "get_tensor_and_data_parallel_group(with_context_parallel=True).rank()"},
    {"tp_dp_cp_size", "get_tensor_and_data_parallel_group(with_context_parallel=True).size()"},
    {"ep_rank", "get_expert_model_parallel_rank()"},
    {"ep_size", "get_expert_model_parallel_world_size()"},
    {"tp_ep_rank", "get_tensor_and_expert_parallel_rank()"},
    {"dp_modulo_ep_rank", "get_data_modulo_expert_parallel_rank()"},
    {"dp_modulo_ep_size", "get_data_modulo_expert_parallel_world_size()"},
    {"etp_rank", "get_expert_tensor_parallel_rank()"},
    {"etp_size", "get_expert_tensor_parallel_world_size()"},
    {"etp_ep_rank", "get_expert_tensor_and_model_parallel_rank()"},
    {"etp_ep_size", "get_expert_tensor_and_model_parallel_world_size()"},
    {"etp_ep_pp_rank", "get_expert_tensor_model_pipeline_parallel_group().rank()"},
    {"etp_ep_pp_size", "get_expert_tensor_model_pipeline_parallel_group().size()"},
    {"edp_rank", "get_expert_data_parallel_rank()"},
    {"edp_size", "get_expert_data_parallel_world_size()"},
    {"partial_edp_rank", "get_expert_data_parallel_rank(partial_expert_data_parallel=True)"},
    {"partial_edp_size", "get_expert_data_parallel_world_size(partial_expert_data_parallel=True)"},
    {"intra_dist_opt_rank", "get_intra_distributed_optimizer_instance_group().rank()"},
    {"intra_dist_opt_size", "get_intra_distributed_optimizer_instance_group().size()"},
    {"inter_dist_opt_rank", "get_inter_distributed_optimizer_instance_group().rank()"},
    {"inter_dist_opt_size", "get_inter_distributed_optimizer_instance_group().size()"},
    {"embedding_global_ranks", "_EMBEDDING_GLOBAL_RANKS"},
    {"in_embedding_group", "is_rank_in_embedding_group()"},
    {"position_embedding_global_ranks", "_POSITION_EMBEDDING_GLOBAL_RANKS"},
    {"in_position_embedding_group", "is_rank_in_position_embedding_group()"},
    {"sp_rank", "get_sequence_parallel_rank()"},
    {"sp_size", "get_sequence_parallel_world_size()"},
    {"sp_src", "get_sequence_parallel_src_rank()"},
    {"sdp_rank", "get_sequence_data_parallel_rank()"},
    {"sdp_size", "get_sequence_data_parallel_world_size()"},
    {"stage_before_split", "is_pipeline_stage_before_split()"},
    {"stage_after_split", "is_pipeline_stage_after_split()"},
    {"stage_at_split", "is_pipeline_stage_at_split()"},
    {NULL, NULL}};

