/*
 * fuzz_schedule.c - libFuzzer target over pipeline schedules: the words of
 * `mpu plan --schedule` ("interleaved --pp 4 --vp 2 --micro-batches 8
 * --group-size 4 --forward-only --backward-cost 1.5", any value, any order,
 * sizes up to INT_MAX and past it) become a schedule config; the counts,
 * every stage's order and the timeline are computed. Nothing may crash,
 * overflow (UBSan) or read out of bounds, whatever the words; a config the
 * library accepts must give orders that run every micro-batch's forward and
 * backward once per chunk, forward first, and a timeline no shorter than one
 * stage's work.
 */
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpu.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Work per input stays small: larger accepted configs are counted, not run. */
#define RUN_MAX_STEPS 20000

/* an integer word as plan reads one, kept to int's range by saturating */
static int int_word(const char *w) {
  long long x = strtoll(w, NULL, 10);
  return x > INT_MAX ? INT_MAX : x < INT_MIN ? INT_MIN : (int)x;
}

static void check_orders(const mpu_schedule_config *c) {
  int n = 0, warmup = 0;
  if (mpu_schedule_count(c, 0, &n, &warmup)) abort(); /* accepted once: accepted again */
  if ((int64_t)n * c->pp > RUN_MAX_STEPS) return;
  mpu_schedule_step *order = malloc(((size_t)n + 1) * sizeof *order);
  double **start = calloc((size_t)c->pp, sizeof *start);
  unsigned char *seen = calloc((size_t)c->microbatches * (size_t)c->vp, 1);
  if (!order || !start || !seen) abort();
  for (int p = 0; p < c->pp; p++) {
    int got = -1, w = -1, count = -1;
    if (mpu_schedule_count(c, p, &count, &w) || count != n || w < 0 || w > n) abort();
    if (mpu_schedule_order(c, p, order, (size_t)n, &got) || got != n) abort();
    if (n > 0 && mpu_schedule_order(c, p, order, (size_t)n - 1, &got) == MPU_SUCCESS) abort();
    memset(seen, 0, (size_t)c->microbatches * (size_t)c->vp);
    for (int i = 0; i < n; i++) {
      const mpu_schedule_step *s = &order[i];
      if (s->microbatch < 0 || s->microbatch >= c->microbatches || s->chunk < 0 ||
          s->chunk >= c->vp)
        abort();
      unsigned char *cell = &seen[(size_t)s->microbatch * (size_t)c->vp + (size_t)s->chunk];
      if (s->phase == 'F') {
        if (*cell) abort(); /* once, and before its backward */
        *cell = 1;
      } else if (s->phase == 'B') {
        if (*cell != 1 || c->forward_only) abort();
        *cell = 2;
      } else {
        abort();
      }
    }
    for (size_t k = 0; k < (size_t)c->microbatches * (size_t)c->vp; k++)
      if (seen[k] != (c->forward_only ? 1 : 2)) abort();
    start[p] = malloc(((size_t)n + 1) * sizeof **start);
    if (!start[p]) abort();
  }
  double makespan = -1, bubble = -1;
  if (mpu_schedule_timeline(c, start, &makespan, &bubble)) abort();
  double busy = c->microbatches * (1.0 + (c->forward_only ? 0 : c->backward_cost));
  if (!(makespan >= busy * (1 - 1e-9)) || !(bubble >= -1e-9)) abort();
  for (int p = 0; p < c->pp; p++) free(start[p]);
  free(start), free(order), free(seen);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char text[512];
  if (size >= sizeof text) size = sizeof text - 1;
  memcpy(text, data, size);
  text[size] = '\0';
  mpu_schedule_config c = MPU_SCHEDULE_CONFIG_INIT;
  char *save = NULL;
  for (char *w = strtok_r(text, " \t\n", &save); w; w = strtok_r(NULL, " \t\n", &save)) {
    char *v = NULL;
    if (!strcmp(w, "--forward-only")) {
      c.forward_only = 1;
      continue;
    }
    if (w[0] == '-' && w[1] == '-') {
      v = strtok_r(NULL, " \t\n", &save);
      if (!v) break;
    }
    if (!v) {
      mpu_schedule_kind k;
      if (!mpu_schedule_from_name(w, &k)) c.kind = k;
      continue;
    }
    if (!strcmp(w, "--pp")) c.pp = int_word(v);
    else if (!strcmp(w, "--vp")) c.vp = int_word(v);
    else if (!strcmp(w, "--micro-batches")) c.microbatches = int_word(v);
    else if (!strcmp(w, "--group-size")) c.group_size = int_word(v);
    else if (!strcmp(w, "--backward-cost")) c.backward_cost = strtod(v, NULL);
    else if (!strcmp(w, "--kind")) c.kind = (mpu_schedule_kind)int_word(v); /* out of range too */
  }
  int n = 0, warmup = 0;
  if (mpu_schedule_count(&c, 0, &n, &warmup) != MPU_SUCCESS) {
    /* refused: the timeline must refuse too, before allocating anything */
    double makespan;
    if (mpu_schedule_timeline(&c, NULL, &makespan, NULL) == MPU_SUCCESS) abort();
    return 0;
  }
  if (n < 1 || (int64_t)n * c.pp > MPU_SCHEDULE_MAX_STEPS) abort(); /* the documented bound */
  check_orders(&c);
  return 0;
}
