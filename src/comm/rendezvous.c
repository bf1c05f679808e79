/*
 * rendezvous.c - the bootstrap behind mpu_comm_nccl_from_env and
 * mpu_comm_gloo_from_env, on a TCPStore.
 *
 * Keys, under the prefix "mpu" (or "mpu/attempt_<TORCHELASTIC_RESTART_COUNT>"
 * in the agent's store, so a restarted group never reads its predecessor's):
 *   job               the job key, set by rank 0; a rank with another is refused
 *   comm<n>/rank<r>/<job>
 *                     claimed once (ADD) by rank r of the n-th from_env call;
 *                     the key names the job (the value of "job"), so a claim
 *                     needs the job's key: a client without it (one that adds
 *                     comm<n>/rank<r> itself, or a stray of another job) claims
 *                     a key the job never reads, and cannot lock rank r out
 *   comm<n>/id        the blob rank 0 publishes
 *   comm<n>/abort     posted by an abort, seen by every peer's watch loop
 *   comm<n>/<split>/abort   the same for a communicator split from it (and so
 *                     on down), <split> naming the split and the color
 * Every rank calls the from_env calls in the same order, so n agrees.
 */
#include "comm/rendezvous.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/store.h"
#include "core/clock.h"
#include "core/error.h"

/* how long rank 0's store waits for a silent or stalled connection */
#define CONN_DEADLINE_S 10.0
/* how often a watch loop asks the store about an abort */
#define ABORT_POLL_S 0.1

static mpu_result_t env_int(const char *fn, const char *name, const char *fallback, long lo,
                            long hi, int *out) {
  const char *v = getenv(name);
  if (!v || !*v) v = fallback;
  if (!v)
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "%s: %s is not set (torchrun sets RANK, WORLD_SIZE, "
                      "LOCAL_RANK, MASTER_ADDR and MASTER_PORT)",
                      fn, name);
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || *end || end == v || x < lo || x > hi)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s=%s (want a whole number %ld..%ld)", fn,
                      name, v, lo, hi);
  *out = (int)x;
  return MPU_SUCCESS;
}

static mpu_result_t env_str(const char *fn, const char *name, int required, char *out,
                            size_t cap) {
  const char *v = getenv(name);
  if (!v || !*v) {
    if (required)
      return mpu__error(MPU_ERR_INVALID_USAGE,
                        "%s: %s is not set (the host of rank 0's store; torchrun sets it)", fn,
                        name);
    v = "";
  }
  if (strlen(v) >= cap)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %s is longer than %zu bytes", fn, name,
                      cap - 1);
  snprintf(out, cap, "%s", v);
  return MPU_SUCCESS;
}

mpu_result_t mpu__rendezvous_read_env(const char *fn, mpu__rendezvous_env *env) {
  memset(env, 0, sizeof *env);
  env->who = fn;
  MPU_CHECK(env_int(fn, "WORLD_SIZE", NULL, 1, 1 << 24, &env->world_size));
  MPU_CHECK(env_int(fn, "RANK", NULL, 0, env->world_size - 1, &env->rank));
  MPU_CHECK(env_int(fn, "LOCAL_RANK", "0", 0, 1 << 16, &env->local_rank));
  MPU_CHECK(env_int(fn, "MASTER_PORT", NULL, 1, 65535, &env->port));
  MPU_CHECK(env_str(fn, "MASTER_ADDR", 1, env->addr, sizeof env->addr));
  MPU_CHECK(env_int(fn, "TORCHELASTIC_RESTART_COUNT", "0", 0, 1 << 30, &env->attempt));
  const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
  /* torch's own test: str(True) (torch/distributed/rendezvous.py) */
  env->agent_store = agent && !strcmp(agent, "True");
  if (agent && *agent && !env->agent_store && strcmp(agent, "False"))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: TORCHELASTIC_USE_AGENT_STORE=%s (want True or False)", fn, agent);
  MPU_CHECK(env_str(fn, "MPU_JOB_KEY", 0, env->job, sizeof env->job));
  if (!env->job[0]) MPU_CHECK(env_str(fn, "TORCHELASTIC_RUN_ID", 0, env->job, sizeof env->job));
  return MPU_SUCCESS;
}

/* ---- rank 0's store: one per port in the process, shared by its communicators ---- */

static pthread_mutex_t served_mu = PTHREAD_MUTEX_INITIALIZER;
static mpu__store_server *served;
static int served_port, served_users;

static mpu_result_t serve_acquire(const char *fn, int port) {
  pthread_mutex_lock(&served_mu);
  mpu_result_t r = MPU_SUCCESS;
  if (served && served_port != port)
    r = mpu__error(MPU_ERR_INVALID_USAGE,
                   "%s: this process already serves the store on port %d (MASTER_PORT=%d now)",
                   fn, served_port, port);
  else if (!served)
    r = mpu__store_serve(fn, port, CONN_DEADLINE_S, &served);
  if (!r) served_port = port, served_users++;
  pthread_mutex_unlock(&served_mu);
  return r;
}

static void serve_release(void) {
  pthread_mutex_lock(&served_mu);
  if (served && --served_users == 0) {
    mpu__store_server_stop(served);
    served = NULL;
  }
  pthread_mutex_unlock(&served_mu);
}

/* ---- joining ---- */

struct mpu__rendezvous {
  mpu__store *store;
  int serving, rank;
  mpu__rendezvous_env env; /* where the store is: a split's channel connects there too */
  char prefix[64];
  char base[192];          /* comm<n>[/<split>...]: its keys' folder */
  char abort_key[208];
  _Atomic double next_poll;
  atomic_int seen;
};

/* How many times this rank has called from_env: the n of comm<n>. Counted
 * per rank (a process holds one rank under torchrun; a test may hold more). */
typedef struct call_count {
  struct call_count *next;
  int rank, calls;
} call_count;
static call_count *call_counts;

static int next_call(int rank) {
  pthread_mutex_lock(&served_mu);
  call_count *c = call_counts;
  while (c && c->rank != rank) c = c->next;
  if (!c && (c = calloc(1, sizeof *c))) {
    c->rank = rank;
    c->next = call_counts;
    call_counts = c;
  }
  int n = c ? c->calls++ : -1;
  pthread_mutex_unlock(&served_mu);
  return n;
}

/* What the job is called in the store: its key and its world size. */
static int job_text(const mpu__rendezvous_env *env, char *job, size_t cap) {
  return snprintf(job, cap, "%s;world=%d", env->job, env->world_size);
}

static mpu_result_t check_job(mpu__rendezvous *rv, const mpu__rendezvous_env *env,
                              double timeout_s) {
  const char *fn = env->who;
  char job[320];
  int n = job_text(env, job, sizeof job);
  void *cur = NULL;
  size_t curn = 0;
  mpu_result_t r = env->rank == 0 ? mpu__store_compare_set(rv->store, "job", "", 0, job,
                                                           (size_t)n, &cur, &curn, timeout_s)
                                  : mpu__store_get(rv->store, "job", &cur, &curn, timeout_s);
  if (r == MPU_ERR_TIMEOUT)
    return mpu__error(MPU_ERR_TIMEOUT,
                      "%s: rank %d: rank 0 never published the job key in the store at %s",
                      fn, env->rank, mpu__store_where(rv->store));
  if (r) return r;
  if (curn != (size_t)n || memcmp(cur, job, curn))
    r = mpu__error(MPU_ERR_INVALID_USAGE,
                   "%s: rank %d refused: the store at %s serves job '%.*s', this process is "
                   "'%s' (MPU_JOB_KEY or TORCHELASTIC_RUN_ID, and WORLD_SIZE, must match)",
                   fn, env->rank, mpu__store_where(rv->store), (int)(curn > 200 ? 200 : curn),
                   (const char *)cur, job);
  free(cur);
  return r;
}

/* how many ranks have joined so far (for a message) */
static int64_t joined_now(mpu__rendezvous *rv, int call) {
  char key[64];
  int64_t n = -1;
  snprintf(key, sizeof key, "comm%d/joined", call);
  if (mpu__store_add(rv->store, key, 0, &n, 1.0)) n = -1;
  return n;
}

mpu_result_t mpu__rendezvous_join(const mpu__rendezvous_env *env, void *blob, size_t len,
                                  double timeout_s, mpu__rendezvous **out) {
  *out = NULL;
  if (env->world_size == 1) return MPU_SUCCESS;
  const char *fn = env->who;
  double deadline = mpu__now() + timeout_s;
  int call = next_call(env->rank);
  mpu__rendezvous *rv = call < 0 ? NULL : calloc(1, sizeof *rv);
  if (!rv) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  rv->rank = env->rank;
  rv->env = *env;
  snprintf(rv->base, sizeof rv->base, "comm%d", call);
  snprintf(rv->abort_key, sizeof rv->abort_key, "%s/abort", rv->base);
  mpu_result_t r = MPU_SUCCESS;
  if (env->rank == 0 && !env->agent_store) {
    r = serve_acquire(env->who, env->port);
    rv->serving = !r;
  }
  if (env->agent_store) snprintf(rv->prefix, sizeof rv->prefix, "mpu/attempt_%d", env->attempt);
  else snprintf(rv->prefix, sizeof rv->prefix, "mpu");
  if (!r) r = mpu__store_connect(fn, env->addr, env->port, rv->prefix, timeout_s, &rv->store);
#define LEFT (deadline - mpu__now() > 0 ? deadline - mpu__now() : 0)
  if (!r) r = check_job(rv, env, LEFT);
  char key[64], job[320], claim[400];
  int64_t claims = 0;
  job_text(env, job, sizeof job);
  snprintf(claim, sizeof claim, "comm%d/rank%d/%s", call, env->rank, job);
  if (!r) r = mpu__store_add(rv->store, claim, 1, &claims, LEFT);
  if (!r && claims != 1)
    r = mpu__error(MPU_ERR_INVALID_USAGE,
                   "%s: rank %d refused: another process already joined as rank %d (RANK=%d "
                   "twice in this job?)",
                   fn, env->rank, env->rank, env->rank);
  snprintf(key, sizeof key, "comm%d/id", call);
  if (!r && env->rank == 0) r = mpu__store_set(rv->store, key, blob, len, LEFT);
  if (!r && env->rank != 0) {
    void *got = NULL;
    size_t n = 0;
    r = mpu__store_get(rv->store, key, &got, &n, LEFT);
    if (r == MPU_ERR_TIMEOUT)
      r = mpu__error(MPU_ERR_TIMEOUT, "%s: rank %d got nothing from rank 0 through %s in time",
                     fn, env->rank, mpu__store_where(rv->store));
    if (!r && n != len)
      r = mpu__error(MPU_ERR_BACKEND, "%s: rank %d: the id in the store has %zu bytes, not %zu",
                     fn, env->rank, n, len);
    if (!r && len) memcpy(blob, got, len); /* an empty id: blob and got may be NULL */
    free(got);
  }
  /* the last to arrive says so; rank 0's own store must outlive the others' reads */
  snprintf(key, sizeof key, "comm%d/joined", call);
  int64_t joined = 0;
  if (!r) r = mpu__store_add(rv->store, key, 1, &joined, LEFT);
  snprintf(key, sizeof key, "comm%d/all", call);
  if (!r && joined == env->world_size) r = mpu__store_set(rv->store, key, "1", 1, LEFT);
  if (!r && env->rank == 0 && rv->serving) {
    r = mpu__store_wait(rv->store, key, LEFT);
    if (r == MPU_ERR_TIMEOUT)
      r = mpu__error(MPU_ERR_TIMEOUT, "%s: rank 0: only %lld of %d ranks came to the store at %s",
                     fn, (long long)joined_now(rv, call), env->world_size,
                     mpu__store_where(rv->store));
  }
#undef LEFT
  if (r) {
    mpu__rendezvous_leave(rv);
    return r;
  }
  *out = rv;
  return MPU_SUCCESS;
}

/* ---- a twin's channel: the host communicator did the rendezvous ---- */

mpu_result_t mpu__rendezvous_serve_any(const char *fn, int *port, char *folder, size_t cap) {
  static int twins;
  pthread_mutex_lock(&served_mu);
  mpu_result_t r = served ? MPU_SUCCESS : mpu__store_serve(fn, 0, CONN_DEADLINE_S, &served);
  if (!r && served_users == 0) served_port = mpu__store_server_port(served);
  if (!r) {
    served_users++;
    *port = served_port;
    snprintf(folder, cap, "twin%d", twins++);
  }
  pthread_mutex_unlock(&served_mu);
  return r;
}

void mpu__rendezvous_unserve(void) { serve_release(); }

mpu_result_t mpu__rendezvous_attach(const char *fn, int rank, const char *addr, int port,
                                    const char *folder, int serving, double timeout_s,
                                    mpu__rendezvous **out) {
  *out = NULL;
  mpu__rendezvous *rv = calloc(1, sizeof *rv);
  if (!rv) {
    if (serving) serve_release();
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: a store channel", fn);
  }
  rv->rank = rank, rv->serving = serving;
  rv->env.who = fn, rv->env.rank = rank, rv->env.port = port;
  snprintf(rv->env.addr, sizeof rv->env.addr, "%s", addr);
  snprintf(rv->prefix, sizeof rv->prefix, "mpu");
  snprintf(rv->base, sizeof rv->base, "%s", folder);
  snprintf(rv->abort_key, sizeof rv->abort_key, "%s/abort", rv->base);
  mpu_result_t r = mpu__store_connect(fn, addr, port, rv->prefix, timeout_s, &rv->store);
  if (r) {
    mpu__rendezvous_leave(rv);
    return r;
  }
  *out = rv;
  return MPU_SUCCESS;
}

void mpu__rendezvous_leave(mpu__rendezvous *rv) {
  if (!rv) return;
  mpu__store_close(rv->store);
  if (rv->serving) serve_release();
  free(rv);
}

void mpu__rendezvous_free(void *ctx) { mpu__rendezvous_leave(ctx); }

mpu__store *mpu__rendezvous_store(const mpu__rendezvous *rv) { return rv->store; }
const char *mpu__rendezvous_base(const mpu__rendezvous *rv) { return rv->base; }

mpu_result_t mpu__rendezvous_child(const mpu__rendezvous *parent, const char *name,
                                   double timeout_s, mpu__rendezvous **out) {
  *out = NULL;
  mpu__rendezvous *rv = calloc(1, sizeof *rv);
  if (!rv) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_comm_split: an abort channel");
  rv->rank = parent->rank;
  rv->env = parent->env;
  memcpy(rv->prefix, parent->prefix, sizeof rv->prefix);
  int n = snprintf(rv->base, sizeof rv->base, "%s/%s", parent->base, name);
  mpu_result_t r = n < 0 || (size_t)n >= sizeof rv->base
                       ? mpu__error(MPU_ERR_UNSUPPORTED, "mpu_comm_split: splits nested too deep "
                                                         "for the store's abort channel")
                       : MPU_SUCCESS;
  snprintf(rv->abort_key, sizeof rv->abort_key, "%s/abort", rv->base);
  /* rank 0's store serves while any of its channels lives */
  if (!r && parent->serving) {
    r = serve_acquire("mpu_comm_split", parent->env.port);
    rv->serving = !r;
  }
  if (!r)
    r = mpu__store_connect("mpu_comm_split", rv->env.addr, rv->env.port, rv->prefix, timeout_s,
                           &rv->store);
  if (r) {
    mpu__rendezvous_leave(rv);
    return r;
  }
  *out = rv;
  return MPU_SUCCESS;
}

/* the posted value: "<rank> <why>" */
void mpu__rendezvous_post_abort(void *ctx, int rank, const char *why) {
  mpu__rendezvous *rv = ctx;
  if (!rv || !rv->store) return;
  char msg[256];
  int n = snprintf(msg, sizeof msg, "%d %s", rank, why ? why : "aborted");
  if (n < 0) return;
  if ((size_t)n >= sizeof msg) n = sizeof msg - 1;
  /* best effort: the abort itself has happened whatever the store says */
  mpu_result_t r = mpu__store_set(rv->store, rv->abort_key, msg, (size_t)n, 1.0);
  (void)r;
}

/* The posted abort's rank and reason: 1, or 0 when it cannot be read (the
 * store went away between the check and the read: rank 0's process may
 * leave as soon as it has reported) or names no rank. */
static int read_abort(mpu__rendezvous *rv, int *who, char *why, size_t n) {
  void *v = NULL;
  size_t vn = 0;
  int rank = -1;
  char text[256] = "";
  if (!mpu__store_get(rv->store, rv->abort_key, &v, &vn, 1.0)) {
    snprintf(text, sizeof text, "%.*s", (int)(vn > 255 ? 255 : vn), (const char *)v);
    char *end;
    long k = strtol(text, &end, 10);
    if (end != text && *end == ' ' && k >= 0 && k < 1 << 24) {
      rank = (int)k;
      memmove(text, end + 1, strlen(end + 1) + 1);
    }
  }
  free(v);
  if (rank < 0) return 0;
  if (who) *who = rank;
  if (why && n) snprintf(why, n, "%s", text);
  return 1;
}

int mpu__rendezvous_poll_abort(void *ctx, int *who, char *why, size_t n) {
  mpu__rendezvous *rv = ctx;
  if (!rv || !rv->store) return 0;
  if (atomic_load(&rv->seen)) return 0; /* reported once already */
  double now = mpu__now();
  if (now < atomic_load(&rv->next_poll)) return 0;
  atomic_store(&rv->next_poll, now + ABORT_POLL_S);
  int ready = 0;
  if (mpu__store_poll_key(rv->store, rv->abort_key, &ready) || !ready) return 0;
  if (atomic_exchange(&rv->seen, 1)) return 0;
  if (read_abort(rv, who, why, n)) return 1;
  atomic_store(&rv->seen, 0); /* not reported: the caller names whom it lost, or polls again */
  return 0;
}

int mpu__rendezvous_check_abort(void *ctx, int *who, char *why, size_t n) {
  mpu__rendezvous *rv = ctx;
  int ready = 0;
  if (!rv || !rv->store || mpu__store_check(rv->store, rv->abort_key, &ready, 1.0) || !ready)
    return 0;
  return read_abort(rv, who, why, n);
}
