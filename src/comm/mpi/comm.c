/*
 * comm.c - the MPI backend's communicators: made over an MPI communicator
 * (a duplicate, with the duplicates the checked calls and the notes need),
 * split, ended without blocking; the entry points (mpu_comm_from_mpi,
 * mpu_comm_mpi_world, mpu_mpi_finalize), the ops table and the helpers
 * every file of the backend shares. The other files, by job: backend.h.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/base/module.h"
#include "comm/mpi/backend.h"
#include "core/env.h"
#include "core/error.h"
#include "core/options.h"
#include "mpu/comm_mpi.h"
#include "mpu/version.h"

static const mpu__comm_ops mpi_ops;
static int we_initialised;

/* ---- shared by the backend's files ------------------------------------------------ */

mpu_result_t mpu__mpi_check(int err, const char *what) {
  if (err == MPI_SUCCESS) return MPU_SUCCESS;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, text, &len);
  return mpu__error(MPU_ERR_BACKEND, "%s: MPI error: %.*s", what, len, text);
}

/* MPI counts and displacements are int: count x blocks elements must fit. */
mpu_result_t mpu__mpi_fits(const char *fn, size_t count, int blocks) {
  size_t elements;
  if (!__builtin_mul_overflow(count, (size_t)blocks, &elements) && elements <= INT32_MAX)
    return MPU_SUCCESS;
  return mpu__error(MPU_ERR_UNSUPPORTED,
                    "%s: %zu x %d elements in one MPI call (MPI counts are int; split the call)",
                    fn, count, blocks);
}

mpu_result_t mpu__mpi_broken(const mpi_impl *m, const char *fn) {
  return mpu__error(m->broken, "%s: communicator is broken: %s", fn, m->why);
}

/* int counts and displacements for MPI's v-calls (v: 4 x size ints). */
mpu_result_t mpu__mpi_ints(mpu_comm *c, const char *fn, const size_t *a, int *out) {
  for (int i = 0; i < c->size; i++) {
    if (a[i] > (size_t)INT_MAX)
      return mpu__error(MPU_ERR_UNSUPPORTED, "%s: %zu elements exceed what MPI can count (%d)",
                        fn, a[i], INT_MAX);
    out[i] = (int)a[i];
  }
  return MPU_SUCCESS;
}

/* ---- making and ending communicators --------------------------------------- */

/* A handle over newcomm (taken), with the settings of `like` (or opts). */
static mpu_result_t wrap(MPI_Comm newcomm, int checked, double timeout_s, mpu_comm **out) {
  static const char fn[] = "mpi backend";
  int rank, size;
  MPI_Comm_set_errhandler(newcomm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(newcomm, &rank);
  MPI_Comm_size(newcomm, &size);
  MPI_Comm notes = MPI_COMM_NULL; /* the roll's, first: MPI_Comm_dup is collective */
  if (checked && isfinite(timeout_s) && size > 1 && MPI_Comm_dup(newcomm, &notes) != MPI_SUCCESS)
    notes = MPI_COMM_NULL;
  MPI_Comm nb = MPI_COMM_NULL; /* where checked non-blocking calls move their data */
  if (checked && size > 1 && MPI_Comm_dup(newcomm, &nb) != MPI_SUCCESS) {
    if (notes != MPI_COMM_NULL) MPI_Comm_free(&notes);
    MPI_Comm_free(&newcomm);
    return mpu__error(MPU_ERR_BACKEND, "%s: MPI_Comm_dup failed", fn);
  }
  mpi_impl *impl = calloc(1, sizeof *impl);
  int *mine = malloc((size_t)size * sizeof(int)), *world = malloc((size_t)size * sizeof(int));
  mpu_comm *c = NULL;
  if (impl) {
    impl->nb = MPI_COMM_NULL;
    impl->blk = calloc((size_t)size + 1, sizeof *impl->blk);
    impl->v = calloc(4 * (size_t)size, sizeof(int));
    impl->ptrs = calloc((size_t)size, sizeof *impl->ptrs);
  }
  if (impl && impl->blk && impl->v && impl->ptrs && mine && world) {
    MPI_Group g, wg;
    MPI_Comm_group(newcomm, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    for (int i = 0; i < size; i++) mine[i] = i;
    MPI_Group_translate_ranks(g, size, mine, wg, world);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    impl->comm = newcomm;
    impl->checked = checked;
    impl->timeout_s = timeout_s;
    impl->timed = checked && isfinite(timeout_s);
    impl->roll = mpu__mpi_roll_make(notes, size, rank, timeout_s);
    notes = MPI_COMM_NULL;
    impl->nb = nb;
    nb = MPI_COMM_NULL;
    long p2p_ranks = mpu__env_mpi_p2p_check_ranks();
    impl->p2p = checked && size > 1 && size <= p2p_ranks && size <= P2P_SIG_RANKS;
    for (int i = 0; i < SIG_REQS; i++) impl->x[i] = MPI_REQUEST_NULL;
    c = mpu__comm_new(&mpi_ops, rank, size, world, impl);
  }
  free(mine);
  free(world);
  if (notes != MPI_COMM_NULL) MPI_Comm_free(&notes);
  if (!c) {
    if (impl && impl->nb != MPI_COMM_NULL) MPI_Comm_free(&impl->nb);
    if (nb != MPI_COMM_NULL) MPI_Comm_free(&nb);
    if (impl) free(impl->blk), free(impl->v), free(impl->ptrs), mpu__mpi_roll_free(impl->roll);
    free(impl);
    MPI_Comm_free(&newcomm);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: communicator of %d", fn, size);
  }
  *out = c;
  return MPU_SUCCESS;
}

static mpu_result_t mpi_create_group(mpu_comm *c, const int *members, int n, mpu_comm **out) {
  static const char fn[] = "mpu_comm_create_group";
  mpi_impl *m = impl_of(c);
  if (m->broken) return mpu__mpi_broken(m, fn);
  MPU_CHECK(mpu__mpi_settle(c, fn)); /* a collective of the communicator: after the calls before it */
  MPI_Group parent, group;
  MPI_Comm newcomm = MPI_COMM_NULL;
  MPU_CHECK(mpu__mpi_check(MPI_Comm_group(comm_of(c), &parent), fn));
  mpu_result_t r = mpu__mpi_check(MPI_Group_incl(parent, n, members, &group), fn);
  MPI_Group_free(&parent);
  if (r) return r;
  r = mpu__mpi_check(MPI_Comm_create_group(comm_of(c), group, 4242, &newcomm), fn);
  MPI_Group_free(&group);
  return r ? r : wrap(newcomm, m->checked, m->timeout_s, out);
}

static mpu_result_t mpi_split(mpu_comm *c, int color, int key, mpu_comm **out) {
  static const char fn[] = "mpu_comm_split";
  mpi_impl *m = impl_of(c);
  if (m->broken) return mpu__mpi_broken(m, fn);
  MPU_CHECK(mpu__mpi_settle(c, fn)); /* a collective of the communicator: after the calls before it */
  MPI_Comm newcomm = MPI_COMM_NULL;
  MPU_CHECK(mpu__mpi_check(MPI_Comm_split(comm_of(c), color == MPU_COMM_SPLIT_NOCOLOR ? MPI_UNDEFINED : color,
                                 key, &newcomm),
                  fn));
  if (newcomm == MPI_COMM_NULL) {
    *out = NULL;
    return MPU_SUCCESS;
  }
  return wrap(newcomm, m->checked, m->timeout_s, out);
}

/* Never blocks: a send nobody received is cancelled, or left to MPI with its
 * buffer in the orphans. */
static void mpi_destroy(mpu_comm *c) {
  mpi_impl *m = c->impl;
  mpu__mpi_sends_end(m);
  free(m->blk);
  free(m->scratch);
  free(m->v);
  free(m->ptrs);
  mpu__mpi_roll_free(m->roll);
  if (m->orphaned) {
    /* Open MPI's non-blocking collectives crash when their communicator is
     * freed under them: a communicator with calls still running stays with
     * MPI until it finalizes */
  } else {
    /* a peer's signature block may still be on its way to nb where an
     * exchange was abandoned or the communicator broke (its peers go on
     * sending): kept, it lands there and is drained, never in a successor */
    if (m->nb != MPI_COMM_NULL && m->p2p && (m->broken || m->sig_left)) mpu__mpi_retire(m->nb);
    else if (m->nb != MPI_COMM_NULL) MPI_Comm_free(&m->nb);
    MPI_Comm_free(&m->comm); /* local in MPI: pending requests still complete */
  }
  free(m);
}

static void mpi_caps(const mpu_comm *c, mpu_comm_caps *caps) {
  caps->fault_detection = impl_of(c)->timed; /* timeouts need the checked, polled path */
  caps->call_checking = impl_of(c)->checked;
}

static const mpu__comm_ops mpi_ops = {
    .name = "mpi",
    .start = mpu__mpi_start,
    .start_nb = mpu__mpi_start_nb,
    .test = mpu__mpi_test,
    .wait = mpu__mpi_wait,
    .release = mpu__mpi_release,
    .send = mpu__mpi_send,
    .recv = mpu__mpi_recv,
    .create_group = mpi_create_group,
    .split = mpi_split,
    .abort = mpu__mpi_abort,
    .native = mpu__mpi_native,
    .caps = mpi_caps,
    .destroy = mpi_destroy,
    .oob_open = mpu__mpi_oob_open,
    .oob_post = mpu__mpi_oob_post,
    .oob_poll = mpu__mpi_oob_poll,
    .oob_close = mpu__mpi_oob_close,
};

MPI_Comm mpu__mpi_comm_of(const mpu_comm *c) { return impl_of(c)->comm; }

/* ---- entry points --------------------------------------------------------------- */

static mpu_result_t check_options(const char *fn, const mpu_mpi_options *given) {
  if (!given) return MPU_SUCCESS;
  mpu_mpi_options full = MPU_MPI_OPTIONS_INIT, *o = &full;
  MPU_CHECK(mpu__take_options(fn, "options", "MPU_MPI_OPTIONS_INIT",
                              given, sizeof full, MPU_MPI_OPTIONS_MIN_SIZE, &full));
  if (o->check_calls < MPU_CHECKS_OFF || o->check_calls > MPU_CHECKS_ON)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: options.check_calls is %d (want MPU_CHECKS_DEFAULT, _ON or _OFF)", fn,
                      o->check_calls);
  return MPU_SUCCESS;
}

/* MPI has no timeouts of its own, so the backend has one only where the
 * caller asked (options.timeout_s > 0 and finite, or MPU_TIMEOUT): without
 * one, checked calls are blocking MPI calls (INFINITY). */
static double mpi_timeout(double given) {
  if (given > 0) return given;
  return mpu__env_timeout_given() ? mpu__env_timeout(0) : INFINITY;
}

mpu_result_t mpu_comm_from_mpi_ex(MPI_Comm comm, const mpu_mpi_options *options, mpu_comm **out) {
  static const char fn[] = "mpu_comm_from_mpi";
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) return mpu__error(MPU_ERR_INVALID_USAGE, "%s: MPI is not initialised", fn);
  if (!out || comm == MPI_COMM_NULL)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL output or MPI_COMM_NULL", fn);
  MPU_CHECK(check_options(fn, options));
  MPI_Comm dup;
  MPU_CHECK(mpu__mpi_check(MPI_Comm_dup(comm, &dup), fn));
  return wrap(dup, mpu__env_check_calls(options ? options->check_calls : MPU_CHECKS_DEFAULT),
              mpi_timeout(options ? options->timeout_s : 0), out);
}

mpu_result_t mpu_comm_from_mpi(MPI_Comm comm, mpu_comm **out) {
  return mpu_comm_from_mpi_ex(comm, NULL, out);
}

static mpu_result_t mpi_world(int *argc, char ***argv, const mpu_mpi_options *options,
                                   mpu_comm **out) {
  static const char fn[] = "mpu_comm_mpi_world";
  int initialised = 0, provided = 0;
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  MPU_CHECK(check_options(fn, options));
  MPI_Initialized(&initialised);
  if (!initialised) {
    MPU_CHECK(mpu__mpi_check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), fn));
    we_initialised = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_FUNNELED)
    return mpu__error(MPU_ERR_UNSUPPORTED, "%s: MPI gives thread level %d, mpu needs FUNNELED", fn,
                      provided);
  return mpu_comm_from_mpi_ex(MPI_COMM_WORLD, options, out);
}


static mpu_result_t mpi_finalize(void) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) mpu__mpi_pair_free(); /* the two-rank reduce's types and operators */
  if (!finalized) mpu__mpi_retired_free(); /* the notes' duplicates (MPI may be the caller's) */
  if (we_initialised && !finalized) MPU_CHECK(mpu__mpi_check(MPI_Finalize(), "mpu_mpi_finalize"));
  we_initialised = 0;
  MPI_Finalized(&finalized);
  if (finalized) mpu__mpi_orphans_progress(1); /* MPI holds nothing any more */
  return MPU_SUCCESS;
}

/* libmpu reaches the backend through this, registered when the library loads */
static const mpu__module mpi_module = {
    .name = "mpi",
    .version = MPU_VERSION_STRING,
    .mpi_world = mpi_world,
    .mpi_finalize = mpi_finalize,
};

__attribute__((constructor)) static void mpi_module_load(void) { mpu__module_register(&mpi_module); }
