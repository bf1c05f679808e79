/*
 * test_regions.c - every region's forward and backward on 8 thread ranks
 * with tp = 1, 2, 4, 8, against values derived by hand (the mpu/mappings.py walkthrough's for
 * tp = 2: _reduce on ranks 6 and 7 gives 13, copy_to's gradient is 13,
 * reduce_from's loss 170 with gradients 12 and 14, scatter_to's gradient
 * [6, 7]); and the errors: shapes that do not divide, wrong output shapes,
 * NULL data.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"

#define TEST_RANK r
#include "test_helpers.h"

/* A region or primitive as a GPU program runs it: where tp's memory is the
 * device's (NCCL), on device tensors filled from the host arrays and read
 * back into them by copies (the host cannot touch device memory); elsewhere
 * on the arrays themselves. step: 'f' forward, 'b' backward, 'p' primitive. */
static mpu_result_t on_mem(char step, int which, mpu_comm *tp, const mpu_tensor *x, mpu_tensor *y,
                           int flags) {
  mpu_tensor dx = *x, dy = *y;
  void *px = NULL, *py = NULL;
  size_t xb = mpu_tensor_nbytes(x), yb = mpu_tensor_nbytes(y);
  int dev = test_on_device(tp) && x->data && y->data;
  mpu_result_t r = MPU_SUCCESS;
  if (dev) {
    r = test_dev_in(tp, x->data, xb, &px);
    if (!r) r = test_dev_in(tp, y->data, yb, &py);
    dx.data = px, dy.data = py;
  }
  if (!r)
    r = step == 'f'   ? mpu_region_forward((mpu_region)which, tp, &dx, &dy)
        : step == 'b' ? mpu_region_backward((mpu_region)which, tp, &dx, &dy, flags)
                      : mpu_primitive_run((mpu_primitive)which, tp, &dx, &dy);
  if (dev) {
    mpu_result_t f = test_dev_out(tp, px, NULL, 0), o = test_dev_out(tp, py, r ? NULL : y->data, yb);
    r = r ? r : o ? o : f;
  }
  return r;
}
#define FWD(region, tp, x, y) on_mem('f', region, tp, x, y, 0)
#define BWD(region, tp, x, y, flags) on_mem('b', region, tp, x, y, flags)
#define PRIM(prim, tp, x, y) on_mem('p', prim, tp, x, y, 0)

static mpu_result_t regions_rank(mpu_state *s, void *arg) {
  (void)arg;
  int r, T, tr;
  mpu_comm_rank(mpu_state_world(s), &r);
  mpu_state_tp_size(s, &T);
  mpu_state_tp_rank(s, &tr);
  mpu_comm *tp;
#ifdef MPU_TEST_NCCL /* the regions on NCCL communicators  */
  ROK(mpu_state_enable_nccl(s, NULL));
#endif
  ROK(mpu_state_comm(s, MPU_GROUP_TP, &tp));
#ifdef MPU_TEST_NCCL
  RCHECK(!strcmp(mpu_comm_backend(tp), "nccl"), "tp group on %s", mpu_comm_backend(tp));
#endif
  int g0 = r - tr; /* the group is g0 .. g0 + T - 1 */
  float group_sum = (float)(T * g0 + T * (T - 1) / 2), sq = 0;
  for (int k = 0; k < T; k++) sq += (float)((g0 + k) * (g0 + k));
  float a[64], b[64], c[64];
  mpu_tensor x, y, z;

  /* _reduce([r]) */
  a[0] = (float)r, x = test_vec(a, 1), y = test_vec(b, 1);
  ROK(PRIM(MPU_PRIM_ALL_REDUCE, tp, &x, &y));
  RCHECK(b[0] == group_sum, "_reduce: %g, want %g", b[0], group_sum);
  /* copy_to: identity forward, all-reduce backward */
  ROK(FWD(MPU_COPY_TO_TP, tp, &x, &y));
  RCHECK(b[0] == (float)r, "copy_to forward");
  ROK(BWD(MPU_COPY_TO_TP, tp, &x, &y, 0));
  RCHECK(b[0] == group_sum, "copy_to backward: %g, want %g", b[0], group_sum);
  /* reduce_from(r * x), loss 2z: z = sum of squares, gradient 2 r */
  a[0] = (float)(r * r);
  ROK(FWD(MPU_REDUCE_FROM_TP, tp, &x, &y));
  RCHECK(b[0] == sq, "reduce_from forward: %g, want %g", b[0], sq);
  a[0] = 2;
  ROK(BWD(MPU_REDUCE_FROM_TP, tp, &x, &y, 0));
  RCHECK(b[0] * (float)r == 2.0f * (float)r, "reduce_from backward");
  if (T == 2 && r >= 6) RCHECK(2 * sq == 170 && 2 * r == (r == 6 ? 12 : 14), "seed values");
  /* scatter_to [1..T] -> [tr + 1]; backward of [r] gathers the group */
  for (int k = 0; k < T; k++) a[k] = (float)(k + 1);
  x = test_vec(a, T), y = test_vec(b, 1);
  ROK(FWD(MPU_SCATTER_TO_TP, tp, &x, &y));
  RCHECK(b[0] == (float)(tr + 1), "scatter_to forward");
  c[0] = (float)r, z = test_vec(c, 1);
  mpu_tensor gx = test_vec(a, T);
  ROK(BWD(MPU_SCATTER_TO_TP, tp, &z, &gx, 0));
  for (int k = 0; k < T; k++) RCHECK(a[k] == (float)(g0 + k), "scatter_to backward [%d]", k);
  /* gather_from [r] -> the group; backward splits */
  a[0] = (float)r, x = test_vec(a, 1), y = test_vec(b, T);
  ROK(FWD(MPU_GATHER_FROM_TP, tp, &x, &y));
  for (int k = 0; k < T; k++) RCHECK(b[k] == (float)(g0 + k), "gather_from forward [%d]", k);
  for (int k = 0; k < T; k++) b[k] = (float)(100 * k + r);
  ROK(BWD(MPU_GATHER_FROM_TP, tp, &y, &x, 0));
  RCHECK(a[0] == (float)(100 * tr + r), "gather_from backward");

  /* sequence parallel: x (rows, 2), x[i][j] = 100 r + 10 i + j */
  int rows = T > 4 ? T : 4;
  float xs[16 * 2], os[64 * 2], gs[16 * 2];
  for (int i = 0; i < rows; i++)
    for (int j = 0; j < 2; j++) xs[i * 2 + j] = (float)(100 * r + 10 * i + j);
  x = test_mat(xs, rows, 2);
  /* scatter: this rank's rows; backward: gather */
  y = test_mat(os, rows / T, 2);
  ROK(FWD(MPU_SCATTER_TO_SP, tp, &x, &y));
  for (int i = 0; i < rows / T; i++)
    RCHECK(os[i * 2] == (float)(100 * r + 10 * (tr * rows / T + i)), "sp scatter row %d", i);
  z = test_mat(gs, rows, 2);
  ROK(BWD(MPU_SCATTER_TO_SP, tp, &y, &z, 0));
  for (int k = 0; k < T; k++) /* block k is rank g0+k's chunk k */
    RCHECK(gs[k * (rows / T) * 2] == (float)(100 * (g0 + k) + 10 * (k * rows / T)), "sp scatter back");
  /* gather: all ranks' rows; backward reduce-scatter (sums) or split (own) */
  y = test_mat(os, rows * T, 2);
  ROK(FWD(MPU_GATHER_FROM_SP, tp, &x, &y));
  for (int k = 0; k < T; k++) RCHECK(os[k * rows * 2] == (float)(100 * (g0 + k)), "sp gather");
  ROK(BWD(MPU_GATHER_FROM_SP, tp, &y, &z, 0)); /* grad = gathered x */
  for (int i = 0; i < rows; i++) { /* every rank sent the same gathered rows: T times block tr */
    float want = (float)T * (float)(100 * (g0 + tr) + 10 * i);
    RCHECK(gs[i * 2] == want, "sp gather backward row %d: %g, want %g", i, gs[i * 2], want);
  }
  ROK(BWD(MPU_GATHER_FROM_SP, tp, &y, &z, MPU_NO_TP_OUTPUT_GRAD));
  for (int i = 0; i < rows; i++) RCHECK(gs[i * 2] == (float)(100 * (g0 + tr) + 10 * i), "split back");
  /* reduce-scatter: the group's sum of this rank's block */
  y = test_mat(os, rows / T, 2);
  ROK(FWD(MPU_REDUCE_SCATTER_TO_SP, tp, &x, &y));
  for (int i = 0; i < rows / T; i++) {
    float want = 100 * group_sum + (float)T * (float)(10 * (tr * rows / T + i));
    RCHECK(os[i * 2] == want, "sp reduce-scatter row %d: %g, want %g", i, os[i * 2], want);
  }

  /* all-to-all: block k of rank j's rows arrives at rank k as block j; twice is the identity */
  float a2a[16 * 2], back[16 * 2];
  mpu_tensor ta = test_mat(a2a, rows, 2), tb = test_mat(back, rows, 2);
  ROK(FWD(MPU_ALL_TO_ALL, tp, &x, &ta));
  for (int k = 0; k < T; k++)
    RCHECK(a2a[k * (rows / T) * 2] == (float)(100 * (g0 + k) + 10 * (tr * rows / T)), "all_to_all");
  ROK(BWD(MPU_ALL_TO_ALL, tp, &ta, &tb, 0));
  RCHECK(!memcmp(back, xs, (size_t)rows * 2 * sizeof(float)), "all_to_all twice");

  /* bad shapes are refused, with a message */
  if (T > 1) {
    float odd[3] = {0};
    mpu_tensor three = test_vec(odd, 3), one = test_vec(b, 1);
    RCHECK(FWD(MPU_SCATTER_TO_TP, tp, &three, &one) == MPU_ERR_INVALID_ARGUMENT &&
               strstr(mpu_last_error(), "not divisible"),
           "a split that does not divide");
    mpu_tensor wrong = test_vec(b, 5);
    RCHECK(FWD(MPU_GATHER_FROM_TP, tp, &one, &wrong) == MPU_ERR_INVALID_ARGUMENT &&
               strstr(mpu_last_error(), "want"),
           "a wrong output shape");
  }
  mpu_tensor null_data = test_vec(a, 1);
  null_data.data = NULL;
  RCHECK(FWD(MPU_COPY_TO_TP, tp, &null_data, &y) == MPU_ERR_INVALID_ARGUMENT,
         "NULL data");
  RCHECK(FWD((mpu_region)42, tp, &x, &y) == MPU_ERR_INVALID_ARGUMENT, "bad region");
  return mpu_comm_barrier(mpu_state_world(s));
}

static void test_regions(void **state) {
  (void)state;
  for (int T = 1; T <= 8; T *= 2) {
    mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
    c.flavor = MPU_FLAVOR_DEEPSPEED;
    c.tp = T;
    c.pp = T == 2 ? 2 : 1; /* tp 2 runs the walkthrough's layout, tp 2 x pp 2 */
    memset(messages, 0, sizeof messages);
    mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
    o.check_calls = 1;
    o.timeout_s = 60;
    mpu_result_t r = mpu_with_state(8, &c, 1, regions_rank, NULL, NULL, &o);
    if (r) {
      for (int k = 0; k < 8; k++)
        if (messages[k][0]) print_error("tp %d rank %d: %s\n", T, k, messages[k]);
      fail_msg("tp %d: %s", T, mpu_last_error());
    }
  }
}

static void test_table(void **state) {
  (void)state;
  assert_int_equal(mpu_region_forward_op(MPU_COPY_TO_TP), MPU_PRIM_IDENTITY);
  assert_int_equal(mpu_region_backward_op(MPU_COPY_TO_TP, 0), MPU_PRIM_ALL_REDUCE);
  assert_int_equal(mpu_region_backward_op(MPU_GATHER_FROM_SP, 0), MPU_PRIM_REDUCE_SCATTER_FIRST);
  assert_int_equal(mpu_region_backward_op(MPU_GATHER_FROM_SP, MPU_NO_TP_OUTPUT_GRAD),
                   MPU_PRIM_SPLIT_FIRST);
  assert_int_equal(mpu_region_backward_op(MPU_REDUCE_SCATTER_TO_SP, 0), MPU_PRIM_GATHER_FIRST);
  assert_string_equal(mpu_region_name(MPU_SCATTER_TO_TP), "scatter_to_tp");
  float d[6];
  mpu_tensor t = test_mat(d, 3, 2), out;
  assert_int_equal(mpu_primitive_shape(MPU_PRIM_GATHER_LAST, 4, &t, &out), MPU_SUCCESS);
  assert_int_equal(out.shape[1], 8);
  assert_int_equal(mpu_primitive_shape(MPU_PRIM_SPLIT_FIRST, 2, &t, &out), MPU_ERR_INVALID_ARGUMENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_table), cmocka_unit_test(test_regions)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
