/*
 * mpi.c - the MPI backend: each collective maps to its MPI counterpart on a
 * duplicate of the caller's communicator (errors returned, not fatal).
 *
 * float16 / bfloat16 reductions go through float32: the inputs are widened,
 * reduced by MPI in float32, and rounded once. avg is a sum followed by a
 * division (MPI has no average). The in-place forms map to MPI_IN_PLACE where
 * MPI's meaning matches, and to a scratch copy where it does not
 * (reduce_scatter's block of a full vector).
 */
#include "comm/comm_internal.h"
#include "core/error.h"

#ifndef MPU_HAVE_MPI

int mpu_mpi_available(void) { return 0; }

#else

#include <stdlib.h>
#include <string.h>

#include "mpu/comm_mpi.h"

int mpu_mpi_available(void) { return 1; }

/* A send in flight: MPI_Isend of a private copy, so send returns at once
 * (eager, as on the threads backend) whatever size the message has. */
typedef struct pending_send {
  MPI_Request req;
  void *copy;
} pending_send;

typedef struct mpi_impl {
  MPI_Comm comm;
  pending_send *sends;
  int nsends, cap;
} mpi_impl;

/* Free the sends that have completed (wait for all of them with `all`). */
static void progress_sends(mpi_impl *m, int all) {
  int kept = 0;
  for (int i = 0; i < m->nsends; i++) {
    int done = 0;
    if (all) MPI_Wait(&m->sends[i].req, MPI_STATUS_IGNORE), done = 1;
    else MPI_Test(&m->sends[i].req, &done, MPI_STATUS_IGNORE);
    if (done) free(m->sends[i].copy);
    else m->sends[kept++] = m->sends[i];
  }
  m->nsends = kept;
}

static const mpu__comm_ops mpi_ops;
static int we_initialised;

static MPI_Comm comm_of(const mpu_comm *c) { return ((const mpi_impl *)c->impl)->comm; }

static mpu_result_t check(int err, const char *what) {
  if (err == MPI_SUCCESS) return MPU_SUCCESS;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(err, text, &len);
  return mpu__error(MPU_ERR_BACKEND, "%s: MPI error: %.*s", what, len, text);
}

static MPI_Datatype type_of(mpu_dtype dt) {
  switch (dt) {
  case MPU_FLOAT32: return MPI_FLOAT;
  case MPU_FLOAT64: return MPI_DOUBLE;
  case MPU_INT32: return MPI_INT32_T;
  case MPU_INT64: return MPI_INT64_T;
  case MPU_UINT8: return MPI_UINT8_T;
  default: return MPI_UINT16_T; /* 16-bit floats, moved as bits */
  }
}

static MPI_Op op_of(mpu_op op) {
  switch (op) {
  case MPU_PROD: return MPI_PROD;
  case MPU_MIN: return MPI_MIN;
  case MPU_MAX: return MPI_MAX;
  default: return MPI_SUM; /* sum, and avg before its division */
  }
}

static int is16(mpu_dtype dt) { return dt == MPU_FLOAT16 || dt == MPU_BFLOAT16; }

static void widen(mpu_dtype dt, const void *in, float *out, size_t n) {
  const uint16_t *h = in;
  for (size_t i = 0; i < n; i++)
    out[i] = dt == MPU_FLOAT16 ? mpu_half_to_float(h[i]) : mpu_bfloat16_to_float(h[i]);
}

static void narrow(mpu_dtype dt, const float *in, void *out, size_t n) {
  uint16_t *h = out;
  for (size_t i = 0; i < n; i++)
    h[i] = dt == MPU_FLOAT16 ? mpu_float_to_half(in[i]) : mpu_float_to_bfloat16(in[i]);
}

/* avg = sum / size, in the dtype's own arithmetic (integers truncate) */
static void divide(void *buf, size_t n, mpu_dtype dt, int size) {
  for (size_t i = 0; i < n; i++) switch (dt) {
    case MPU_FLOAT32: ((float *)buf)[i] /= (float)size; break;
    case MPU_FLOAT64: ((double *)buf)[i] /= (double)size; break;
    case MPU_INT32: ((int32_t *)buf)[i] /= size; break;
    case MPU_INT64: ((int64_t *)buf)[i] /= size; break;
    default: ((uint8_t *)buf)[i] = (uint8_t)(((uint8_t *)buf)[i] / size); break;
    }
}

static mpu_result_t mpi_all_reduce(mpu_comm *c, const void *send, void *recv, size_t count,
                                   mpu_dtype dt, mpu_op op) {
  static const char fn[] = "mpu_comm_all_reduce";
  if (count > INT32_MAX) return mpu__error(MPU_ERR_UNSUPPORTED, "%s: %zu elements (MPI counts are int)", fn, count);
  if (is16(dt)) {
    float *f = malloc((count ? count : 1) * sizeof(float));
    if (!f) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    widen(dt, send, f, count);
    mpu_result_t r = check(MPI_Allreduce(MPI_IN_PLACE, f, (int)count, MPI_FLOAT, op_of(op), comm_of(c)), fn);
    if (!r && op == MPU_AVG) divide(f, count, MPU_FLOAT32, c->size);
    if (!r) narrow(dt, f, recv, count);
    free(f);
    return r;
  }
  MPU_CHECK(check(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, (int)count, type_of(dt),
                                op_of(op), comm_of(c)),
                  fn));
  if (op == MPU_AVG) divide(recv, count, dt, c->size);
  return MPU_SUCCESS;
}

static mpu_result_t mpi_reduce_scatter(mpu_comm *c, const void *send, void *recv, size_t count,
                                       mpu_dtype dt, mpu_op op) {
  static const char fn[] = "mpu_comm_reduce_scatter";
  size_t total = count * (size_t)c->size, es = mpu_dtype_size(dt);
  if (total > INT32_MAX) return mpu__error(MPU_ERR_UNSUPPORTED, "%s: %zu elements", fn, total);
  int wide = is16(dt);
  if (!wide && (const char *)recv != (const char *)send + (size_t)c->rank * count * es) {
    MPU_CHECK(check(MPI_Reduce_scatter_block(send, recv, (int)count, type_of(dt), op_of(op),
                                             comm_of(c)),
                    fn));
    if (op == MPU_AVG) divide(recv, count, dt, c->size);
    return MPU_SUCCESS;
  }
  /* a scratch input (widened) and output (for the in-place block and 16-bit) */
  float *in = wide ? malloc((total ? total : 1) * sizeof(float)) : NULL;
  void *out = malloc((count ? count : 1) * (wide ? sizeof(float) : es));
  mpu_result_t r = (wide && !in) || !out ? mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn) : MPU_SUCCESS;
  if (!r) {
    if (wide) widen(dt, send, in, total);
    r = check(MPI_Reduce_scatter_block(wide ? (const void *)in : send, out, (int)count,
                                       wide ? MPI_FLOAT : type_of(dt), op_of(op), comm_of(c)),
              fn);
  }
  if (!r && op == MPU_AVG) divide(out, count, wide ? MPU_FLOAT32 : dt, c->size);
  if (!r) {
    if (wide) narrow(dt, out, recv, count);
    else if (count) memcpy(recv, out, count * es);
  }
  free(in);
  free(out);
  return r;
}

static mpu_result_t mpi_reduce(mpu_comm *c, const void *send, void *recv, size_t count,
                               mpu_dtype dt, mpu_op op, int root) {
  static const char fn[] = "mpu_comm_reduce";
  if (count > INT32_MAX) return mpu__error(MPU_ERR_UNSUPPORTED, "%s: %zu elements", fn, count);
  int me = c->rank == root;
  if (is16(dt)) {
    float *f = malloc((count ? count : 1) * sizeof(float));
    if (!f) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    widen(dt, send, f, count);
    mpu_result_t r = check(MPI_Reduce(me ? MPI_IN_PLACE : f, me ? f : NULL, (int)count, MPI_FLOAT,
                                      op_of(op), root, comm_of(c)),
                           fn);
    if (!r && me && op == MPU_AVG) divide(f, count, MPU_FLOAT32, c->size);
    if (!r && me) narrow(dt, f, recv, count);
    free(f);
    return r;
  }
  const void *s = me && send == recv ? MPI_IN_PLACE : send;
  MPU_CHECK(check(MPI_Reduce(s, me ? recv : NULL, (int)count, type_of(dt), op_of(op), root, comm_of(c)), fn));
  if (me && op == MPU_AVG) divide(recv, count, dt, c->size);
  return MPU_SUCCESS;
}

static mpu_result_t mpi_all_gather(mpu_comm *c, const void *send, void *recv, size_t count,
                                   mpu_dtype dt) {
  if (count > INT32_MAX / (size_t)c->size)
    return mpu__error(MPU_ERR_UNSUPPORTED, "mpu_comm_all_gather: %zu elements", count);
  const char *in_place = (const char *)recv + (size_t)c->rank * count * mpu_dtype_size(dt);
  return check(MPI_Allgather(send == in_place ? MPI_IN_PLACE : send, (int)count, type_of(dt), recv,
                             (int)count, type_of(dt), comm_of(c)),
               "mpu_comm_all_gather");
}

static mpu_result_t mpi_broadcast(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, int root) {
  if (count > INT32_MAX) return mpu__error(MPU_ERR_UNSUPPORTED, "mpu_comm_broadcast: %zu", count);
  return check(MPI_Bcast(buf, (int)count, type_of(dt), root, comm_of(c)), "mpu_comm_broadcast");
}

static mpu_result_t mpi_all_to_all(mpu_comm *c, const void *send, void *recv, size_t count,
                                   mpu_dtype dt) {
  if (count > INT32_MAX / (size_t)c->size)
    return mpu__error(MPU_ERR_UNSUPPORTED, "mpu_comm_all_to_all: %zu elements", count);
  return check(MPI_Alltoall(send, (int)count, type_of(dt), recv, (int)count, type_of(dt), comm_of(c)),
               "mpu_comm_all_to_all");
}

static mpu_result_t mpi_barrier(mpu_comm *c) {
  return check(MPI_Barrier(comm_of(c)), "mpu_comm_barrier");
}

#define P2P_TAG 7001

static mpu_result_t mpi_send(mpu_comm *c, const void *buf, size_t count, mpu_dtype dt, int peer) {
  static const char fn[] = "mpu_comm_send";
  mpi_impl *m = c->impl;
  if (count > INT32_MAX) return mpu__error(MPU_ERR_UNSUPPORTED, "%s: %zu", fn, count);
  progress_sends(m, 0);
  if (m->nsends == m->cap) {
    int cap = m->cap ? 2 * m->cap : 8;
    pending_send *grown = realloc(m->sends, (size_t)cap * sizeof *grown);
    if (!grown) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    m->sends = grown, m->cap = cap;
  }
  size_t bytes = count * mpu_dtype_size(dt);
  void *copy = malloc(bytes ? bytes : 1);
  if (!copy) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes", fn, bytes);
  if (bytes) memcpy(copy, buf, bytes);
  pending_send *p = &m->sends[m->nsends];
  mpu_result_t r = check(MPI_Isend(copy, (int)count, type_of(dt), peer, P2P_TAG, m->comm, &p->req), fn);
  if (r) {
    free(copy);
    return r;
  }
  p->copy = copy;
  m->nsends++;
  return MPU_SUCCESS;
}

static mpu_result_t mpi_recv(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, int peer) {
  static const char fn[] = "mpu_comm_recv";
  MPI_Status st;
  int got = 0;
  progress_sends(c->impl, 0);
  MPU_CHECK(check(MPI_Probe(peer, P2P_TAG, comm_of(c), &st), fn));
  MPU_CHECK(check(MPI_Get_count(&st, type_of(dt), &got), fn));
  if (got == MPI_UNDEFINED || (size_t)got != count) { /* drop it, as the threads backend does */
    int bytes = 0;
    MPI_Get_count(&st, MPI_BYTE, &bytes);
    char *sink = malloc(bytes > 0 ? (size_t)bytes : 1);
    if (sink) MPI_Recv(sink, bytes, MPI_BYTE, peer, P2P_TAG, comm_of(c), MPI_STATUS_IGNORE);
    free(sink);
    return mpu__error(MPU_ERR_MISMATCH,
                      "%s: expected %zu x %s from rank %d, but it sent %d bytes (the message is "
                      "dropped)",
                      fn, count, mpu_dtype_name(dt), peer, bytes);
  }
  return check(MPI_Recv(buf, (int)count, type_of(dt), peer, P2P_TAG, comm_of(c), MPI_STATUS_IGNORE), fn);
}

/* A handle over newcomm (taken); its members' ranks in MPI_COMM_WORLD. */
static mpu_result_t wrap(MPI_Comm newcomm, mpu_comm **out) {
  static const char fn[] = "mpi backend";
  int rank, size;
  MPI_Comm_set_errhandler(newcomm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(newcomm, &rank);
  MPI_Comm_size(newcomm, &size);
  mpi_impl *impl = calloc(1, sizeof *impl);
  int *mine = malloc((size_t)size * sizeof(int)), *world = malloc((size_t)size * sizeof(int));
  mpu_comm *c = NULL;
  if (impl && mine && world) {
    MPI_Group g, wg;
    MPI_Comm_group(newcomm, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    for (int i = 0; i < size; i++) mine[i] = i;
    MPI_Group_translate_ranks(g, size, mine, wg, world);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    impl->comm = newcomm;
    c = mpu__comm_new(&mpi_ops, rank, size, world, impl);
  }
  free(mine);
  free(world);
  if (!c) {
    free(impl);
    MPI_Comm_free(&newcomm);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: communicator of %d", fn, size);
  }
  *out = c;
  return MPU_SUCCESS;
}

static mpu_result_t mpi_create_group(mpu_comm *c, const int *members, int n, mpu_comm **out) {
  static const char fn[] = "mpu_comm_create_group";
  MPI_Group parent, group;
  MPI_Comm newcomm = MPI_COMM_NULL;
  MPU_CHECK(check(MPI_Comm_group(comm_of(c), &parent), fn));
  mpu_result_t r = check(MPI_Group_incl(parent, n, members, &group), fn);
  MPI_Group_free(&parent);
  if (r) return r;
  r = check(MPI_Comm_create_group(comm_of(c), group, 4242, &newcomm), fn);
  MPI_Group_free(&group);
  return r ? r : wrap(newcomm, out);
}

static mpu_result_t mpi_split(mpu_comm *c, int color, int key, mpu_comm **out) {
  MPI_Comm newcomm = MPI_COMM_NULL;
  MPU_CHECK(check(MPI_Comm_split(comm_of(c), color == MPU_COMM_SPLIT_NOCOLOR ? MPI_UNDEFINED : color,
                                 key, &newcomm),
                  "mpu_comm_split"));
  if (newcomm == MPI_COMM_NULL) {
    *out = NULL;
    return MPU_SUCCESS;
  }
  return wrap(newcomm, out);
}

static mpu_result_t mpi_abort(mpu_comm *c) {
  MPI_Abort(comm_of(c), 1); /* MPI ends every process of the job */
  return MPU_SUCCESS;
}

static void mpi_destroy(mpu_comm *c) {
  mpi_impl *impl = c->impl;
  progress_sends(impl, 1); /* the sends must complete before their buffers go */
  free(impl->sends);
  MPI_Comm_free(&impl->comm);
  free(impl);
}

static const mpu__comm_ops mpi_ops = {
    .name = "mpi",
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .broadcast = mpi_broadcast,
    .reduce = mpi_reduce,
    .all_to_all = mpi_all_to_all,
    .barrier = mpi_barrier,
    .send = mpi_send,
    .recv = mpi_recv,
    .create_group = mpi_create_group,
    .split = mpi_split,
    .abort = mpi_abort,
    .destroy = mpi_destroy,
};

mpu_result_t mpu_comm_from_mpi(MPI_Comm comm, mpu_comm **out) {
  static const char fn[] = "mpu_comm_from_mpi";
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) return mpu__error(MPU_ERR_INVALID_USAGE, "%s: MPI is not initialised", fn);
  if (!out || comm == MPI_COMM_NULL)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL output or MPI_COMM_NULL", fn);
  MPI_Comm dup;
  MPU_CHECK(check(MPI_Comm_dup(comm, &dup), fn));
  return wrap(dup, out);
}

mpu_result_t mpu_comm_mpi_world(int *argc, char ***argv, mpu_comm **out) {
  static const char fn[] = "mpu_comm_mpi_world";
  int initialised = 0, provided = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    MPU_CHECK(check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), fn));
    we_initialised = 1;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_FUNNELED)
    return mpu__error(MPU_ERR_UNSUPPORTED, "%s: MPI gives thread level %d, mpu needs FUNNELED", fn,
                      provided);
  return mpu_comm_from_mpi(MPI_COMM_WORLD, out);
}

mpu_result_t mpu_mpi_finalize(void) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (we_initialised && !finalized) MPU_CHECK(check(MPI_Finalize(), "mpu_mpi_finalize"));
  we_initialised = 0;
  return MPU_SUCCESS;
}

#endif
