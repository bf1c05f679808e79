/*
 * test_hardening.c - refusals of the training blocks, the schedules and the
 * layout text: every refused call returns a clear error and changes nothing.
 *
 *   optimizer     every float option finite and in range; a parameter name
 *                 past the limit refused, not cut; ranks of one dp group
 *                 given different options fail at init (ZeRO-1 and the
 *                 sharded optimizer), every one of them
 *   recompute     a checkpoint with invalid streams leaves every stream,
 *                 the default one too, as it was
 *   schedule      sizes near INT_MAX refused before any product overflows;
 *                 at most MPU_SCHEDULE_MAX_STEPS steps
 *   layout text   negative sizes, a key given twice, empty text refused
 *   with_state    a config naming another world refused
 */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"

/* ---- optimizer options ------------------------------------------------------------------ */

static void one_param(mpu_param_buffer *b) {
  mpu_param_buffer_init(b, 0);
  assert_int_equal(mpu_param_buffer_add(b, "w", 8, MPU_PARAM_DUPLICATE, NULL), 0);
  assert_int_equal(mpu_param_buffer_finalize(b, NULL, NULL), 0);
}

static void test_optimizer_float_options(void **state) {
  (void)state;
  mpu_param_buffer b;
  one_param(&b);
  mpu_comm *fake;
  assert_int_equal(mpu_comm_fake_create(0, 1, &fake), 0);
  const float bad[] = {INFINITY, -INFINITY, NAN, -1.0f};
  size_t fields[] = {offsetof(mpu_adamw_options, lr), offsetof(mpu_adamw_options, beta1),
                     offsetof(mpu_adamw_options, beta2), offsetof(mpu_adamw_options, eps),
                     offsetof(mpu_adamw_options, weight_decay),
                     offsetof(mpu_adamw_options, clip_grad)};
  static const char *const names[] = {"lr", "beta1", "beta2", "eps", "weight_decay", "clip_grad"};
  for (size_t f = 0; f < 6; f++)
    for (size_t k = 0; k < 4; k++) {
      mpu_adamw_options o = MPU_ADAMW_OPTIONS_INIT;
      memcpy((char *)&o + fields[f], &bad[k], sizeof(float));
      mpu_optimizer opt;
      assert_int_equal(mpu_optimizer_init(&opt, &b, fake, 0, &o), MPU_ERR_INVALID_ARGUMENT);
      assert_non_null(strstr(mpu_last_error(), names[f]));
    }
  /* the bounds themselves: beta 1 and eps 0 out, lr 0 and beta 0 in */
  mpu_adamw_options o = MPU_ADAMW_OPTIONS_INIT;
  o.beta2 = 1.0f;
  mpu_optimizer opt;
  assert_int_equal(mpu_optimizer_init(&opt, &b, fake, 0, &o), MPU_ERR_INVALID_ARGUMENT);
  o.beta2 = 0.999f, o.eps = 0.0f;
  assert_int_equal(mpu_optimizer_init(&opt, &b, fake, 0, &o), MPU_ERR_INVALID_ARGUMENT);
  o.eps = 1e-8f, o.lr = 0.0f, o.beta1 = 0.0f, o.clip_grad = 0.0f, o.weight_decay = 0.0f;
  assert_int_equal(mpu_optimizer_init(&opt, &b, fake, 0, &o), 0);
  mpu_optimizer_free(&opt);
  mpu_param_buffer_free(&b);
  mpu_comm_destroy(fake);
}

static void test_param_names(void **state) {
  (void)state;
  mpu_param_buffer b;
  mpu_param_buffer_init(&b, 0);
  char name[100];
  memset(name, 'a', 99);
  name[99] = 0;
  assert_int_equal(mpu_param_buffer_add(&b, name, 4, MPU_PARAM_DUPLICATE, NULL),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "99 characters"));
  name[48] = 0; /* 48: one past the limit */
  assert_int_equal(mpu_param_buffer_add(&b, name, 4, MPU_PARAM_DUPLICATE, NULL),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_param_buffer_add(&b, "", 4, MPU_PARAM_DUPLICATE, NULL),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(b.nparams, 0);
  name[47] = 0; /* 47 fits, whole */
  int i;
  assert_int_equal(mpu_param_buffer_add(&b, name, 4, MPU_PARAM_DUPLICATE, &i), 0);
  assert_string_equal(b.params[i].name, name);
  assert_int_equal(mpu_param_buffer_add(&b, name, 4, MPU_PARAM_DUPLICATE, NULL),
                   MPU_ERR_INVALID_ARGUMENT); /* one name, one parameter */
  assert_non_null(strstr(mpu_last_error(), "already"));
  assert_int_equal(b.nparams, 1);
  mpu_param_buffer_free(&b);
}

/* ---- optimizer options agreed across dp ---------------------------------------------------- */

typedef struct agree_case {
  int odd_rank;              /* the rank given other options (-1: none) */
  int field;                 /* 0 lr, 1 sum, 2 distributed, 3 shape, 4 lr of mpu_fsdp,
                              * 5 mpu_fsdp's layout */
  mpu_result_t results[4];
  char messages[4][256];
} agree_case;

static mpu_result_t agree_rank(mpu_comm *world, void *arg) {
  agree_case *c = arg;
  int rank;
  mpu_comm_rank(world, &rank);
  mpu_param_buffer b;
  mpu_param_buffer_init(&b, 0);
  size_t n = c->field == 3 && rank == c->odd_rank ? 9 : 8;
  mpu_result_t r = mpu_param_buffer_add(&b, "w", n, MPU_PARAM_DUPLICATE, NULL);
  if (!r) r = mpu_param_buffer_finalize(&b, NULL, NULL);
  mpu_adamw_options o = MPU_ADAMW_OPTIONS_INIT;
  int distributed = 1;
  if (rank == c->odd_rank) {
    if (c->field == 0) o.lr = 2e-3f;
    if (c->field == 1) o.sync.sum = 1;
    if (c->field == 2) distributed = 0;
  }
  mpu_optimizer opt;
  memset(&opt, 0, sizeof opt);
  if (c->field >= 4) { /* the sharded optimizer (ZeRO-3), one rank with another lr or layout */
    mpu_fsdp_options fo = MPU_FSDP_OPTIONS_INIT;
    fo.adamw = o;
    if (rank == c->odd_rank && c->field == 4) fo.adamw.lr = 2e-3f;
    if (rank == c->odd_rank && c->field == 5) fo.layout = MPU_FSDP_PER_PARAM;
    mpu_fsdp *f = NULL;
    if (!r) r = mpu_fsdp_create(&b, world, NULL, &fo, &f);
    mpu_fsdp_free(f);
  } else if (!r) {
    r = mpu_optimizer_init(&opt, &b, world, distributed, &o);
  }
  c->results[rank] = r;
  snprintf(c->messages[rank], sizeof c->messages[rank], "%s", r ? mpu_last_error() : "");
  mpu_optimizer_free(&opt);
  mpu_param_buffer_free(&b);
  return MPU_SUCCESS;
}

static void test_optimizer_options_agree(void **state) {
  (void)state;
  static const char *const field[] = {"lr", "sum", "distributed", "elements", "lr", "layout"};
  for (int f = 0; f < 6; f += 4) {
    agree_case same = {.odd_rank = -1, .field = f};
    assert_int_equal(mpu_launch(4, agree_rank, &same, NULL, NULL), 0);
    for (int r = 0; r < 4; r++) assert_int_equal(same.results[r], MPU_SUCCESS);
  }
  for (int f = 0; f < 6; f++) {
    agree_case c = {.odd_rank = 2, .field = f};
    assert_int_equal(mpu_launch(4, agree_rank, &c, NULL, NULL), 0);
    for (int r = 0; r < 4; r++) { /* every rank refuses, naming rank 2 and the option */
      assert_int_equal(c.results[r], MPU_ERR_MISMATCH);
      char want[64];
      snprintf(want, sizeof want, "rank 2's %s is", field[f]);
      assert_non_null(strstr(c.messages[r], want));
      if (f == 5) assert_non_null(strstr(c.messages[r], "is per_param, rank 0's flat"));
    }
  }
}

/* ---- recompute ------------------------------------------------------------------------- */

static mpu_result_t never_called(void *user) {
  (*(int *)user)++;
  return MPU_SUCCESS;
}

static void test_recompute_refusal_changes_nothing(void **state) {
  (void)state;
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  c.world_size = 2, c.tp = 2;
  mpu_state *s;
  assert_int_equal(mpu_state_mock(0, &c, 99, &s), 0);
  mpu_rng *d = mpu_state_default_rng(s);
  mpu_rng_tracker *t = mpu_state_rng_tracker(s);
  mpu_rng before = *d;
  mpu_rng_states streams_before;
  assert_int_equal(mpu_rng_tracker_get_states(t, &streams_before), 0);
  mpu_recompute *ck = malloc(sizeof *ck);
  assert_non_null(ck);
  int calls = 0;
  for (int garbage = 0; garbage < 3; garbage++) {
    memset(ck, garbage == 0 ? 0xff : 0x5a, sizeof *ck); /* saved is non-zero, streams invalid */
    if (garbage == 2) ck->saved = 1, ck->streams.n = 1, memset(ck->streams.names[0], 'x', 48);
    assert_int_equal(mpu_recompute_replay(ck, s, never_called, &calls),
                     MPU_ERR_INVALID_ARGUMENT);
    assert_memory_equal(d, &before, sizeof before);
    mpu_rng_states now;
    assert_int_equal(mpu_rng_tracker_get_states(t, &now), 0);
    assert_memory_equal(&now, &streams_before, sizeof now);
  }
  assert_int_equal(calls, 0);
  free(ck);
  mpu_state_destroy(s);
}

/* ---- schedules ------------------------------------------------------------------------- */

static void test_schedule_bounds(void **state) {
  (void)state;
  mpu_schedule_config c = MPU_SCHEDULE_CONFIG_INIT;
  c.kind = MPU_SCHEDULE_INTERLEAVED, c.pp = INT_MAX, c.vp = INT_MAX, c.microbatches = INT_MAX;
  double makespan;
  /* each product refused before it is made (UBSan would flag the overflow) */
  assert_int_equal(mpu_schedule_timeline(&c, NULL, &makespan, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "at most"));
  c.pp = 2, c.vp = 1, c.kind = MPU_SCHEDULE_1F1B, c.microbatches = 4000000;
  assert_int_equal(mpu_schedule_timeline(&c, NULL, &makespan, NULL), MPU_ERR_INVALID_ARGUMENT);
  int n, w;
  c.pp = INT_MAX, c.microbatches = 1;
  assert_int_equal(mpu_schedule_count(&c, 0, &n, &w), MPU_ERR_INVALID_ARGUMENT);
  /* the limit itself is accepted, one step more is not */
  c.pp = 4, c.microbatches = MPU_SCHEDULE_MAX_STEPS / 8;
  assert_int_equal(mpu_schedule_count(&c, 0, &n, &w), 0);
  assert_int_equal(n, MPU_SCHEDULE_MAX_STEPS / 4);
  c.microbatches++;
  assert_int_equal(mpu_schedule_count(&c, 0, &n, &w), MPU_ERR_INVALID_ARGUMENT);
}

/* ---- layout text ----------------------------------------------------------------------- */

static void test_layout_parse_refusals(void **state) {
  (void)state;
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT, untouched;
  c.tp = 3;
  untouched = c;
  static const char *const bad[] = {"tp=-2",         "tp=2 tp=4",   "",        "  ,\t\n",
                                    "world_size=-8", "pp=-1",       "split_rank=-2",
                                    "order=tp-dp order=dp-tp",     "flavor=core flavor=core"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    assert_int_equal(mpu_layout_config_parse(bad[i], &c), MPU_ERR_INVALID_ARGUMENT);
    assert_memory_equal(&c, &untouched, sizeof c);
  }
  assert_int_equal(mpu_layout_config_parse("tp=2 tp=4", &c), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "'tp' is given twice"));
  assert_int_equal(mpu_layout_config_parse("", &c), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "no entries"));
  assert_int_equal(mpu_layout_config_parse("tp=-2", &c), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "tp=-2"));
  assert_int_equal(mpu_layout_config_parse("world_size=8 split_rank=-1 tp=2", &c), 0);
  assert_int_equal(c.split_rank, -1);
  assert_int_equal(c.tp, 2);
}

static mpu_result_t nothing(mpu_state *s, void *arg) {
  (void)s;
  __atomic_fetch_add((int *)arg, 1, __ATOMIC_RELAXED); /* ranks are threads */
  return MPU_SUCCESS;
}

static void test_with_state_world(void **state) {
  (void)state;
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  c.world_size = 8, c.tp = 2;
  int calls = 0;
  assert_int_equal(mpu_with_state(4, &c, 1, nothing, &calls, NULL, NULL),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "world_size 8"));
  assert_int_equal(calls, 0);
  c.world_size = 0; /* the launch's */
  assert_int_equal(mpu_with_state(4, &c, 1, nothing, &calls, NULL, NULL), 0);
  c.world_size = 4;
  assert_int_equal(mpu_with_state(4, &c, 1, nothing, &calls, NULL, NULL), 0);
  assert_int_equal(calls, 8);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_optimizer_float_options),
      cmocka_unit_test(test_param_names),
      cmocka_unit_test(test_optimizer_options_agree),
      cmocka_unit_test(test_recompute_refusal_changes_nothing),
      cmocka_unit_test(test_schedule_bounds),
      cmocka_unit_test(test_layout_parse_refusals),
      cmocka_unit_test(test_with_state_world),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
