/*
 * store.h - a key-value store that speaks PyTorch's TCPStore protocol (the
 * c10d wire format of torch/csrc/distributed/c10d/TCPStore.cpp and its libuv
 * server), so an mpu process can be a client of the store torchrun's elastic
 * agent serves, and can serve one a torch client can use. Part of libmpu
 * (not installed), exported to the backend libraries that start from
 * torchrun's variables: NCCL (mpu_comm_nccl_from_env) and gloo
 * (mpu_comm_gloo_from_env).
 *
 * Wire format (all integers little-endian, lengths are 64-bit):
 *   query      u8 type, then its fields
 *   string     u64 length, bytes             (keys and values alike)
 *   key list   u64 count, count strings      (CHECK, WAIT, MULTI_GET)
 *   VALIDATE   u32 0x3C85F7CE                (first message; no answer)
 *   SET key value / APPEND key value         (no answer)
 *   COMPARE_SET key expected desired -> string (the value after the call)
 *   GET key -> string          ADD key i64 -> i64 (values kept as decimal text)
 *   CHECK keys -> u8 (0 ready, 1 not ready)   WAIT keys -> u8 0 once all exist
 *   CANCEL_WAIT -> u8 1        GETNUMKEYS -> i64   DELETE_KEY key -> i64
 *   MULTI_GET keys -> one string each         MULTI_SET u64 n, n (key, value)
 *   PING u32 nonce -> the same u32
 * A TCPStore client puts "/" before every key; torch's PrefixStore makes a
 * key prefix + "/" + key. The client here does both, so a key "k" under the
 * prefix "p" is "/p/k" on the wire, as PrefixStore("p", TCPStore) writes it.
 */
#ifndef MPU_COMM_STORE_H
#define MPU_COMM_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "mpu/result.h"

enum {
  MPU__STORE_VALIDATE = 0,
  MPU__STORE_SET = 1,
  MPU__STORE_COMPARE_SET = 2,
  MPU__STORE_GET = 3,
  MPU__STORE_ADD = 4,
  MPU__STORE_CHECK = 5,
  MPU__STORE_WAIT = 6,
  MPU__STORE_GETNUMKEYS = 7,
  MPU__STORE_DELETE_KEY = 8,
  MPU__STORE_APPEND = 9,
  MPU__STORE_MULTI_GET = 10,
  MPU__STORE_MULTI_SET = 11,
  MPU__STORE_CANCEL_WAIT = 12,
  MPU__STORE_PING = 13,
  MPU__STORE_QUERY_TYPES = 14
};
#define MPU__STORE_MAGIC 0x3C85F7CEu
#define MPU__STORE_READY 0        /* CHECK's answers */
#define MPU__STORE_NOT_READY 1
#define MPU__STORE_STOP_WAITING 0 /* WAIT's and CANCEL_WAIT's answers */
#define MPU__STORE_WAIT_CANCELED 1
#define MPU__STORE_MAX_KEY 8192            /* the limits of torch's libuv server */
#define MPU__STORE_MAX_VALUE (8u << 20)
#define MPU__STORE_MAX_KEYS (128u * 1024u)
#define MPU__STORE_MAX_QUERY (16u << 20)   /* one whole query, all fields */

/* ---- the codec: encoding queries, parsing them (the server's side) ---- */

typedef struct mpu__store_buf {
  uint8_t *p;
  size_t n, cap;
  int failed; /* out of memory or over MPU__STORE_MAX_QUERY: drop the buffer */
} mpu__store_buf;

void mpu__store_put_u8(mpu__store_buf *b, uint8_t v);
void mpu__store_put_u32(mpu__store_buf *b, uint32_t v);
void mpu__store_put_u64(mpu__store_buf *b, uint64_t v);
void mpu__store_put_bytes(mpu__store_buf *b, const void *p, size_t n); /* u64 length + bytes */
void mpu__store_buf_free(mpu__store_buf *b);

typedef struct mpu__store_str {
  const uint8_t *p;
  size_t n;
} mpu__store_str;

/* One parsed query. Strings point into the parsed bytes. For the key lists
 * (CHECK, WAIT, MULTI_GET) and MULTI_SET, count says how many and list is
 * where the first string begins: mpu__store_next_str walks them. */
typedef struct mpu__store_query {
  int type;
  mpu__store_str key, a, b; /* a: SET/APPEND value, COMPARE_SET expected; b: desired */
  int64_t i64;              /* ADD's delta */
  uint32_t u32;             /* VALIDATE's magic, PING's nonce */
  uint64_t count;
  const uint8_t *list;
} mpu__store_query;

/* Parse one query from the start of p[0..n): returns the bytes it took (> 0),
 * 0 when the query is not complete yet, or -1 when the bytes can never be a
 * query (unknown type, a length over the limits), with *why saying which. */
long mpu__store_parse(const uint8_t *p, size_t n, mpu__store_query *q, const char **why);

/* The next string of a parsed list (trusted: the parser checked them). */
mpu__store_str mpu__store_next_str(const uint8_t **at);

/* ---- the client ---- */

typedef struct mpu__store mpu__store;

/* Connect to host:port (a name, an IPv4 or IPv6 address; retrying until
 * timeout_s since the server may start later), validate and ping. Keys are
 * put under prefix ("" for none) as torch's PrefixStore does. Errors name
 * who (e.g. "mpu_comm_nccl_from_env") and the address. */
MPU_SIBLING_API mpu_result_t mpu__store_connect(const char *who, const char *host, int port, const char *prefix,
                                double timeout_s, mpu__store **out);
MPU_SIBLING_API void mpu__store_close(mpu__store *s);
const char *mpu__store_where(const mpu__store *s); /* "host:port" for messages */

MPU_SIBLING_API mpu_result_t mpu__store_set(mpu__store *s, const char *key, const void *v, size_t n,
                            double timeout_s);
/* Waits for the key first, as TCPStore.get does. *v is malloc'd (free it). */
MPU_SIBLING_API mpu_result_t mpu__store_get(mpu__store *s, const char *key, void **v, size_t *n,
                            double timeout_s);
mpu_result_t mpu__store_add(mpu__store *s, const char *key, int64_t delta, int64_t *out,
                            double timeout_s);
/* Sets key to desired when it holds expected (or is missing and expected is
 * empty); *cur (malloc'd) gets the value after the call. */
mpu_result_t mpu__store_compare_set(mpu__store *s, const char *key, const void *expected,
                                    size_t en, const void *desired, size_t dn, void **cur,
                                    size_t *curn, double timeout_s);
mpu_result_t mpu__store_check(mpu__store *s, const char *key, int *ready, double timeout_s);
/* MPU_ERR_TIMEOUT after timeout_s (the wait is cancelled on the server). */
MPU_SIBLING_API mpu_result_t mpu__store_wait(mpu__store *s, const char *key, double timeout_s);
/* Never blocks: sends a CHECK when none is in flight and reads its answer
 * when it has come. *ready is 1 once the key exists, 0 while not known. */
mpu_result_t mpu__store_poll_key(mpu__store *s, const char *key, int *ready);

/* ---- the server ---- */

typedef struct mpu__store_server mpu__store_server;

/* Serve a store on port (0: any free port) of every address of this host,
 * IPv6 and IPv4, in a thread of its own. Any number of clients at once; a
 * client that has not validated, or stops halfway through a query or an
 * answer, for conn_timeout_s is dropped without holding up the others. */
mpu_result_t mpu__store_serve(const char *who, int port, double conn_timeout_s,
                              mpu__store_server **out);
int mpu__store_server_port(const mpu__store_server *s);
void mpu__store_server_stop(mpu__store_server *s);

#endif
