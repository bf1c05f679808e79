/*
 * testing.c - the test helpers (BioNeMo's): run a function with a fresh
 * state on thread ranks or a given world, a mock state of any rank of any
 * size, and reset.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "state/state_internal.h"
#include "core/options.h"

/* ---- testing helpers ------------------------------------------------------------------------ */

typedef struct with_state_ctx {
  mpu_layout_config cfg;
  uint64_t seed;
  mpu_state_fn fn;
  void *arg;
} with_state_ctx;

/* One rank's with-state run: init, seed, fn, destroy always (so the next
 * test starts clean), and the state current before comes back. */
static mpu_result_t run_with_state(mpu_comm *world, const mpu_layout_config *cfg, uint64_t seed,
                                   mpu_state_fn fn, void *arg) {
  mpu_state *before = mpu__state_current, *s = NULL;
  /* BioNeMo's helpers put back the random state they found: here, the
   * streams of the state that was current (its default stream and every
   * tracked one), whatever fn drew from them */
  int had = mpu__state_is_live(before);
  mpu_rng saved_default;
  mpu_rng_tracker saved_tracker;
  if (had) saved_default = before->default_rng, saved_tracker = before->tracker;
  mpu_result_t r = mpu_state_init(world, cfg, &s);
  if (!r) r = mpu_state_manual_seed(s, seed);
  if (!r) r = fn(s, arg);
  mpu_state_destroy(s); /* unless fn did already (mpu_state_reset): the registry knows */
  had = had && mpu__state_is_live(before); /* fn may have destroyed it too */
  mpu__state_current = had ? before : NULL;
  if (had) before->default_rng = saved_default, before->tracker = saved_tracker;
  return r;
}

static mpu_result_t with_state_rank(mpu_comm *world, void *arg) {
  with_state_ctx *ctx = arg;
  return run_with_state(world, &ctx->cfg, ctx->seed, ctx->fn, ctx->arg);
}

mpu_result_t mpu_with_state_on(mpu_comm *world, const mpu_layout_config *cfg, uint64_t seed,
                               mpu_state_fn fn, void *arg) {
  if (!world || !cfg || !fn)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "mpu_with_state_on: NULL communicator, config or function");
  return run_with_state(world, cfg, seed, fn, arg);
}

mpu_result_t mpu_with_state(int nranks, const mpu_layout_config *cfg, uint64_t seed,
                            mpu_state_fn fn, void *arg, mpu_result_t *results,
                            const mpu_launch_options *options) {
  if (!cfg || !fn)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_with_state: NULL config or function");
  mpu_layout_config full = MPU_LAYOUT_CONFIG_INIT;
  MPU_CHECK(mpu__take_options("mpu_with_state", "config", "MPU_LAYOUT_CONFIG_INIT",
                              cfg, sizeof full,
                              MPU_LAYOUT_CONFIG_MIN_SIZE, &full));
  if (full.world_size && full.world_size != nranks) /* the config names another world */
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "mpu_with_state: the config's world_size %d is not the %d ranks launched "
                      "(0 takes the launch's)", full.world_size, nranks);
  with_state_ctx ctx = {full, seed, fn, arg};
  ctx.cfg.world_size = nranks;
  /* a bad config fails here, once, before any thread starts */
  mpu_layout *check;
  MPU_CHECK(mpu_layout_create(&ctx.cfg, &check));
  mpu_layout_free(check);
  return mpu_launch(nranks, with_state_rank, &ctx, results, options);
}

mpu_result_t mpu_state_mock(int rank, const mpu_layout_config *cfg, uint64_t seed,
                            mpu_state **out) {
  if (!cfg || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_state_mock: NULL argument");
  mpu_comm *world;
  MPU_CHECK(mpu_comm_fake_create(rank, cfg->world_size, &world));
  mpu_state *s = NULL;
  mpu_result_t r = mpu_state_init(world, cfg, &s);
  if (r) {
    mpu_comm_destroy(world);
    return r;
  }
  s->owns_world = 1;
  r = mpu_state_manual_seed(s, seed);
  if (r) {
    mpu_state_destroy(s);
    return r;
  }
  *out = s;
  return MPU_SUCCESS;
}

void mpu_state_reset(void) { mpu_state_destroy(mpu__state_current); }
