/*
 * order.c - the test double's stream-order checker (order.h): vector clocks
 * per stream and per host thread, and per device allocation the last writer
 * and the readers since of each byte range. One lock guards all of it: the
 * double's streams are worker threads and its ranks host threads.
 */
#include <stdarg.h>

#include "nccl_double/double.h"
#include "nccl_double/order.h"

typedef struct vclock {
  uint32_t n;
  uint64_t *t; /* t[id]: the last tick of actor id this clock is ordered after */
} vclock;

struct order_actor {
  uint32_t id;
  int device, blocking, legacy, host;
  vclock view; /* view.t[id] is the actor's own last tick */
  order_actor *next; /* the live streams */
};

struct order_clock {
  vclock c;
};

typedef struct touch {
  uintptr_t lo, hi;
  uint32_t actor;
  uint64_t tick;
  int write;
  const char *what;
} touch;

typedef struct alloc {
  uintptr_t lo, hi;
  touch *a;
  size_t n, cap;
} alloc;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t next_id;
static char (*names)[64];
static uint32_t names_cap;
static order_actor *live;
static alloc *allocs; /* sorted by lo */
static size_t nallocs, allocs_cap;
static long violations;
static char last_message[768];
static __thread order_actor *host_self;
static pthread_key_t host_key;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;

/* The checker's own bookkeeping failing is the test machine's problem, not
 * the program's: say so and stop. */
static void *grow(void *p, size_t n, size_t size) {
  void *q = realloc(p, n * size);
  if (!q) {
    fprintf(stderr, "nccl double: the stream-order checker is out of memory\n");
    abort();
  }
  return q;
}

/* ---- vector clocks ---------------------------------------------------------------- */

static uint64_t vc_get(const vclock *v, uint32_t id) { return id < v->n ? v->t[id] : 0; }

static void vc_fit(vclock *v, uint32_t n) {
  if (n <= v->n) return;
  v->t = grow(v->t, n, sizeof *v->t);
  memset(v->t + v->n, 0, (n - v->n) * sizeof *v->t);
  v->n = n;
}

static void vc_join(vclock *a, const vclock *b) {
  vc_fit(a, b->n);
  for (uint32_t i = 0; i < b->n; i++)
    if (b->t[i] > a->t[i]) a->t[i] = b->t[i];
}

/* ---- actors --------------------------------------------------------------------- */

static order_actor *actor_new(int device, int blocking, int legacy, int host) {
  order_actor *a = calloc(1, sizeof *a);
  if (!a) return NULL;
  a->id = next_id++;
  a->device = device, a->blocking = blocking, a->legacy = legacy, a->host = host;
  if (a->id >= names_cap) {
    names_cap = names_cap ? names_cap * 2 : 256;
    names = grow(names, names_cap, sizeof *names);
  }
  if (host)
    snprintf(names[a->id], sizeof names[a->id], "host thread %u", a->id);
  else if (legacy)
    snprintf(names[a->id], sizeof names[a->id], "the legacy default stream of device %d", device);
  else
    snprintf(names[a->id], sizeof names[a->id], "stream %u (%s, device %d)", a->id,
             blocking ? "blocking" : "non-blocking", device);
  vc_fit(&a->view, a->id + 1);
  return a;
}

static void host_gone(void *p) {
  order_actor *a = p;
  host_self = NULL; /* a later destructor's CUDA call makes a new one */
  pthread_mutex_lock(&lock);
  free(a->view.t);
  free(a);
  pthread_mutex_unlock(&lock);
}

static void host_key_make(void) { pthread_key_create(&host_key, host_gone); }

/* The calling thread's actor (under the lock). */
static order_actor *host(void) {
  if (!host_self) {
    pthread_once(&host_once, host_key_make);
    host_self = actor_new(-1, 0, 0, 1);
    if (!host_self) {
      fprintf(stderr, "nccl double: the stream-order checker is out of memory\n");
      abort();
    }
    pthread_setspecific(host_key, host_self);
  }
  return host_self;
}

order_actor *double_order_stream_new(int device, int blocking, int legacy) {
  pthread_mutex_lock(&lock);
  order_actor *a = actor_new(device, blocking, legacy, 0);
  if (a) a->next = live, live = a;
  pthread_mutex_unlock(&lock);
  return a;
}

void double_order_stream_gone(order_actor *a) {
  if (!a) return;
  pthread_mutex_lock(&lock);
  for (order_actor **p = &live; *p; p = &(*p)->next)
    if (*p == a) {
      *p = a->next;
      break;
    }
  free(a->view.t);
  free(a);
  pthread_mutex_unlock(&lock);
}

/* Work being put on stream a by this thread: a is ordered after what the
 * thread has seen, and the legacy default stream and the blocking streams of
 * its device after each other (under the lock). */
static void prepare(order_actor *a) {
  vc_join(&a->view, &host()->view);
  if (!a->blocking && !a->legacy) return; /* cudaStreamNonBlocking: nothing implicit */
  for (order_actor *b = live; b; b = b->next) {
    if (b == a || b->device != a->device) continue;
    if ((a->legacy && b->blocking && !b->legacy) || (a->blocking && !a->legacy && b->legacy))
      vc_join(&a->view, &b->view);
  }
}

/* ---- allocations ---------------------------------------------------------------- */

/* The allocation holding p, or NULL (host memory: not the checker's). */
static alloc *find(uintptr_t p) {
  size_t lo = 0, hi = nallocs;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (allocs[mid].lo <= p) lo = mid + 1;
    else hi = mid;
  }
  if (!lo || p >= allocs[lo - 1].hi) return NULL;
  return &allocs[lo - 1];
}

void double_order_alloc(const void *p, size_t bytes) {
  uintptr_t lo = (uintptr_t)p;
  pthread_mutex_lock(&lock);
  if (nallocs == allocs_cap) {
    allocs_cap = allocs_cap ? allocs_cap * 2 : 64;
    allocs = grow(allocs, allocs_cap, sizeof *allocs);
  }
  size_t i = 0;
  while (i < nallocs && allocs[i].lo < lo) i++;
  memmove(allocs + i + 1, allocs + i, (nallocs - i) * sizeof *allocs);
  allocs[i] = (alloc){lo, lo + (bytes ? bytes : 1), NULL, 0, 0};
  nallocs++;
  pthread_mutex_unlock(&lock);
}

void double_order_free(const void *p) {
  pthread_mutex_lock(&lock);
  alloc *a = find((uintptr_t)p);
  if (a && a->lo == (uintptr_t)p) {
    free(a->a);
    size_t i = (size_t)(a - allocs);
    memmove(allocs + i, allocs + i + 1, (nallocs - i - 1) * sizeof *allocs);
    nallocs--;
  }
  pthread_mutex_unlock(&lock);
}

int double_order_tracked(const void *p) {
  pthread_mutex_lock(&lock);
  int t = find((uintptr_t)p) != NULL;
  pthread_mutex_unlock(&lock);
  return t;
}

/* [lo, hi) of a span inside its allocation; 0 if the checker does not track it. */
static alloc *clip(const double_span *s, uintptr_t *lo, uintptr_t *hi) {
  if (!s->p || !s->bytes) return NULL;
  alloc *a = find((uintptr_t)s->p);
  if (!a) return NULL;
  *lo = (uintptr_t)s->p;
  *hi = s->bytes > a->hi - *lo ? a->hi : *lo + s->bytes;
  return a;
}

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_message, sizeof last_message, fmt, ap);
  va_end(ap);
  violations++;
  double_set_error("%.255s", last_message);
  fprintf(stderr, "nccl double: stream-order violation: %s\n", last_message);
}

/* Is work on `a` that reads (or writes) [lo, hi) of m ordered after what
 * touched it before? 0, or -1 after reporting (under the lock). */
static int check(order_actor *a, const char *what, alloc *m, uintptr_t lo, uintptr_t hi, int write) {
  for (size_t i = 0; i < m->n; i++) {
    const touch *e = &m->a[i];
    if (e->hi <= lo || e->lo >= hi || e->actor == a->id) continue;
    if (!write && !e->write) continue; /* reads do not race with reads */
    if (vc_get(&a->view, e->actor) >= e->tick) continue;
    violation("%s on %s %s %p (offset %zu of a device allocation of %zu bytes) that %s on %s "
              "%s, and nothing orders it after that (record an event there and "
              "cudaStreamWaitEvent it here, or synchronise the host first)",
              what, names[a->id], write ? "writes" : "reads", (void *)lo, (size_t)(lo - m->lo),
              (size_t)(m->hi - m->lo), e->what, names[e->actor], e->write ? "wrote" : "reads");
    return -1;
  }
  return 0;
}

/* Record an touch: a write replaces what it covers, a read replaces the
 * same actor's reads it covers (under the lock). */
static void record(alloc *m, touch n) {
  touch *out = grow(NULL, m->n * 2 + 1, sizeof *out); /* each entry leaves at most two pieces */
  size_t k = 0;
  for (size_t i = 0; i < m->n; i++) {
    touch e = m->a[i];
    int replaced = e.hi > n.lo && e.lo < n.hi && (n.write || (!e.write && e.actor == n.actor));
    if (!replaced) {
      out[k++] = e;
      continue;
    }
    if (e.lo < n.lo) out[k] = e, out[k++].hi = n.lo;
    if (e.hi > n.hi) out[k] = e, out[k++].lo = n.hi;
  }
  out[k++] = n;
  free(m->a);
  m->a = out;
  m->n = k;
  m->cap = m->n;
}

static int access_locked(order_actor *a, const char *what, const double_span *reads, int nr,
                         const double_span *writes, int nw) {
  uintptr_t lo, hi;
  alloc *m;
  for (int i = 0; i < nr; i++)
    if ((m = clip(&reads[i], &lo, &hi)) && check(a, what, m, lo, hi, 0)) return -1;
  for (int i = 0; i < nw; i++)
    if ((m = clip(&writes[i], &lo, &hi)) && check(a, what, m, lo, hi, 1)) return -1;
  uint64_t tick = ++a->view.t[a->id];
  for (int i = 0; i < nr; i++)
    if ((m = clip(&reads[i], &lo, &hi))) record(m, (touch){lo, hi, a->id, tick, 0, what});
  for (int i = 0; i < nw; i++)
    if ((m = clip(&writes[i], &lo, &hi))) record(m, (touch){lo, hi, a->id, tick, 1, what});
  return 0;
}

int double_order_access(order_actor *a, const char *what, const double_span *reads, int nr,
                        const double_span *writes, int nw) {
  if (!a) return 0;
  pthread_mutex_lock(&lock);
  prepare(a);
  int r = double_forgives(DOUBLE_FORGIVE_ORDER) ? (a->view.t[a->id]++, 0)
                                                : access_locked(a, what, reads, nr, writes, nw);
  pthread_mutex_unlock(&lock);
  return r;
}

int double_order_nccl(order_actor *a, int kind, const void *send, void *recv, size_t count,
                      size_t elem, int nranks, int rank, int root) {
  static const char *const what[] = {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter",
                                     "ncclBroadcast", "ncclReduce",    "ncclAlltoAll",
                                     "ncclSend",      "ncclRecv"};
  size_t one = count * elem, all = one * (size_t)nranks;
  double_span r = {send, one}, w = {recv, one};
  int nr = 1, nw = 1;
  switch (kind) {
  case K_ALL_GATHER: w.bytes = all; break;
  case K_REDUCE_SCATTER: r.bytes = all; break;
  case K_ALL_TO_ALL: r.bytes = w.bytes = all; break;
  case K_BROADCAST: nr = rank == root; break;
  case K_REDUCE: nw = rank == root; break;
  case K_SEND: nw = 0; break;
  case K_RECV: nr = 0; break;
  default: break;
  }
  return double_order_access(a, what[kind], &r, nr, &w, nw);
}

/* ---- events and host synchronisation ---------------------------------------------- */

void double_order_record(order_actor *a, order_clock **snap) {
  if (!a) return;
  pthread_mutex_lock(&lock);
  prepare(a);
  if (!*snap) *snap = calloc(1, sizeof **snap);
  if (*snap) {
    (*snap)->c.n = 0; /* keep the array; forget the old clock */
    vc_join(&(*snap)->c, &a->view);
  }
  pthread_mutex_unlock(&lock);
}

void double_order_wait(order_actor *a, const order_clock *snap) {
  if (!a) return;
  pthread_mutex_lock(&lock);
  prepare(a);
  if (snap) vc_join(&a->view, &snap->c);
  pthread_mutex_unlock(&lock);
}

void double_order_clock_free(order_clock *snap) {
  if (!snap) return;
  free(snap->c.t);
  free(snap);
}

void double_order_host_after(order_actor *a) {
  if (!a) return;
  pthread_mutex_lock(&lock);
  vc_join(&host()->view, &a->view);
  pthread_mutex_unlock(&lock);
}

void double_order_host_after_clock(const order_clock *snap) {
  if (!snap) return;
  pthread_mutex_lock(&lock);
  vc_join(&host()->view, &snap->c);
  pthread_mutex_unlock(&lock);
}

void double_order_host_after_device(int device) {
  pthread_mutex_lock(&lock);
  order_actor *h = host();
  for (order_actor *b = live; b; b = b->next)
    if (b->device == device) vc_join(&h->view, &b->view);
  pthread_mutex_unlock(&lock);
}

/* ---- for tests ----------------------------------------------------------------- */

int double_order_host_write(const void *p, size_t bytes) {
  pthread_mutex_lock(&lock);
  order_actor *h = host();
  double_span s = {p, bytes};
  int r = double_forgives(DOUBLE_FORGIVE_ORDER) ? 0 : access_locked(h, "a store", NULL, 0, &s, 1);
  pthread_mutex_unlock(&lock);
  return r;
}

long double_order_violations(void) {
  pthread_mutex_lock(&lock);
  long n = violations;
  pthread_mutex_unlock(&lock);
  return n;
}

const char *double_order_message(void) {
  static __thread char copy[sizeof last_message];
  pthread_mutex_lock(&lock);
  memcpy(copy, last_message, sizeof copy);
  pthread_mutex_unlock(&lock);
  return copy;
}

long double_order_take_violations(void) {
  pthread_mutex_lock(&lock);
  long n = violations;
  violations = 0;
  pthread_mutex_unlock(&lock);
  return n;
}

/* A race nobody claimed fails the program, whatever the calls returned. */
__attribute__((destructor)) static void unclaimed(void) {
  long n = double_order_violations();
  if (!n) return;
  fprintf(stderr, "nccl double: %ld stream-order violation(s) that no test claimed; the last: %s\n",
          n, double_order_message());
  _exit(70);
}
