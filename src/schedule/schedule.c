/*
 * schedule.c - the step orders of Megatron's pipeline schedules, and their
 * timeline.
 *
 * The orders follow schedules.py's loops (warm-up, steady 1F1B, cool-down);
 * the interleaved one reads its micro-batches and chunks from the same
 * schedule table (get_schedule_table): groups of group_size micro-batches,
 * each group run on chunk 0, then chunk 1, ...; a backward at virtual step k
 * takes the table's k-th entry with the chunk reversed (its micro-batch is
 * then the count of earlier backwards of that chunk: the FIFO the original
 * pops).
 */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "core/options.h"
#include "mpu/schedule.h"

static const char *const names[] = {"no-pipelining", "1f1b", "interleaved"};

const char *mpu_schedule_name(mpu_schedule_kind kind) {
  return (unsigned)kind < 3 ? names[kind] : "invalid";
}

mpu_result_t mpu_schedule_from_name(const char *name, mpu_schedule_kind *out) {
  for (int k = 0; k < 3; k++)
    if (name && out && !strcasecmp(name, names[k])) return *out = (mpu_schedule_kind)k, MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                    "unknown schedule '%s' (want no-pipelining, 1f1b or interleaved)",
                    name ? name : "(null)");
}

/* The config with defaults filled in, checked. */
static mpu_result_t take(const char *fn, const mpu_schedule_config *given, mpu_schedule_config *c) {
  if (!given) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL config", fn);
  mpu_schedule_config full = MPU_SCHEDULE_CONFIG_INIT;
  MPU_CHECK(mpu__take_options(fn, "config", "MPU_SCHEDULE_CONFIG_INIT", given, sizeof full,
                              sizeof full, &full));
  *c = full;
  if ((unsigned)c->kind > MPU_SCHEDULE_INTERLEAVED)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: schedule kind %d", fn, (int)c->kind);
  if (c->pp < 1 || c->vp < 1 || c->microbatches < 1)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: pp (%d), vp (%d) and microbatches (%d) must be at least 1", fn, c->pp,
                      c->vp, c->microbatches);
  /* each factor below 2^31, so the first product fits; the second only once
   * the first is bounded */
  int64_t total = (int64_t)c->microbatches * c->vp;
  if (total > MPU_SCHEDULE_MAX_STEPS / 2 || 2 * total * c->pp > MPU_SCHEDULE_MAX_STEPS)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: %d micro-batches x %d chunks x %d stages make %.0f steps; a schedule "
                      "has at most %d (2^20, an %d MiB timeline): fewer micro-batches show the "
                      "same pattern",
                      fn, c->microbatches, c->vp, c->pp, 2.0 * (double)total * c->pp,
                      MPU_SCHEDULE_MAX_STEPS,
                      (int)(MPU_SCHEDULE_MAX_STEPS * sizeof(double) >> 20));
  if (!(c->backward_cost > 0) || c->backward_cost > 1e6)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: backward_cost %g (want > 0)", fn,
                      c->backward_cost);
  switch (c->kind) {
  case MPU_SCHEDULE_NO_PIPELINING:
    if (c->pp != 1 || c->vp != 1)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: no pipelining is the schedule of pp 1 without virtual stages (pp %d, "
                        "vp %d)",
                        fn, c->pp, c->vp);
    break;
  case MPU_SCHEDULE_1F1B:
    if (c->vp != 1)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: 1F1B runs one model chunk per rank (vp %d: use the interleaved "
                        "schedule)",
                        fn, c->vp);
    break;
  case MPU_SCHEDULE_INTERLEAVED:
    if (c->pp < 2)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: pipeline-model-parallel size should be greater than 1 with "
                        "interleaved schedule",
                        fn);
    if (!c->group_size) c->group_size = c->pp;
    if (c->group_size > c->microbatches || c->group_size < c->pp)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: The number of contiguous micro-batches in a virtual pipeline stage "
                        "should range in [PP=%d , M=%d] (group size %d)",
                        fn, c->pp, c->microbatches, c->group_size);
    if (c->microbatches % c->group_size && c->microbatches % c->group_size < c->pp)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: The remainder of M (the total micro-batches) divided by N (number of "
                        "contiguous micro-batches in a virtual pipeline stage) should be 0, or "
                        "larger than or equal to the pipeline-parallel size, but it is %d",
                        fn, c->microbatches % c->group_size);
    break;
  }
  if (c->kind != MPU_SCHEDULE_INTERLEAVED) c->group_size = 0;
  return MPU_SUCCESS;
}

static int warmup_of(const mpu_schedule_config *c, int rank) {
  int total = c->microbatches * c->vp, w;
  if (c->forward_only) return total;
  if (c->kind == MPU_SCHEDULE_NO_PIPELINING) return 0;
  if (c->kind == MPU_SCHEDULE_1F1B) w = c->pp - rank - 1;
  else w = (c->pp - rank - 1) * 2 + (c->vp - 1) * c->group_size;
  return w < total ? w : total;
}

mpu_result_t mpu_schedule_count(const mpu_schedule_config *cfg, int pp_rank, int *n,
                                int *warmup) {
  static const char fn[] = "mpu_schedule_count";
  mpu_schedule_config c = MPU_SCHEDULE_CONFIG_INIT;
  MPU_CHECK(take(fn, cfg, &c));
  if (!n || !warmup) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL output", fn);
  if (pp_rank < 0 || pp_rank >= c.pp)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: pipeline rank %d of %d", fn, pp_rank, c.pp);
  int total = c.microbatches * c.vp;
  *n = c.forward_only ? total : 2 * total;
  *warmup = warmup_of(&c, pp_rank);
  return MPU_SUCCESS;
}

/* get_schedule_table's entry k: micro-batch and chunk */
static void table_entry(const mpu_schedule_config *c, int k, int *mb, int *chunk) {
  if (c->kind != MPU_SCHEDULE_INTERLEAVED) {
    *mb = k, *chunk = 0;
    return;
  }
  int N = c->group_size, m = c->microbatches, vp = c->vp;
  /* full groups of N micro-batches x vp chunks; the last group takes the rest */
  int full = (m / N) - (m % N == 0 ? 1 : 0); /* groups before the last one */
  int before = full * N * vp;
  if (k < before) {
    int g = k / (N * vp), in = k % (N * vp);
    *chunk = in / N, *mb = g * N + in % N;
    return;
  }
  int last = m - full * N, in = k - before;
  *chunk = in / last, *mb = full * N + in % last;
}

static mpu_schedule_step step(char phase, const mpu_schedule_config *c, int k) {
  mpu_schedule_step s;
  s.phase = phase;
  table_entry(c, k, &s.microbatch, &s.chunk);
  if (phase == 'B') s.chunk = c->vp - 1 - s.chunk; /* get_model_chunk_id(k, forward=False) */
  return s;
}

mpu_result_t mpu_schedule_order(const mpu_schedule_config *cfg, int pp_rank,
                                mpu_schedule_step *out, size_t cap, int *n) {
  static const char fn[] = "mpu_schedule_order";
  mpu_schedule_config c = MPU_SCHEDULE_CONFIG_INIT;
  int count, warmup;
  MPU_CHECK(mpu_schedule_count(cfg, pp_rank, &count, &warmup));
  MPU_CHECK(take(fn, cfg, &c));
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL output", fn);
  if ((size_t)count > cap)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d steps, out holds %zu", fn, count, cap);
  int total = c.microbatches * c.vp, m = 0, remaining = total - warmup;
  if (c.kind == MPU_SCHEDULE_NO_PIPELINING && !c.forward_only) {
    for (int i = 0; i < total; i++) out[m++] = step('F', &c, i), out[m++] = step('B', &c, i);
  } else {
    for (int k = 0; k < warmup; k++) out[m++] = step('F', &c, k);
    for (int k = 0; k < remaining; k++) { /* steady state: one forward, one backward */
      out[m++] = step('F', &c, k + warmup);
      if (!c.forward_only) out[m++] = step('B', &c, k);
    }
    if (!c.forward_only)
      for (int k = remaining; k < total; k++) out[m++] = step('B', &c, k);
  }
  *n = m;
  return MPU_SUCCESS;
}

mpu_result_t mpu_schedule_timeline(const mpu_schedule_config *cfg, double **start,
                                   double *makespan, double *bubble) {
  static const char fn[] = "mpu_schedule_timeline";
  mpu_schedule_config c = MPU_SCHEDULE_CONFIG_INIT;
  MPU_CHECK(take(fn, cfg, &c));
  int P = c.pp, V = c.pp * c.vp, M = c.microbatches, steps = 0, warmup;
  MPU_CHECK(mpu_schedule_count(&c, 0, &steps, &warmup));
  size_t cells = (size_t)M * (size_t)V;
  /* end[phase][mb * V + virtual stage], < 0 until done */
  double *end = malloc(2 * cells * sizeof *end), *free_at = calloc((size_t)P, sizeof *free_at);
  int *next = calloc((size_t)P, sizeof *next), *stack = malloc((size_t)P * sizeof *stack);
  unsigned char *queued = calloc((size_t)P, 1);
  mpu_schedule_step *order = malloc((size_t)P * (size_t)steps * sizeof *order);
  mpu_result_t r = MPU_SUCCESS;
  if (!end || !free_at || !next || !stack || !queued || !order) {
    r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d stages x %d steps", fn, P, steps);
    goto out;
  }
  for (size_t i = 0; i < 2 * cells; i++) end[i] = -1;
  for (int p = 0; p < P && !r; p++) {
    int n;
    r = mpu_schedule_order(&c, p, order + (size_t)p * steps, (size_t)steps, &n);
  }
  if (r) goto out;
  double tf = 1.0 / c.vp, tb = c.backward_cost / c.vp, last = 0;
  /* each rank runs its order; a step starts once the steps it needs are
   * done. A step needs only the neighbouring stages' steps (the previous
   * virtual stage's forward, the next one's backward), so a stage that
   * moved wakes its two neighbours: every step is tried O(1) times, not
   * once per sweep over all stages (pp sweeps of pp stages for a deep pipe) */
  int top = 0, done = 0;
  for (int p = P - 1; p >= 0; p--) stack[top++] = p, queued[p] = 1;
  while (top) {
    int p = stack[--top], moved = 0;
    queued[p] = 0;
    while (next[p] < steps) {
      const mpu_schedule_step *s = &order[(size_t)p * steps + next[p]];
      int vs = s->chunk * P + p;
      size_t cell = (size_t)s->microbatch * V + (size_t)vs;
      double ready = free_at[p];
      if (s->phase == 'F') {
        if (vs > 0) {
          double prev = end[cell - 1];
          if (prev < 0) break;
          ready = prev > ready ? prev : ready;
        }
      } else {
        double own = end[cell], after = vs + 1 < V ? end[cells + cell + 1] : 0;
        if (own < 0 || after < 0) break;
        ready = own > ready ? own : ready;
        ready = after > ready ? after : ready;
      }
      double e = ready + (s->phase == 'F' ? tf : tb);
      end[(s->phase == 'B' ? cells : 0) + cell] = e;
      if (start && start[p]) start[p][next[p]] = ready;
      free_at[p] = e;
      last = e > last ? e : last;
      next[p]++, done++, moved = 1;
    }
    int wake[2] = {(p + 1) % P, (p + P - 1) % P};
    for (int k = 0; moved && k < 2; k++)
      if (!queued[wake[k]]) stack[top++] = wake[k], queued[wake[k]] = 1;
  }
  if (done < P * steps) {
    r = mpu__error(MPU_ERR_INTERNAL, "%s: the %s order deadlocks", fn, mpu_schedule_name(c.kind));
    goto out;
  }
  double busy = M * (1.0 + (c.forward_only ? 0 : c.backward_cost));
  if (makespan) *makespan = last;
  if (bubble) *bubble = (last - busy) / busy;
out:
  free(end), free(free_at), free(next), free(stack), free(queued), free(order);
  return r;
}
