/*
 * dtype.c - dtype sizes and names, and the float16 / bfloat16 conversions
 * (round to nearest even, as hardware and torch do).
 */
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "mpu/tensor.h"

static const struct {
  const char *name;
  size_t size;
  int is_float;
} dtypes[MPU_DTYPE_COUNT] = {
    [MPU_FLOAT32] = {"float32", 4, 1}, [MPU_FLOAT64] = {"float64", 8, 1},
    [MPU_FLOAT16] = {"float16", 2, 1}, [MPU_BFLOAT16] = {"bfloat16", 2, 1},
    [MPU_INT32] = {"int32", 4, 0},     [MPU_INT64] = {"int64", 8, 0},
    [MPU_UINT8] = {"uint8", 1, 0},     [MPU_INT8] = {"int8", 1, 0},
    [MPU_UINT32] = {"uint32", 4, 0},   [MPU_UINT64] = {"uint64", 8, 0},
};

static int valid(mpu_dtype dt) { return (unsigned)dt < MPU_DTYPE_COUNT; }

size_t mpu_dtype_size(mpu_dtype dt) { return valid(dt) ? dtypes[dt].size : 0; }

const char *mpu_dtype_name(mpu_dtype dt) { return valid(dt) ? dtypes[dt].name : "invalid"; }

int mpu_dtype_is_float(mpu_dtype dt) { return valid(dt) && dtypes[dt].is_float; }

mpu_result_t mpu_dtype_from_name(const char *name, mpu_dtype *out) {
  static const struct {
    const char *alias;
    mpu_dtype dt;
  } aliases[] = {{"fp32", MPU_FLOAT32}, {"f32", MPU_FLOAT32},  {"float", MPU_FLOAT32},
                 {"fp64", MPU_FLOAT64}, {"f64", MPU_FLOAT64},  {"double", MPU_FLOAT64},
                 {"fp16", MPU_FLOAT16}, {"f16", MPU_FLOAT16},  {"half", MPU_FLOAT16},
                 {"bf16", MPU_BFLOAT16}, {"int", MPU_INT32},   {"i32", MPU_INT32},
                 {"i64", MPU_INT64},    {"long", MPU_INT64},   {"u8", MPU_UINT8},
                 {"byte", MPU_UINT8},   {"i8", MPU_INT8},      {"char", MPU_INT8},
                 {"u32", MPU_UINT32},   {"u64", MPU_UINT64}};
  if (!name || !out)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_dtype_from_name: NULL argument");
  for (int i = 0; i < MPU_DTYPE_COUNT; i++)
    if (strcasecmp(name, dtypes[i].name) == 0) return *out = (mpu_dtype)i, MPU_SUCCESS;
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcasecmp(name, aliases[i].alias) == 0) return *out = aliases[i].dt, MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                    "unknown dtype '%s' (want float32, float64, float16, bfloat16, int8, "
                    "int32, int64, uint8, uint32 or uint64)",
                    name);
}

static uint32_t bits_of(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return x;
}

static float float_of(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

uint16_t mpu_float_to_half(float f) {
  uint32_t x = bits_of(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;

  if (exp == 0xff) /* inf stays inf; NaN stays a quiet NaN */
    return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0));

  int32_t e = (int32_t)exp - 127 + 15;
  if (e >= 31) return (uint16_t)(sign | 0x7c00u);
  if (e <= 0) { /* a half subnormal (or zero): mantissa in units of 2^-24 */
    if (e < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    int shift = 14 - e;
    uint32_t h = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++; /* may carry into the exponent: right */
    return (uint16_t)(sign | h);
  }
  uint32_t h = sign | ((uint32_t)e << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++; /* carry may reach infinity: right */
  return (uint16_t)h;
}

float mpu_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) { /* zero or subnormal: mant * 2^-24, exact in float32 */
    float v = (float)mant * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return float_of(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

uint16_t mpu_float_to_bfloat16(float f) {
  uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float mpu_bfloat16_to_float(uint16_t b) { return float_of((uint32_t)b << 16); }
