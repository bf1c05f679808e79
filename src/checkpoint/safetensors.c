/*
 * safetensors.c - the safetensors header: written by the checkpoint writer
 * and the merge, read back and checked by inspect and the tests.
 */
#include "checkpoint/safetensors.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static const struct {
  const char *name;
  size_t size;
} dtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
              {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
              {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};

size_t mpu__st_dtype_size(const char *dtype) {
  for (size_t i = 0; dtype && i < sizeof dtypes / sizeof dtypes[0]; i++)
    if (!strcmp(dtypes[i].name, dtype)) return dtypes[i].size;
  return 0;
}

static int by_begin(const void *a, const void *b) {
  const st_entry *x = a, *y = b;
  return (x->begin > y->begin) - (x->begin < y->begin);
}

void mpu__st_free(st_header *h) {
  if (!h) return;
  mpu__json_free(&h->root);
  free(h->entries);
  memset(h, 0, sizeof *h);
}

/* the message first: name points into the header being freed */
static mpu_result_t bad(st_header *h, const char *what, const char *name, const char *why) {
  mpu_result_t r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: not a safetensors file: %s%s%s%s",
                              what, name ? "tensor '" : "", name ? name : "", name ? "': " : "", why);
  mpu__st_free(h);
  return r;
}

mpu_result_t mpu__st_parse(const uint8_t *head, size_t len, uint64_t file_size, const char *what,
                           st_header *out) {
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "safetensors: NULL output");
  memset(out, 0, sizeof *out);
  if (!what) what = "safetensors file";
  if (!head || len < 8 || file_size < 8) return bad(out, what, NULL, "shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | head[i];
  if (n > ST_MAX_HEADER) return bad(out, what, NULL, "a header longer than 100 MB");
  if (n + 8 > file_size || n + 8 > len) return bad(out, what, NULL, "the header runs past the end");
  if (n < 2 || head[8] != '{') return bad(out, what, NULL, "the header is not a JSON object");
  out->header_len = (size_t)n, out->data_start = n + 8;
  mpu_result_t r = mpu__json_parse((const char *)head + 8, (size_t)n, what, &out->root);
  if (r) return r;
  if (out->root.type != JSON_OBJECT) return bad(out, what, NULL, "the header is not a JSON object");
  out->entries = calloc(out->root.n ? out->root.n : 1, sizeof *out->entries);
  if (!out->entries) {
    mpu__st_free(out);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu tensors", what, out->root.n);
  }
  for (size_t i = 0; i < out->root.n; i++) {
    const char *name = out->root.keys[i];
    const json *t = &out->root.items[i];
    if (!strcmp(name, "__metadata__")) {
      if (t->type != JSON_OBJECT) return bad(out, what, NULL, "__metadata__ is not an object");
      for (size_t k = 0; k < t->n; k++)
        if (t->items[k].type != JSON_STRING)
          return bad(out, what, NULL, "a __metadata__ value is not a string");
      continue;
    }
    st_entry *e = &out->entries[out->n];
    e->name = name;
    const json *shape = mpu__json_get(t, "shape"), *off = mpu__json_get(t, "data_offsets");
    e->dtype = mpu__json_str(t, "dtype");
    if (t->type != JSON_OBJECT || t->n != 3 || !e->dtype || !shape || !off)
      return bad(out, what, name, "wants exactly dtype, shape and data_offsets");
    size_t esize = mpu__st_dtype_size(e->dtype);
    if (!esize) return bad(out, what, name, "an unknown dtype");
    if (shape->type != JSON_ARRAY || shape->n > ST_MAX_DIMS)
      return bad(out, what, name, "the shape is not a list of at most 8 sizes");
    uint64_t numel = 1;
    e->ndim = (int)shape->n;
    for (size_t d = 0; d < shape->n; d++) {
      const json *s = &shape->items[d];
      if (s->type != JSON_NUMBER || !s->is_int || s->integer < 0)
        return bad(out, what, name, "a size in the shape is not a whole number");
      e->shape[d] = s->integer;
      if (s->integer && numel > UINT64_MAX / (uint64_t)s->integer)
        return bad(out, what, name, "the shape overflows");
      numel *= (uint64_t)s->integer;
    }
    if (off->type != JSON_ARRAY || off->n != 2 || off->items[0].type != JSON_NUMBER ||
        off->items[1].type != JSON_NUMBER || !off->items[0].is_int || !off->items[1].is_int ||
        off->items[0].integer < 0 || off->items[1].integer < off->items[0].integer)
      return bad(out, what, name, "data_offsets is not [begin, end] with begin <= end");
    e->begin = (uint64_t)off->items[0].integer, e->end = (uint64_t)off->items[1].integer;
    if (numel > UINT64_MAX / esize || e->end - e->begin != numel * esize)
      return bad(out, what, name, "data_offsets do not hold shape x dtype bytes");
    out->n++;
  }
  /* the data is tiled exactly: sorted by offset, each tensor starts where the last ended */
  st_entry *sorted = malloc((out->n ? (size_t)out->n : 1) * sizeof *sorted);
  if (!sorted) {
    mpu__st_free(out);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d tensors", what, out->n);
  }
  memcpy(sorted, out->entries, (size_t)out->n * sizeof *sorted);
  qsort(sorted, (size_t)out->n, sizeof *sorted, by_begin);
  uint64_t at = 0;
  const char *gap = NULL;
  for (int i = 0; i < out->n && !gap; i++) {
    if (sorted[i].begin != at) gap = sorted[i].name;
    at = sorted[i].end;
  }
  free(sorted);
  if (gap) return bad(out, what, gap, "its data does not start where the previous tensor's ends");
  if (at != file_size - out->data_start)
    return bad(out, what, NULL, at > file_size - out->data_start ? "the data is truncated"
                                                                 : "bytes after the last tensor");
  return MPU_SUCCESS;
}

mpu_result_t mpu__st_header(const st_item *items, int n, const char *const *meta, int n_meta,
                            char **out, size_t *out_len) {
  json_buf b = {0};
  mpu__jb_append(&b, "\0\0\0\0\0\0\0\0{", 9);
  int first = 1;
  if (n_meta > 0) {
    mpu__jb_printf(&b, "\"__metadata__\":{");
    for (int i = 0; i < n_meta; i++) {
      if (i) mpu__jb_append(&b, ",", 1);
      mpu__jb_string(&b, meta[2 * i]);
      mpu__jb_append(&b, ":", 1);
      mpu__jb_string(&b, meta[2 * i + 1]);
    }
    mpu__jb_append(&b, "}", 1);
    first = 0;
  }
  uint64_t at = 0;
  for (int i = 0; i < n; i++) {
    if (!first) mpu__jb_append(&b, ",", 1);
    first = 0;
    mpu__jb_string(&b, items[i].name);
    mpu__jb_printf(&b, ":{\"dtype\":\"F32\",\"shape\":[");
    for (int d = 0; d < items[i].ndim; d++)
      mpu__jb_printf(&b, "%s%lld", d ? "," : "", (long long)items[i].shape[d]);
    mpu__jb_printf(&b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
                   (unsigned long long)(at + items[i].bytes));
    at += items[i].bytes;
  }
  mpu__jb_append(&b, "}", 1);
  while (!b.failed && b.len % 8) mpu__jb_append(&b, " ", 1); /* the data 8-byte aligned */
  if (b.failed) {
    mpu__jb_free(&b);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "safetensors: a header of %d tensors", n);
  }
  uint64_t hlen = b.len - 8;
  for (int i = 0; i < 8; i++) b.s[i] = (char)(hlen >> (8 * i) & 0xFF);
  *out = b.s, *out_len = b.len;
  return MPU_SUCCESS;
}
