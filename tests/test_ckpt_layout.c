/*
 * test_ckpt_layout.c - what a checkpoint records of the layout that saved
 * it: mpu_ckpt_layout_from_state fills it from a state; a save of 8 ranks
 * whose set keeps mpu_ckpt_set_init's layout takes the current state's, and
 * without a state (or with sizes that do not multiply to the world) it is
 * refused and leaves no index.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpu.h"

#define ELEMS 4
static char dir[64];

/* each rank saves its ELEMS of a vector of 8 x ELEMS, with the layout given (NULL: as
 * mpu_ckpt_set_init leaves it) */
static mpu_result_t save_slice(mpu_comm *world, const mpu_ckpt_layout *layout) {
  int rank, size;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &size);
  float data[ELEMS];
  for (int i = 0; i < ELEMS; i++) data[i] = (float)(rank * ELEMS + i);
  int64_t shape[1] = {(int64_t)size * ELEMS}, local[1] = {ELEMS};
  mpu_ckpt_box box;
  memset(&box, 0, sizeof box);
  box.global_offset[0] = (int64_t)rank * ELEMS, box.length[0] = ELEMS;
  mpu_ckpt_span sp = {0, ELEMS, data};
  mpu_ckpt_set set;
  mpu_ckpt_set_init(&set);
  if (layout) set.layout = *layout;
  mpu_result_t r = mpu_ckpt_add(&set, "x", MPU_CKPT_PARAM, 1, shape, local, &box, 1, &sp, 1, &sp, 1);
  if (!r) r = mpu_ckpt_save(dir, world, &set);
  mpu_ckpt_set_free(&set);
  return r;
}

static mpu_result_t from_state_rank(mpu_state *s, void *arg) {
  (void)arg;
  mpu_ckpt_layout l;
  memset(&l, 0, sizeof l);
  l.zero1 = 1;
  mpu_result_t r = mpu_ckpt_layout_from_state(s, &l);
  if (r) return r;
  if (l.world != 8 || l.tp != 2 || l.pp != 2 || l.vp != 2 || l.dp != 2 || l.cp != 1 ||
      l.ep != 1 || !l.zero1 || strcmp(l.flavor, "core"))
    return MPU_ERR_MISMATCH;
  mpu_ckpt_layout current;
  memset(&current, 0, sizeof current);
  r = mpu_ckpt_layout_from_state(NULL, &current); /* this thread's current state */
  return r ? r : (current.tp == 2 && current.world == 8 ? MPU_SUCCESS : MPU_ERR_MISMATCH);
}

static void test_from_state(void **state) {
  (void)state;
  mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
  cfg.tp = 2, cfg.pp = 2, cfg.vp = 2;
  assert_int_equal(mpu_with_state(8, &cfg, 1, from_state_rank, NULL, NULL, NULL), MPU_SUCCESS);
  /* no state: refused, the layout unchanged */
  mpu_ckpt_layout l;
  memset(&l, 0x5a, sizeof l);
  mpu_ckpt_layout before = l;
  assert_int_equal(mpu_ckpt_layout_from_state(NULL, &l), MPU_ERR_INVALID_ARGUMENT);
  assert_memory_equal(&l, &before, sizeof l);
  assert_int_equal(mpu_ckpt_layout_from_state(NULL, NULL), MPU_ERR_INVALID_ARGUMENT);
}

static mpu_result_t save_in_state(mpu_state *s, void *arg) {
  (void)arg;
  return save_slice(mpu_state_world(s), NULL);
}

static void test_save_fills_from_state(void **state) {
  (void)state;
  mpu_layout_config cfg = MPU_LAYOUT_CONFIG_INIT;
  cfg.tp = 2, cfg.pp = 2;
  assert_int_equal(mpu_with_state(8, &cfg, 1, save_in_state, NULL, NULL, NULL), MPU_SUCCESS);
  mpu_ckpt *ck = NULL;
  assert_int_equal(mpu_ckpt_open(dir, &ck), MPU_SUCCESS);
  mpu_ckpt_info in;
  assert_int_equal(mpu_ckpt_get_info(ck, &in), MPU_SUCCESS);
  assert_int_equal(in.layout.world, 8);
  assert_int_equal(in.layout.tp, 2);
  assert_int_equal(in.layout.pp, 2);
  assert_int_equal(in.layout.dp, 2);
  assert_int_equal(in.layout.vp, 0);
  mpu_ckpt_free(ck);
}

static mpu_result_t save_no_state(mpu_comm *world, void *arg) { return save_slice(world, arg); }

static void expect_refused(const mpu_ckpt_layout *layout) {
  mpu_result_t results[8];
  mpu_ckpt *ck = NULL;
  assert_int_not_equal(mpu_launch(8, save_no_state, (void *)layout, results, NULL), MPU_SUCCESS);
  for (int i = 0; i < 8; i++) assert_int_not_equal(results[i], MPU_SUCCESS);
  assert_int_equal(results[0], MPU_ERR_INVALID_ARGUMENT);
  assert_int_not_equal(mpu_ckpt_open(dir, &ck), MPU_SUCCESS); /* no index */
  assert_null(ck);
}

static mpu_result_t message_rank(mpu_comm *world, void *arg) {
  mpu_result_t r = save_slice(world, arg);
  int rank;
  mpu_comm_rank(world, &rank);
  if (rank == 0 && (r != MPU_ERR_INVALID_ARGUMENT ||
                    !strstr(mpu_last_error(), "tp 1 x pp 1 x cp 1 x dp 1, not the 8 ranks") ||
                    !strstr(mpu_last_error(), "mpu_ckpt_layout_from_state")))
    return MPU_ERR_MISMATCH;
  return r;
}

static void test_save_without_layout_refused(void **state) {
  (void)state;
  strcat(dir, "_r"); /* a directory no save wrote to: a refusal leaves no index */
  /* rank 0's message names the sizes and the helper */
  mpu_result_t results[8];
  mpu_launch(8, message_rank, NULL, results, NULL);
  assert_int_equal(results[0], MPU_ERR_INVALID_ARGUMENT);
  expect_refused(NULL);
  mpu_ckpt_layout wrong;
  memset(&wrong, 0, sizeof wrong);
  wrong.tp = 4, wrong.pp = 1, wrong.cp = 1, wrong.dp = 4, wrong.ep = 1; /* 16 ranks' sizes */
  snprintf(wrong.flavor, sizeof wrong.flavor, "core");
  expect_refused(&wrong);
  /* set by hand to sizes that fit: saved as given */
  mpu_ckpt_layout right = wrong;
  right.dp = 2;
  assert_int_equal(mpu_launch(8, save_no_state, &right, NULL, NULL), MPU_SUCCESS);
  mpu_ckpt *ck = NULL;
  assert_int_equal(mpu_ckpt_open(dir, &ck), MPU_SUCCESS);
  mpu_ckpt_info in;
  mpu_ckpt_get_info(ck, &in);
  assert_int_equal(in.layout.tp, 4);
  assert_int_equal(in.layout.dp, 2);
  mpu_ckpt_free(ck);
}

int main(void) {
  snprintf(dir, sizeof dir, "ckpt_layout_%d", (int)getpid());
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_from_state),
      cmocka_unit_test(test_save_fills_from_state),
      cmocka_unit_test(test_save_without_layout_refused),
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  char cmd[160];
  snprintf(cmd, sizeof cmd, "rm -rf ckpt_layout_%d ckpt_layout_%d_r", (int)getpid(), (int)getpid());
  if (system(cmd)) failed++;
  return failed;
}
