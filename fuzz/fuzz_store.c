/*
 * fuzz_store.c - libFuzzer target over the TCPStore query parser that rank
 * 0's store server runs on every byte a client sends (src/comm/store.c):
 * any bytes are parsed query after query, as the server reads them, until
 * they run out or are refused; every parsed query lies inside the input, its
 * key lists walk inside it too, and written back out with the encoder it
 * parses again to the same bytes.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void encode(mpu__store_buf *b, const mpu__store_query *q) {
  mpu__store_put_u8(b, (uint8_t)q->type);
  switch (q->type) {
  case MPU__STORE_VALIDATE:
  case MPU__STORE_PING: mpu__store_put_u32(b, q->u32); break;
  case MPU__STORE_SET:
  case MPU__STORE_APPEND:
    mpu__store_put_bytes(b, q->key.p, q->key.n);
    mpu__store_put_bytes(b, q->a.p, q->a.n);
    break;
  case MPU__STORE_COMPARE_SET:
    mpu__store_put_bytes(b, q->key.p, q->key.n);
    mpu__store_put_bytes(b, q->a.p, q->a.n);
    mpu__store_put_bytes(b, q->b.p, q->b.n);
    break;
  case MPU__STORE_GET:
  case MPU__STORE_DELETE_KEY: mpu__store_put_bytes(b, q->key.p, q->key.n); break;
  case MPU__STORE_ADD:
    mpu__store_put_bytes(b, q->key.p, q->key.n);
    mpu__store_put_u64(b, (uint64_t)q->i64);
    break;
  case MPU__STORE_CHECK:
  case MPU__STORE_WAIT:
  case MPU__STORE_MULTI_GET:
  case MPU__STORE_MULTI_SET: {
    mpu__store_put_u64(b, q->count);
    const uint8_t *at = q->list;
    for (uint64_t i = 0; i < q->count * (q->type == MPU__STORE_MULTI_SET ? 2 : 1); i++) {
      mpu__store_str s = mpu__store_next_str(&at);
      mpu__store_put_bytes(b, s.p, s.n);
    }
    break;
  }
  default: break;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t at = 0;
  while (at < size) {
    mpu__store_query q;
    const char *why = NULL;
    long n = mpu__store_parse(data + at, size - at, &q, &why);
    if (n < 0) {
      if (!why || !*why) abort(); /* a refusal always says why */
      break;
    }
    if (n == 0) break; /* the rest is an unfinished query */
    if ((size_t)n > size - at) abort();
    mpu__store_buf b = {0};
    encode(&b, &q);
    if (!b.failed && (b.n != (size_t)n || memcmp(b.p, data + at, (size_t)n))) abort();
    mpu__store_buf_free(&b);
    at += (size_t)n;
  }
  return 0;
}
