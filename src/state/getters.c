/*
 * getters.c - the getters of one rank's state with Megatron's virtual-stage
 * and override rules, and the setters of what may change after init.
 *
 * The answers right after init come from the layout (mpu_layout_rank_info);
 * what can change afterwards (virtual rank, split rank, the _MPU_ overrides)
 * is kept in the state and applied here exactly where the original reads it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/options.h"
#include "state/state_internal.h"

/* ---- getters ---------------------------------------------------------------------------- */

#define STATE(fn, s, out_ptr)                              \
  const mpu_state *st = NULL;                              \
  MPU_CHECK(mpu__state_resolve(fn, s, &st));                          \
  if (!(out_ptr)) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL output", fn)

/* A core-0.19 grid at an offset: a rank outside it is in no group, and the
 * getters that read a group have nothing to answer (the original asserts). */
static mpu_result_t in_grid(const char *fn, const mpu_state *st) {
  if (st->base.in_grid) return MPU_SUCCESS;
  int first, size;
  mpu_layout_grid(st->layout, &first, &size);
  return mpu__error(MPU_ERR_INVALID_USAGE,
                    "%s: rank %d is outside this state's grid (ranks %d..%d) and in no group", fn,
                    st->base.rank, first, first + size - 1);
}

/* STATE, for getters that answer from this rank's groups */
#define GRID_STATE(fn, s, out_ptr) \
  STATE(fn, s, out_ptr);           \
  MPU_CHECK(in_grid(fn, st))

int mpu_state_is_initialized(const mpu_state *s) {
  return mpu__state_is_live(s ? s : mpu__state_current);
}

const mpu_layout *mpu_state_layout(const mpu_state *s) {
  const mpu_state *st = s ? s : mpu__state_current;
  return mpu__state_is_live(st) ? st->layout : NULL;
}

mpu_comm *mpu_state_world(const mpu_state *s) {
  const mpu_state *st = s ? s : mpu__state_current;
  return mpu__state_is_live(st) ? st->world : NULL;
}

static int tp_size(const mpu_state *s) { return s->tp_size_ov >= 0 ? s->tp_size_ov : s->base.tp_size; }
static int tp_rank(const mpu_state *s) { return s->tp_rank_ov >= 0 ? s->tp_rank_ov : s->base.tp_rank; }
int mpu__state_tp_rank(const mpu_state *s) { return tp_rank(s); }
static int pp_size(const mpu_state *s) { return s->pp_size_ov >= 0 ? s->pp_size_ov : s->base.pp_size; }
static int pp_rank(const mpu_state *s) { return s->pp_rank_ov >= 0 ? s->pp_rank_ov : s->base.pp_rank; }

static int first_stage(const mpu_state *s, int ignore_virtual) {
  if (!ignore_virtual && s->vp_size >= 0 && s->vp_rank != 0) return 0;
  return pp_rank(s) == 0;
}

static int last_stage(const mpu_state *s, int ignore_virtual) {
  if (!ignore_virtual && s->vp_size >= 0 && s->vp_rank != s->vp_size - 1) return 0;
  return pp_rank(s) == pp_size(s) - 1;
}

static int before_split(const mpu_state *s, int stage) {
  if (pp_size(s) == 1 || s->split_rank < 0) return 1;
  return stage < s->split_rank;
}

static int after_split(const mpu_state *s, int stage) {
  if (pp_size(s) == 1 || s->split_rank < 0) return 1;
  return stage >= s->split_rank;
}

static int in_embedding(const mpu_state *s, int ignore_virtual) {
  const int *e = s->base.embedding_global_ranks;
  int n = s->base.n_embedding, rank = s->base.rank, in = 0;
  for (int i = 0; i < n; i++) in |= e[i] == rank;
  if (!in || ignore_virtual) return in;
  if (rank == e[0]) return first_stage(s, 0);
  if (rank == e[n - 1]) return last_stage(s, 0);
  return 1;
}

/* pipe[index] with the pipeline size the getters see (overrides may make it odd) */
static mpu_result_t pipe_at(const char *fn, const mpu_state *s, int index, int *rank) {
  if (index < 0 || index >= s->base.pp_size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: pipeline position %d is outside this rank's %d-stage pipeline "
                      "(check the pipeline overrides)",
                      fn, index, s->base.pp_size);
  *rank = s->pipe[index];
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_info(const mpu_state *s, mpu_rank_info *info) {
  STATE("mpu_state_info", s, info);
  mpu_rank_info x = st->base;
  x.tp_rank = tp_rank(st);
  x.tp_size = tp_size(st);
  if (mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED && x.tp_size > 0)
    x.tp_src = (x.rank / x.tp_size) * x.tp_size;
  x.pp_rank = pp_rank(st);
  x.pp_size = pp_size(st);
  if (x.pp_size > 0 && x.pp_size <= st->base.pp_size) {
    x.pp_last = st->pipe[x.pp_size - 1];
    x.pp_next = st->pipe[(x.pp_rank + 1) % x.pp_size];
    x.pp_prev = st->pipe[((x.pp_rank - 1) % x.pp_size + x.pp_size) % x.pp_size];
  }
  x.vp_rank = st->vp_rank;
  x.vp_size = st->vp_size;
  /* is_rank_in_embedding_group()'s default: ignore_virtual False before
   * core_v0.19.0, True in it */
  x.in_embedding_group =
      in_embedding(st, mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_CORE_019);
  if (mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED) { /* its getters only */
    x.is_first_stage = first_stage(st, 1);
    x.is_last_stage = last_stage(st, 1);
    x.stage_before_split = before_split(st, x.pp_rank);
    x.stage_after_split = after_split(st, x.pp_rank);
    x.stage_at_split = before_split(st, x.pp_rank) && after_split(st, x.pp_rank + 1);
  }
  return mpu__give_out("mpu_state_info", "info", "MPU_RANK_INFO_INIT", info, &x, sizeof x,
                       MPU_RANK_INFO_MIN_SIZE);
}

static mpu_group_kind seen_as(const mpu_state *st, mpu_group_kind kind);

mpu_result_t mpu_state_host_comm(const mpu_state *s, mpu_group_kind kind, mpu_comm **out) {
  STATE("mpu_state_host_comm", s, out);
  if ((unsigned)kind < MPU_GROUP_KIND_COUNT) kind = seen_as(st, kind);
  if ((unsigned)kind >= MPU_GROUP_KIND_COUNT || !st->comms[kind])
    return mpu__error(MPU_ERR_INVALID_USAGE, "mpu_state_host_comm: rank %d is in no group of kind %d",
                      st->base.rank, (int)kind);
  *out = st->comms[kind];
  return MPU_SUCCESS;
}

/* Megatron-DeepSpeed: get_data_parallel_group() answers with the sequence-data group
 * (equal to the data-parallel group when sp is 1), as get_data_parallel_
 * world_size and _rank do; the plain group stays reachable through
 * mpu_state_plain_dp_comm. Core has no such alias. */
static mpu_group_kind seen_as(const mpu_state *st, mpu_group_kind kind) {
  int ds = mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED;
  return ds && kind == MPU_GROUP_DP ? MPU_GROUP_SDP : kind;
}

mpu_result_t mpu_state_plain_dp_comm(const mpu_state *s, mpu_comm **out) {
  STATE("mpu_state_plain_dp_comm", s, out);
  if (!st->comms[MPU_GROUP_DP])
    return mpu__error(MPU_ERR_INVALID_USAGE, "mpu_state_plain_dp_comm: rank %d is in no dp group",
                      st->base.rank);
  *out = st->nccl[MPU_GROUP_DP] ? st->nccl[MPU_GROUP_DP] : st->comms[MPU_GROUP_DP];
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_comm(const mpu_state *s, mpu_group_kind kind, mpu_comm **out) {
  STATE("mpu_state_comm", s, out);
  if ((unsigned)kind < MPU_GROUP_KIND_COUNT) kind = seen_as(st, kind);
  if (!mpu_layout_has(st->layout, kind))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_state_comm: the %s layout has no %s groups",
                      mpu_flavor_name(mpu_layout_config_of(st->layout)->flavor),
                      mpu_group_kind_name(mpu_layout_config_of(st->layout)->flavor, kind));
  if (!st->comms[kind])
    return mpu__error(MPU_ERR_INVALID_USAGE, "mpu_state_comm: rank %d is in no %s group",
                      st->base.rank,
                      mpu_group_kind_name(mpu_layout_config_of(st->layout)->flavor, kind));
  *out = st->nccl[kind] ? st->nccl[kind] : st->comms[kind];
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_group_rank(const mpu_state *s, mpu_group_kind kind, int *rank) {
  mpu_comm *c;
  MPU_CHECK(mpu_state_comm(s, kind, &c));
  return mpu_comm_rank(c, rank);
}

mpu_result_t mpu_state_group_size(const mpu_state *s, mpu_group_kind kind, int *size) {
  mpu_comm *c;
  MPU_CHECK(mpu_state_comm(s, kind, &c));
  return mpu_comm_size(c, size);
}

mpu_result_t mpu_state_src_rank(const mpu_state *s, mpu_group_kind kind, int *rank) {
  GRID_STATE("mpu_state_src_rank", s, rank);
  int ds = mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED;
  if (ds && kind == MPU_GROUP_TP) return mpu_state_tp_src_rank(st, rank);
  if (ds && kind == MPU_GROUP_SP) {
    *rank = (st->base.rank / st->base.sp_size) * st->base.sp_size;
    return MPU_SUCCESS;
  }
  int pos, size; /* dp: get_data_parallel_src_rank reads the plain group's ranks */
  return mpu_layout_locate(st->layout, kind, st->base.rank, &pos, &size, rank);
}

#define GETTER(name, expr)                                    \
  mpu_result_t mpu_state_##name(const mpu_state *s, int *v) { \
    GRID_STATE("mpu_state_" #name, s, v);                     \
    *v = (expr);                                              \
    return MPU_SUCCESS;                                       \
  }

GETTER(tp_rank, tp_rank(st))
GETTER(tp_size, tp_size(st))
GETTER(tp_src_rank, mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED
                        ? (st->base.rank / tp_size(st)) * tp_size(st)
                        : st->base.tp_src)
GETTER(pp_rank, pp_rank(st))
GETTER(pp_size, pp_size(st))
GETTER(dp_rank, st->base.dp_rank)
/* Megatron-DeepSpeed: get_data_parallel_world_size() is get_sequence_data_parallel_
 * world_size(), so an sdp size override moves it too (deepspeed only) */
GETTER(dp_size, mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED &&
                        st->sdp_size_ov >= 0
                    ? st->sdp_size_ov
                    : st->base.dp_size)
GETTER(dp_src_rank, st->base.dp_src)
GETTER(mp_rank, st->base.mp_rank)
GETTER(mp_size, st->base.mp_size)
GETTER(is_stage_at_split, before_split(st, pp_rank(st)) && after_split(st, pp_rank(st) + 1))
GETTER(cp_rank, st->base.cp_rank)
GETTER(cp_size, st->base.cp_size)
GETTER(ep_rank, st->base.ep_rank)
GETTER(ep_size, st->base.ep_size)
/* core_v0.8.0 has no expert tensor group: the tensor group serves (its getters fall back to it) */
GETTER(etp_rank, st->base.etp_size > 0 ? st->base.etp_rank : tp_rank(st))
GETTER(etp_size, st->base.etp_size > 0 ? st->base.etp_size : tp_size(st))
GETTER(edp_rank, st->base.edp_rank)
GETTER(edp_size, st->base.edp_size)

/* module globals in the original, answered on every rank */
#define GLOBAL_GETTER(name, expr)                             \
  mpu_result_t mpu_state_##name(const mpu_state *s, int *v) { \
    STATE("mpu_state_" #name, s, v);                          \
    *v = (expr);                                              \
    return MPU_SUCCESS;                                       \
  }

GLOBAL_GETTER(vp_rank, st->vp_rank)
GLOBAL_GETTER(vp_size, st->vp_size)
GLOBAL_GETTER(split_rank, st->split_rank)
GLOBAL_GETTER(in_position_embedding_group, st->base.in_position_embedding_group)

mpu_result_t mpu_state_is_pp_first_stage(const mpu_state *s, int ignore_virtual, int *yes) {
  GRID_STATE("mpu_state_is_pp_first_stage", s, yes);
  *yes = first_stage(st, ignore_virtual);
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_is_pp_last_stage(const mpu_state *s, int ignore_virtual, int *yes) {
  GRID_STATE("mpu_state_is_pp_last_stage", s, yes);
  *yes = last_stage(st, ignore_virtual);
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_in_embedding_group(const mpu_state *s, int ignore_virtual, int *yes) {
  STATE("mpu_state_in_embedding_group", s, yes);
  *yes = in_embedding(st, ignore_virtual);
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_is_stage_before_split(const mpu_state *s, int stage, int *yes) {
  GRID_STATE("mpu_state_is_stage_before_split", s, yes);
  *yes = before_split(st, stage < 0 ? pp_rank(st) : stage);
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_is_stage_after_split(const mpu_state *s, int stage, int *yes) {
  GRID_STATE("mpu_state_is_stage_after_split", s, yes);
  *yes = after_split(st, stage < 0 ? pp_rank(st) : stage);
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_pp_first_rank(const mpu_state *s, int *rank) {
  GRID_STATE("mpu_state_pp_first_rank", s, rank);
  return pipe_at("mpu_state_pp_first_rank", st, 0, rank);
}

mpu_result_t mpu_state_pp_last_rank(const mpu_state *s, int *rank) {
  GRID_STATE("mpu_state_pp_last_rank", s, rank);
  return pipe_at("mpu_state_pp_last_rank", st, pp_size(st) - 1, rank);
}

mpu_result_t mpu_state_pp_next_rank(const mpu_state *s, int *rank) {
  GRID_STATE("mpu_state_pp_next_rank", s, rank);
  int n = pp_size(st);
  return pipe_at("mpu_state_pp_next_rank", st, n > 0 ? (pp_rank(st) + 1) % n : -1, rank);
}

mpu_result_t mpu_state_pp_prev_rank(const mpu_state *s, int *rank) {
  GRID_STATE("mpu_state_pp_prev_rank", s, rank);
  int n = pp_size(st); /* Python's % is never negative */
  return pipe_at("mpu_state_pp_prev_rank", st, n > 0 ? ((pp_rank(st) - 1) % n + n) % n : -1, rank);
}

/* ---- setters ----------------------------------------------------------------------------- */

#define SETTER(name, field, lo)                                                       \
  mpu_result_t mpu_state_##name(mpu_state *s, int v) {                                \
    mpu_state *st = NULL;                                                             \
    MPU_CHECK(mpu__state_mutable("mpu_state_" #name, s, &st));                             \
    if (v < (lo))                                                                     \
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_state_" #name ": %d (want >= %d)", v, lo); \
    st->field = v;                                                                    \
    return MPU_SUCCESS;                                                               \
  }

SETTER(set_vp_rank, vp_rank, -1)
SETTER(set_vp_size, vp_size, -1)
SETTER(set_split_rank, split_rank, -1)
SETTER(set_tp_size, tp_size_ov, -1)
SETTER(set_tp_rank, tp_rank_ov, -1)
SETTER(set_pp_size, pp_size_ov, -1)
SETTER(set_pp_rank, pp_rank_ov, -1)

/* ---- Megatron-DeepSpeed: sequence parallelism, training and eval mode ------------------- */

static mpu_result_t deepspeed_only(const char *fn, const mpu_state *st) {
  if (mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED) return MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                    "%s: the core layout has no sequence-parallel groups (a deepspeed-flavour call)",
                    fn);
}

static int sp_size(const mpu_state *s) {
  return s->sp_size_ov >= 0 ? s->sp_size_ov : s->training ? s->base.sp_size : 1;
}

#define SEQ_GETTER(name, expr)                                \
  mpu_result_t mpu_state_##name(const mpu_state *s, int *v) { \
    STATE("mpu_state_" #name, s, v);                          \
    MPU_CHECK(deepspeed_only("mpu_state_" #name, st));        \
    *v = (expr);                                              \
    return MPU_SUCCESS;                                       \
  }

SEQ_GETTER(sp_size, sp_size(st))
SEQ_GETTER(sp_rank, st->sp_rank_ov >= 0 ? st->sp_rank_ov : st->training ? st->base.sp_rank : 0)
SEQ_GETTER(sdp_size, st->sdp_size_ov >= 0 ? st->sdp_size_ov : st->base.sdp_size)
SEQ_GETTER(sdp_rank, st->sdp_rank_ov >= 0 ? st->sdp_rank_ov : st->base.sdp_rank)

mpu_result_t mpu_state_sp_src_rank(const mpu_state *s, int *rank) {
  STATE("mpu_state_sp_src_rank", s, rank);
  MPU_CHECK(deepspeed_only("mpu_state_sp_src_rank", st));
  int n = sp_size(st);
  if (n <= 0) /* Python: ZeroDivisionError */
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "mpu_state_sp_src_rank: the sequence-parallel size is overridden to %d", n);
  *rank = (st->base.rank / n) * n;
  return MPU_SUCCESS;
}

#define SEQ_SETTER(name, field)                                                       \
  mpu_result_t mpu_state_##name(mpu_state *s, int v) {                                \
    mpu_state *st = NULL;                                                             \
    MPU_CHECK(mpu__state_mutable("mpu_state_" #name, s, &st));                             \
    MPU_CHECK(deepspeed_only("mpu_state_" #name, st));                                \
    if (v < -1)                                                                       \
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_state_" #name ": %d (want >= -1)", v); \
    st->field = v;                                                                    \
    return MPU_SUCCESS;                                                               \
  }

SEQ_SETTER(set_sp_size, sp_size_ov)
SEQ_SETTER(set_sp_rank, sp_rank_ov)
SEQ_SETTER(set_sdp_size, sdp_size_ov)
SEQ_SETTER(set_sdp_rank, sdp_rank_ov)

mpu_result_t mpu_state_is_training_mode(const mpu_state *s, int *yes) {
  STATE("mpu_state_is_training_mode", s, yes);
  *yes = st->training;
  return MPU_SUCCESS;
}

static mpu_result_t set_mode(const char *fn, mpu_state *s, int training) {
  mpu_state *st = NULL;
  MPU_CHECK(mpu__state_mutable(fn, s, &st));
  st->training = training;
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_set_training_mode(mpu_state *s) {
  return set_mode("mpu_state_set_training_mode", s, 1);
}

mpu_result_t mpu_state_set_eval_mode(mpu_state *s) {
  return set_mode("mpu_state_set_eval_mode", s, 0);
}

/* a live state of the deepspeed flavour, given or current */
static int live_deepspeed(const mpu_state *s) {
  return mpu_state_is_initialized(s) &&
         mpu_layout_config_of((s ? s : mpu__state_current)->layout)->flavor == MPU_FLAVOR_DEEPSPEED;
}

int mpu_state_sp_is_initialized(const mpu_state *s) { return live_deepspeed(s); }
int mpu_state_sdp_is_initialized(const mpu_state *s) { return live_deepspeed(s); }

int mpu_state_is_uninitialized(const mpu_state *s) { return !mpu_state_is_initialized(s); }

