/*
 * json.c - a strict recursive-descent JSON parser (RFC 8259) with a depth
 * limit, and the text buffer the writers share.
 */
#include "checkpoint/json.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef struct parser {
  const char *s;
  size_t len, pos;
  const char *what;
  int depth;
} parser;

static mpu_result_t fail(parser *p, const char *why) {
  return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: not valid JSON at byte %zu: %s", p->what, p->pos,
                    why);
}

static void skip_ws(parser *p) {
  while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                             p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
    p->pos++;
}

static int hex4(parser *p, unsigned *out) {
  if (p->len - p->pos < 4) return -1;
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p->s[p->pos++];
    v <<= 4;
    if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
    else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
    else return -1;
  }
  *out = v;
  return 0;
}

static void put_utf8(char *d, size_t *n, unsigned cp) {
  if (cp < 0x80) d[(*n)++] = (char)cp;
  else if (cp < 0x800) {
    d[(*n)++] = (char)(0xC0 | (cp >> 6));
    d[(*n)++] = (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    d[(*n)++] = (char)(0xE0 | (cp >> 12));
    d[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[(*n)++] = (char)(0x80 | (cp & 0x3F));
  } else {
    d[(*n)++] = (char)(0xF0 | (cp >> 18));
    d[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
    d[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
    d[(*n)++] = (char)(0x80 | (cp & 0x3F));
  }
}

/* The length of the well-formed UTF-8 sequence at s (RFC 3629: no overlong forms, no
 * surrogates, at most U+10FFFF), or 0. */
static size_t utf8_len(const unsigned char *s) {
  unsigned char c = s[0];
  size_t n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  for (size_t i = 1; i < n; i++)
    if ((s[i] & 0xC0) != 0x80) return 0;
  if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F) || (c == 0xF0 && s[1] < 0x90) ||
      (c == 0xF4 && s[1] > 0x8F))
    return 0;
  return n;
}

/* After the opening quote: the decoded string (never longer than its source). */
static mpu_result_t parse_string(parser *p, char **out) {
  size_t start = p->pos, end = start;
  while (end < p->len && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
  if (end >= p->len) return fail(p, "unterminated string");
  char *d = malloc(end - start + 1);
  if (!d) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a string of %zu bytes", p->what, end - start);
  size_t n = 0;
  while (p->pos < end) {
    unsigned char c = (unsigned char)p->s[p->pos++];
    if (c < 0x20) {
      free(d);
      return fail(p, "a control character in a string");
    }
    if (c >= 0x80) { /* JSON text is UTF-8: a sequence that is not is refused */
      size_t k = utf8_len((const unsigned char *)p->s + p->pos - 1);
      if (!k) {
        free(d);
        return fail(p, "a byte that is not UTF-8 in a string");
      }
      memcpy(d + n, p->s + p->pos - 1, k);
      n += k, p->pos += k - 1;
      continue;
    }
    if (c != '\\') {
      d[n++] = (char)c;
      continue;
    }
    char e = p->s[p->pos++];
    unsigned cp;
    switch (e) {
    case '"': d[n++] = '"'; break;
    case '\\': d[n++] = '\\'; break;
    case '/': d[n++] = '/'; break;
    case 'b': d[n++] = '\b'; break;
    case 'f': d[n++] = '\f'; break;
    case 'n': d[n++] = '\n'; break;
    case 'r': d[n++] = '\r'; break;
    case 't': d[n++] = '\t'; break;
    case 'u':
      if (hex4(p, &cp) || p->pos > end) {
        free(d);
        return fail(p, "a bad \\u escape");
      }
      if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair */
        unsigned lo;
        if (end - p->pos < 6 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
            (p->pos += 2, hex4(p, &lo)) || lo < 0xDC00 || lo >= 0xE000) {
          free(d);
          return fail(p, "an unpaired surrogate");
        }
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      } else if (cp >= 0xDC00 && cp < 0xE000) {
        free(d);
        return fail(p, "an unpaired surrogate");
      }
      if (cp == 0) {
        free(d);
        return fail(p, "a NUL character in a string");
      }
      put_utf8(d, &n, cp);
      break;
    default: free(d); return fail(p, "an unknown escape");
    }
  }
  d[n] = '\0';
  p->pos = end + 1;
  *out = d;
  return MPU_SUCCESS;
}

static mpu_result_t parse_number(parser *p, json *v) {
  size_t start = p->pos;
  int integer = 1;
  if (p->pos < p->len && p->s[p->pos] == '-') p->pos++;
  if (p->pos >= p->len) return fail(p, "a bad number");
  if (p->s[p->pos] == '0') p->pos++;
  else if (p->s[p->pos] >= '1' && p->s[p->pos] <= '9')
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
  else return fail(p, "a bad number");
  if (p->pos < p->len && p->s[p->pos] == '.') {
    integer = 0, p->pos++;
    size_t d = p->pos;
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    if (p->pos == d) return fail(p, "a bad fraction");
  }
  if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
    integer = 0, p->pos++;
    if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
    size_t d = p->pos;
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') p->pos++;
    if (p->pos == d) return fail(p, "a bad exponent");
  }
  /* the whole literal, however long: strtod and strtoll read it exactly (a cut one would read
   * "1.000...0e-3" as 1) */
  size_t n = p->pos - start;
  char small[64], *buf = n < sizeof small ? small : malloc(n + 1);
  if (!buf) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a number of %zu bytes", p->what, n);
  memcpy(buf, p->s + start, n);
  buf[n] = '\0';
  v->type = JSON_NUMBER;
  v->number = strtod(buf, NULL); /* out of range: +-HUGE_VAL or 0, for the reader to refuse */
  if (integer) {
    errno = 0;
    long long x = strtoll(buf, NULL, 10);
    if (errno == 0) v->is_int = 1, v->integer = x;
  }
  if (buf != small) free(buf);
  return MPU_SUCCESS;
}

static mpu_result_t parse_value(parser *p, json *v);

static mpu_result_t grow(parser *p, json *v, size_t *cap, int object) {
  if (v->n < *cap) return MPU_SUCCESS;
  size_t c = *cap ? 2 * *cap : 4;
  json *items = realloc(v->items, c * sizeof *items);
  if (!items) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu items", p->what, c);
  v->items = items;
  if (object) {
    char **keys = realloc(v->keys, c * sizeof *keys);
    if (!keys) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu keys", p->what, c);
    v->keys = keys;
  }
  *cap = c;
  return MPU_SUCCESS;
}

static mpu_result_t parse_container(parser *p, json *v, int object) {
  char close = object ? '}' : ']';
  size_t cap = 0;
  v->type = object ? JSON_OBJECT : JSON_ARRAY;
  if (++p->depth > JSON_MAX_DEPTH) return fail(p, "nested deeper than 64");
  skip_ws(p);
  if (p->pos < p->len && p->s[p->pos] == close) {
    p->pos++, p->depth--;
    return MPU_SUCCESS;
  }
  for (;;) {
    MPU_CHECK(grow(p, v, &cap, object));
    char *key = NULL;
    skip_ws(p);
    if (object) {
      if (p->pos >= p->len || p->s[p->pos] != '"') return fail(p, "expected a key");
      p->pos++;
      MPU_CHECK(parse_string(p, &key));
      for (size_t i = 0; i < v->n; i++)
        if (!strcmp(v->keys[i], key)) {
          free(key);
          return fail(p, "a duplicate key");
        }
      skip_ws(p);
      if (p->pos >= p->len || p->s[p->pos] != ':') {
        free(key);
        return fail(p, "expected ':'");
      }
      p->pos++;
      v->keys[v->n] = key;
    }
    memset(&v->items[v->n], 0, sizeof v->items[v->n]);
    v->n++; /* counted before parsing: a failure frees what was built */
    MPU_CHECK(parse_value(p, &v->items[v->n - 1]));
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ',') {
      p->pos++;
      continue;
    }
    if (p->pos < p->len && p->s[p->pos] == close) {
      p->pos++, p->depth--;
      return MPU_SUCCESS;
    }
    return fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
  }
}

static int literal(parser *p, const char *word) {
  size_t n = strlen(word);
  if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n)) return 0;
  p->pos += n;
  return 1;
}

static mpu_result_t parse_value(parser *p, json *v) {
  skip_ws(p);
  if (p->pos >= p->len) return fail(p, "unexpected end");
  char c = p->s[p->pos];
  if (c == '{' || c == '[') {
    p->pos++;
    return parse_container(p, v, c == '{');
  }
  if (c == '"') {
    p->pos++;
    v->type = JSON_STRING;
    return parse_string(p, &v->string);
  }
  if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, v);
  if (literal(p, "true")) return v->type = JSON_BOOL, v->boolean = 1, MPU_SUCCESS;
  if (literal(p, "false")) return v->type = JSON_BOOL, v->boolean = 0, MPU_SUCCESS;
  if (literal(p, "null")) return v->type = JSON_NULL, MPU_SUCCESS;
  return fail(p, "unexpected character");
}

mpu_result_t mpu__json_parse(const char *text, size_t len, const char *what, json *out) {
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "json: NULL output");
  memset(out, 0, sizeof *out);
  if (!text && len) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "json: NULL text");
  parser p = {text, len, 0, what ? what : "JSON", 0};
  mpu_result_t r = parse_value(&p, out);
  if (!r) {
    skip_ws(&p);
    if (p.pos != p.len) r = fail(&p, "text after the value");
  }
  if (r) mpu__json_free(out);
  return r;
}

void mpu__json_free(json *v) {
  if (!v) return;
  for (size_t i = 0; i < v->n; i++) {
    mpu__json_free(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items), free(v->keys), free(v->string);
  memset(v, 0, sizeof *v);
}

const json *mpu__json_get(const json *obj, const char *key) {
  if (!obj || obj->type != JSON_OBJECT) return NULL;
  for (size_t i = 0; i < obj->n; i++)
    if (!strcmp(obj->keys[i], key)) return &obj->items[i];
  return NULL;
}

int mpu__json_int(const json *obj, const char *key, int64_t *out) {
  const json *v = mpu__json_get(obj, key);
  if (!v || v->type != JSON_NUMBER || !v->is_int) return -1;
  *out = v->integer;
  return 0;
}

const char *mpu__json_str(const json *obj, const char *key) {
  const json *v = mpu__json_get(obj, key);
  return v && v->type == JSON_STRING ? v->string : NULL;
}

/* ---- writing ----------------------------------------------------------------------------- */

void mpu__jb_append(json_buf *b, const char *s, size_t n) {
  if (b->failed) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *t = realloc(b->s, cap);
    if (!t) {
      b->failed = 1;
      return;
    }
    b->s = t, b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len] = '\0';
}

void mpu__jb_printf(json_buf *b, const char *fmt, ...) {
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->failed = 1;
    return;
  }
  if ((size_t)n < sizeof small) {
    mpu__jb_append(b, small, (size_t)n);
    return;
  }
  char *big = malloc((size_t)n + 1);
  if (!big) {
    b->failed = 1;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)n + 1, fmt, ap);
  va_end(ap);
  mpu__jb_append(b, big, (size_t)n);
  free(big);
}

void mpu__jb_string_ex(json_buf *b, const char *s, int script_safe) {
  mpu__jb_append(b, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)s; *c;) {
    size_t n;
    if (*c == '"' || *c == '\\') {
      char e[2] = {'\\', (char)*c};
      mpu__jb_append(b, e, 2);
    } else if (*c < 0x20 || *c == 0x7F || (script_safe && (*c == '<' || *c == '>' || *c == '&'))) {
      mpu__jb_printf(b, "\\u%04x", *c);
    } else if (*c < 0x80) {
      mpu__jb_append(b, (const char *)c, 1);
    } else if ((n = utf8_len(c))) {
      mpu__jb_append(b, (const char *)c, n);
      c += n;
      continue;
    } else {
      mpu__jb_append(b, "\\ufffd", 6); /* a byte that is not UTF-8: JSON text is UTF-8 */
    }
    c++;
  }
  mpu__jb_append(b, "\"", 1);
}

void mpu__jb_string(json_buf *b, const char *s) { mpu__jb_string_ex(b, s, 0); }

void mpu__jb_free(json_buf *b) {
  free(b->s);
  memset(b, 0, sizeof *b);
}
