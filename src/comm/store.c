/*
 * store.c - the TCPStore wire format (encoding, parsing) and the client.
 * The server is store_server.c. Sockets are non-blocking under poll(), so
 * every call ends by its deadline.
 */
#include "comm/store.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"

/* ---- codec ---- */

static void put_raw(mpu__store_buf *b, const void *p, size_t n) {
  if (b->failed) return;
  if (n > MPU__STORE_MAX_QUERY - b->n) {
    b->failed = 1;
    return;
  }
  if (b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n) cap *= 2;
    uint8_t *q = realloc(b->p, cap);
    if (!q) {
      b->failed = 1;
      return;
    }
    b->p = q, b->cap = cap;
  }
  if (n) memcpy(b->p + b->n, p, n);
  b->n += n;
}

void mpu__store_put_u8(mpu__store_buf *b, uint8_t v) { put_raw(b, &v, 1); }

void mpu__store_put_u32(mpu__store_buf *b, uint32_t v) {
  uint8_t x[4];
  for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
  put_raw(b, x, 4);
}

void mpu__store_put_u64(mpu__store_buf *b, uint64_t v) {
  uint8_t x[8];
  for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
  put_raw(b, x, 8);
}

void mpu__store_put_bytes(mpu__store_buf *b, const void *p, size_t n) {
  mpu__store_put_u64(b, n);
  put_raw(b, p, n);
}

void mpu__store_buf_free(mpu__store_buf *b) {
  free(b->p);
  *b = (mpu__store_buf){0};
}

static uint64_t get_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

typedef struct cursor {
  const uint8_t *p;
  size_t n, at;
  const char *why;
} cursor;

/* 1: read, 0: more bytes needed, -1: never valid */
static int take_u64(cursor *c, uint64_t *v) {
  if (c->n - c->at < 8) return 0;
  *v = get_u64(c->p + c->at);
  c->at += 8;
  return 1;
}

static int take_str(cursor *c, mpu__store_str *s, size_t limit, const char *what) {
  uint64_t len;
  int k = take_u64(c, &len);
  if (k <= 0) return k;
  if (len > limit) {
    c->why = what;
    return -1;
  }
  if (c->n - c->at < len) return 0;
  s->p = c->p + c->at;
  s->n = (size_t)len;
  c->at += (size_t)len;
  return 1;
}

#define TAKE(expr)                 \
  do {                             \
    int k_ = (expr);               \
    if (k_ < 0) goto bad;          \
    if (k_ == 0) goto more;        \
  } while (0)

long mpu__store_parse(const uint8_t *p, size_t n, mpu__store_query *q, const char **why) {
  cursor c = {p, n, 0, NULL};
  memset(q, 0, sizeof *q);
  *why = NULL;
  if (n < 1) return 0;
  q->type = p[0];
  c.at = 1;
  uint64_t v;
  switch (q->type) {
  case MPU__STORE_VALIDATE:
  case MPU__STORE_PING:
    if (n < 5) goto more;
    q->u32 = get_u32(p + 1);
    c.at = 5;
    break;
  case MPU__STORE_SET:
  case MPU__STORE_APPEND:
    TAKE(take_str(&c, &q->key, MPU__STORE_MAX_KEY, "a key over 8 KiB"));
    TAKE(take_str(&c, &q->a, MPU__STORE_MAX_VALUE, "a value over 8 MiB"));
    break;
  case MPU__STORE_COMPARE_SET:
    TAKE(take_str(&c, &q->key, MPU__STORE_MAX_KEY, "a key over 8 KiB"));
    TAKE(take_str(&c, &q->a, MPU__STORE_MAX_VALUE, "a value over 8 MiB"));
    TAKE(take_str(&c, &q->b, MPU__STORE_MAX_VALUE, "a value over 8 MiB"));
    break;
  case MPU__STORE_GET:
  case MPU__STORE_DELETE_KEY:
    TAKE(take_str(&c, &q->key, MPU__STORE_MAX_KEY, "a key over 8 KiB"));
    break;
  case MPU__STORE_ADD:
    TAKE(take_str(&c, &q->key, MPU__STORE_MAX_KEY, "a key over 8 KiB"));
    TAKE(take_u64(&c, &v));
    q->i64 = (int64_t)v;
    break;
  case MPU__STORE_CHECK:
  case MPU__STORE_WAIT:
  case MPU__STORE_MULTI_GET:
  case MPU__STORE_MULTI_SET:
    TAKE(take_u64(&c, &q->count));
    if (q->count > MPU__STORE_MAX_KEYS) {
      c.why = "more than 131072 keys in one query";
      goto bad;
    }
    q->list = p + c.at;
    for (uint64_t i = 0; i < q->count; i++) {
      mpu__store_str s;
      TAKE(take_str(&c, &s, MPU__STORE_MAX_KEY, "a key over 8 KiB"));
      if (q->type == MPU__STORE_MULTI_SET)
        TAKE(take_str(&c, &s, MPU__STORE_MAX_VALUE, "a value over 8 MiB"));
    }
    break;
  case MPU__STORE_GETNUMKEYS:
  case MPU__STORE_CANCEL_WAIT: break;
  default: c.why = "an unknown query type"; goto bad;
  }
  if (c.at > MPU__STORE_MAX_QUERY) {
    c.why = "a query over 16 MiB";
    goto bad;
  }
  return (long)c.at;
more:
  /* a query still arriving may not grow past the limit either */
  if (n > MPU__STORE_MAX_QUERY) {
    *why = "a query over 16 MiB";
    return -1;
  }
  return 0;
bad:
  *why = c.why ? c.why : "a malformed query";
  return -1;
}

mpu__store_str mpu__store_next_str(const uint8_t **at) {
  mpu__store_str s = {*at + 8, (size_t)get_u64(*at)};
  *at += 8 + s.n;
  return s;
}

/* ---- client ---- */

struct mpu__store {
  pthread_mutex_t mu; /* one query at a time on the connection */
  int fd;
  int broken;         /* the connection is out of step: every call fails */
  int check_in_flight; /* mpu__store_poll_key sent a CHECK, answer not read */
  double check_sent;
  char who[64], where[300], prefix[256];
};

const char *mpu__store_where(const mpu__store *s) { return s->where; }

static void pause_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static int ms_left(double deadline) {
  double left = deadline - mpu__now();
  if (left <= 0) return 0;
  return left > 1e6 ? 1000000000 : (int)(left * 1000) + 1;
}

/* 0: moved; 1: deadline; -1: connection closed or failed */
static int move_all(int fd, void *buf, size_t len, int sending, double deadline) {
  char *p = buf;
  while (len) {
    ssize_t k = sending ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
    if (k > 0) {
      p += k, len -= (size_t)k;
      continue;
    }
    if (k == 0 && !sending) return -1;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
    struct pollfd pfd = {fd, sending ? POLLOUT : POLLIN, 0};
    int ms = ms_left(deadline);
    if (!ms) return 1;
    if (poll(&pfd, 1, ms) < 0 && errno != EINTR) return -1;
  }
  return 0;
}

static mpu_result_t io_error(mpu__store *s, int k, const char *what) {
  s->broken = 1; /* half a query or answer moved: the stream is out of step */
  if (k > 0)
    return mpu__error(MPU_ERR_TIMEOUT, "%s: the store at %s did not answer %s in time", s->who,
                      s->where, what);
  return mpu__error(MPU_ERR_SYSTEM, "%s: the store at %s closed the connection (%s)", s->who,
                    s->where, what);
}

static mpu_result_t send_buf(mpu__store *s, mpu__store_buf *b, double deadline, const char *what) {
  if (b->failed) {
    mpu__store_buf_free(b);
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s: the query is over 16 MiB or memory ran out",
                      s->who, what);
  }
  int k = move_all(s->fd, b->p, b->n, 1, deadline);
  mpu__store_buf_free(b);
  return k ? io_error(s, k, what) : MPU_SUCCESS;
}

static mpu_result_t recv_exact(mpu__store *s, void *p, size_t n, double deadline, const char *what) {
  int k = move_all(s->fd, p, n, 0, deadline);
  return k ? io_error(s, k, what) : MPU_SUCCESS;
}

static mpu_result_t recv_u64(mpu__store *s, uint64_t *v, double deadline, const char *what) {
  uint8_t x[8];
  MPU_CHECK(recv_exact(s, x, 8, deadline, what));
  *v = get_u64(x);
  return MPU_SUCCESS;
}

static mpu_result_t recv_bytes(mpu__store *s, void **v, size_t *n, double deadline,
                               const char *what) {
  uint64_t len;
  MPU_CHECK(recv_u64(s, &len, deadline, what));
  if (len > MPU__STORE_MAX_VALUE) {
    s->broken = 1;
    return mpu__error(MPU_ERR_BACKEND, "%s: the store at %s answered %s with %llu bytes (over 8 MiB)",
                      s->who, s->where, what, (unsigned long long)len);
  }
  uint8_t *p = malloc(len ? (size_t)len : 1);
  if (!p) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %s", s->who, what);
  mpu_result_t r = recv_exact(s, p, (size_t)len, deadline, what);
  if (r) {
    free(p);
    return r;
  }
  *v = p;
  *n = (size_t)len;
  return MPU_SUCCESS;
}

/* "/" + prefix + "/" + key, as PrefixStore over TCPStore writes it */
static void put_key(mpu__store *s, mpu__store_buf *b, const char *key) {
  size_t pn = strlen(s->prefix), kn = strlen(key);
  if (pn + kn + 2 > MPU__STORE_MAX_KEY) {
    b->failed = 1;
    return;
  }
  char full[MPU__STORE_MAX_KEY + 2];
  size_t n = 0;
  full[n++] = '/';
  if (pn) {
    memcpy(full + n, s->prefix, pn);
    n += pn;
    full[n++] = '/';
  }
  memcpy(full + n, key, kn);
  n += kn;
  mpu__store_put_bytes(b, full, n);
}

/* Enter a call: one at a time, on a connection still in step. An answer to a
 * CHECK that mpu__store_poll_key left in flight is read (and dropped) first. */
static mpu_result_t enter(mpu__store *s, const char *what, double deadline) {
  pthread_mutex_lock(&s->mu);
  if (s->broken) {
    pthread_mutex_unlock(&s->mu);
    return mpu__error(MPU_ERR_SYSTEM, "%s: %s: the connection to the store at %s was lost earlier",
                      s->who, what, s->where);
  }
  if (s->check_in_flight) {
    uint8_t r;
    mpu_result_t e = recv_exact(s, &r, 1, deadline, what);
    if (e) {
      pthread_mutex_unlock(&s->mu);
      return e;
    }
    s->check_in_flight = 0;
  }
  return MPU_SUCCESS;
}

static mpu_result_t leave(mpu__store *s, mpu_result_t r) {
  pthread_mutex_unlock(&s->mu);
  return r;
}

/* Enter a call and begin its query: the type, then the key. */
static mpu_result_t begin(mpu__store *s, mpu__store_buf *b, int type, const char *key,
                          double deadline, const char *what) {
  MPU_CHECK(enter(s, what, deadline));
  *b = (mpu__store_buf){0};
  mpu__store_put_u8(b, (uint8_t)type);
  put_key(s, b, key);
  return MPU_SUCCESS;
}

static mpu_result_t connect_once(const struct addrinfo *ai, double deadline, int *fd_out) {
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) return MPU_ERR_SYSTEM;
  int ok = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
  if (!ok && errno == EINPROGRESS) {
    struct pollfd pfd = {fd, POLLOUT, 0};
    int ms = ms_left(deadline);
    int err = 0;
    socklen_t el = sizeof err;
    ok = ms && poll(&pfd, 1, ms < 1000 ? ms : 1000) == 1 &&
         !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) && !err;
  }
  if (!ok) {
    close(fd);
    return MPU_ERR_SYSTEM;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  *fd_out = fd;
  return MPU_SUCCESS;
}

mpu_result_t mpu__store_connect(const char *who, const char *host, int port, const char *prefix,
                                double timeout_s, mpu__store **out) {
  *out = NULL;
  if (!host || !*host || port < 1 || port > 65535 || !prefix || strlen(prefix) >= 256)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: no store address, or a bad port or prefix",
                      who);
  double deadline = mpu__now() + timeout_s;
  char ports[16];
  snprintf(ports, sizeof ports, "%d", port);
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int g = getaddrinfo(host, ports, &hints, &res);
  if (g)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: cannot resolve the store's host '%s': %s", who,
                      host, gai_strerror(g));
  mpu__store *s = calloc(1, sizeof *s);
  if (!s) {
    freeaddrinfo(res);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", who);
  }
  pthread_mutex_init(&s->mu, NULL);
  s->fd = -1;
  snprintf(s->who, sizeof s->who, "%s", who);
  snprintf(s->where, sizeof s->where, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
  snprintf(s->prefix, sizeof s->prefix, "%s", prefix);
  /* the server may come later than us: try every address until the deadline */
  while (s->fd < 0) {
    for (const struct addrinfo *ai = res; ai && s->fd < 0; ai = ai->ai_next)
      connect_once(ai, deadline, &s->fd);
    if (s->fd >= 0 || mpu__now() >= deadline) break;
    pause_ms(50);
  }
  freeaddrinfo(res);
  if (s->fd < 0) {
    mpu_result_t r = mpu__error(MPU_ERR_TIMEOUT, "%s: no store answered at %s within %.3g s",
                                who, s->where, timeout_s);
    mpu__store_close(s);
    return r;
  }
  /* validate, then ping: the answer proves a TCPStore server is there */
  mpu__store_buf b = {0};
  uint32_t nonce = (uint32_t)getpid();
  mpu__store_put_u8(&b, MPU__STORE_VALIDATE);
  mpu__store_put_u32(&b, MPU__STORE_MAGIC);
  mpu__store_put_u8(&b, MPU__STORE_PING);
  mpu__store_put_u32(&b, nonce);
  mpu_result_t r = send_buf(s, &b, deadline, "the handshake");
  uint8_t echo[4];
  if (!r) r = recv_exact(s, echo, 4, deadline, "the handshake");
  if (!r && get_u32(echo) != nonce)
    r = mpu__error(MPU_ERR_BACKEND, "%s: the server at %s does not speak the TCPStore protocol",
                   who, s->where);
  if (r) {
    mpu__store_close(s);
    return r;
  }
  *out = s;
  return MPU_SUCCESS;
}

void mpu__store_close(mpu__store *s) {
  if (!s) return;
  if (s->fd >= 0) close(s->fd);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

mpu_result_t mpu__store_set(mpu__store *s, const char *key, const void *v, size_t n,
                            double timeout_s) {
  double deadline = mpu__now() + timeout_s;
  mpu__store_buf b;
  MPU_CHECK(begin(s, &b, MPU__STORE_SET, key, deadline, "set"));
  if (n > MPU__STORE_MAX_VALUE) b.failed = 1;
  mpu__store_put_bytes(&b, v, n);
  return leave(s, send_buf(s, &b, deadline, "set"));
}

static mpu_result_t wait_locked(mpu__store *s, const char *key, double deadline, double timeout_s) {
  mpu__store_buf b = {0};
  mpu__store_put_u8(&b, MPU__STORE_WAIT);
  mpu__store_put_u64(&b, 1);
  put_key(s, &b, key);
  MPU_CHECK(send_buf(s, &b, deadline, "wait"));
  uint8_t r = 0xff;
  int k = move_all(s->fd, &r, 1, 0, deadline);
  if (k < 0) return io_error(s, k, "wait");
  if (k == 0) {
    if (r == MPU__STORE_STOP_WAITING) return MPU_SUCCESS;
    s->broken = 1;
    return mpu__error(MPU_ERR_BACKEND, "%s: the store at %s answered a wait with %u", s->who,
                      s->where, r);
  }
  /* out of time: cancel on the server, which answers WAIT_CANCELED (a
   * STOP_WAITING that crossed the cancel on the wire may come first) */
  b = (mpu__store_buf){0};
  mpu__store_put_u8(&b, MPU__STORE_CANCEL_WAIT);
  double grace = mpu__now() + 5;
  MPU_CHECK(send_buf(s, &b, grace, "cancelling a wait"));
  for (int i = 0; i < 2; i++) {
    MPU_CHECK(recv_exact(s, &r, 1, grace, "cancelling a wait"));
    if (r == MPU__STORE_WAIT_CANCELED) break;
  }
  if (r != MPU__STORE_WAIT_CANCELED) s->broken = 1;
  return mpu__error(MPU_ERR_TIMEOUT, "%s: key '%s' did not appear in the store at %s within %.3g s",
                    s->who, key, s->where, timeout_s);
}

mpu_result_t mpu__store_wait(mpu__store *s, const char *key, double timeout_s) {
  double deadline = mpu__now() + timeout_s;
  MPU_CHECK(enter(s, "wait", deadline));
  return leave(s, wait_locked(s, key, deadline, timeout_s));
}

mpu_result_t mpu__store_get(mpu__store *s, const char *key, void **v, size_t *n,
                            double timeout_s) {
  double deadline = mpu__now() + timeout_s;
  MPU_CHECK(enter(s, "get", deadline));
  mpu_result_t r = wait_locked(s, key, deadline, timeout_s);
  if (r) return leave(s, r);
  mpu__store_buf b = {0};
  mpu__store_put_u8(&b, MPU__STORE_GET);
  put_key(s, &b, key);
  r = send_buf(s, &b, deadline, "get");
  if (!r) r = recv_bytes(s, v, n, deadline, "get");
  return leave(s, r);
}

mpu_result_t mpu__store_add(mpu__store *s, const char *key, int64_t delta, int64_t *out,
                            double timeout_s) {
  double deadline = mpu__now() + timeout_s;
  mpu__store_buf b;
  MPU_CHECK(begin(s, &b, MPU__STORE_ADD, key, deadline, "add"));
  mpu__store_put_u64(&b, (uint64_t)delta);
  mpu_result_t r = send_buf(s, &b, deadline, "add");
  uint64_t v = 0;
  if (!r) r = recv_u64(s, &v, deadline, "add");
  if (!r && out) *out = (int64_t)v;
  return leave(s, r);
}

mpu_result_t mpu__store_compare_set(mpu__store *s, const char *key, const void *expected,
                                    size_t en, const void *desired, size_t dn, void **cur,
                                    size_t *curn, double timeout_s) {
  double deadline = mpu__now() + timeout_s;
  mpu__store_buf b;
  MPU_CHECK(begin(s, &b, MPU__STORE_COMPARE_SET, key, deadline, "compare_set"));
  if (en > MPU__STORE_MAX_VALUE || dn > MPU__STORE_MAX_VALUE) b.failed = 1;
  mpu__store_put_bytes(&b, expected, en);
  mpu__store_put_bytes(&b, desired, dn);
  mpu_result_t r = send_buf(s, &b, deadline, "compare_set");
  if (!r) r = recv_bytes(s, cur, curn, deadline, "compare_set");
  return leave(s, r);
}

static void put_check(mpu__store *s, mpu__store_buf *b, const char *key) {
  mpu__store_put_u8(b, MPU__STORE_CHECK);
  mpu__store_put_u64(b, 1);
  put_key(s, b, key);
}

mpu_result_t mpu__store_check(mpu__store *s, const char *key, int *ready, double timeout_s) {
  double deadline = mpu__now() + timeout_s;
  MPU_CHECK(enter(s, "check", deadline));
  mpu__store_buf b = {0};
  put_check(s, &b, key);
  mpu_result_t r = send_buf(s, &b, deadline, "check");
  uint8_t a = 0xff;
  if (!r) r = recv_exact(s, &a, 1, deadline, "check");
  if (!r) *ready = a == MPU__STORE_READY;
  return leave(s, r);
}

mpu_result_t mpu__store_poll_key(mpu__store *s, const char *key, int *ready) {
  *ready = 0;
  if (pthread_mutex_trylock(&s->mu)) return MPU_SUCCESS; /* busy: ask next time */
  mpu_result_t r = MPU_SUCCESS;
  if (s->broken) {
    r = mpu__error(MPU_ERR_SYSTEM, "%s: the connection to the store at %s was lost", s->who,
                   s->where);
  } else if (!s->check_in_flight) {
    mpu__store_buf b = {0};
    put_check(s, &b, key); /* a few dozen bytes: the socket buffer takes them at once */
    r = send_buf(s, &b, mpu__now() + 1, "check");
    if (!r) s->check_in_flight = 1, s->check_sent = mpu__now();
  } else {
    uint8_t a;
    ssize_t k = recv(s->fd, &a, 1, 0);
    if (k == 1) {
      s->check_in_flight = 0;
      *ready = a == MPU__STORE_READY;
    } else if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      r = io_error(s, -1, "check");
    }
  }
  pthread_mutex_unlock(&s->mu);
  return r;
}
