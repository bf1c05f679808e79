/*
 * fuzz_json.c - libFuzzer target over the JSON parser that reads checkpoint
 * indexes and safetensors headers: any bytes are refused with a message or
 * parsed into a tree; a parsed tree written back out and parsed again must
 * give the same tree (strings, numbers, nesting, key order).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void write_json(json_buf *b, const json *v) {
  switch (v->type) {
  case JSON_NULL: mpu__jb_printf(b, "null"); break;
  case JSON_BOOL: mpu__jb_printf(b, v->boolean ? "true" : "false"); break;
  case JSON_NUMBER:
    if (v->is_int) mpu__jb_printf(b, "%lld", (long long)v->integer);
    else mpu__jb_printf(b, "%.17e", v->number); /* stays a fraction when read back */
    break;
  case JSON_STRING: mpu__jb_string(b, v->string); break;
  case JSON_ARRAY:
  case JSON_OBJECT:
    mpu__jb_printf(b, v->type == JSON_ARRAY ? "[" : "{");
    for (size_t i = 0; i < v->n; i++) {
      if (i) mpu__jb_printf(b, ",");
      if (v->type == JSON_OBJECT) {
        mpu__jb_string(b, v->keys[i]);
        mpu__jb_printf(b, ":");
      }
      write_json(b, &v->items[i]);
    }
    mpu__jb_printf(b, v->type == JSON_ARRAY ? "]" : "}");
    break;
  }
}

static int same(const json *a, const json *b) {
  if (a->type != b->type || a->n != b->n) return 0;
  switch (a->type) {
  case JSON_BOOL: return a->boolean == b->boolean;
  case JSON_NUMBER:
    if (a->is_int != b->is_int) return 0;
    return a->is_int ? a->integer == b->integer
                     : (a->number == b->number || (a->number != a->number && b->number != b->number));
  case JSON_STRING: return !strcmp(a->string, b->string);
  case JSON_ARRAY:
  case JSON_OBJECT:
    for (size_t i = 0; i < a->n; i++)
      if ((a->keys && strcmp(a->keys[i], b->keys[i])) || !same(&a->items[i], &b->items[i])) return 0;
    return 1;
  default: return 1;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json v;
  if (mpu__json_parse((const char *)data, size, "fuzz", &v)) return 0;
  json_buf b = {0};
  write_json(&b, &v);
  if (!b.failed) {
    json again;
    /* what was written must parse back to the same tree (inf from a huge literal excepted) */
    if (mpu__json_parse(b.s, b.len, "fuzz again", &again) == MPU_SUCCESS) {
      if (!same(&v, &again)) abort();
      mpu__json_free(&again);
    } else if (!strstr(b.s, "inf") && !strstr(b.s, "nan")) {
      abort();
    }
  }
  mpu__jb_free(&b);
  mpu__json_free(&v);
  return 0;
}
