/*
 * json.h - the small JSON reader and writer the checkpoint index and the
 * safetensors header need (RFC 8259): a parser into a tree with limits on
 * depth and size, lookups, and a growing text buffer with string escaping.
 * Internal to libmpu; fuzzed by fuzz/fuzz_json.c.
 */
#ifndef MPU_CHECKPOINT_JSON_H
#define MPU_CHECKPOINT_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "mpu/result.h"

typedef enum json_type { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json {
  json_type type;
  int boolean;
  double number;          /* the literal's value, however long, correctly rounded (+-HUGE_VAL
                             past a double's range) */
  int is_int;             /* an integer literal that fits int64 */
  int64_t integer;
  char *string;           /* JSON_STRING: NUL-terminated UTF-8 (NUL inside, or bytes that are
                             not UTF-8, refused) */
  size_t n;               /* items of an array or object */
  struct json *items;
  char **keys;            /* JSON_OBJECT: keys[i] names items[i] */
} json;

#define JSON_MAX_DEPTH 64

/* Parse text[0, len) (the whole of it, surrounding white space allowed) into
 * *out; on failure *out is empty and the error says where. what names the
 * text in the message ("index.json"). Duplicate keys are refused. */
mpu_result_t mpu__json_parse(const char *text, size_t len, const char *what, json *out);
void mpu__json_free(json *v);

/* The member called key of an object, or NULL. */
const json *mpu__json_get(const json *obj, const char *key);
/* Typed lookups: 0 on success, -1 when absent or of another type. */
int mpu__json_int(const json *obj, const char *key, int64_t *out);
const char *mpu__json_str(const json *obj, const char *key);

/* A text that grows; a failed allocation sets failed and drops later appends. */
typedef struct json_buf {
  char *s;
  size_t len, cap;
  int failed;
} json_buf;

void mpu__jb_printf(json_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mpu__jb_append(json_buf *b, const char *s, size_t n);
/* s as a JSON string literal, quotes and escapes included: the one escaper of mpu's JSON,
 * the tool's included. Control characters as \u00XX, a byte that is not part of well-formed
 * UTF-8 as \ufffd (the replacement character; JSON text is UTF-8); script_safe also escapes
 * < > & (JSON inside an HTML <script>). */
void mpu__jb_string(json_buf *b, const char *s);
MPU_SIBLING_API void mpu__jb_string_ex(json_buf *b, const char *s, int script_safe);
MPU_SIBLING_API void mpu__jb_free(json_buf *b);

#endif
