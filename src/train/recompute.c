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
  if (!d || !t) return mpu__error(MPU_ERR_INVALID_USAGE, "checkpoint: no live state");
  *def = *d;
  return mpu_rng_tracker_get_states(t, streams);
}

static mpu_result_t put(mpu_state *s, const mpu_rng *def, const mpu_rng_states *streams) {
  mpu_rng *d = mpu_state_default_rng(s);
  mpu_rng_tracker *t = mpu_state_rng_tracker(s);
  if (!d || !t) return mpu__error(MPU_ERR_INVALID_USAGE, "checkpoint: no live state");
  /* the streams first: set_states checks them all before it changes anything,
   * so a refused checkpoint leaves the default stream as it was too */
  MPU_CHECK(mpu_rng_tracker_set_states(t, streams));
  *d = *def;
  return MPU_SUCCESS;
}

mpu_result_t mpu_checkpoint_forward(mpu_checkpoint *ck, mpu_state *s, mpu_block_fn forward,
                                    void *user) {
  if (!ck || !forward)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_checkpoint_forward: NULL argument");
  memset(ck, 0, sizeof *ck);
  MPU_CHECK(save(s, &ck->default_rng, &ck->streams));
  ck->saved = 1;
  return forward(user);
}

mpu_result_t mpu_checkpoint_recompute(mpu_checkpoint *ck, mpu_state *s, mpu_block_fn forward,
                                      void *user) {
  static const char fn[] = "mpu_checkpoint_recompute";
  if (!ck || !forward) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (!ck->saved)
    return mpu__error(MPU_ERR_INVALID_USAGE, "%s: no mpu_checkpoint_forward ran before", fn);
  mpu_rng now_default;
  mpu_rng_states now;
  MPU_CHECK(save(s, &now_default, &now));
  MPU_CHECK(put(s, &ck->default_rng, &ck->streams));
  mpu_result_t r = forward(user);
  mpu_result_t back = put(s, &now_default, &now); /* whatever forward returned */
  return r ? r : back;
}
