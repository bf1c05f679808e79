/*
 * create.c - making and ending NCCL communicators.
 *
 * An NCCL communicator is made among the members of a host communicator (its
 * "twin": threads in one process, one GPU per thread, or MPI processes, one
 * GPU per process): member 0 makes the unique id, the twin broadcasts it, each
 * member joins with ncclCommInitRank on its device. create_group does the same
 * on a group of the twin, so NCCL communicators are made among members only.
 * Without a host backend, mpu_comm_nccl_from_env bootstraps from torchrun's
 * variables through a TCPStore (rendezvous.c, store.c).
 *
 * Each communicator holds two NCCL handles (backend.h): a non-blocking
 * maker, made and split under the deadline, and a blocking work handle split
 * from it, which runs every call and is the raw handle.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/base/module.h"
#include "comm/nccl/backend.h"
#include "comm/rendezvous.h"
#include "core/env.h"
#include "core/error.h"
#include "core/options.h"
#include "mpu/version.h"

/* What a communicator hands on to the ones made from it. */
typedef struct settings {
  int device;
  void *stream;     /* the caller's stream, or NULL: one of its own */
  double timeout_s;
  int share;        /* splitShare of the maker */
  int one_rank;     /* a group of one calls NCCL */
  nccl_family *family; /* the parent's, for a split that shares its resources */
} settings;

/* ---- making and ending communicators ---------------------------------------------- */

/* The local rank: how many members before this one run on the same host. */
static mpu_result_t local_rank_of(mpu_comm *host, int *local) {
  int n = host->size, me = host->rank;
  char *names = calloc((size_t)n, 64);
  char mine[64] = "";
  if (!names) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "nccl: %d host names", n);
  gethostname(mine, sizeof mine - 1);
  mpu_result_t r = mpu_comm_all_gather(host, mine, names, 64, MPU_UINT8);
  int count = 0;
  for (int k = 0; !r && k < me; k++) count += !strncmp(names + (size_t)k * 64, mine, 64);
  free(names);
  *local = count;
  return r;
}

/* A new impl with s's settings (not yet on a device or stream). */
static nccl_impl *impl_new(const settings *s) {
  nccl_impl *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
  int bad = pthread_mutex_init(&m->lock, &a);
  pthread_mutexattr_destroy(&a);
  if (bad) {
    free(m);
    return NULL;
  }
  m->device = s->device;
  m->timeout_s = s->timeout_s;
  m->share = s->share;
  m->one_rank = s->one_rank;
  if (s->share) {
    m->family = s->family;
    if (m->family) {
      atomic_fetch_add(&m->family->refs, 1);
    } else if ((m->family = calloc(1, sizeof *m->family))) {
      atomic_store(&m->family->refs, 1);
    } else {
      pthread_mutex_destroy(&m->lock);
      free(m);
      return NULL;
    }
  }
  return m;
}

/* The settings m hands on to its splits and groups. */
static settings settings_of(const nccl_impl *m) {
  return (settings){m->device, m->on_user_stream ? m->stream : NULL, m->timeout_s, m->share,
                    m->one_rank, m->family};
}

static void impl_free(nccl_impl *m) {
  if (!m) return;
  mpu__nccl_watchdog_remove(m);
  mpu__nccl_oob_leave(m);
  mpu__nccl_end_handle(m);
  if (m->one) cudaFree(m->one);
  mpu__nccl_stream_free(m);
  mpu__nccl_pending_free(m);
  if (m->own_stream && m->stream) cudaStreamDestroy(m->stream);
  if (m->own_host) mpu_comm_destroy(m->host);
  if (m->family && atomic_fetch_sub(&m->family->refs, 1) == 1) free(m->family);
  pthread_mutex_destroy(&m->lock);
  free(m);
}

/* The maker's config: non-blocking, so init and split return ncclInProgress
 * and the caller polls ncclCommGetAsyncError against its own deadline (a
 * blocking one would wait forever for a member that never comes). NCCL 2.28
 * shares a child's resources when the *parent's* config.splitShare says so
 * (init.cc, ncclCommInitChildComm: comm->shareResources = ...
 * comm->config.splitShare): share is the caller's choice, 0 by default. */
static ncclConfig_t maker_config(int share) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  cfg.splitShare = share;
#else
  (void)share;
#endif
  return cfg;
}

/* The work handle's: blocking, so no call on it (or on the raw handle) ever
 * answers ncclInProgress; it has no splits. */
static ncclConfig_t work_config(void) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 1;
  return cfg;
}

/* A non-blocking split of parent (q: what ncclCommSplit returned) runs as
 * the parent's job (init.cc, ncclCommInitChildComm; group.cc), and
 * ncclCommSplit returns ncclSuccess while it runs (NCCLCHECK lets the
 * group's ncclInProgress through), so success says nothing: wait until the
 * parent's async error no longer says ncclInProgress, for at most
 * timeout_s. MPU_ERR_TIMEOUT leaves the job running: the caller then aborts
 * the parent, which ends it. */
static mpu_result_t split_wait(ncclComm_t parent, ncclResult_t q, double timeout_s,
                               const char *fn, const char *who) {
  if (q != ncclSuccess && q != ncclInProgress) return mpu__nccl_error(q, parent, fn);
  return mpu__nccl_await(NULL, NULL, parent, timeout_s, fn, who);
}

/* Abort a split's parent and child: aborting the parent ends its job, which
 * writes the child into the slot before ncclCommAbort returns; then the
 * child (NCCL hands out a failed one too) is aborted. */
static void split_undo(ncclComm_t *parent, ncclComm_t *slot) {
  if (*parent) ncclCommAbort(*parent);
  *parent = NULL;
  ncclComm_t child = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (child) ncclCommAbort(child);
  *slot = NULL;
}

/* m's work handle: a blocking split of its maker, every member taking part
 * in rank order. On failure the maker is aborted too. */
static mpu_result_t add_work(nccl_impl *m, int rank, const char *fn) {
  ncclConfig_t cfg = work_config();
  m->split_out = NULL;
  ncclResult_t q = ncclCommSplit(m->maker, 0, rank, &m->split_out, &cfg);
  mpu_result_t r = split_wait(m->maker, q, m->timeout_s, fn,
                              "a member stopped before the communicator's blocking handle was made");
  if (!r && !m->split_out)
    r = mpu__error(MPU_ERR_BACKEND, "%s: NCCL made no blocking handle", fn);
  if (r) {
    split_undo(&m->maker, &m->split_out);
    return r;
  }
  m->comm = m->split_out;
  m->split_out = NULL;
  return MPU_SUCCESS;
}

/* ncclCommInitRankConfig without blocking, polled until the deadline. */
static mpu_result_t init_under_deadline(nccl_impl *m, int rank, int n, const ncclUniqueId *id,
                                        double timeout_s, const char *fn) {
  ncclConfig_t cfg = maker_config(m->share);
  ncclComm_t comm = NULL;
  ncclResult_t q = ncclCommInitRankConfig(&comm, n, *id, rank, &cfg);
  if (q != ncclSuccess && q != ncclInProgress) return mpu__nccl_error(q, NULL, fn);
  char who[160];
  snprintf(who, sizeof who,
           "of its %d members, some never called it (every member makes it together: each of "
           "the host communicator's, or each rank torchrun started)",
           n);
  mpu_result_t r = mpu__nccl_await(NULL, comm, comm, timeout_s, fn, who);
  if (r == MPU_ERR_TIMEOUT) return r; /* aborted there */
  if (r) {
    ncclCommAbort(comm);
    return r;
  }
  m->maker = comm;
  return add_work(m, rank, fn);
}

/* The communicator around m: the base, the watchdog. On failure m is freed. */
static mpu_result_t finish(nccl_impl *m, int rank, int size, const int *world, int one_rank,
                           const char *fn, mpu_comm **out) {
  mpu_result_t r = mpu__nccl_watchdog_add(m);
  mpu_comm *c = r ? NULL : mpu__comm_new(&mpu__nccl_ops, rank, size, world, m);
  if (!r && !c) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  if (r) {
    impl_free(m);
    return r;
  }
  c->one_through_backend = one_rank;
  pthread_mutex_lock(&m->lock);
  m->self = c; /* the watchdog looks at it from now on */
  pthread_mutex_unlock(&m->lock);
  *out = c;
  return MPU_SUCCESS;
}

/* The twin's out-of-band channel (opened collectively over host) as m's:
 * aborts reach members in other processes. */
static void attach_channel(nccl_impl *m, const mpu_comm *host, void *channel) {
  m->oob_post_abort = host->ops->oob_post;
  m->oob_poll_abort = host->ops->oob_poll;
  m->oob_free = host->ops->oob_close;
  m->oob_ctx = channel;
}

/* Join an NCCL communicator of n ranks as `rank` with the given id. */
/* m's stream (the caller's, or one of its own) and barrier int, on its device. */
static mpu_result_t equip(nccl_impl *m, void *stream, const char *fn) {
  MPU_CHECK(mpu__nccl_cuda_error(cudaSetDevice(m->device), fn));
  if (stream) {
    m->stream = stream, m->on_user_stream = 1;
  } else {
    MPU_CHECK(mpu__nccl_cuda_error(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking), fn));
    m->own_stream = 1;
  }
  return mpu__nccl_cuda_error(cudaMalloc((void **)&m->one, sizeof(int)), fn);
}

static mpu_result_t make(int rank, int n, const ncclUniqueId *id, const settings *s,
                         mpu_comm *host, int own_host, const int *world, void *channel,
                         const char *fn, mpu_comm **out) {
  nccl_impl *m = impl_new(s);
  if (!m) {
    if (channel) host->ops->oob_close(channel);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  }
  if (channel) attach_channel(m, host, channel);
  m->host = host;
  m->own_host = own_host;
  mpu_result_t r = equip(m, s->stream, fn);
  if (!r) r = init_under_deadline(m, rank, n, id, s->timeout_s, fn);
  if (!r && host && !channel) r = mpu__nccl_oob_join(m, id); /* the members in this process */
  if (r) {
    impl_free(m);
    return r;
  }
  return finish(m, rank, n, world, s->one_rank, fn, out);
}

/* Member 0 of host makes the id, host broadcasts it, everyone joins. */
static mpu_result_t make_over(mpu_comm *host, int own_host, const settings *s, mpu_comm **out) {
  static const char fn[] = "mpu_comm_nccl_create";
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  int ok = 1;
  if (host->rank == 0) ok = ncclGetUniqueId(&id) == ncclSuccess;
  mpu_result_t r = mpu_comm_broadcast(host, &ok, 1, MPU_INT32, 0);
  if (!r) r = mpu_comm_broadcast(host, &id, sizeof id, MPU_UINT8, 0);
  if (!r && !ok) r = mpu__error(MPU_ERR_BACKEND, "%s: member 0 could not make an NCCL id", fn);
  /* a twin spanning processes lends its out-of-band channel (collective:
   * every member gets here or none does) */
  void *channel = NULL;
  if (!r && host->ops->oob_open) r = host->ops->oob_open(host, &channel);
  int *world = NULL;
  if (!r) {
    world = malloc((size_t)host->size * sizeof(int));
    if (!world) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    for (int k = 0; !r && k < host->size; k++) world[k] = mpu__comm_world_rank(host, k);
  }
  if (!r) {
    r = make(host->rank, host->size, &id, s, host, own_host, world, channel, fn, out);
  } else if (channel) {
    host->ops->oob_close(channel);
  }
  free(world);
  if (r && own_host) mpu_comm_destroy(host);
  return r;
}

/* The caller's options over the defaults (an older, shorter struct keeps
 * the newer fields' defaults). */
static mpu_result_t take_options(const char *fn, const mpu_nccl_options *o, mpu_nccl_options *full) {
  *full = (mpu_nccl_options)MPU_NCCL_OPTIONS_INIT;
  if (!o) return MPU_SUCCESS;
  return mpu__take_options(fn, "options", "MPU_NCCL_OPTIONS_INIT", o, sizeof *full,
                           MPU_NCCL_OPTIONS_MIN_SIZE, full);
}

/* A new root communicator's settings from the options and the knobs. */
static settings root_settings(const mpu_nccl_options *o, int device) {
  return (settings){device, o->stream, mpu__env_timeout(o->timeout_s), o->share_resources != 0,
                    o->one_rank_through_nccl || mpu__env_nccl_one_rank(), NULL};
}

/* The device of this rank: the option, else the local rank modulo the GPUs. */
static mpu_result_t pick_device(const char *fn, const mpu_nccl_options *o, int local, int *device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  /* a CPU machine: "driver version is insufficient" or "no CUDA-capable device" */
  if (e != cudaSuccess || count < 1)
    return mpu__error(MPU_ERR_UNSUPPORTED, "%s: no GPU here (CUDA: %s); the nccl backend needs "
                      "one GPU per rank: on CPUs use gloo (mpu_comm_gloo_from_env, torchrun's "
                      "variables), MPI or threads", fn,
                      e != cudaSuccess ? cudaGetErrorString(e) : "no device");
  int want = o && o->device >= 0 ? o->device : local % count;
  if (want >= count)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: device %d, but there are %d", fn, want, count);
  *device = want;
  return MPU_SUCCESS;
}

static mpu_result_t nccl_create(mpu_comm *host, const mpu_nccl_options *options,
                                mpu_comm **out) {
  static const char fn[] = "mpu_comm_nccl_create";
  int local = 0, device = 0;
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  mpu_nccl_options full;
  MPU_CHECK(take_options(fn, options, &full));
  options = &full;
  int rank, size;
  MPU_CHECK(mpu_comm_rank(host, &rank));
  MPU_CHECK(mpu_comm_size(host, &size));
  if (host->ops == &mpu__nccl_ops)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the host communicator is an NCCL one", fn);
  if (options->device < 0) MPU_CHECK(local_rank_of(host, &local));
  mpu_result_t r = pick_device(fn, options, local, &device);
  /* every member must agree before anyone joins NCCL, or the others would hang */
  int32_t failed = r != MPU_SUCCESS, any = 0;
  MPU_CHECK(mpu_comm_all_reduce(host, &failed, &any, 1, MPU_INT32, MPU_MAX));
  if (r) return r;
  if (any) return mpu__error(MPU_ERR_ABORTED, "%s: another member could not pick a device", fn);
  settings s = root_settings(options, device);
  MPU_CHECK(make_over(host, 0, &s, out));
  if (!options->keep_host) impl_of(*out)->host = NULL;
  return MPU_SUCCESS;
}

/* A communicator from the environment keeps its store connection: its
 * abort channel to the peers (NCCL tells them only on its socket and IB
 * transports). */
static void keep_store(nccl_impl *m, mpu__rendezvous *rv) {
  if (!rv) return; /* a world of one */
  m->oob_post_abort = mpu__rendezvous_post_abort;
  m->oob_poll_abort = mpu__rendezvous_poll_abort;
  m->oob_free = mpu__rendezvous_free;
  m->oob_ctx = rv;
}

static mpu_result_t nccl_from_env(const mpu_nccl_options *options, mpu_comm **out) {
  static const char fn[] = "mpu_comm_nccl_from_env";
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  mpu_nccl_options full;
  MPU_CHECK(take_options(fn, options, &full));
  options = &full;
  mpu__rendezvous_env env;
  MPU_CHECK(mpu__rendezvous_read_env(fn, &env));
  int device = 0;
  MPU_CHECK(pick_device(fn, options, env.local_rank, &device));
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (env.rank == 0 && ncclGetUniqueId(&id) != ncclSuccess)
    return mpu__error(MPU_ERR_BACKEND, "%s: could not make an NCCL id", fn);
  settings s = root_settings(options, device);
  mpu__rendezvous *rv = NULL;
  MPU_CHECK(mpu__rendezvous_join(&env, &id, sizeof id, s.timeout_s, &rv));
  mpu_result_t r = make(env.rank, env.world_size, &id, &s, NULL, 0, NULL, NULL, fn, out);
  if (r) {
    mpu__rendezvous_leave(rv);
    return r;
  }
  keep_store(impl_of(*out), rv);
  return MPU_SUCCESS;
}

mpu_result_t mpu__nccl_host_twin(const mpu_comm *comm, mpu_comm **host) {
  if (!impl_of(comm)->host)
    return mpu__error(MPU_ERR_UNSUPPORTED,
                      "mpu_comm_host_twin: made from the environment, this communicator has no "
                      "host twin");
  *host = impl_of(comm)->host;
  return MPU_SUCCESS;
}

mpu_result_t mpu__nccl_create_group(mpu_comm *c, const int *members, int n, mpu_comm **out) {
  static const char fn[] = "mpu_comm_create_group";
  nccl_impl *m = impl_of(c);
  MPU_CHECK(mpu__nccl_usable(c, fn));
  if (!m->host)
    return mpu__error(MPU_ERR_UNSUPPORTED,
                      "%s: an NCCL communicator made from the environment has no host twin to "
                      "make groups with (use mpu_comm_split)",
                      fn);
  mpu_comm *twin = NULL;
  MPU_CHECK(mpu_comm_create_group(m->host, members, n, &twin));
  settings s = settings_of(m);
  return make_over(twin, 1, &s, out);
}

/* The first half of a split: a new maker from c's, collective over every
 * rank of c (NOCOLOR ones too, which get NULL). NCCL runs it as a job of
 * c's maker and writes the child into m->split_out when the job ends. Past
 * the deadline, or when the job failed (NCCL then leaves its error in the
 * parent), c cannot go on: it is broken, its handles aborted (which ends the
 * job, so nothing is written after this returns), and the child aborted. */
static mpu_result_t split_maker(mpu_comm *c, int color, int key, ncclComm_t *child,
                                const char *fn) {
  nccl_impl *m = impl_of(c);
  char who[200];
  snprintf(who, sizeof who,
           "a rank of the parent communicator of %d ranks never called mpu_comm_split (every rank "
           "takes part, those with MPU_COMM_SPLIT_NOCOLOR too)",
           c->size);
  ncclConfig_t cfg = maker_config(m->share);
  pthread_mutex_lock(&m->lock); /* the watchdog leaves the handles alone meanwhile */
  mpu_result_t r = m->maker ? MPU_SUCCESS : mpu__nccl_broken_error(m, fn);
  if (!r) {
    m->split_out = NULL;
    ncclResult_t q = ncclCommSplit(m->maker, color == MPU_COMM_SPLIT_NOCOLOR ? NCCL_SPLIT_NOCOLOR : color,
                                   key, &m->split_out, &cfg);
    r = split_wait(m->maker, q, m->timeout_s, fn, who);
    if (r) {
      mpu__nccl_mark_broken(c, r, "%s (this communicator took part: NCCL aborted)", mpu_last_error());
      mpu__nccl_family_abort(m);
      ncclComm_t work = m->comm;
      m->comm = NULL;
      if (work) ncclCommAbort(work);
      split_undo(&m->maker, &m->split_out);
      r = mpu__nccl_broken_error(m, fn);
    }
    *child = m->split_out;
    m->split_out = NULL;
  }
  pthread_mutex_unlock(&m->lock);
  return r;
}

/* Collective over c, like ncclCommSplit (NCCL's own split: of c's maker,
 * then the child's blocking handle of its own); the host twin, if any, is
 * split alike, so the new communicator has one. */
mpu_result_t mpu__nccl_split(mpu_comm *c, int color, int key, mpu_comm **out) {
  static const char fn[] = "mpu_comm_split";
  nccl_impl *m = impl_of(c);
  MPU_CHECK(mpu__nccl_usable(c, fn));
  mpu_comm *twin = NULL;
  if (m->host) MPU_CHECK(mpu_comm_split(m->host, color, key, &twin));
  /* a twin spanning processes lends its channel: opened first, collective
   * over the twin's members, before anything that can fail on one alone */
  void *channel = NULL;
  if (twin && twin->ops->oob_open) {
    mpu_result_t ro = twin->ops->oob_open(twin, &channel);
    if (ro) {
      mpu_comm_destroy(twin);
      return ro;
    }
  }
  int split_no = ++m->splits; /* the same on every member: splits are collective */
  settings s = settings_of(m);
  nccl_impl *nm = impl_new(&s);
  if (!nm) {
    if (channel) twin->ops->oob_close(channel);
    mpu_comm_destroy(twin);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  }
  nm->host = twin;
  nm->own_host = twin != NULL;
  if (channel) attach_channel(nm, twin, channel);
  /* every rank of c takes part, NOCOLOR ones too (they get no communicator):
   * NCCL's split is collective over the parent */
  mpu_result_t r = split_maker(c, color, key, &nm->maker, fn);
  if (!r && !nm->maker) {
    impl_free(nm);
    *out = NULL;
    return MPU_SUCCESS;
  }
  int rank = 0, size = 0;
  if (!r) r = mpu__nccl_error(ncclCommUserRank(nm->maker, &rank), nm->maker, fn);
  if (!r) r = mpu__nccl_error(ncclCommCount(nm->maker, &size), nm->maker, fn);
  if (!r) r = equip(nm, s.stream, fn); /* a parent on the caller's stream: the child too */
  if (!r) r = add_work(nm, rank, fn);
  if (!r && !twin && m->oob_post_abort == mpu__rendezvous_post_abort) {
    /* a split of a torchrun world: a channel of its own on the store */
    char name[48];
    snprintf(name, sizeof name, "split%d.%d", split_no, color);
    mpu__rendezvous *rv = NULL;
    r = mpu__rendezvous_child(m->oob_ctx, name, nm->timeout_s, &rv);
    if (!r) keep_store(nm, rv);
  }
  if (!r && mpu__nccl_oob_is_board(m) && twin) {
    /* the members in this process share the parent's board: name the
     * child's after it, the split and the color */
    ncclUniqueId board;
    memset(&board, 0, sizeof board);
    uint64_t name[3] = {mpu__nccl_oob_board_serial(m), (uint64_t)split_no, (uint64_t)(unsigned)color};
    memcpy(board.internal, name, sizeof name);
    board.internal[sizeof name] = 2; /* never an NCCL id */
    r = mpu__nccl_oob_join(nm, &board);
  }
  int *world = NULL;
  if (!r && twin) {
    world = malloc((size_t)size * sizeof(int));
    if (!world) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    for (int k = 0; !r && k < size; k++) world[k] = mpu__comm_world_rank(twin, k);
  }
  if (r) {
    free(world);
    impl_free(nm);
    return r;
  }
  r = finish(nm, rank, size, world, s.one_rank, fn, out);
  free(world);
  return r;
}

/* End one handle the orderly way when NCCL says it is sound (its async
 * error first: ncclCommDestroy of a communicator whose job still runs
 * returns early inside a group it never closes, init.cc), else leave it to
 * the abort. 0 when it is gone. */
static int destroy_handle(ncclComm_t *h, const char *what) {
  if (!*h) return 0;
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(*h, &async) != ncclSuccess || async != ncclSuccess) return -1;
  ncclResult_t d = ncclCommDestroy(*h);
  if (d != ncclSuccess) {
    mpu__nccl_error(d, NULL, what); /* the message stays: abort ends it below */
    return -1;
  }
  *h = NULL;
  return 0;
}

/* Destroy: the watchdog lets go first; work still on the stream is waited
 * for under the deadline (an abort would stop it, and with shared resources
 * the relatives' too), then the handles end the orderly way, or by
 * ncclCommAbort when broken, failed, or still busy at the deadline. */
void mpu__nccl_destroy(mpu_comm *c) {
  static const char fn[] = "mpu_comm_destroy";
  nccl_impl *m = c->impl;
  mpu__nccl_watchdog_remove(m);
  m->self = NULL;
  cudaSetDevice(m->device);
  int sound = m->comm && !atomic_load(&m->broken);
  if (sound && cudaStreamQuery(m->stream) != cudaSuccess) {
    cudaGetLastError();
    cudaEvent_t ev = NULL;
    sound = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) == cudaSuccess &&
            cudaEventRecord(ev, m->stream) == cudaSuccess &&
            mpu__nccl_watch(c, ev, -1, 1, fn) == MPU_SUCCESS;
    if (ev) cudaEventDestroy(ev);
  }
  pthread_mutex_lock(&m->lock);
  if (sound && !destroy_handle(&m->comm, fn) && !destroy_handle(&m->maker, fn))
    destroy_handle(&m->local, fn);
  pthread_mutex_unlock(&m->lock);
  impl_free(m); /* aborts what is left */
}

/* libmpu reaches the backend through this, registered when the library loads */
static const mpu__module nccl_module = {
    .name = "nccl",
    .version = MPU_VERSION_STRING,
    .nccl_create = nccl_create,
    .nccl_from_env = nccl_from_env,
    .usable = mpu__nccl_runtime_check,
};

__attribute__((constructor)) static void nccl_module_load(void) {
  mpu__module_register(&nccl_module);
}
