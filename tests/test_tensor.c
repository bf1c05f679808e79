/*
 * test_tensor.c - dtypes, the 16-bit float conversions and the tensor view's
 * split / concat, against values worked out by hand.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"

static void test_dtypes(void **state) {
  (void)state;
  assert_int_equal(mpu_dtype_size(MPU_FLOAT32), 4);
  assert_int_equal(mpu_dtype_size(MPU_FLOAT64), 8);
  assert_int_equal(mpu_dtype_size(MPU_FLOAT16), 2);
  assert_int_equal(mpu_dtype_size(MPU_BFLOAT16), 2);
  assert_int_equal(mpu_dtype_size(MPU_INT32), 4);
  assert_int_equal(mpu_dtype_size(MPU_INT64), 8);
  assert_int_equal(mpu_dtype_size(MPU_UINT8), 1);
  assert_int_equal(mpu_dtype_size(MPU_INT8), 1);
  assert_int_equal(mpu_dtype_size(MPU_UINT32), 4);
  assert_int_equal(mpu_dtype_size(MPU_UINT64), 8);
  assert_int_equal(mpu_dtype_size((mpu_dtype)42), 0);
  /* appended after uint8: the earlier values are ABI */
  assert_int_equal(MPU_UINT8, 6);
  assert_int_equal(MPU_INT8, 7);
  assert_int_equal(MPU_UINT32, 8);
  assert_int_equal(MPU_UINT64, 9);
  mpu_dtype dt = MPU_INT64;
  assert_int_equal(mpu_dtype_from_name("bf16", &dt), MPU_SUCCESS);
  assert_int_equal(dt, MPU_BFLOAT16);
  assert_int_equal(mpu_dtype_from_name("Float16", &dt), MPU_SUCCESS);
  assert_int_equal(dt, MPU_FLOAT16);
  assert_int_equal(mpu_dtype_from_name("float128", &dt), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(dt, MPU_FLOAT16); /* unchanged on error */
  assert_non_null(strstr(mpu_last_error(), "float128"));
  assert_string_equal(mpu_dtype_name(MPU_UINT8), "uint8");
  /* the names nccl-tests and NCCL use, and the short aliases */
  static const struct { const char *name; mpu_dtype dt; } names[] = {
      {"int8", MPU_INT8},     {"uint32", MPU_UINT32}, {"uint64", MPU_UINT64}, {"i8", MPU_INT8},
      {"u32", MPU_UINT32},    {"u64", MPU_UINT64},    {"INT8", MPU_INT8}};
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
    dt = MPU_FLOAT32;
    assert_int_equal(mpu_dtype_from_name(names[k].name, &dt), MPU_SUCCESS);
    assert_int_equal(dt, names[k].dt);
  }
  assert_string_equal(mpu_dtype_name(MPU_INT8), "int8");
  assert_string_equal(mpu_dtype_name(MPU_UINT32), "uint32");
  assert_string_equal(mpu_dtype_name(MPU_UINT64), "uint64");
  assert_false(mpu_dtype_is_float(MPU_UINT64));
  assert_true(mpu_dtype_is_float(MPU_BFLOAT16));
  assert_false(mpu_dtype_is_float(MPU_INT64));
}

static float f32(uint32_t bits) {
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static void test_half(void **state) {
  (void)state;
  assert_int_equal(mpu_float_to_half(1.0f), 0x3c00);
  assert_int_equal(mpu_float_to_half(-2.0f), 0xc000);
  assert_int_equal(mpu_float_to_half(65504.0f), 0x7bff);  /* largest half */
  assert_int_equal(mpu_float_to_half(65519.0f), 0x7bff);  /* below the halfway point */
  assert_int_equal(mpu_float_to_half(65520.0f), 0x7c00);  /* rounds up to infinity */
  assert_int_equal(mpu_float_to_half(ldexpf(1, -24)), 0x0001); /* smallest subnormal */
  assert_int_equal(mpu_float_to_half(ldexpf(1, -25)), 0x0000); /* tie goes to even (0) */
  assert_int_equal(mpu_float_to_half(ldexpf(3, -26)), 0x0001); /* above the tie */
  assert_int_equal(mpu_float_to_half(ldexpf(3, -25)), 0x0002); /* 1.5 units: tie to even 2 */
  assert_int_equal(mpu_float_to_half(ldexpf(1, -14)), 0x0400); /* smallest normal */
  assert_int_equal(mpu_float_to_half(1.0f + ldexpf(1, -11)), 0x3c00); /* tie to even */
  assert_int_equal(mpu_float_to_half(1.0f + ldexpf(3, -11)), 0x3c02); /* tie to even, up */
  assert_int_equal(mpu_float_to_half(INFINITY), 0x7c00);
  assert_int_equal(mpu_float_to_half(-0.0f), 0x8000);
  assert_true(isnan(mpu_half_to_float(mpu_float_to_half(NAN))));
  /* every half survives the round trip through float32 */
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = mpu_half_to_float((uint16_t)h);
    if (isnan(f)) continue;
    assert_int_equal(mpu_float_to_half(f), h);
  }
  assert_true(mpu_half_to_float(0x0001) == ldexpf(1, -24));
  assert_true(mpu_half_to_float(0x3555) == 0.333251953125f);
}

static void test_bfloat16(void **state) {
  (void)state;
  assert_int_equal(mpu_float_to_bfloat16(1.0f), 0x3f80);
  assert_int_equal(mpu_float_to_bfloat16(f32(0x3f808000)), 0x3f80); /* tie to even, down */
  assert_int_equal(mpu_float_to_bfloat16(f32(0x3f818000)), 0x3f82); /* tie to even, up */
  assert_int_equal(mpu_float_to_bfloat16(f32(0x3f808001)), 0x3f81);
  assert_int_equal(mpu_float_to_bfloat16(f32(0x7f7fffff)), 0x7f80); /* overflow to inf */
  assert_true(isnan(mpu_bfloat16_to_float(mpu_float_to_bfloat16(NAN))));
  for (uint32_t b = 0; b < 0x10000; b++) {
    float f = mpu_bfloat16_to_float((uint16_t)b);
    if (isnan(f)) continue;
    assert_int_equal(mpu_float_to_bfloat16(f), b);
  }
}

static void test_view(void **state) {
  (void)state;
  mpu_tensor t;
  int64_t shape[3] = {2, 3, 4};
  float data[24];
  assert_int_equal(mpu_tensor_init(&t, data, MPU_FLOAT32, 3, shape), MPU_SUCCESS);
  assert_int_equal(mpu_tensor_numel(&t), 24);
  assert_int_equal(mpu_tensor_nbytes(&t), 96);
  char buf[64];
  assert_string_equal(mpu_tensor_describe(&t, buf, sizeof buf), "float32[2, 3, 4]");
  mpu_tensor scalar;
  assert_int_equal(mpu_tensor_init(&scalar, data, MPU_INT64, 0, NULL), MPU_SUCCESS);
  assert_int_equal(mpu_tensor_numel(&scalar), 1);

  int64_t bad[2] = {2, -1};
  assert_int_equal(mpu_tensor_init(&t, data, MPU_FLOAT32, 2, bad), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "negative"));
  assert_int_equal(mpu_tensor_init(&t, data, MPU_FLOAT32, 9, shape), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_tensor_init(&t, NULL, MPU_FLOAT32, 3, shape), MPU_ERR_INVALID_ARGUMENT);
  int64_t huge[3] = {INT64_MAX / 2, 4, 4};
  assert_int_equal(mpu_tensor_init(&t, data, MPU_FLOAT32, 3, huge), MPU_ERR_INVALID_ARGUMENT);
  int64_t empty[2] = {0, 5};
  assert_int_equal(mpu_tensor_init(&t, NULL, MPU_FLOAT32, 2, empty), MPU_SUCCESS);
  assert_int_equal(mpu_tensor_nbytes(&t), 0);

  mpu_tensor owned;
  assert_int_equal(mpu_tensor_alloc(&owned, MPU_FLOAT64, 3, shape), MPU_SUCCESS);
  assert_true(owned.owns_data);
  for (int i = 0; i < 24; i++) assert_true(((double *)owned.data)[i] == 0.0);
  mpu_tensor_free(&owned);
  assert_null(owned.data);
  mpu_tensor_free(NULL);
}

/* x[i][j][k] = 100 i + 10 j + k, split along every dim and joined back. */
static void test_split_concat(void **state) {
  (void)state;
  int64_t shape[3] = {2, 4, 6};
  int32_t x[48];
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 4; j++)
      for (int k = 0; k < 6; k++) x[(i * 4 + j) * 6 + k] = 100 * i + 10 * j + k;
  mpu_tensor in;
  assert_int_equal(mpu_tensor_init(&in, x, MPU_INT32, 3, shape), MPU_SUCCESS);

  /* last dim in 3 parts: part 1 holds k = 2, 3 */
  int32_t part[3][16], back[48];
  mpu_tensor parts[3], out;
  int64_t ps[3] = {2, 4, 2};
  for (int p = 0; p < 3; p++) {
    assert_int_equal(mpu_tensor_init(&parts[p], part[p], MPU_INT32, 3, ps), MPU_SUCCESS);
    assert_int_equal(mpu_tensor_split(&in, -1, 3, p, &parts[p]), MPU_SUCCESS);
  }
  assert_int_equal(part[1][0], 2);
  assert_int_equal(part[1][1], 3);
  assert_int_equal(part[1][2], 12);
  assert_int_equal(part[2][15], 100 + 30 + 5);
  assert_int_equal(mpu_tensor_init(&out, back, MPU_INT32, 3, shape), MPU_SUCCESS);
  assert_int_equal(mpu_tensor_concat(parts, 3, 2, &out), MPU_SUCCESS);
  assert_memory_equal(back, x, sizeof x);

  /* the middle dim in 2 parts: part 1 holds j = 2, 3 */
  int64_t ms[3] = {2, 2, 6};
  int32_t mid[2][24];
  mpu_tensor halves[2];
  for (int p = 0; p < 2; p++) {
    mpu_tensor_init(&halves[p], mid[p], MPU_INT32, 3, ms);
    assert_int_equal(mpu_tensor_split(&in, 1, 2, p, &halves[p]), MPU_SUCCESS);
  }
  assert_int_equal(mid[1][0], 20);
  assert_int_equal(mid[1][12], 120);
  memset(back, 0, sizeof back);
  assert_int_equal(mpu_tensor_concat(halves, 2, 1, &out), MPU_SUCCESS);
  assert_memory_equal(back, x, sizeof x);

  /* the first dim: part 1 is the second half of memory */
  int64_t fs[3] = {1, 4, 6};
  mpu_tensor first;
  int32_t f[24];
  mpu_tensor_init(&first, f, MPU_INT32, 3, fs);
  assert_int_equal(mpu_tensor_split(&in, 0, 2, 1, &first), MPU_SUCCESS);
  assert_memory_equal(f, x + 24, sizeof f);

  /* uneven parts join too */
  int64_t s1[3] = {2, 4, 1}, s5[3] = {2, 4, 5};
  int32_t a[8], b[40];
  mpu_tensor two[2];
  mpu_tensor_init(&two[0], a, MPU_INT32, 3, s1);
  mpu_tensor_init(&two[1], b, MPU_INT32, 3, s5);
  for (int i = 0; i < 8; i++) a[i] = x[i * 6];
  for (int i = 0; i < 8; i++)
    for (int k = 0; k < 5; k++) b[i * 5 + k] = x[i * 6 + 1 + k];
  memset(back, 0, sizeof back);
  assert_int_equal(mpu_tensor_concat(two, 2, -1, &out), MPU_SUCCESS);
  assert_memory_equal(back, x, sizeof x);
}

/* The 1- and 8-byte integer dtypes move whole elements: the last dim of a
 * [2, 4] in 2 parts and back, with every bit of the extremes kept. */
static void test_split_concat_int_dtypes(void **state) {
  (void)state;
  int64_t shape[2] = {2, 4}, hs[2] = {2, 2};
  int8_t i8[8] = {INT8_MIN, -1, 0, 1, 2, 3, 126, INT8_MAX}, i8h[2][4], i8b[8] = {0};
  uint64_t u64[8] = {UINT64_MAX, 0, 1, (uint64_t)1 << 63, 5, 6, 7, UINT64_MAX - 1}, u64h[2][4],
           u64b[8] = {0};
  uint32_t u32[8] = {UINT32_MAX, 0, 1, 1u << 31, 5, 6, 7, UINT32_MAX - 1}, u32h[2][4],
           u32b[8] = {0};
  struct { mpu_dtype dt; void *x, *h0, *h1, *back; size_t es; } cases[] = {
      {MPU_INT8, i8, i8h[0], i8h[1], i8b, 1},
      {MPU_UINT32, u32, u32h[0], u32h[1], u32b, 4},
      {MPU_UINT64, u64, u64h[0], u64h[1], u64b, 8}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    mpu_tensor in, halves[2], out;
    assert_int_equal(mpu_tensor_init(&in, cases[c].x, cases[c].dt, 2, shape), MPU_SUCCESS);
    assert_int_equal(mpu_tensor_init(&halves[0], cases[c].h0, cases[c].dt, 2, hs), MPU_SUCCESS);
    assert_int_equal(mpu_tensor_init(&halves[1], cases[c].h1, cases[c].dt, 2, hs), MPU_SUCCESS);
    for (int p = 0; p < 2; p++)
      assert_int_equal(mpu_tensor_split(&in, 1, 2, p, &halves[p]), MPU_SUCCESS);
    /* part 1 holds columns 2, 3 of both rows */
    const char *x = cases[c].x, *h1 = cases[c].h1;
    size_t es = cases[c].es;
    assert_memory_equal(h1, x + 2 * es, 2 * es);
    assert_memory_equal(h1 + 2 * es, x + 6 * es, 2 * es);
    assert_int_equal(mpu_tensor_init(&out, cases[c].back, cases[c].dt, 2, shape), MPU_SUCCESS);
    assert_int_equal(mpu_tensor_concat(halves, 2, 1, &out), MPU_SUCCESS);
    assert_memory_equal(cases[c].back, x, 8 * es);
  }
}

static void test_split_errors(void **state) {
  (void)state;
  int64_t shape[2] = {3, 5};
  float x[15] = {0}, y[15];
  mpu_tensor in, out;
  mpu_tensor_init(&in, x, MPU_FLOAT32, 2, shape);
  int64_t os[2] = {3, 1};
  mpu_tensor_init(&out, y, MPU_FLOAT32, 2, os);
  memset(y, 0x7f, sizeof y);
  assert_int_equal(mpu_tensor_split(&in, 1, 2, 0, &out), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "not divisible"));
  assert_int_equal(mpu_tensor_split(&in, 2, 5, 0, &out), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_tensor_split(&in, -3, 5, 0, &out), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_tensor_split(&in, 1, 5, 5, &out), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_tensor_split(&in, 1, 0, 0, &out), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_tensor_split(&in, 0, 3, 0, &out), MPU_ERR_INVALID_ARGUMENT); /* shape */
  assert_int_equal(mpu_tensor_split(NULL, 0, 1, 0, &out), MPU_ERR_INVALID_ARGUMENT);
  out.dtype = MPU_INT32;
  assert_int_equal(mpu_tensor_split(&in, 1, 5, 0, &out), MPU_ERR_INVALID_ARGUMENT);
  for (int i = 0; i < 15; i++) { /* untouched by every failed call */
    uint32_t bits;
    memcpy(&bits, &y[i], 4);
    assert_int_equal(bits, 0x7f7f7f7f);
  }
  mpu_tensor parts[2] = {in, in};
  parts[1].dtype = MPU_INT32;
  int64_t cs[2] = {6, 5};
  float z[30];
  mpu_tensor cat;
  mpu_tensor_init(&cat, z, MPU_FLOAT32, 2, cs);
  assert_int_equal(mpu_tensor_concat(parts, 2, 0, &cat), MPU_ERR_INVALID_ARGUMENT);
  parts[1].dtype = MPU_FLOAT32;
  assert_int_equal(mpu_tensor_concat(parts, 2, 0, &cat), MPU_SUCCESS);
  assert_int_equal(mpu_tensor_concat(parts, 2, 1, &cat), MPU_ERR_INVALID_ARGUMENT); /* shape */
  assert_int_equal(mpu_tensor_concat(parts, 0, 0, &cat), MPU_ERR_INVALID_ARGUMENT);
}

/* An output that overlaps an input is refused, not copied over itself. */
static void test_overlap(void **state) {
  (void)state;
  float buf[16] = {0};
  mpu_tensor whole, half, parts[2];
  int64_t s16[1] = {16}, s8[1] = {8};
  assert_int_equal(mpu_tensor_init(&whole, buf, MPU_FLOAT32, 1, s16), MPU_SUCCESS);
  assert_int_equal(mpu_tensor_init(&half, buf + 4, MPU_FLOAT32, 1, s8), MPU_SUCCESS);
  assert_int_equal(mpu_tensor_split(&whole, 0, 2, 1, &half), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "overlaps"));
  parts[0] = half, parts[1] = half;
  parts[1].data = buf + 8;
  assert_int_equal(mpu_tensor_concat(parts, 2, 0, &whole), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "overlaps part 0"));
}

static void test_results(void **state) {
  (void)state;
  assert_string_equal(mpu_result_name(MPU_SUCCESS), "MPU_SUCCESS");
  assert_string_equal(mpu_result_name(MPU_ERR_TIMEOUT), "MPU_ERR_TIMEOUT");
  assert_string_equal(mpu_result_name((mpu_result_t)999), "MPU_ERR_UNKNOWN");
  assert_non_null(strstr(mpu_result_string(MPU_ERR_MISMATCH), "mismatched"));
  mpu_clear_error();
  assert_string_equal(mpu_last_error(), "");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dtypes),       cmocka_unit_test(test_half),
      cmocka_unit_test(test_bfloat16),     cmocka_unit_test(test_view),
      cmocka_unit_test(test_split_concat), cmocka_unit_test(test_split_errors),
      cmocka_unit_test(test_split_concat_int_dtypes),
      cmocka_unit_test(test_results),      cmocka_unit_test(test_overlap),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
