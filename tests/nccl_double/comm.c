/*
 * comm.c - NCCL's communicators in the test double (double.h): unique ids,
 * init (blocking until every rank joined), split, abort, destroy, errors,
 * groups.
 */
#include <stdarg.h>

#include "nccl_double/double.h"

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_long inits, splits, shared_splits, blocking_children; /* double_count() */

long double_count(const char *name) {
  return !strcmp(name, "init")                   ? atomic_load(&inits)
         : !strcmp(name, "split")                ? atomic_load(&splits)
         : !strcmp(name, "split_shared")         ? atomic_load(&shared_splits)
         : !strcmp(name, "split_blocking_child") ? atomic_load(&blocking_children)
                                                 : -1;
}

/* NCCL's commHash: getHash of the id's bytes for a root; for a split, the
 * parent's hash, its split count and the color eaten in turn (init.cc). */
static uint64_t hash_eat(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}
static clique *cliques;
static void release(ncclComm_t c);

/* NCCL keeps one static last-error string for the whole process (debug.cc's
 * ncclLastError, written under its debug lock): any thread's or
 * communicator's failure overwrites it. The reader gets a snapshot taken
 * under the lock (NCCL hands out the buffer itself; a copy keeps the
 * double's readers free of data races). */
static pthread_mutex_t last_error_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_error[1024];
static __thread char last_error_seen[1024];

void double_set_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pthread_mutex_lock(&last_error_lock);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  pthread_mutex_unlock(&last_error_lock);
  va_end(ap);
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error";
  case ncclSystemError: return "unhandled system error";
  case ncclInternalError: return "internal error";
  case ncclInvalidArgument: return "invalid argument";
  case ncclInvalidUsage: return "invalid usage";
  case ncclRemoteError: return "remote process exited or there was a network error";
  case ncclInProgress: return "NCCL operation in progress";
  default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm; /* NCCL ignores it too */
  pthread_mutex_lock(&last_error_lock);
  memcpy(last_error_seen, last_error, sizeof last_error_seen);
  pthread_mutex_unlock(&last_error_lock);
  return last_error_seen;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  static uint64_t counter;
  pthread_mutex_lock(&registry_lock);
  uint64_t k = ++counter;
  pthread_mutex_unlock(&registry_lock);
  memset(id, 0, sizeof *id);
  uint64_t stamp[3] = {k, (uint64_t)getpid(), (uint64_t)time(NULL)};
  memcpy(id->internal, stamp, sizeof stamp);
  return ncclSuccess;
}

int double_stopped(ncclComm_t c) {
  return atomic_load(&c->aborted) || double_family_aborted(c) ||
         (c->q && c->q->aborted); /* q->aborted: switch "abort" only */
}

/* Wait on q's condition, but wake now and then: an abort of a communicator
 * still being made may not know which clique its joiner waits on. */
void double_wait_a_while(clique *q) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += 20 * 1000000L;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_cond_timedwait(&q->cond, &q->lock, &ts);
}

/* Find or make the clique of id and count c in it (NCCL's bootstrap). */
static ncclResult_t enter(ncclComm_t c, int nranks, const ncclUniqueId *id, int rank) {
  pthread_mutex_lock(&registry_lock);
  clique *q = cliques;
  while (q && memcmp(&q->id, id, sizeof *id)) q = q->next;
  if (!q) {
    q = calloc(1, sizeof *q);
    if (q) {
      q->slots = calloc((size_t)nranks, sizeof *q->slots);
      q->boxes = calloc((size_t)nranks, sizeof *q->boxes);
      q->devices = calloc((size_t)nranks, sizeof *q->devices);
      q->boot_colors = calloc((size_t)nranks, sizeof(int));
      q->boot_keys = calloc((size_t)nranks, sizeof(int));
    }
    if (!q || !q->slots || !q->boxes || !q->devices || !q->boot_colors || !q->boot_keys) {
      if (q) free(q->slots), free(q->boxes), free(q->devices), free(q->boot_colors), free(q->boot_keys);
      free(q);
      pthread_mutex_unlock(&registry_lock);
      return ncclSystemError;
    }
    q->id = *id;
    static uint64_t cliques_made; /* under registry_lock */
    q->serial = ++cliques_made;
    q->n = nranks;
    for (int i = 0; i < nranks; i++) q->devices[i] = -1;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
    q->next = cliques;
    cliques = q;
  }
  if (q->n != nranks) {
    pthread_mutex_unlock(&registry_lock);
    double_set_error("nranks %d differs from the id's %d", nranks, q->n);
    return ncclInvalidUsage;
  }
  q->refs++;
  pthread_mutex_unlock(&registry_lock);
  pthread_mutex_lock(&q->lock);
  c->q = q;
  c->rank = rank;
  pthread_mutex_unlock(&q->lock);
  return ncclSuccess;
}

/* Block until every rank of c's clique joined (or c is aborted). */
static ncclResult_t join(ncclComm_t c, int device) {
  clique *q = c->q;
  pthread_mutex_lock(&q->lock);
  for (int i = 0; i < q->n; i++)
    if (q->devices[i] == device) q->duplicate = 1;
  q->devices[c->rank] = device;
  q->joined++;
  pthread_cond_broadcast(&q->cond);
  while (q->joined < q->n && !atomic_load(&c->aborted)) double_wait_a_while(q);
  int gave_up = q->joined < q->n, dup = q->duplicate;
  if (gave_up) q->joined--; /* an aborted rank never completes the bootstrap */
  pthread_mutex_unlock(&q->lock);
  if (gave_up) return ncclRemoteError;
  if (dup) {
    double_set_error("Duplicate GPU detected: two ranks of one communicator on one device");
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

/* Whether a config asks for a non-blocking communicator; -1 if it was not
 * made with NCCL_CONFIG_INITIALIZER (NCCL refuses it). */
static int nonblocking(const ncclConfig_t *cfg) {
  if (!cfg) return 0;
  if (cfg->magic != 0xcafebeef || cfg->size == 0 || cfg->size > sizeof *cfg) {
    double_set_error("config not initialized with NCCL_CONFIG_INITIALIZER");
    return -1;
  }
  return cfg->blocking == 0; /* NCCL_CONFIG_UNDEF_INT: blocking, NCCL's default */
}

typedef struct init_job {
  ncclComm_t c;
  int device;
  ncclComm_t parent; /* a split: the parent's ranks meet first */
  int color, key;
  ncclComm_t *out;   /* a split running as the parent's job: where the child goes at the end */
} init_job;

static ncclResult_t split_meet(ncclComm_t parent, ncclComm_t c, int color, int key, int *size,
                               int *rank, ncclUniqueId *id);

static void *init_main(void *p) {
  init_job *j = p;
  ncclComm_t c = j->c;
  ncclResult_t r = ncclSuccess;
  if (j->parent) {
    int size = 0, rank = 0;
    ncclUniqueId id;
    r = split_meet(j->parent, c, j->color, j->key, &size, &rank, &id);
    if (r == ncclSuccess && j->color != NCCL_SPLIT_NOCOLOR) r = enter(c, size, &id, rank);
  }
  if (r == ncclSuccess && (!j->parent || j->color != NCCL_SPLIT_NOCOLOR)) r = join(c, j->device);
  free(j);
  atomic_store(&c->async, r);
  return NULL;
}

/* NCCL 2.28's non-blocking split: a job of the parent (ncclCommInitRankFunc
 * run by the group's thread). The child joins its clique, then goes into
 * *out whatever came of it, and the result into the parent's async error. */
static void *split_job_main(void *p) {
  init_job *j = p;
  ncclComm_t parent = j->parent, child = j->c;
  int size = 0, rank = 0;
  ncclUniqueId id;
  ncclResult_t r = split_meet(parent, parent, j->color, j->key, &size, &rank, &id);
  if (child) {
    if (r == ncclSuccess) r = enter(child, size, &id, rank);
    if (r == ncclSuccess) r = join(child, j->device);
    atomic_store(&child->async, r);
    __atomic_store_n(j->out, child, __ATOMIC_RELEASE); /* init.cc: at exit, a failed child too */
  }
  free(j);
  atomic_store(&parent->async, r);
  return NULL;
}

/* Start the background part of a non-blocking init or split. */
static ncclResult_t launch(ncclComm_t c, init_job *j) {
  atomic_store(&c->async, ncclInProgress);
  if (pthread_create(&c->joiner, NULL, init_main, j)) {
    free(j);
    atomic_store(&c->async, ncclSystemError);
    return ncclSystemError;
  }
  c->has_joiner = 1;
  return ncclInProgress;
}

static ncclResult_t init_rank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                              ncclConfig_t *cfg) {
  int nb = nonblocking(cfg);
  if (nb < 0) return ncclInvalidArgument;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    double_set_error("rank %d of %d", rank, nranks);
    return ncclInvalidArgument;
  }
  ncclComm_t c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  if (double_family_join(c, NULL)) {
    free(c);
    return ncclSystemError;
  }
  c->hash = hash_eat(14695981039346656037ull, id.internal, sizeof id.internal);
  ncclResult_t r = enter(c, nranks, &id, rank);
  if (r != ncclSuccess) {
    double_family_leave(c);
    free(c);
    return r;
  }
  if (nb) {
    init_job *j = calloc(1, sizeof *j);
    if (!j) {
      release(c);
      return ncclSystemError;
    }
    *j = (init_job){c, double_current_device(), NULL, 0, 0, NULL};
    c->nonblocking = 1;
    c->split_share = cfg->splitShare == 1;
    *out = c; /* NCCL hands out the handle at once: poll it, or abort it */
    return launch(c, j);
  }
  c->split_share = cfg && cfg->splitShare == 1;
  r = join(c, double_current_device()); /* blocks until every rank came, as NCCL's */
  if (r != ncclSuccess) {
    release(c);
    return r;
  }
  *out = c;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
  atomic_fetch_add(&inits, 1);
  return init_rank(out, nranks, id, rank, NULL);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *cfg) {
  atomic_fetch_add(&inits, 1);
  return init_rank(out, nranks, id, rank, cfg);
}

static void release(ncclComm_t c) {
  clique *q = c->q;
  if (q) {
    pthread_mutex_lock(&registry_lock);
    int last = --q->refs == 0;
    if (last)
      for (clique **p = &cliques; *p; p = &(*p)->next)
        if (*p == q) {
          *p = q->next;
          break;
        }
    pthread_mutex_unlock(&registry_lock);
    if (last) {
      free(q->boxes); /* offers live on their senders' stacks */
      free(q->devices);
      free(q->slots);
      free(q->boot_colors);
      free(q->boot_keys);
      pthread_mutex_destroy(&q->lock);
      pthread_cond_destroy(&q->cond);
      free(q);
    }
  }
  double_family_leave(c);
  free(c->user_ops);
  free(c);
}

/* Wait until this communicator's tasks have all run. */
static void drain(ncclComm_t c) {
  if (!c->q) return;
  pthread_mutex_lock(&c->q->lock);
  while (c->inflight) pthread_cond_wait(&c->q->cond, &c->q->lock);
  pthread_mutex_unlock(&c->q->lock);
}

/* ncclCommEnsureReady: a communicator whose init or split job still runs
 * answers ncclInvalidArgument; one that failed, its error (NCCL keeps it). */
static ncclResult_t ensure_ready(ncclComm_t c, const char *fn) {
  ncclResult_t a = atomic_load(&c->async);
  if (a != ncclInProgress) return a;
  double_set_error("%s: Attempt to use communicator before the previous operation returned "
                   "ncclSuccess", fn);
  return ncclInvalidArgument;
}

ncclResult_t double_comm_ready(ncclComm_t c, const char *fn) {
  ncclResult_t r = ensure_ready(c, fn);
  if (r != ncclSuccess && c->nonblocking) atomic_store(&c->async, r); /* enqueue.cc's fail path */
  return r;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclSuccess;
  if (ensure_ready(c, "ncclCommDestroy") != ncclSuccess) {
    /* NCCL 2.28's ncclCommDestroy opens a group (ncclGroupStartInternal) and
     * returns through NCCLCHECK(ncclCommEnsureReady) without closing it, for
     * a communicator in progress or failed: this thread stays inside a group */
    (void)ncclGroupStart();
    return ncclInvalidArgument;
  }
  if (c->has_joiner) pthread_join(c->joiner, NULL);
  drain(c);
  release(c);
  return ncclSuccess;
}

/* Stop this rank's communicator. As NCCL on NVLink, P2P and SHM, the peers
 * are not told: their pending work waits for this rank until their own
 * watchdog aborts them (switch "abort": they fail with ncclRemoteError). */
ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclSuccess;
  atomic_store(&c->aborted, 1);
  double_family_abort(c);
  if (c->has_joiner) pthread_join(c->joiner, NULL); /* ends an init in progress */
  clique *q = c->q;
  if (q) {
    pthread_mutex_lock(&q->lock);
    if (double_forgives(DOUBLE_FORGIVE_ABORT)) q->aborted = 1;
    pthread_cond_broadcast(&q->cond);
    pthread_mutex_unlock(&q->lock);
  }
  drain(c);
  release(c);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
  if (!c || !err) return ncclInvalidArgument;
  *err = atomic_load(&c->async);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
  if (!c || !count) return ncclInvalidArgument;
  if (atomic_load(&c->async) == ncclInProgress || !c->q) return ncclInProgress;
  *count = c->q->n;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
  if (!c || !rank) return ncclInvalidArgument;
  if (atomic_load(&c->async) == ncclInProgress || !c->q) return ncclInProgress;
  *rank = c->rank;
  return ncclSuccess;
}

/* The collective part of a split: every rank of the parent (NOCOLOR ones
 * too) hands in its color and key; ranks of one color form a new clique
 * ordered by key, then parent rank. stop: the child being made (its abort
 * ends the wait). */
/* The bootstrap's meeting of q's ranks (bootstrapAllGather), apart from the
 * kernels' (double_meet): 0, or -1 if stop was aborted first. */
static int boot_meet(ncclComm_t stop, clique *q) {
  pthread_mutex_lock(&q->lock);
  uint64_t gen = q->boot_generation;
  if (++q->boot_arrived == q->n) {
    q->boot_arrived = 0;
    q->boot_generation++;
    pthread_cond_broadcast(&q->cond);
  } else {
    while (gen == q->boot_generation && !double_stopped(stop)) double_wait_a_while(q);
  }
  int bad = gen == q->boot_generation;
  if (bad) q->boot_arrived--;
  pthread_mutex_unlock(&q->lock);
  return bad ? -1 : 0;
}

static ncclResult_t split_meet(ncclComm_t parent, ncclComm_t stop, int color, int key, int *size,
                               int *rank, ncclUniqueId *id) {
  clique *q = parent->q;
  int n = q->n, me = parent->rank;
  pthread_mutex_lock(&q->lock);
  q->boot_colors[me] = color, q->boot_keys[me] = key;
  pthread_mutex_unlock(&q->lock);
  if (boot_meet(stop, q)) return ncclRemoteError;
  int *colors = malloc((size_t)n * sizeof(int)), *keys = malloc((size_t)n * sizeof(int));
  if (!colors || !keys) {
    free(colors), free(keys);
    return ncclSystemError;
  }
  pthread_mutex_lock(&q->lock);
  memcpy(colors, q->boot_colors, (size_t)n * sizeof(int));
  memcpy(keys, q->boot_keys, (size_t)n * sizeof(int));
  uint64_t split_no = q->boot_generation; /* the same on every rank: names the new cliques */
  pthread_mutex_unlock(&q->lock);
  if (boot_meet(stop, q)) {
    free(colors), free(keys);
    return ncclRemoteError;
  }
  *size = *rank = 0;
  for (int r = 0; r < n; r++) {
    if (colors[r] != color) continue;
    ++*size;
    if (keys[r] < key || (keys[r] == key && r < me)) ++*rank;
  }
  free(colors), free(keys);
  memset(id, 0, sizeof *id);
  uint64_t name[3] = {q->serial, split_no, (uint64_t)(unsigned)color};
  memcpy(id->internal, name, sizeof name);
  id->internal[sizeof name] = 1; /* never equal to an id from ncclGetUniqueId */
  return ncclSuccess;
}

/* Split: collective over every rank of the parent, NCCL_SPLIT_NOCOLOR ones
 * included (they get NULL). Blocks until every rank of the parent came and
 * the new communicator is made, unless the parent is non-blocking: then the
 * split runs as the parent's job, *out stays NULL until it ends, the
 * parent's async error says ncclInProgress meanwhile, and the call returns
 * ncclSuccess (init.cc, ncclCommSplit: NCCLCHECK(ncclGroupEndInternal())
 * lets the group's ncclInProgress through and returns the split's own
 * result, as NCCL 2.28.3 on an H200 showed). */
ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *cfg) {
  if (!c || !out) return ncclInvalidArgument;
  int nb = nonblocking(cfg);
  if (nb < 0) return ncclInvalidArgument;
  if (!cfg) nb = c->nonblocking; /* the child copies the parent's config */
  atomic_fetch_add(&splits, 1);
  /* the parent's config decides (init.cc, ncclCommInitChildComm:
   * comm->shareResources = ... comm->config.splitShare) */
  int share = c->split_share;
  if (share) atomic_fetch_add(&shared_splits, 1);
  if (!nb) atomic_fetch_add(&blocking_children, 1);
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    double_set_error("ncclCommSplit: color %d", color);
    return ncclInvalidArgument;
  }
  *out = NULL; /* NCCL_COMM_NULL until the split is complete */
  ncclResult_t r = ensure_ready(c, "ncclCommSplit");
  if (r != ncclSuccess) return r;
  int early = double_forgives(DOUBLE_FORGIVE_SPLIT_EARLY);
  /* every split counts, NOCOLOR ones too: the child's hash eats the count */
  int split_no = ++c->splits;
  ncclComm_t child = NULL;
  if (color != NCCL_SPLIT_NOCOLOR) {
    child = calloc(1, sizeof *child);
    if (!child) return ncclSystemError;
    if (double_family_join(child, share && !double_forgives(DOUBLE_FORGIVE_SHARE) ? c : NULL)) {
      free(child);
      return ncclSystemError;
    }
    uint64_t h = hash_eat(14695981039346656037ull, &c->hash, sizeof c->hash);
    h = hash_eat(h, &split_no, sizeof split_no);
    child->hash = hash_eat(h, &color, sizeof color);
    child->nonblocking = nb;
    child->split_share = cfg ? cfg->splitShare == 1 : c->split_share;
  }
  init_job *j = calloc(1, sizeof *j);
  if (!j) {
    if (child) release(child);
    return ncclSystemError;
  }
  *j = (init_job){child ? child : c, double_current_device(), c, color, key, out};
  if (early && nb) { /* switch "split_early": the child at once, its own job */
    if (!child) {
      if (c->has_joiner) pthread_join(c->joiner, NULL), c->has_joiner = 0;
      return launch(c, j);
    }
    j->out = NULL;
    *out = child;
    return launch(child, j);
  }
  if (c->nonblocking) { /* the parent's mode decides (group.cc: ncclGroupBlocking) */
    if (c->has_joiner) pthread_join(c->joiner, NULL), c->has_joiner = 0;
    j->c = child;
    atomic_store(&c->async, ncclInProgress);
    if (pthread_create(&c->joiner, NULL, split_job_main, j)) {
      free(j);
      if (child) release(child);
      atomic_store(&c->async, ncclSystemError);
      return ncclSystemError;
    }
    c->has_joiner = 1;
    return ncclSuccess; /* not ncclInProgress: the parent's async error says it */
  }
  free(j);
  int size = 0, rank = 0;
  ncclUniqueId id;
  r = split_meet(c, c, color, key, &size, &rank, &id);
  if (r == ncclSuccess && child) r = enter(child, size, &id, rank);
  if (r == ncclSuccess && child) r = join(child, double_current_device());
  if (r != ncclSuccess) {
    if (child) release(child);
    return r;
  }
  *out = child;
  return ncclSuccess;
}

/* Group calls: every call issued between ncclGroupStart and ncclGroupEnd on
 * one thread is held, as NCCL holds it, and reaches its stream at
 * ncclGroupEnd (an event recorded inside the group runs before it). Per
 * communicator and stream, in issue order: the collectives one task each,
 * then the point-to-point calls as one task whose sends and recvs progress
 * together. Communicators on different streams progress independently. */
typedef struct held_chain {
  struct held_chain *next;
  ncclComm_t comm;
  cudaStream_t stream;
  coll_task *colls, *p2p; /* lists through ->more */
} held_chain;

static __thread int depth;
static __thread held_chain *chains;

static void chain_append(coll_task **list, coll_task *k) {
  while (*list) list = &(*list)->more;
  *list = k;
}

/* Inside a group, hold a call until ncclGroupEnd. */
ncclResult_t double_group_hold(coll_task *k, cudaStream_t stream, int *was_held) {
  *was_held = 0;
  if (depth == 0) return ncclSuccess;
  held_chain **p = &chains;
  while (*p && ((*p)->comm != k->t.comm || (*p)->stream != stream)) p = &(*p)->next;
  if (!*p) {
    *p = calloc(1, sizeof **p);
    if (!*p) return ncclSystemError;
    (*p)->comm = k->t.comm, (*p)->stream = stream;
  }
  chain_append(k->s.kind == K_SEND || k->s.kind == K_RECV ? &(*p)->p2p : &(*p)->colls, k);
  *was_held = 1;
  return ncclSuccess;
}

int double_group_depth(void) { return depth; }

ncclResult_t ncclGroupStart(void) {
  depth++;
  return ncclSuccess;
}

/* The held communicators in ascending commHash (include/group.h,
 * ncclGroupCommJoin), or in issue order (switch "group_order"). */
static void sort_chains(void) {
  if (double_forgives(DOUBLE_FORGIVE_GROUP_ORDER)) return;
  held_chain *sorted = NULL;
  while (chains) {
    held_chain *h = chains, **p = &sorted;
    chains = h->next;
    while (*p && (*p)->comm->hash <= h->comm->hash) p = &(*p)->next;
    h->next = *p;
    *p = h;
  }
  chains = sorted;
}

ncclResult_t ncclGroupEnd(void) {
  if (depth <= 0) return ncclInvalidUsage;
  if (--depth > 0) return ncclSuccess;
  int nonblocking = 0;
  sort_chains();
  for (held_chain *h = chains, *next; h; h = next) {
    next = h->next;
    for (coll_task *k = h->colls, *after; k; k = after) {
      after = k->more;
      k->more = NULL;
      double_submit(k, h->stream);
    }
    if (h->p2p) double_submit(h->p2p, h->stream);
    nonblocking |= h->comm->nonblocking;
    free(h);
  }
  chains = NULL;
  /* enqueued already; a non-blocking communicator's async state says so */
  return nonblocking ? ncclInProgress : ncclSuccess;
}

/* Meet every rank of the clique; 0, or -1 if c was aborted first (or, with
 * switch "abort", any rank of the clique). */
int double_meet(ncclComm_t c, clique *q) {
  pthread_mutex_lock(&q->lock);
  uint64_t gen = q->generation;
  if (++q->arrived == q->n) {
    q->arrived = 0;
    q->generation++;
    pthread_cond_broadcast(&q->cond);
  } else {
    while (gen == q->generation && !double_stopped(c)) double_wait_a_while(q);
  }
  int bad = gen == q->generation;
  if (bad) q->arrived--; /* gave up: it never met them */
  pthread_mutex_unlock(&q->lock);
  return bad ? -1 : 0;
}
