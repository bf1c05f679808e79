/*
 * comm.c - NCCL's communicators in the test double (double.h): unique ids,
 * init (blocking until every rank joined), split, abort, destroy, errors,
 * groups.
 */
#include "nccl_double/double.h"

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static clique *cliques;
static void release(ncclComm_t c);
__thread char double_last_error[256];


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
  (void)comm;
  return double_last_error;
}

ncclResult_t ncclGetVersion(int *version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
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

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    snprintf(double_last_error, sizeof double_last_error, "rank %d of %d", rank, nranks);
    return ncclInvalidArgument;
  }
  ncclComm_t c = calloc(1, sizeof *c);
  if (!c) return ncclSystemError;
  pthread_mutex_lock(&registry_lock);
  clique *q = cliques;
  while (q && memcmp(&q->id, &id, sizeof id)) q = q->next;
  if (!q) {
    q = calloc(1, sizeof *q);
    if (q) {
      q->slots = calloc((size_t)nranks, sizeof *q->slots);
      q->boxes = calloc((size_t)nranks, sizeof *q->boxes);
      q->devices = calloc((size_t)nranks, sizeof *q->devices);
    }
    if (!q || !q->slots || !q->boxes || !q->devices) {
      if (q) free(q->slots), free(q->boxes), free(q->devices);
      free(q);
      free(c);
      pthread_mutex_unlock(&registry_lock);
      return ncclSystemError;
    }
    q->id = id;
    q->n = nranks;
    for (int i = 0; i < nranks; i++) q->devices[i] = -1;
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->cond, NULL);
    q->next = cliques;
    cliques = q;
  }
  if (q->n != nranks) {
    pthread_mutex_unlock(&registry_lock);
    free(c);
    snprintf(double_last_error, sizeof double_last_error, "nranks %d differs from the id's %d", nranks, q->n);
    return ncclInvalidUsage;
  }
  q->refs++;
  pthread_mutex_unlock(&registry_lock);
  c->q = q;
  c->rank = rank;
  pthread_mutex_lock(&q->lock); /* block until every rank has joined, as NCCL */
  for (int i = 0; i < q->n; i++)
    if (q->devices[i] == double_current_device()) q->duplicate = 1;
  q->devices[rank] = double_current_device();
  q->joined++;
  pthread_cond_broadcast(&q->cond);
  while (q->joined < q->n) pthread_cond_wait(&q->cond, &q->lock);
  int dup = q->duplicate;
  pthread_mutex_unlock(&q->lock);
  if (dup) {
    snprintf(double_last_error, sizeof double_last_error,
             "Duplicate GPU detected: two ranks of one communicator on one device");
    release(c);
    return ncclInvalidUsage;
  }
  *out = c;
  return ncclSuccess;
}

static void release(ncclComm_t c) {
  clique *q = c->q;
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
    pthread_mutex_destroy(&q->lock);
    pthread_cond_destroy(&q->cond);
    free(q);
  }
  free(c);
}

/* Wait until this communicator's tasks have all run. */
static void drain(ncclComm_t c) {
  pthread_mutex_lock(&c->q->lock);
  while (c->inflight) pthread_cond_wait(&c->q->cond, &c->q->lock);
  pthread_mutex_unlock(&c->q->lock);
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  drain(c);
  release(c);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclSuccess;
  clique *q = c->q;
  pthread_mutex_lock(&q->lock);
  c->aborted = 1;
  q->aborted = 1; /* peers blocked on this rank give up with ncclRemoteError */
  pthread_cond_broadcast(&q->cond);
  pthread_mutex_unlock(&q->lock);
  drain(c);
  release(c);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *err) {
  if (!c || !err) return ncclInvalidArgument;
  pthread_mutex_lock(&c->q->lock);
  *err = c->async;
  pthread_mutex_unlock(&c->q->lock);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
  *count = c->q->n;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
  *rank = c->rank;
  return ncclSuccess;
}

/* Split: every rank of the parent calls it (collective, in order); ranks of
 * one color form a new clique ordered by key, then parent rank. */
ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *cfg) {
  (void)cfg;
  if (!c || !out) return ncclInvalidArgument;
  clique *q = c->q;
  int n = q->n, me = c->rank;
  /* the host thread meets its peers through the slots, as the workers do */
  q->slots[me] = (slot){-1, NULL, NULL, (size_t)(unsigned)color, ncclInt32, ncclSum, key};
  if (double_meet(q)) return ncclRemoteError;
  int *colors = malloc((size_t)n * sizeof(int)), *keys = malloc((size_t)n * sizeof(int));
  if (!colors || !keys) {
    free(colors), free(keys);
    return ncclSystemError;
  }
  for (int r = 0; r < n; r++) colors[r] = (int)(unsigned)q->slots[r].count, keys[r] = q->slots[r].root;
  uint64_t split_no = q->generation; /* the same on every rank: names the new cliques */
  if (double_meet(q)) {
    free(colors), free(keys);
    return ncclRemoteError;
  }
  *out = NULL;
  if (color == NCCL_SPLIT_NOCOLOR) {
    free(colors), free(keys);
    return ncclSuccess;
  }
  int size = 0, rank = 0;
  for (int r = 0; r < n; r++) {
    if (colors[r] != color) continue;
    size++;
    if (keys[r] < key || (keys[r] == key && r < me)) rank++;
  }
  free(colors), free(keys);
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  uint64_t name[3] = {(uint64_t)(uintptr_t)q, split_no, (uint64_t)(unsigned)color};
  memcpy(id.internal, name, sizeof name);
  id.internal[sizeof name] = 1; /* never equal to an id from ncclGetUniqueId */
  return ncclCommInitRank(out, size, id, rank);
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

ncclResult_t ncclGroupStart(void) {
  depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (depth <= 0) return ncclInvalidUsage;
  if (--depth > 0) return ncclSuccess;
  for (held_chain *h = chains, *next; h; h = next) {
    next = h->next;
    for (coll_task *k = h->colls, *after; k; k = after) {
      after = k->more;
      k->more = NULL;
      double_submit(k, h->stream);
    }
    if (h->p2p) double_submit(h->p2p, h->stream);
    free(h);
  }
  chains = NULL;
  return ncclSuccess;
}

/* Meet every rank of the clique; 0, or -1 if the clique was aborted. */
int double_meet(clique *q) {
  pthread_mutex_lock(&q->lock);
  uint64_t gen = q->generation;
  if (++q->arrived == q->n) {
    q->arrived = 0;
    q->generation++;
    pthread_cond_broadcast(&q->cond);
  } else {
    while (gen == q->generation && !q->aborted) pthread_cond_wait(&q->cond, &q->lock);
  }
  int bad = q->aborted && gen == q->generation;
  pthread_mutex_unlock(&q->lock);
  return bad ? -1 : 0;
}
