/*
 * recompute.c - activation recompute with the random streams of the first
 * pass (Megatron's CheckpointFunction).
 */
#include <string.h>

#include "core/error.h"
#include "mpu/train.h"

/* The state's streams: its default one and every tracked one. */
static mpu_result_t save(mpu_state *s, mpu_rng *def, mpu_rng_states *streams) {
  mpu_rng *d = mpu_state_default_rng(s);
  mpu_rng_tracker *t = mpu_state_rng_tracker(s);
  if (!d || !t) return mpu__error(MPU_ERR_INVALID_USAGE, "recompute: no live state");
  *def = *d;
  return mpu_rng_tracker_get_states(t, streams);
}

static mpu_result_t put(mpu_state *s, const mpu_rng *def, const mpu_rng_states *streams) {
  mpu_rng *d = mpu_state_default_rng(s);
  mpu_rng_tracker *t = mpu_state_rng_tracker(s);
  if (!d || !t) return mpu__error(MPU_ERR_INVALID_USAGE, "recompute: no live state");
  /* the streams first: set_states checks them all before it changes anything,
   * so a refused checkpoint leaves the default stream as it was too */
  MPU_CHECK(mpu_rng_tracker_set_states(t, streams));
  *d = *def;
  return MPU_SUCCESS;
}

mpu_result_t mpu_recompute_forward(mpu_recompute *rc, mpu_state *s, mpu_block_fn forward,
                                   void *user) {
  if (!rc || !forward)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_recompute_forward: NULL argument");
  memset(rc, 0, sizeof *rc);
  MPU_CHECK(save(s, &rc->default_rng, &rc->streams));
  rc->saved = 1;
  return forward(user);
}

mpu_result_t mpu_recompute_replay(mpu_recompute *rc, mpu_state *s, mpu_block_fn forward,
                                  void *user) {
  static const char fn[] = "mpu_recompute_replay";
  if (!rc || !forward) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (!rc->saved)
    return mpu__error(MPU_ERR_INVALID_USAGE, "%s: no mpu_recompute_forward ran before", fn);
  mpu_rng now_default;
  mpu_rng_states now;
  MPU_CHECK(save(s, &now_default, &now));
  MPU_CHECK(put(s, &rc->default_rng, &rc->streams));
  mpu_result_t r = forward(user);
  mpu_result_t back = put(s, &now_default, &now); /* whatever forward returned */
  return r ? r : back;
}

/* the old names: the same calls */
mpu_result_t mpu_checkpoint_forward(mpu_recompute *ck, mpu_state *s, mpu_block_fn forward,
                                    void *user) {
  return mpu_recompute_forward(ck, s, forward, user);
}

mpu_result_t mpu_checkpoint_recompute(mpu_recompute *ck, mpu_state *s, mpu_block_fn forward,
                                      void *user) {
  return mpu_recompute_replay(ck, s, forward, user);
}
