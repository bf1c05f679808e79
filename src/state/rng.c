/*
 * rng.c - seeded random streams (xoshiro256**), the named-stream tracker
 * (Megatron's CudaRNGStatesTracker), and the state's seeding
 * (model_parallel_cuda_manual_seed).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "state/state_internal.h"

/* ---- random streams ------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

void mpu_rng_seed(mpu_rng *g, uint64_t seed) {
  for (int i = 0; i < 4; i++) g->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t mpu_rng_next(mpu_rng *g) {
  uint64_t *s = g->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

float mpu_rng_uniform(mpu_rng *g) { return (float)(mpu_rng_next(g) >> 40) * (1.0f / 16777216.0f); }

float mpu_rng_normal(mpu_rng *g, float mean, float std) {
  /* Box-Muller on two uniforms in (0, 1] and [0, 1) */
  double u1 = ((double)(mpu_rng_next(g) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = (double)(mpu_rng_next(g) >> 11) * (1.0 / 9007199254740992.0);
  double r = __builtin_sqrt(-2.0 * __builtin_log(u1));
  return mean + std * (float)(r * __builtin_cos(6.283185307179586 * u2));
}

void mpu_rng_tracker_reset(mpu_rng_tracker *t) {
  if (t) memset(t, 0, sizeof *t);
}

/* The stream called name among the first n names: its index, or -1. */
static int stream_index(const char (*names)[48], int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (!strcmp(names[i], name)) return i;
  return -1;
}

mpu_result_t mpu_rng_tracker_add(mpu_rng_tracker *t, const char *name, uint64_t seed) {
  if (!t || !name || !*name || strlen(name) >= sizeof t->names[0])
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_rng_tracker_add: bad tracker or name");
  for (int i = 0; i < t->nseeds; i++) /* Megatron checks the seed first */
    if (t->seeds[i] == seed)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "seed %llu already exists",
                        (unsigned long long)seed);
  if (stream_index(t->names, t->n, name) >= 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "rng state %s already exists", name);
  if (t->n == MPU_RNG_TRACKER_MAX || t->nseeds == MPU_RNG_TRACKER_MAX)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_rng_tracker_add: more than %d streams",
                      MPU_RNG_TRACKER_MAX);
  t->seeds[t->nseeds++] = seed;
  strcpy(t->names[t->n], name);
  mpu_rng_seed(&t->rngs[t->n++], seed);
  return MPU_SUCCESS;
}

mpu_result_t mpu_rng_tracker_fork(mpu_rng_tracker *t, const char *name, mpu_rng **out) {
  if (!t || !name || !out)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_rng_tracker_fork: NULL argument");
  int i = stream_index(t->names, t->n, name);
  if (i >= 0) return *out = &t->rngs[i], MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT, "rng state %s is not added", name);
}

mpu_result_t mpu_rng_tracker_get_states(const mpu_rng_tracker *t, mpu_rng_states *out) {
  if (!t || !out)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_rng_tracker_get_states: NULL argument");
  memset(out, 0, sizeof *out);
  out->n = t->n;
  memcpy(out->names, t->names, sizeof out->names);
  memcpy(out->rngs, t->rngs, sizeof out->rngs);
  return MPU_SUCCESS;
}

mpu_result_t mpu_rng_tracker_set_states(mpu_rng_tracker *t, const mpu_rng_states *states) {
  static const char fn[] = "mpu_rng_tracker_set_states";
  if (!t || !states) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (states->n < 0 || states->n > MPU_RNG_TRACKER_MAX)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d streams (want 0..%d)", fn, states->n,
                      MPU_RNG_TRACKER_MAX);
  for (int i = 0; i < states->n; i++) /* names must be strings, or fork would read past them */
    if (!memchr(states->names[i], 0, sizeof states->names[i]) || !states->names[i][0])
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: stream %d has no name", fn, i);
    else if (stream_index(states->names, i, states->names[i]) >= 0) /* a tracker is a dict */
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: stream %d repeats the name %s", fn, i,
                        states->names[i]);
  t->n = states->n;
  memcpy(t->names, states->names, sizeof t->names);
  memcpy(t->rngs, states->rngs, sizeof t->rngs);
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_manual_seed(mpu_state *s, uint64_t seed) {
  mpu_state *st = NULL;
  MPU_CHECK(mpu__state_mutable("mpu_state_manual_seed", s, &st));
  /* model_parallel_cuda_manual_seed: the default stream gets the seed, the
   * tensor-parallel one seed + 2718 + tp rank; core_v0.8.0 also tracks the
   * data-parallel stream (the seed) and the expert one (seed + 1024 + 100 ep
   * rank + tp rank; core_v0.19.0: + the expert tensor rank), in this order.
   * A rank outside a core-0.19 grid has no ranks: its streams use 0. */
  int in = st->base.in_grid;
  uint64_t tp = in ? (uint64_t)mpu__state_tp_rank(st) : 0, ep = in ? (uint64_t)st->base.ep_rank : 0;
  mpu_flavor flavor = mpu_layout_config_of(st->layout)->flavor;
  uint64_t etp = flavor == MPU_FLAVOR_CORE_019 && in ? (uint64_t)st->base.etp_rank : tp;
  mpu_rng_seed(&st->default_rng, seed);
  mpu_rng_tracker_reset(&st->tracker);
  int core = flavor != MPU_FLAVOR_DEEPSPEED;
  if (core) MPU_CHECK(mpu_rng_tracker_add(&st->tracker, MPU_DATA_PARALLEL_RNG, seed));
  MPU_CHECK(mpu_rng_tracker_add(&st->tracker, MPU_MODEL_PARALLEL_RNG, seed + 2718 + tp));
  if (core)
    MPU_CHECK(mpu_rng_tracker_add(&st->tracker, MPU_EXPERT_PARALLEL_RNG,
                                  seed + 1024 + 100 * ep + etp));
  return MPU_SUCCESS;
}

mpu_rng *mpu_state_default_rng(mpu_state *s) {
  mpu_state *st = NULL;
  return mpu__state_mutable("mpu_state_default_rng", s, &st) ? NULL : &st->default_rng;
}

mpu_rng_tracker *mpu_state_rng_tracker(mpu_state *s) {
  mpu_state *st = NULL;
  return mpu__state_mutable("mpu_state_rng_tracker", s, &st) ? NULL : &st->tracker;
}

