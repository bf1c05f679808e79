/*
 * create.c - the gloo backend's communicators: a world from torchrun's
 * variables (the rendezvous NCCL uses too: rendezvous.c over store.c), groups
 * among their members only, abort, destroy, and how a failure is named.
 *
 * Each communicator of two or more ranks is a gloo context (a full mesh of
 * TCP connections) whose pairs' addresses go through the job's store under
 * the communicator's own key folder: comm<n>/gloo/... for a world,
 * comm<n>/<group>/gloo/... for a group, where <group> is named by its member
 * list and how many groups this rank made with that list before, so only
 * members meet, and meet in the order they made their groups (as
 * MPI_Comm_create_group's tags). The folder also holds the communicator's
 * abort key: mpu_comm_abort posts "<rank> <why>" there, then closes this
 * rank's connections; a peer whose wait then fails reads the key and names
 * the rank (a peer that died without posting is named as lost).
 */
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/base/module.h"
#include "comm/gloo/gloo.h"
#include "comm/store.h"
#include "core/clock.h"
#include "core/env.h"
#include "core/options.h"
#include "mpu/version.h"

/* how long a peer whose connection failed looks for an abort in the store */
#define ABORT_LOOK_S 2.0
/* a call that waited this long asks the store whether a peer aborted
 * meanwhile (one round trip: nothing against such a wait) */
#define LONG_WAIT_S 1.0

static const mpu__comm_ops gloo_ops;

/* ---- the store, as gloo's rendezvous reads it ---- */

typedef struct store_ctx {
  mpu__store *store;
  const char *folder;
} store_ctx;

static int key_of(const store_ctx *s, const char *key, char *out, size_t cap, char *err,
                  size_t errn) {
  int n = snprintf(out, cap, "%s/gloo/%s", s->folder, key);
  if (n > 0 && (size_t)n < cap) return 0;
  snprintf(err, errn, "a store key under %s is too long", s->folder);
  return -1;
}

static int store_set(void *ctx, const char *key, const void *v, size_t n, char *err,
                     size_t errn) {
  const store_ctx *s = ctx;
  char k[512];
  if (key_of(s, key, k, sizeof k, err, errn)) return -1;
  if (!mpu__store_set(s->store, k, v, n, 30.0)) return 0;
  snprintf(err, errn, "%s", mpu_last_error());
  return -1;
}

static int store_get(void *ctx, const char *key, void **v, size_t *n, double timeout_s,
                     char *err, size_t errn) {
  const store_ctx *s = ctx;
  char k[512];
  if (key_of(s, key, k, sizeof k, err, errn)) return -1;
  if (!mpu__store_get(s->store, k, v, n, timeout_s)) return 0;
  snprintf(err, errn, "%s", mpu_last_error());
  return -1;
}

/* Where gloo listens: GLOO_SOCKET_IFNAME's interface (torch's variable), the
 * loopback when the store is on it (one host), else this host's name. */
static void listen_on(const char *master, char *host, size_t cap, int *is_iface) {
  const char *ifname = getenv("GLOO_SOCKET_IFNAME");
  *is_iface = 0;
  if (ifname && *ifname) {
    snprintf(host, cap, "%.*s", (int)strcspn(ifname, ","), ifname); /* the first one */
    *is_iface = 1;
    return;
  }
  if (!strcmp(master, "localhost") || !strncmp(master, "127.", 4) || !strcmp(master, "::1")) {
    snprintf(host, cap, "127.0.0.1");
    return;
  }
  if (gethostname(host, cap)) snprintf(host, cap, "127.0.0.1");
  host[cap - 1] = 0;
}

/* A write to a connection a peer closed raises SIGPIPE, which would end the
 * process (gloo does not ask send(2) not to): ignored, as Python (and so
 * torch) ignores it, unless the program chose a handler of its own. */
static void ignore_sigpipe(void) {
  struct sigaction old;
  if (sigaction(SIGPIPE, NULL, &old) == 0 && old.sa_handler == SIG_DFL &&
      !(old.sa_flags & SA_SIGINFO))
    signal(SIGPIPE, SIG_IGN);
}

/* Connect rank `rank` of `size` through rv's folder. */
static mpu_result_t connect_mesh(const char *fn, mpu__rendezvous *rv, const char *master,
                                 int rank, int size, double timeout_s, mpu__gl **out) {
  char host[256], err[512] = "";
  int is_iface = 0;
  listen_on(master, host, sizeof host, &is_iface);
  ignore_sigpipe();
  store_ctx sc = {mpu__rendezvous_store(rv), mpu__rendezvous_base(rv)};
  mpu__gl_store st = {&sc, store_set, store_get};
  if (!mpu__gl_connect(host, is_iface, rank, size, &st, timeout_s, out, err, sizeof err))
    return MPU_SUCCESS;
  return mpu__error(MPU_ERR_BACKEND, "%s: rank %d of %d could not connect to its peers "
                    "(listening on %s%s): gloo: %s", fn, rank, size,
                    is_iface ? "interface " : "", host, err);
}

/* A communicator over g (owned from here on, as rv is). */
static mpu_result_t wrap(mpu__gl *g, mpu__rendezvous *rv, const char *master, int rank,
                         int size, const int *world_ranks, double timeout_s, int check_calls,
                         mpu_comm **out) {
  gloo_impl *m = calloc(1, sizeof *m);
  mpu_comm *c = m ? mpu__comm_new(&gloo_ops, rank, size, world_ranks, m) : NULL;
  if (!c) {
    free(m);
    mpu__gl_free(g);
    mpu__rendezvous_leave(rv);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_comm_gloo: a communicator");
  }
  m->g = g;
  m->rv = rv;
  snprintf(m->master, sizeof m->master, "%s", master);
  m->timeout_s = timeout_s;
  m->check_calls = check_calls;
  m->sends_tail = &m->sends;
  m->to_self_tail = &m->to_self;
  pthread_mutex_init(&m->lock, NULL);
  /* gloo's full mesh returns on a rank once its own pairs are up, maybe
   * before a peer's are: a member that destroyed the communicator at once
   * would close a connection that peer is still making. One barrier: every
   * member is connected before any has it. */
  mpu_result_t r = g ? mpu__gloo_eager_init(c) : MPU_SUCCESS;
  if (!r && g) r = mpu_comm_barrier(c);
  if (r) {
    char why[640];
    snprintf(why, sizeof why, "%s", mpu_last_error());
    mpu_comm_destroy(c);
    return mpu__error(r, "%s (setting up: its eager buffers, then a first barrier, which every "
                      "member passes connected)", why);
  }
  *out = c;
  return MPU_SUCCESS;
}

/* options (NULL: the defaults) taken and checked: the timeout and call checking in force */
static mpu_result_t take_options(const char *fn, const mpu_gloo_options *options, double *timeout_s,
                                 int *check_calls) {
  mpu_gloo_options o = MPU_GLOO_OPTIONS_INIT;
  if (options)
    MPU_CHECK(mpu__take_options(fn, "options", "MPU_GLOO_OPTIONS_INIT", options, sizeof o,
                                MPU_GLOO_OPTIONS_MIN_SIZE, &o));
  if (o.check_calls < MPU_CHECKS_OFF || o.check_calls > MPU_CHECKS_ON)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: options.check_calls is %d (want MPU_CHECKS_DEFAULT, _ON or _OFF)", fn,
                      o.check_calls);
  *timeout_s = mpu__env_timeout(o.timeout_s);
  *check_calls = mpu__env_check_calls(o.check_calls);
  return MPU_SUCCESS;
}

static mpu_result_t gloo_from_env(const mpu_gloo_options *options, mpu_comm **out) {
  static const char fn[] = "mpu_comm_gloo_from_env";
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  double timeout_s = 0;
  int check_calls = 0;
  MPU_CHECK(take_options(fn, options, &timeout_s, &check_calls));
  mpu__rendezvous_env env;
  MPU_CHECK(mpu__rendezvous_read_env(fn, &env));
  mpu__rendezvous *rv = NULL;
  MPU_CHECK(mpu__rendezvous_join(&env, NULL, 0, timeout_s, &rv));
  mpu__gl *g = NULL;
  if (rv) { /* NULL: a world of one, answered by base */
    mpu_result_t r = connect_mesh(fn, rv, env.addr, env.rank, env.world_size, timeout_s, &g);
    if (r) {
      mpu__rendezvous_leave(rv);
      return r;
    }
  }
  return wrap(g, rv, env.addr, env.rank, env.world_size, NULL, timeout_s, check_calls, out);
}

/* ---- a twin of a host communicator ---- */

/* what rank 0 of the host tells the others: where its store is */
typedef struct twin_where {
  int32_t port, failed;
  char host[256], folder[64];
} twin_where;

static mpu_result_t gloo_create(mpu_comm *host, const mpu_gloo_options *options, mpu_comm **out) {
  static const char fn[] = "mpu_comm_gloo_create";
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  *out = NULL;
  double timeout_s = 0;
  int check_calls = 0, rank = 0, size = 0;
  MPU_CHECK(mpu_comm_rank(host, &rank));
  MPU_CHECK(mpu_comm_size(host, &size));
  MPU_CHECK(take_options(fn, options, &timeout_s, &check_calls));
  if (size == 1) /* answered by base, as a world of one */
    return wrap(NULL, NULL, "127.0.0.1", 0, 1, NULL, timeout_s, check_calls, out);
  twin_where w;
  memset(&w, 0, sizeof w);
  char failure[512] = "";
  if (rank == 0) {
    if (mpu__rendezvous_serve_any(fn, &w.port, w.folder, sizeof w.folder))
      w.failed = 1, snprintf(failure, sizeof failure, "%s", mpu_last_error());
    if (gethostname(w.host, sizeof w.host)) snprintf(w.host, sizeof w.host, "127.0.0.1");
    w.host[sizeof w.host - 1] = 0;
  }
  /* every member learns the store's place over the host; one host for all
   * (its name the same everywhere) keeps gloo on the loopback */
  mpu_result_t r = mpu_comm_broadcast(host, &w, sizeof w, MPU_UINT8, 0);
  char mine[256] = "";
  if (gethostname(mine, sizeof mine)) mine[0] = 0;
  mine[sizeof mine - 1] = 0;
  int32_t elsewhere = strcmp(mine, w.host) != 0, any = 0;
  if (!r) r = mpu_comm_all_reduce(host, &elsewhere, &any, 1, MPU_INT32, MPU_MAX);
  if (r || w.failed) {
    if (rank == 0 && !w.failed) mpu__rendezvous_unserve(); /* the hold taken above */
    if (r) return r;
    return mpu__error(MPU_ERR_BACKEND, "%s: rank 0 of the host communicator could not serve the "
                      "store its peers meet through%s%s", fn, failure[0] ? ": " : "", failure);
  }
  const char *at = any ? w.host : "127.0.0.1";
  mpu__rendezvous *rv = NULL;
  MPU_CHECK(mpu__rendezvous_attach(fn, rank, at, w.port, w.folder, rank == 0, timeout_s, &rv));
  mpu__gl *g = NULL;
  int *world = malloc((size_t)size * sizeof *world);
  r = world ? connect_mesh(fn, rv, at, rank, size, timeout_s, &g)
            : mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d members", fn, size);
  if (r) {
    free(world);
    mpu__rendezvous_leave(rv);
    return r;
  }
  for (int i = 0; i < size && !r; i++) r = mpu_comm_world_rank(host, i, &world[i]);
  if (r) {
    free(world);
    mpu__gl_free(g);
    mpu__rendezvous_leave(rv);
    return r;
  }
  r = wrap(g, rv, at, rank, size, world, timeout_s, check_calls, out);
  free(world);
  return r;
}

/* ---- groups ---- */

static uint64_t members_digest(const int *members, int n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the list */
  for (int i = 0; i <= n; i++) {
    uint32_t v = (uint32_t)(i < n ? members[i] : n);
    for (int b = 0; b < 4; b++) h = (h ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
  }
  return h;
}

static mpu_result_t gloo_create_group(mpu_comm *c, const int *members, int n, mpu_comm **out) {
  static const char fn[] = "mpu_comm_create_group";
  gloo_impl *m = gloo_of(c);
  MPU_CHECK(mpu__gloo_usable(c, fn));
  int pos = 0, *world = malloc((size_t)n * sizeof *world);
  if (!world) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d members", fn, n);
  for (int i = 0; i < n; i++) {
    world[i] = mpu__comm_world_rank(c, members[i]);
    if (members[i] == c->rank) pos = i;
  }
  mpu_result_t r = MPU_SUCCESS;
  mpu__gl *g = NULL;
  mpu__rendezvous *rv = NULL;
  if (n > 1) {
    uint64_t digest = members_digest(members, n);
    gloo_made *k = m->made;
    while (k && k->digest != digest) k = k->next;
    if (!k && (k = calloc(1, sizeof *k))) {
      k->digest = digest;
      k->next = m->made;
      m->made = k;
    }
    if (!k) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    char name[64];
    if (!r) snprintf(name, sizeof name, "g%016llx.%d", (unsigned long long)digest, k->times++);
    if (!r) r = mpu__rendezvous_child(m->rv, name, m->timeout_s, &rv);
    if (!r) r = connect_mesh(fn, rv, m->master, pos, n, m->timeout_s, &g);
    if (r) {
      mpu__rendezvous_leave(rv);
      free(world);
      return r;
    }
  }
  r = wrap(g, rv, m->master, pos, n, world, m->timeout_s, m->check_calls, out);
  free(world);
  return r;
}

/* ---- failures ---- */

static void rank_list(const mpu_comm *c, const unsigned char *pending, char *out, size_t cap) {
  size_t used = 0;
  int listed = 0, total = 0;
  out[0] = 0;
  for (int p = 0; pending && p < c->size; p++) total += pending[p] != 0;
  for (int p = 0; pending && p < c->size && used < cap; p++) {
    if (!pending[p]) continue;
    if (listed == 8) {
      snprintf(out + used, cap - used, " and %d more", total - listed);
      return;
    }
    used += (size_t)snprintf(out + used, cap - used, "%s%s%d", listed ? ", " : "",
                             listed ? "" : total == 1 ? "rank " : "ranks ", p);
    if (c->world_ranks && c->world_ranks[p] != p && used < cap)
      used += (size_t)snprintf(out + used, cap - used, " (world %d)", c->world_ranks[p]);
    listed++;
  }
}

mpu_result_t mpu__gloo_usable(mpu_comm *c, const char *fn) {
  gloo_impl *m = gloo_of(c);
  pthread_mutex_lock(&m->lock);
  mpu_result_t r = m->broken;
  char why[sizeof m->why];
  memcpy(why, m->why, sizeof why);
  pthread_mutex_unlock(&m->lock);
  if (!r) return MPU_SUCCESS;
  return mpu__error(r, "%s: the communicator is broken: %s", fn, why);
}

mpu_result_t mpu__gloo_watch(mpu_comm *c, const char *fn, mpu__gl_buf **bufs, int n) {
  gloo_impl *m = gloo_of(c);
  pthread_mutex_lock(&m->lock);
  int broken = m->broken != MPU_SUCCESS;
  if (!broken) m->waiting = bufs, m->nwaiting = n;
  pthread_mutex_unlock(&m->lock);
  return broken ? mpu__gloo_usable(c, fn) : MPU_SUCCESS;
}

void mpu__gloo_unwatch(mpu_comm *c) {
  gloo_impl *m = gloo_of(c);
  pthread_mutex_lock(&m->lock);
  m->waiting = NULL, m->nwaiting = 0;
  pthread_mutex_unlock(&m->lock);
}

/* the message of a peer's post read from the store */
static void peer_posted(const char *fn, int who, const char *reason, const char *what, char *why,
                        size_t cap) {
  snprintf(why, cap, "%s: rank %d %s, while this rank waited for %s", fn, who, reason, what);
}

mpu_result_t mpu__gloo_break(mpu_comm *c, mpu_result_t code, const char *why) {
  gloo_impl *m = gloo_of(c);
  pthread_mutex_lock(&m->lock);
  if (!m->broken) {
    m->broken = code;
    snprintf(m->why, sizeof m->why, "%s", why);
  }
  pthread_mutex_unlock(&m->lock);
  return mpu__error(code, "%s", why);
}

mpu_result_t mpu__gloo_fail(mpu_comm *c, const char *fn, int rc, const char *what,
                            const unsigned char *pending, const char *gloo) {
  gloo_impl *m = gloo_of(c);
  pthread_mutex_lock(&m->lock);
  int already = m->broken != MPU_SUCCESS; /* this rank aborted meanwhile */
  pthread_mutex_unlock(&m->lock);
  if (already) return mpu__gloo_usable(c, fn);
  char names[200], why[sizeof m->why];
  rank_list(c, pending, names, sizeof names);
  mpu_result_t code = MPU_ERR_ABORTED;
  int who = -1, first = -1;
  for (int p = 0; pending && p < c->size && first < 0; p++)
    if (pending[p]) first = p;
  char reason[256] = "", said[256];
  if (rc == 1) {
    code = MPU_ERR_TIMEOUT;
    snprintf(why, sizeof why, "%s timed out after %.3g s waiting for %s from %s (communicator "
             "of %d ranks)", fn, m->timeout_s, what, names[0] ? names : "its peers", c->size);
    /* gloo closed this rank's connections: a peer that waits on them finds who was late */
    snprintf(said, sizeof said, "did not come within %.3g s (rank %d gave up waiting)",
             m->timeout_s, c->rank);
    if (first >= 0) mpu__rendezvous_post_abort(m->rv, first, said);
  } else {
    /* an aborting rank, or the first to see a rank gone, posts before its
     * connections close: the key is there, or soon */
    double until = mpu__now() + ABORT_LOOK_S;
    int seen = 0;
    while (!(seen = mpu__rendezvous_poll_abort(m->rv, &who, reason, sizeof reason)) &&
           mpu__now() < until)
      usleep(20000);
    if (seen) {
      peer_posted(fn, who, reason, what, why, sizeof why);
    } else {
      snprintf(why, sizeof why, "%s: lost the connection to %s while waiting for %s (the "
               "process exited or its connections closed): gloo: %s", fn,
               names[0] ? names : "a peer", what, gloo ? gloo : "");
      snprintf(said, sizeof said, "is gone: its connections closed (rank %d saw it)", c->rank);
      if (first >= 0) mpu__rendezvous_post_abort(m->rv, first, said);
    }
  }
  /* the connections stay open (a peer may still be taking what this rank
   * sent): closing them would make the peers name this rank, not the lost one */
  return mpu__gloo_break(c, code, why);
}

mpu_result_t mpu__gloo_after_wait(mpu_comm *c, const char *fn, const char *what, double waited_s) {
  gloo_impl *m = gloo_of(c);
  int who = -1;
  char reason[256] = "", why[sizeof m->why];
  if (waited_s < LONG_WAIT_S || !mpu__rendezvous_check_abort(m->rv, &who, reason, sizeof reason))
    return MPU_SUCCESS;
  peer_posted(fn, who, reason, what, why, sizeof why);
  return mpu__gloo_break(c, MPU_ERR_ABORTED, why);
}

/* ---- abort, destroy, capabilities ---- */

static mpu_result_t gloo_abort(mpu_comm *c) {
  gloo_impl *m = gloo_of(c);
  pthread_mutex_lock(&m->lock);
  int first = m->broken == MPU_SUCCESS;
  if (first) {
    m->broken = MPU_ERR_ABORTED;
    snprintf(m->why, sizeof m->why, "rank %d aborted it (mpu_comm_abort)", c->rank);
  }
  pthread_mutex_unlock(&m->lock);
  /* posted before the connections close: a peer that sees them close finds it */
  if (first && m->rv) mpu__rendezvous_post_abort(m->rv, c->rank, "aborted (mpu_comm_abort)");
  /* closed before the owner's waits are interrupted: once a wait returns,
   * gloo's loop thread is done with the call's buffers, which it frees */
  mpu__gl_close(m->g);
  pthread_mutex_lock(&m->lock);
  for (int i = 0; i < m->nwaiting; i++)
    if (m->waiting[i]) mpu__gl_buf_interrupt(m->waiting[i]);
  pthread_mutex_unlock(&m->lock);
  return MPU_SUCCESS;
}

static void gloo_destroy(mpu_comm *c) {
  gloo_impl *m = gloo_of(c);
  if (!m) return;
  /* eager sends not yet received: their peers may still take them. A broken
   * communicator waits for none: a send still in flight then closes the
   * connections first, which ends gloo's use of its buffer. With none in
   * flight the context is freed gently, as a healthy one's: closing resets
   * the connections (SO_LINGER 0) and loses what this rank's last sends left
   * in the kernel, and a rank that broke on a mismatch of its own finding
   * has sent its part of that call to peers that made it right */
  mpu__gloo_reap(c, m->broken ? 0 : m->timeout_s);
  if (m->broken && m->sends) {
    mpu__gl_close(m->g);
    mpu__gloo_reap(c, -1);
  }
  while (m->to_self) { /* never received */
    gloo_pending *p = m->to_self;
    m->to_self = p->next;
    free(p->bytes);
    free(p);
  }
  mpu__gloo_eager_free(c);
  mpu__gl_free(m->g);
  mpu__rendezvous_leave(m->rv);
  while (m->made) {
    gloo_made *k = m->made;
    m->made = k->next;
    free(k);
  }
  pthread_mutex_destroy(&m->lock);
  free(m->staging);
  free(m);
  c->impl = NULL;
}

static void gloo_caps(const mpu_comm *c, mpu_comm_caps *caps) {
  caps->fault_detection = 1;
  caps->call_checking = gloo_of(c)->check_calls;
}

/* send and recv as the comm layer describes them (mpu__call) */
static mpu_result_t gloo_send(mpu_comm *c, const mpu__call *k) {
  return mpu__gloo_send(c, k->send, (size_t)k->sig.count, (mpu_dtype)k->sig.dtype, k->peer);
}

static mpu_result_t gloo_recv(mpu_comm *c, const mpu__call *k) {
  return mpu__gloo_recv(c, k->recv, (size_t)k->sig.count, (mpu_dtype)k->sig.dtype, k->peer);
}

static const mpu__comm_ops gloo_ops = {
    .name = "gloo",
    .start = mpu__gloo_start,
    .send = gloo_send,
    .recv = gloo_recv,
    .create_group = gloo_create_group,
    .abort = gloo_abort,
    .caps = gloo_caps,
    .destroy = gloo_destroy,
};

/* libmpu reaches the backend through this, registered when the library loads */
static const mpu__module gloo_module = {
    .name = "gloo",
    .version = MPU_VERSION_STRING,
    .gloo_from_env = gloo_from_env,
    .gloo_create = gloo_create,
};

__attribute__((constructor)) static void gloo_module_load(void) {
  mpu__module_register(&gloo_module);
}
