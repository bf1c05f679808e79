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
#include "mpu/version.h"

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

/* The caller's stream a communicator runs on, or NULL if it has its own. */
static void *user_stream(const nccl_impl *m) { return m->on_user_stream ? m->stream : NULL; }

static void impl_free(nccl_impl *m) {
  if (!m) return;
  mpu__nccl_oob_leave(m);
  if (m->comm) ncclCommDestroy(m->comm);
  if (m->one) cudaFree(m->one);
  mpu__nccl_stream_free(m);
  if (m->own_stream && m->stream) cudaStreamDestroy(m->stream);
  if (m->own_host) mpu_comm_destroy(m->host);
  free(m);
}

/* A config for a communicator made without blocking: init and split return
 * ncclInProgress and the caller polls ncclCommGetAsyncError against its own
 * deadline (a blocking one would wait forever for a member that never
 * comes). splitShare: children share the parent's resources. */
static ncclConfig_t nonblocking_config(void) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
  cfg.splitShare = 1;
#endif
  return cfg;
}

/* ncclCommInitRankConfig without blocking, polled until the deadline. */
static mpu_result_t init_under_deadline(nccl_impl *m, int rank, int n, const ncclUniqueId *id,
                                        double timeout_s, const char *fn) {
  ncclConfig_t cfg = nonblocking_config();
  ncclComm_t comm = NULL;
  ncclResult_t q = ncclCommInitRankConfig(&comm, n, *id, rank, &cfg);
  if (q != ncclSuccess && q != ncclInProgress) return mpu__nccl_error(q, NULL, fn);
  char who[160];
  snprintf(who, sizeof who,
           "of its %d members, some never called it (each member of the host communicator makes "
           "it together)",
           n);
  mpu_result_t r = mpu__nccl_await(NULL, comm, comm, timeout_s, fn, who);
  if (r == MPU_ERR_TIMEOUT) return r; /* aborted there */
  if (r) {
    ncclCommAbort(comm);
    return r;
  }
  m->comm = comm;
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
static mpu_result_t make(int rank, int n, const ncclUniqueId *id, int device, void *stream,
                         double timeout_s, mpu_comm *host, int own_host, const int *world,
                         void *channel, mpu_comm **out) {
  static const char fn[] = "mpu_comm_nccl_create";
  nccl_impl *m = calloc(1, sizeof *m);
  if (!m) {
    if (channel) host->ops->oob_close(channel);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  }
  if (channel) attach_channel(m, host, channel);
  m->device = device;
  m->timeout_s = timeout_s;
  m->host = host;
  m->own_host = own_host;
  mpu_result_t r = mpu__nccl_cuda_error(cudaSetDevice(device), fn);
  if (!r && stream) m->stream = stream, m->on_user_stream = 1;
  if (!r && !stream) {
    r = mpu__nccl_cuda_error(cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking), fn);
    m->own_stream = !r;
  }
  if (!r) r = mpu__nccl_cuda_error(cudaMalloc((void **)&m->one, sizeof(int)), fn);
  if (!r) r = init_under_deadline(m, rank, n, id, timeout_s, fn);
  if (!r && host && !channel) r = mpu__nccl_oob_join(m, id); /* the members in this process */
  mpu_comm *c = r ? NULL : mpu__comm_new(&mpu__nccl_ops, rank, n, world, m);
  if (!r && !c) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  if (r) {
    impl_free(m);
    return r;
  }
  *out = c;
  return MPU_SUCCESS;
}

/* Member 0 of host makes the id, host broadcasts it, everyone joins. */
static mpu_result_t make_over(mpu_comm *host, int own_host, int device, void *stream,
                              double timeout_s, mpu_comm **out) {
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
    r = make(host->rank, host->size, &id, device, stream, timeout_s, host, own_host, world, channel,
             out);
  } else if (channel) {
    host->ops->oob_close(channel);
  }
  free(world);
  if (r && own_host) mpu_comm_destroy(host);
  return r;
}

static mpu_result_t check_options(const char *fn, const mpu_nccl_options *o) {
  if (o && (o->size == 0 || o->size > sizeof *o))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: options.size is %zu (start from MPU_NCCL_OPTIONS_INIT)", fn, o->size);
  return MPU_SUCCESS;
}

/* The device of this rank: the option, else the local rank modulo the GPUs. */
static mpu_result_t pick_device(const char *fn, const mpu_nccl_options *o, int local, int *device) {
  int count = 0;
  MPU_CHECK(mpu__nccl_cuda_error(cudaGetDeviceCount(&count), fn));
  if (count < 1) return mpu__error(MPU_ERR_UNSUPPORTED, "%s: no CUDA device", fn);
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
  MPU_CHECK(check_options(fn, options));
  int rank, size;
  MPU_CHECK(mpu_comm_rank(host, &rank));
  MPU_CHECK(mpu_comm_size(host, &size));
  if (host->ops == &mpu__nccl_ops)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the host communicator is an NCCL one", fn);
  if (!options || options->device < 0) MPU_CHECK(local_rank_of(host, &local));
  mpu_result_t r = pick_device(fn, options, local, &device);
  /* every member must agree before anyone joins NCCL, or the others would hang */
  int32_t failed = r != MPU_SUCCESS, any = 0;
  MPU_CHECK(mpu_comm_all_reduce(host, &failed, &any, 1, MPU_INT32, MPU_MAX));
  if (r) return r;
  if (any) return mpu__error(MPU_ERR_ABORTED, "%s: another member could not pick a device", fn);
  int keep = !options || options->size < offsetof(mpu_nccl_options, keep_host) + sizeof(int) ||
             options->keep_host;
  MPU_CHECK(make_over(host, 0, device, options ? options->stream : NULL,
                      mpu__env_timeout(options ? options->timeout_s : 0), out));
  if (!keep) impl_of(*out)->host = NULL;
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
  MPU_CHECK(check_options(fn, options));
  mpu__rendezvous_env env;
  MPU_CHECK(mpu__rendezvous_read_env(&env));
  int device = 0;
  MPU_CHECK(pick_device(fn, options, env.local_rank, &device));
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (env.rank == 0 && ncclGetUniqueId(&id) != ncclSuccess)
    return mpu__error(MPU_ERR_BACKEND, "%s: could not make an NCCL id", fn);
  double timeout = mpu__env_timeout(options ? options->timeout_s : 0);
  mpu__rendezvous *rv = NULL;
  MPU_CHECK(mpu__rendezvous_join(&env, &id, sizeof id, timeout, &rv));
  mpu_result_t r = make(env.rank, env.world_size, &id, device, options ? options->stream : NULL,
                        timeout, NULL, 0, NULL, NULL, out);
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
  return make_over(twin, 1, m->device, user_stream(m), m->timeout_s, out);
}

/* Collective over c, like ncclCommSplit (NCCL's own split, sharing the
 * parent's resources where NCCL has splitShare); the host twin, if any, is
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
  nccl_impl *nm = calloc(1, sizeof *nm);
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
  ncclConfig_t cfg = nonblocking_config();
  ncclComm_t nc = NULL;
  int nocolor = color == MPU_COMM_SPLIT_NOCOLOR;
  ncclResult_t q = ncclCommSplit(m->comm, nocolor ? NCCL_SPLIT_NOCOLOR : color, key, &nc, &cfg);
  mpu_result_t r = q == ncclInProgress || q == ncclSuccess ? MPU_SUCCESS
                                                            : mpu__nccl_error(q, m->comm, fn);
  if (!r) {
    char who[200];
    snprintf(who, sizeof who,
             "a rank of the parent communicator of %d ranks never called mpu_comm_split (every "
             "rank takes part, those with MPU_COMM_SPLIT_NOCOLOR too)",
             c->size);
    r = mpu__nccl_await(c, nc, nc ? nc : m->comm, m->timeout_s, fn, who);
    if (r && r != MPU_ERR_TIMEOUT && nc) ncclCommAbort(nc);
    if (r && nocolor) /* the parent took part in the failed split: it cannot go on */
      mpu__nccl_abort(c);
  }
  if (!r && !nc) {
    impl_free(nm);
    *out = NULL;
    return MPU_SUCCESS;
  }
  if (r) nc = NULL;
  int rank = 0, size = 0;
  if (!r) r = mpu__nccl_error(ncclCommUserRank(nc, &rank), nc, fn);
  if (!r) r = mpu__nccl_error(ncclCommCount(nc, &size), nc, fn);
  nm->comm = nc;
  nm->device = m->device;
  nm->timeout_s = m->timeout_s;
  nm->stream = user_stream(m); /* a parent on the caller's stream: the child too */
  nm->on_user_stream = nm->stream != NULL;
  if (!r && !nm->stream) {
    r = mpu__nccl_cuda_error(cudaStreamCreateWithFlags(&nm->stream, cudaStreamNonBlocking), fn);
    nm->own_stream = !r;
  }
  if (!r) r = mpu__nccl_cuda_error(cudaMalloc((void **)&nm->one, sizeof(int)), fn);
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
  mpu_comm *nc_comm = r ? NULL : mpu__comm_new(&mpu__nccl_ops, rank, size, world, nm);
  free(world);
  if (!r && !nc_comm) r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  if (r) {
    impl_free(nm);
    return r;
  }
  *out = nc_comm;
  return MPU_SUCCESS;
}

void mpu__nccl_destroy(mpu_comm *c) {
  nccl_impl *m = c->impl;
  cudaSetDevice(m->device);
  if (m->comm && !atomic_load(&m->broken) && cudaStreamQuery(m->stream) == cudaSuccess) {
    ncclCommDestroy(m->comm); /* nothing pending: the orderly way */
    m->comm = NULL;
  }
  mpu__nccl_end_handle(m); /* work still queued, or broken: do not wait for it */
  impl_free(m);
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
