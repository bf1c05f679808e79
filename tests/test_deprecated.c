/*
 * test_deprecated.c - the names kept for one release beside their new ones
 * (docs/api.md, "Lifecycles and names") still compile, link and do what the
 * new ones do.
 */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"

typedef struct block {
  mpu_state *s;
  uint64_t drawn; /* the block's one random draw */
} block;

static mpu_result_t draw(void *user) {
  block *b = user;
  b->drawn = mpu_rng_next(mpu_state_default_rng(b->s));
  return MPU_SUCCESS;
}

static mpu_result_t rank_fn(mpu_state *s, void *arg) {
  block u = {s, 0};
  mpu_checkpoint ck; /* the old type name */
  mpu_result_t r = mpu_checkpoint_forward(&ck, s, draw, &u);
  uint64_t first = u.drawn;
  if (!r) r = mpu_checkpoint_recompute(&ck, s, draw, &u);
  if (!r && u.drawn != first) r = mpu_fail(MPU_ERR_INTERNAL, "replay drew %llu, forward %llu",
                                           (unsigned long long)u.drawn, (unsigned long long)first);
  *(int *)arg = r == MPU_SUCCESS;
  return r;
}

static void test_recompute_old_names(void **state) {
  (void)state;
  int ok = 0;
  mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
  assert_int_equal(mpu_with_state(1, &cfg, 1234, rank_fn, &ok, NULL, NULL), MPU_SUCCESS);
  assert_true(ok);
  mpu_checkpoint never;
  memset(&never, 0, sizeof never);
  assert_int_equal(mpu_checkpoint_recompute(&never, NULL, draw, NULL), MPU_ERR_INVALID_USAGE);
  assert_non_null(strstr(mpu_last_error(), "mpu_recompute_forward"));
}

/* mpu_ckpt_close accepts NULL as mpu_ckpt_free does, and frees what mpu_ckpt_open made (the
 * refusal of a missing folder leaves nothing to free) */
static void test_ckpt_close(void **state) {
  (void)state;
  mpu_ckpt *ck = NULL;
  mpu_ckpt_close(NULL);
  assert_int_not_equal(mpu_ckpt_open("/nonexistent/mpu-test-deprecated", &ck), MPU_SUCCESS);
  mpu_ckpt_close(ck);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_recompute_old_names),
                                     cmocka_unit_test(test_ckpt_close)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
