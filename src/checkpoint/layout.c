/*
 * layout.c - what a checkpoint records of the layout that saved it: filled
 * from a parallel state, and the rule a save applies (the sizes must
 * multiply to the world's size, as Megatron's world = tp x pp x cp x dp).
 */
#include <stdio.h>
#include <string.h>

#include "checkpoint/ckpt_internal.h"
#include "core/error.h"

mpu_result_t mpu_ckpt_layout_from_state(const mpu_state *s, mpu_ckpt_layout *out) {
  static const char fn[] = "mpu_ckpt_layout_from_state";
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL layout", fn);
  if (!mpu_state_is_initialized(s))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: no parallel state (mpu_state_init first)", fn);
  const mpu_state *st = s ? s : mpu_state_current();
  mpu_ckpt_layout l;
  memset(&l, 0, sizeof l);
  int vp = -1;
  MPU_CHECK(mpu_comm_size(mpu_state_world(st), &l.world));
  MPU_CHECK(mpu_state_tp_size(st, &l.tp));
  MPU_CHECK(mpu_state_pp_size(st, &l.pp));
  MPU_CHECK(mpu_state_vp_size(st, &vp));
  MPU_CHECK(mpu_state_dp_size(st, &l.dp));
  MPU_CHECK(mpu_state_cp_size(st, &l.cp));
  MPU_CHECK(mpu_state_ep_size(st, &l.ep));
  l.vp = vp > 0 ? vp : 0; /* 0: no virtual pipeline, as the index records it */
  l.zero1 = out->zero1;   /* the optimizer's, not the state's: kept */
  snprintf(l.flavor, sizeof l.flavor, "%s",
           mpu_flavor_name(mpu_layout_config_of(mpu_state_layout(st))->flavor));
  *out = l;
  return MPU_SUCCESS;
}

/* mpu_ckpt_set_init's layout: nothing set */
static int untouched(const mpu_ckpt_layout *l) {
  return l->tp == 1 && l->pp == 1 && l->dp == 1 && l->cp == 1 && l->vp == 0;
}

mpu_result_t mpu__ckpt_layout_for_save(const mpu_ckpt_layout *given, int world,
                                       mpu_ckpt_layout *out) {
  *out = *given;
  if (world > 1 && untouched(given) && mpu_state_is_initialized(NULL)) {
    int size = 0;
    if (!mpu_comm_size(mpu_state_world(mpu_state_current()), &size) && size == world)
      MPU_CHECK(mpu_ckpt_layout_from_state(NULL, out));
  }
  out->world = world;
  /* the product stops growing past world: each factor is an int, so it never overflows */
  const int factors[4] = {out->tp, out->pp, out->cp, out->dp};
  int64_t ranks = 1;
  for (int i = 0; i < 4 && ranks > 0 && ranks <= world; i++) ranks = factors[i] < 1 ? 0 : ranks * factors[i];
  if (ranks != world)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "mpu_ckpt_save: the set's layout says tp %d x pp %d x cp %d x dp %d, not the "
                      "%d ranks saving: fill it with mpu_ckpt_layout_from_state (or set tp, pp, "
                      "cp and dp)",
                      out->tp, out->pp, out->cp, out->dp, world);
  return MPU_SUCCESS;
}
