/*
 * test_state_registry.c - a destroyed state is an error, never read: every
 * entry point looks the state up among the live ones first (run under ASan,
 * a read of freed memory fails the test).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"

static mpu_layout_config config(int world, int tp) {
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  c.world_size = world;
  c.tp = tp;
  return c;
}

/* fn ends the state mpu_with_state made (mpu_state_reset): the helper's own
 * destroy afterwards finds it gone instead of freeing it twice */
static mpu_result_t resets(mpu_state *s, void *arg) {
  int *calls = arg;
  __atomic_fetch_add(calls, 1, __ATOMIC_SEQ_CST);
  if (mpu_state_current() != s) return MPU_ERR_INTERNAL;
  mpu_state_reset();
  return mpu_state_is_initialized(s) ? MPU_ERR_INTERNAL : MPU_SUCCESS;
}

static void test_with_state_fn_resets(void **state) {
  (void)state;
  mpu_layout_config c = config(2, 2);
  int calls = 0;
  assert_int_equal(mpu_with_state(2, &c, 7, resets, &calls, NULL, NULL), MPU_SUCCESS);
  assert_int_equal(calls, 2);
  assert_null(mpu_state_current());
}

static void test_calls_after_destroy(void **state) {
  (void)state;
  mpu_layout_config c = config(8, 2);
  mpu_state *s = NULL;
  assert_int_equal(mpu_state_mock(3, &c, 1, &s), MPU_SUCCESS);
  int rank = -1;
  assert_int_equal(mpu_state_tp_rank(s, &rank), MPU_SUCCESS);
  assert_int_equal(rank, 1);
  mpu_state_destroy(s);
  /* every kind of entry point: getters, setters, NCCL, buffers, seeding */
  assert_int_equal(mpu_state_tp_rank(s, &rank), MPU_ERR_INVALID_USAGE);
  assert_non_null(strstr(mpu_last_error(), "not a live state"));
  assert_int_equal(mpu_state_enable_nccl(s, NULL), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_state_set_tp_rank(s, 0), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_state_manual_seed(s, 1), MPU_ERR_INVALID_USAGE);
  mpu_tensor t;
  int64_t shape[1] = {4};
  assert_int_equal(mpu_state_memory_buffer(s, "x", MPU_FLOAT32, 1, shape, &t),
                   MPU_ERR_INVALID_USAGE);
  mpu_comm *comm = NULL;
  assert_int_equal(mpu_state_comm(s, MPU_GROUP_TP, &comm), MPU_ERR_INVALID_USAGE);
  assert_null(mpu_state_default_rng(s));
  assert_null(mpu_state_layout(s));
  assert_null(mpu_state_world(s));
  assert_false(mpu_state_is_initialized(s));
  /* twice: refused with a message, nothing read */
  mpu_clear_error();
  mpu_state_destroy(s);
  assert_non_null(strstr(mpu_last_error(), "destroyed twice"));
}

/* the current state destroyed from elsewhere: the thread's getters fail,
 * they do not read it */
static void test_current_destroyed(void **state) {
  (void)state;
  mpu_layout_config c = config(4, 2);
  mpu_state *s = NULL;
  assert_int_equal(mpu_state_mock(0, &c, 1, &s), MPU_SUCCESS);
  mpu_state_set_current(s);
  mpu_state *alias = s;
  mpu_state_destroy(alias);
  int size = 0;
  mpu_state_set_current(alias); /* a stale pointer made current again */
  assert_int_equal(mpu_state_tp_size(NULL, &size), MPU_ERR_INVALID_USAGE);
  assert_false(mpu_state_is_initialized(NULL));
  mpu_state_reset(); /* no crash: not live, nothing freed */
  mpu_state_set_current(NULL);
}

/* fn destroys the state that was current before: the helper does not put
 * its streams back into freed memory */
static mpu_state *outer;

static mpu_result_t destroys_outer(mpu_state *s, void *arg) {
  (void)s, (void)arg;
  mpu_state_destroy(outer);
  return MPU_SUCCESS;
}

static void test_with_state_fn_destroys_outer(void **state) {
  (void)state;
  mpu_layout_config c = config(1, 1);
  assert_int_equal(mpu_state_mock(0, &c, 1, &outer), MPU_SUCCESS);
  mpu_state_set_current(outer);
  mpu_comm *world = NULL;
  assert_int_equal(mpu_comm_fake_create(0, 1, &world), MPU_SUCCESS);
  assert_int_equal(mpu_with_state_on(world, &c, 3, destroys_outer, NULL), MPU_SUCCESS);
  assert_null(mpu_state_current());
  mpu_comm_destroy(world);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_with_state_fn_resets),
      cmocka_unit_test(test_calls_after_destroy),
      cmocka_unit_test(test_current_destroyed),
      cmocka_unit_test(test_with_state_fn_destroys_outer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
