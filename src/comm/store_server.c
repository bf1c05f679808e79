/*
 * store_server.c - a server of PyTorch's TCPStore protocol (store.h): what
 * rank 0 runs when no torchrun agent serves a store. One thread, one poll()
 * over every connection, so no client waits on another; a connection that
 * has not validated, or stalls halfway through a query or an answer, for the
 * connection deadline is dropped. The data: a hash table of keys to values,
 * with torch's libuv server's rules (COMPARE_SET, ADD on decimal text, GET of
 * a missing key answers an empty value, WAIT answers once every key exists).
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/store.h"
#include "core/clock.h"
#include "core/error.h"

#define MAX_CONNS 65536

typedef struct entry {
  struct entry *next;
  uint8_t *key, *val;
  size_t kn, vn;
} entry;

typedef struct conn {
  int fd;
  int validated;
  double since;          /* accepted, or the current query/answer began */
  mpu__store_buf in, out;
  size_t out_at;         /* bytes of out already sent */
  uint8_t *wait;         /* a pending WAIT's key list (a copy), NULL if none */
  uint64_t wait_count;
} conn;

struct mpu__store_server {
  pthread_t thread;
  int listen_fd, wake[2], port;
  double conn_timeout_s;
  conn *conns;
  size_t nconn, capconn;
  entry **table;
  size_t nbuckets, nkeys;
};

/* ---- the data ---- */

static size_t hash(const uint8_t *p, size_t n) {
  size_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static entry **slot(mpu__store_server *s, mpu__store_str k) {
  entry **e = &s->table[hash(k.p, k.n) % s->nbuckets];
  while (*e && ((*e)->kn != k.n || memcmp((*e)->key, k.p, k.n))) e = &(*e)->next;
  return e;
}

static entry *find(mpu__store_server *s, mpu__store_str k) { return *slot(s, k); }

static uint8_t *dup_bytes(const uint8_t *p, size_t n) {
  uint8_t *q = malloc(n ? n : 1);
  if (q && n) memcpy(q, p, n);
  return q;
}

/* 0 on success, -1 out of memory */
static int put(mpu__store_server *s, mpu__store_str k, const uint8_t *v, size_t vn, int append) {
  entry **e = slot(s, k);
  if (*e && append) {
    if (vn > SIZE_MAX - (*e)->vn) return -1;
    uint8_t *q = realloc((*e)->val, (*e)->vn + vn + 1);
    if (!q) return -1;
    if (vn) memcpy(q + (*e)->vn, v, vn);
    (*e)->val = q, (*e)->vn += vn;
    return 0;
  }
  uint8_t *val = dup_bytes(v, vn);
  if (!val) return -1;
  if (*e) {
    free((*e)->val);
    (*e)->val = val, (*e)->vn = vn;
    return 0;
  }
  entry *x = calloc(1, sizeof *x);
  uint8_t *key = x ? dup_bytes(k.p, k.n) : NULL;
  if (!key) {
    free(x), free(val);
    return -1;
  }
  *x = (entry){NULL, key, val, k.n, vn};
  *e = x;
  s->nkeys++;
  return 0;
}

static int del(mpu__store_server *s, mpu__store_str k) {
  entry **e = slot(s, k);
  if (!*e) return 0;
  entry *x = *e;
  *e = x->next;
  free(x->key), free(x->val), free(x);
  s->nkeys--;
  return 1;
}

static int all_present(mpu__store_server *s, const uint8_t *list, uint64_t count) {
  for (uint64_t i = 0; i < count; i++)
    if (!find(s, mpu__store_next_str(&list))) return 0;
  return 1;
}

/* ---- connections ---- */

static void drop(mpu__store_server *s, size_t i) {
  conn *c = &s->conns[i];
  close(c->fd);
  mpu__store_buf_free(&c->in);
  mpu__store_buf_free(&c->out);
  free(c->wait);
  s->conns[i] = s->conns[--s->nconn];
}

/* after a change, answer every WAIT whose keys all exist now */
static void wake_waiters(mpu__store_server *s) {
  for (size_t i = 0; i < s->nconn; i++) {
    conn *c = &s->conns[i];
    if (c->wait && all_present(s, c->wait, c->wait_count)) {
      free(c->wait);
      c->wait = NULL;
      mpu__store_put_u8(&c->out, MPU__STORE_STOP_WAITING);
    }
  }
}

/* Carry out one parsed query; 0, or -1 to drop the client. */
static int run_query(mpu__store_server *s, conn *c, const mpu__store_query *q, const uint8_t *qend) {
  mpu__store_buf *o = &c->out;
  if (!c->validated) {
    if (q->type != MPU__STORE_VALIDATE || q->u32 != MPU__STORE_MAGIC) return -1;
    c->validated = 1;
    return 0;
  }
  switch (q->type) {
  case MPU__STORE_VALIDATE: return q->u32 == MPU__STORE_MAGIC ? 0 : -1;
  case MPU__STORE_PING: mpu__store_put_u32(o, q->u32); return 0;
  case MPU__STORE_SET:
  case MPU__STORE_APPEND:
    if (put(s, q->key, q->a.p, q->a.n, q->type == MPU__STORE_APPEND)) return -1;
    wake_waiters(s);
    return 0;
  case MPU__STORE_COMPARE_SET: {
    entry *e = find(s, q->key);
    if ((!e && q->a.n == 0) || (e && e->vn == q->a.n && !memcmp(e->val, q->a.p, q->a.n))) {
      if (put(s, q->key, q->b.p, q->b.n, 0)) return -1;
      mpu__store_put_bytes(o, q->b.p, q->b.n);
      wake_waiters(s);
    } else if (!e) {
      mpu__store_put_bytes(o, q->a.p, q->a.n);
    } else {
      mpu__store_put_bytes(o, e->val, e->vn);
    }
    return 0;
  }
  case MPU__STORE_GET: {
    entry *e = find(s, q->key);
    mpu__store_put_bytes(o, e ? e->val : NULL, e ? e->vn : 0);
    return 0;
  }
  case MPU__STORE_ADD: {
    entry *e = find(s, q->key);
    long long v = 0;
    if (e) {
      char num[32];
      if (e->vn == 0 || e->vn >= sizeof num) return -1;
      memcpy(num, e->val, e->vn);
      num[e->vn] = 0;
      char *end;
      errno = 0;
      v = strtoll(num, &end, 10);
      if (errno || *end) return -1; /* not a number: torch's server refuses it too */
    }
    if ((q->i64 > 0 && v > INT64_MAX - q->i64) || (q->i64 < 0 && v < INT64_MIN - q->i64))
      return -1;
    v += q->i64;
    char num[32];
    int n = snprintf(num, sizeof num, "%lld", v);
    if (put(s, q->key, (const uint8_t *)num, (size_t)n, 0)) return -1;
    mpu__store_put_u64(o, (uint64_t)v);
    wake_waiters(s);
    return 0;
  }
  case MPU__STORE_CHECK:
    mpu__store_put_u8(o, all_present(s, q->list, q->count) ? MPU__STORE_READY
                                                           : MPU__STORE_NOT_READY);
    return 0;
  case MPU__STORE_WAIT:
    if (all_present(s, q->list, q->count)) {
      mpu__store_put_u8(o, MPU__STORE_STOP_WAITING);
      return 0;
    }
    free(c->wait);
    c->wait = dup_bytes(q->list, (size_t)(qend - q->list));
    c->wait_count = q->count;
    return c->wait ? 0 : -1;
  case MPU__STORE_CANCEL_WAIT:
    free(c->wait);
    c->wait = NULL;
    mpu__store_put_u8(o, MPU__STORE_WAIT_CANCELED);
    return 0;
  case MPU__STORE_GETNUMKEYS: mpu__store_put_u64(o, (uint64_t)s->nkeys); return 0;
  case MPU__STORE_DELETE_KEY: mpu__store_put_u64(o, (uint64_t)del(s, q->key)); return 0;
  case MPU__STORE_MULTI_GET: {
    const uint8_t *at = q->list;
    for (uint64_t i = 0; i < q->count; i++) {
      entry *e = find(s, mpu__store_next_str(&at));
      mpu__store_put_bytes(o, e ? e->val : NULL, e ? e->vn : 0);
    }
    return 0;
  }
  case MPU__STORE_MULTI_SET: {
    const uint8_t *at = q->list;
    for (uint64_t i = 0; i < q->count; i++) {
      mpu__store_str k = mpu__store_next_str(&at), v = mpu__store_next_str(&at);
      if (put(s, k, v.p, v.n, 0)) return -1;
    }
    wake_waiters(s);
    return 0;
  }
  default: return -1;
  }
}

/* Run every whole query at the front of c->in; 0, or -1 to drop. */
static int run_queries(mpu__store_server *s, conn *c) {
  size_t used = 0;
  for (;;) {
    mpu__store_query q;
    const char *why;
    long n = mpu__store_parse(c->in.p + used, c->in.n - used, &q, &why);
    if (n < 0) return -1;
    if (n == 0) break;
    if (run_query(s, c, &q, c->in.p + used + n) || c->out.failed) return -1;
    used += (size_t)n;
    c->since = mpu__now();
  }
  if (used) {
    memmove(c->in.p, c->in.p + used, c->in.n - used);
    c->in.n -= used;
  }
  return 0;
}

/* Read what came, running the queries as they complete; 0, or -1 to drop. */
static int on_readable(mpu__store_server *s, conn *c) {
  uint8_t chunk[65536];
  for (;;) {
    ssize_t k = recv(c->fd, chunk, sizeof chunk, 0);
    if (k == 0) return -1;
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -1;
    }
    if (c->in.n == 0) c->since = mpu__now(); /* a new query begins */
    mpu__store_buf *in = &c->in;
    /* a query still arriving is bounded by the parser's limit */
    if (in->n + (size_t)k > in->cap) {
      size_t cap = in->cap ? in->cap : 4096;
      while (cap < in->n + (size_t)k) cap *= 2;
      uint8_t *p = realloc(in->p, cap);
      if (!p) return -1;
      in->p = p, in->cap = cap;
    }
    memcpy(in->p + in->n, chunk, (size_t)k);
    in->n += (size_t)k;
    if (run_queries(s, c)) return -1;
    if ((size_t)k < sizeof chunk) return 0;
  }
}

static int on_writable(conn *c) {
  while (c->out_at < c->out.n) {
    ssize_t k = send(c->fd, c->out.p + c->out_at, c->out.n - c->out_at, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -1;
    }
    c->out_at += (size_t)k;
  }
  c->out.n = c->out_at = 0;
  return 0;
}

static void accept_all(mpu__store_server *s) {
  for (;;) {
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (s->nconn == MAX_CONNS) {
      close(fd);
      continue;
    }
    if (s->nconn == s->capconn) {
      size_t cap = s->capconn ? s->capconn * 2 : 16;
      conn *p = realloc(s->conns, cap * sizeof *p);
      if (!p) {
        close(fd);
        return;
      }
      s->conns = p, s->capconn = cap;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    s->conns[s->nconn++] = (conn){.fd = fd, .since = mpu__now()};
  }
}

static void *serve_loop(void *arg) {
  mpu__store_server *s = arg;
  struct pollfd *pfd = NULL;
  size_t cap = 0;
  for (;;) {
    if (cap < s->nconn + 2) {
      size_t want = (s->nconn + 2) * 2;
      struct pollfd *p = realloc(pfd, want * sizeof *p);
      if (!p) break;
      pfd = p, cap = want;
    }
    pfd[0] = (struct pollfd){s->wake[0], POLLIN, 0};
    pfd[1] = (struct pollfd){s->listen_fd, POLLIN, 0};
    size_t n = s->nconn;
    for (size_t i = 0; i < n; i++)
      pfd[i + 2] = (struct pollfd){s->conns[i].fd,
                                   (short)(POLLIN | (s->conns[i].out.n ? POLLOUT : 0)), 0};
    /* wake up often enough to keep the connection deadlines */
    int ms = (int)(s->conn_timeout_s * 1000 / 4);
    ms = ms < 10 ? 10 : ms > 250 ? 250 : ms;
    if (poll(pfd, n + 2, ms) < 0 && errno != EINTR) break;
    if (pfd[0].revents) break; /* stop */
    double now = mpu__now();
    /* walk backwards: drop() moves the last connection into the hole */
    for (size_t i = n; i-- > 0;) {
      conn *c = &s->conns[i];
      short ev = pfd[i + 2].revents;
      int bad = (ev & (POLLERR | POLLNVAL)) != 0;
      if (!bad && (ev & (POLLIN | POLLHUP))) bad = on_readable(s, c) != 0;
      if (!bad && c->out.n) bad = on_writable(c) != 0;
      /* the deadline: a silent newcomer, a query cut off halfway, an answer
       * the client does not take */
      if (!bad && (!c->validated || c->in.n || c->out.n) && now - c->since > s->conn_timeout_s)
        bad = 1;
      if (bad) drop(s, i);
    }
    if (pfd[1].revents & POLLIN) accept_all(s);
  }
  free(pfd);
  return NULL;
}

static int listen_on(int family, int port) {
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1, zero = 0;
  if (fd < 0) return -1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int ok;
  if (family == AF_INET6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero); /* IPv4 too */
    struct sockaddr_in6 a = {0};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons((uint16_t)port);
    a.sin6_addr = in6addr_any;
    ok = !bind(fd, (struct sockaddr *)&a, sizeof a);
  } else {
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    ok = !bind(fd, (struct sockaddr *)&a, sizeof a);
  }
  if (!ok || listen(fd, 1024)) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

mpu_result_t mpu__store_serve(const char *who, int port, double conn_timeout_s,
                              mpu__store_server **out) {
  *out = NULL;
  if (port < 0 || port > 65535 || !(conn_timeout_s > 0))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: bad port %d or connection deadline", who,
                      port);
  int fd = listen_on(AF_INET6, port);
  if (fd < 0 && errno != EADDRINUSE) fd = listen_on(AF_INET, port); /* no IPv6 here */
  if (fd < 0)
    return mpu__error(MPU_ERR_SYSTEM,
                      "%s: cannot serve a store on port %d: %s (is a torchrun agent serving one "
                      "there? then TORCHELASTIC_USE_AGENT_STORE=True makes every rank its client)",
                      who, port, strerror(errno));
  mpu__store_server *s = calloc(1, sizeof *s);
  if (s) s->nbuckets = 1024, s->table = calloc(s->nbuckets, sizeof *s->table);
  if (!s || !s->table || pipe2(s->wake, O_CLOEXEC)) {
    if (s) free(s->table);
    free(s);
    close(fd);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: the store server", who);
  }
  struct sockaddr_storage a;
  socklen_t al = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &al);
  s->port = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                          : ((struct sockaddr_in *)&a)->sin_port);
  s->listen_fd = fd;
  s->conn_timeout_s = conn_timeout_s;
  if (pthread_create(&s->thread, NULL, serve_loop, s)) {
    close(s->wake[0]), close(s->wake[1]), close(fd);
    free(s->table), free(s);
    return mpu__error(MPU_ERR_SYSTEM, "%s: cannot start the store's thread", who);
  }
  *out = s;
  return MPU_SUCCESS;
}

int mpu__store_server_port(const mpu__store_server *s) { return s->port; }

void mpu__store_server_stop(mpu__store_server *s) {
  if (!s) return;
  char x = 1;
  while (write(s->wake[1], &x, 1) < 0 && errno == EINTR) {
  }
  pthread_join(s->thread, NULL);
  while (s->nconn) drop(s, s->nconn - 1);
  free(s->conns);
  for (size_t i = 0; i < s->nbuckets; i++)
    while (s->table[i]) {
      entry *e = s->table[i];
      s->table[i] = e->next;
      free(e->key), free(e->val), free(e);
    }
  free(s->table);
  close(s->listen_fd), close(s->wake[0]), close(s->wake[1]);
  free(s);
}
