/*
 * comm.c - the public communicator API but the calls (calls.c): live
 * handles, what a communicator is (rank, size, capabilities), its memory and
 * stream, the communication clock, making and ending communicators.
 *
 * Everything a caller can get wrong is caught here or in calls.c, once, for
 * every backend: a bad or destroyed handle, a bad member list or colour.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <strings.h>

#include "comm/base/collective.h"
#include "comm/base/signature.h"
#include "comm/base/group.h"
#include "comm/comm_internal.h"
#include "comm/services.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/registry.h"
#include "core/span.h"

/* ---- live handles (core/registry.h): every entry point looks its handle up
 * before it reads anything through it ------------------------------------------ */

static mpu__registry live = MPU__REGISTRY_INIT(mpu_comm, next_live);

static int is_launchers(const void *c) { return ((const mpu_comm *)c)->owned_by_launcher; }

static int live_find(const mpu_comm *c) { return mpu__registry_find(&live, c); }

/* Remove c from the live handles, comparing pointers only (c may be a freed
 * or foreign pointer). Returns 0 if c was not live; -1 (and keeps it) if c is
 * the launcher's world communicator and refuse_world is set; 1 if removed. */
static int live_take(const mpu_comm *c, int refuse_world) {
  return mpu__registry_take(&live, c, refuse_world ? is_launchers : NULL);
}

mpu_comm *mpu__comm_new(const mpu__comm_ops *ops, int rank, int size, const int *world_ranks,
                        void *impl) {
  mpu_comm *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  if (world_ranks) {
    c->world_ranks = malloc((size_t)size * sizeof(int));
    if (!c->world_ranks) {
      free(c);
      return NULL;
    }
    memcpy(c->world_ranks, world_ranks, (size_t)size * sizeof(int));
  }
  c->magic = MPU_COMM_MAGIC;
  c->ops = ops;
  c->rank = rank;
  c->size = size;
  c->impl = impl;
  mpu__registry_add(&live, c);
  return c;
}

void mpu__comm_free(mpu_comm *c) {
  if (!c) return;
  mpu__detach_requests(c);
  live_take(c, 0);
  /* the threads world's handles end here (mpu_launch); a device backend's
   * scratch is released in mpu_comm_destroy, while its stream still is */
  if (!c->ops->scratch_resize) free(c->scratch);
  c->magic = MPU_COMM_FREED;
  free(c->world_ranks);
  free(c);
}

mpu_result_t mpu__recv_mismatch(size_t count, mpu_dtype dt, size_t got_count, mpu_dtype got,
                                int peer) {
  if (got_count == count && got == dt) return MPU_SUCCESS;
  return mpu__error(MPU_ERR_MISMATCH,
                    "mpu_comm_recv: expected %zu x %s from rank %d, but it sent %zu x %s (the "
                    "message is dropped)",
                    count, mpu_dtype_name(dt), peer, got_count, mpu_dtype_name(got));
}

mpu_result_t mpu__deliver(void *buf, size_t count, mpu_dtype dt, const void *data,
                          size_t got_count, mpu_dtype got, int peer) {
  MPU_CHECK(mpu__recv_mismatch(count, dt, got_count, got, peer));
  if (count) memcpy(buf, data, count * mpu_dtype_size(dt));
  return MPU_SUCCESS;
}

/* ---- the handle check every entry point makes first ------------------------------ */

mpu_result_t mpu__comm_check(const char *fn, const mpu_comm *c) {
  if (!c) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: communicator is NULL", fn);
  if (!live_find(c) || c->magic != MPU_COMM_MAGIC)
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "%s: %p is not a live communicator (destroyed, or never created)", fn,
                      (const void *)c);
  return MPU_SUCCESS;
}

/* ---- facts ---------------------------------------------------------------- */

const char *mpu_op_name(mpu_op op) {
  static const char *names[MPU_OP_COUNT] = {"sum", "prod", "min", "max", "avg"};
  return (unsigned)op < MPU_OP_COUNT ? names[op] : "invalid";
}

mpu_result_t mpu_op_from_name(const char *name, mpu_op *out) {
  if (!name || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_op_from_name: NULL");
  for (int i = 0; i < MPU_OP_COUNT; i++)
    if (!strcasecmp(name, mpu_op_name((mpu_op)i))) return *out = (mpu_op)i, MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                    "unknown reduction op '%s' (want sum, prod, min, max or avg)", name);
}

mpu_result_t mpu_comm_rank(const mpu_comm *comm, int *rank) {
  MPU_CHECK(mpu__comm_check("mpu_comm_rank", comm));
  if (!rank) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_comm_rank: rank is NULL");
  *rank = comm->rank;
  return MPU_SUCCESS;
}

mpu_result_t mpu_comm_size(const mpu_comm *comm, int *size) {
  MPU_CHECK(mpu__comm_check("mpu_comm_size", comm));
  if (!size) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_comm_size: size is NULL");
  *size = comm->size;
  return MPU_SUCCESS;
}

mpu_result_t mpu__comm_members(mpu_comm *c) {
  if (c->world_ranks || !c->lazy_members || !c->ops->list_members) return MPU_SUCCESS;
  int *w = malloc((size_t)c->size * sizeof(int));
  if (!w) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "listing the %d members of a group", c->size);
  mpu_result_t r = c->ops->list_members(c, w);
  if (r) free(w);
  else c->world_ranks = w;
  return r;
}

mpu_result_t mpu_comm_world_rank(const mpu_comm *comm, int rank, int *world_rank) {
  MPU_CHECK(mpu__comm_check("mpu_comm_world_rank", comm));
  MPU_CHECK(mpu__comm_check_rank("mpu_comm_world_rank", "rank", comm, rank));
  if (!world_rank)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_comm_world_rank: world_rank is NULL");
  /* the answer does not change: listing a described group's members is a cache */
  MPU_CHECK(mpu__comm_members((mpu_comm *)comm));
  *world_rank = mpu__comm_world_rank(comm, rank);
  return MPU_SUCCESS;
}

const char *mpu_comm_backend(const mpu_comm *comm) {
  return comm && live_find(comm) ? comm->ops->name : "invalid";
}

/* ---- memory, streams, capabilities ----------------------------------------------- */

/* base's defaults (a host backend's), then the backend's own fields */
static void caps_of(const mpu_comm *comm, mpu_comm_caps *all) {
  *all = (mpu_comm_caps){sizeof *all, MPU_MEMORY_HOST, 0, 0, 0, 0, 1, 1, 0, 0, -1, 1, 1};
  if (comm->ops->caps) comm->ops->caps(comm, all);
}

mpu_result_t mpu_comm_capabilities(const mpu_comm *comm, mpu_comm_caps *caps) {
  static const char fn[] = "mpu_comm_capabilities";
  MPU_CHECK(mpu__comm_check(fn, comm));
  if (!caps) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: caps is NULL", fn);
  if (caps->size == 0 || caps->size > sizeof *caps)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: caps.size is %zu (set it to sizeof, up to %zu)",
                      fn, caps->size, sizeof *caps);
  mpu_comm_caps all;
  caps_of(comm, &all);
  size_t size = caps->size; /* a caller built against a shorter struct gets its part */
  memcpy(caps, &all, size);
  caps->size = size;
  return MPU_SUCCESS;
}

mpu_result_t mpu_comm_stream(const mpu_comm *comm, void **stream) {
  MPU_CHECK(mpu__comm_check("mpu_comm_stream", comm));
  if (!stream) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_comm_stream: stream is NULL");
  *stream = comm->ops->get_stream ? comm->ops->get_stream(comm) : NULL;
  return MPU_SUCCESS;
}

mpu_result_t mpu_comm_set_stream(mpu_comm *comm, void *stream) {
  MPU_CHECK(mpu__comm_check("mpu_comm_set_stream", comm));
  MPU_CHECK(mpu__group_refuse("mpu_comm_set_stream"));
  if (!comm->ops->set_stream)
    return mpu__error(MPU_ERR_UNSUPPORTED, "mpu_comm_set_stream: the %s backend has no streams",
                      comm->ops->name);
  MPU_CHECK(mpu__flush(comm));
  return comm->ops->set_stream(comm, stream);
}

mpu_result_t mpu_comm_nccl_handle(const mpu_comm *comm, void **nccl_comm) {
  static const char fn[] = "mpu_comm_nccl_handle";
  MPU_CHECK(mpu__comm_check(fn, comm));
  if (!nccl_comm) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: nccl_comm is NULL", fn);
  *nccl_comm = NULL;
  if (!comm->ops->native_handle)
    return mpu__error(MPU_ERR_UNSUPPORTED, "%s: a %s communicator has no NCCL communicator", fn,
                      comm->ops->name);
  return comm->ops->native_handle(comm, nccl_comm);
}

/* What mpu_comm_mem_alloc handed out, by address, with the backend that
 * made it: mem_free takes only these, once, and through that backend. */
typedef struct mem_block {
  void *ptr;
  const mpu__comm_ops *ops;
  struct mem_block *next_live;
} mem_block;
static mpu__registry blocks = MPU__REGISTRY_KEYED_INIT(mem_block, next_live, ptr);

mpu_result_t mpu_comm_mem_alloc(mpu_comm *comm, size_t bytes, void **out) {
  static const char fn[] = "mpu_comm_mem_alloc";
  MPU_CHECK(mpu__comm_check(fn, comm));
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  if (bytes > (size_t)PTRDIFF_MAX)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %zu bytes", fn, bytes);
  mem_block *m = calloc(1, sizeof *m);
  if (!m) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes", fn, bytes);
  m->ops = comm->ops;
  if (comm->ops->mem_alloc) {
    mpu_result_t r = comm->ops->mem_alloc(comm, bytes, &m->ptr);
    if (r) {
      free(m);
      return r;
    }
  } else if (!(m->ptr = malloc(bytes ? bytes : 1))) {
    free(m);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes", fn, bytes);
  }
  *out = m->ptr;
  mpu__registry_add(&blocks, m);
  return MPU_SUCCESS;
}

mpu_result_t mpu_comm_mem_free(mpu_comm *comm, void *p) {
  static const char fn[] = "mpu_comm_mem_free";
  MPU_CHECK(mpu__comm_check(fn, comm));
  if (!p) return MPU_SUCCESS;
  mem_block *m = mpu__registry_take_key(&blocks, p);
  if (!m)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: %p is not memory mpu_comm_mem_alloc handed out (or it was freed "
                      "already)",
                      fn, p);
  if (m->ops->mem_free != comm->ops->mem_free) { /* another kind of memory */
    mpu__registry_add(&blocks, m);
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: %p is %s memory; free it through a %s communicator, not %s", fn, p,
                      m->ops->name, m->ops->name, comm->ops->name);
  }
  mpu_result_t r = MPU_SUCCESS;
  if (comm->ops->mem_free)
    r = comm->ops->mem_free(comm, p);
  else
    free(p);
  free(m);
  return r;
}

mpu_result_t mpu__comm_scratch(mpu_comm *c, size_t bytes, void **out) {
  if (bytes <= c->scratch_bytes && c->scratch) {
    *out = c->scratch;
    return MPU_SUCCESS;
  }
  void *grown = NULL;
  if (c->ops->scratch_resize) {
    /* the old buffer is released in stream order: the work using it ends first */
    mpu_result_t r = c->ops->scratch_resize(c, c->scratch, bytes, &grown);
    if (r) {
      if (grown != c->scratch) c->scratch = NULL, c->scratch_bytes = 0;
      return r;
    }
  } else {
    if (!(grown = malloc(bytes ? bytes : 1)))
      return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%zu bytes of scratch", bytes);
    free(c->scratch);
  }
  c->scratch = grown;
  c->scratch_bytes = bytes;
  *out = grown;
  return MPU_SUCCESS;
}

/* At destroy: a device backend's release is ordered after the work issued. */
static void scratch_free(mpu_comm *c) {
  void *none = NULL;
  if (c->scratch && c->ops->scratch_resize) c->ops->scratch_resize(c, c->scratch, 0, &none);
  else free(c->scratch);
  c->scratch = NULL;
  c->scratch_bytes = 0;
}

/* mpu_comm_copy2d and its enqueue-only form: one check, then the backend's copy. */
static mpu_result_t copy2d(const char *fn, int enqueue, mpu_comm *comm, void *dst, size_t dpitch,
                           const void *src, size_t spitch, size_t width, size_t height) {
  size_t dspan = 0, sspan = 0;
  MPU_CHECK(mpu__comm_check(fn, comm));
  if (!width || !height) return MPU_SUCCESS;
  if (!dst || !src || dpitch < width || spitch < width ||
      !mpu__span2d(dst, dpitch, width, height, &dspan) ||
      !mpu__span2d(src, spitch, width, height, &sspan))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: %zu rows of %zu bytes, pitches %zu and %zu, buffers %p and %p", fn,
                      height, width, dpitch, spitch, dst, src);
  if (mpu__spans_overlap(dst, dspan, src, sspan))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: the destination (%p, %zu bytes) overlaps the source (%p, %zu bytes); "
                      "copy into separate storage",
                      fn, dst, dspan, src, sspan);
  MPU_CHECK(mpu__flush(comm));
  if (enqueue && comm->ops->copy2d_enqueue)
    return comm->ops->copy2d_enqueue(comm, dst, dpitch, src, spitch, width, height);
  if (comm->ops->copy2d) return comm->ops->copy2d(comm, dst, dpitch, src, spitch, width, height);
  for (size_t i = 0; i < height; i++)
    memmove((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
  return MPU_SUCCESS;
}

mpu_result_t mpu_comm_copy2d(mpu_comm *comm, void *dst, size_t dpitch, const void *src,
                             size_t spitch, size_t width, size_t height) {
  return copy2d("mpu_comm_copy2d", 0, comm, dst, dpitch, src, spitch, width, height);
}

mpu_result_t mpu__comm_copy2d_enqueue(mpu_comm *c, void *dst, size_t dpitch, const void *src,
                                      size_t spitch, size_t width, size_t height) {
  return copy2d("mpu_comm_copy2d", 1, c, dst, dpitch, src, spitch, width, height);
}

/* the host's scaling: (x * num) / den, so a division alone (num 1) rounds
 * as torch's `tensor / n` does; 16-bit floats computed in float32 */
static void host_scale(mpu_dtype dt, void *buf, size_t n, int64_t num, int64_t den) {
  uint16_t *h = buf;
  for (size_t k = 0; k < n; k++) switch (dt) {
    case MPU_FLOAT32: ((float *)buf)[k] = ((float *)buf)[k] * (float)num / (float)den; break;
    case MPU_FLOAT64: ((double *)buf)[k] = ((double *)buf)[k] * (double)num / (double)den; break;
    case MPU_FLOAT16: h[k] = mpu_float_to_half(mpu_half_to_float(h[k]) * (float)num / (float)den); break;
    case MPU_BFLOAT16:
      h[k] = mpu_float_to_bfloat16(mpu_bfloat16_to_float(h[k]) * (float)num / (float)den);
      break;
    default: return;
    }
}

mpu_result_t mpu__comm_scale(mpu_comm *c, void *buf, size_t count, mpu_dtype dt, int64_t num,
                             int64_t den) {
  static const char fn[] = "scaling a buffer";
  MPU_CHECK(mpu__comm_check(fn, c));
  if (!mpu_dtype_is_float(dt) || num < 1 || den < 1 || (num != 1 && den != 1))
    return mpu__error(MPU_ERR_INTERNAL, "%s: %s by %lld / %lld", fn, mpu_dtype_name(dt),
                      (long long)num, (long long)den);
  if (mpu__group_open())
    return mpu__error(MPU_ERR_INVALID_USAGE, "%s: inside mpu_group_start/end", fn);
  if (!count || (num == 1 && den == 1)) return MPU_SUCCESS;
  MPU_CHECK(mpu__flush(c));
  if (!c->ops->scale) {
    host_scale(dt, buf, count, num, den);
    return MPU_SUCCESS;
  }
  return c->ops->scale(c, buf, count, dt, num, den);
}

int mpu__comm_ordered(mpu_comm *c, const void *out, size_t bytes) {
  char why[8];
  if (!c || !c->ops->order_caller || !c->ops->copy2d_enqueue || mpu__group_open()) return 0;
  /* plain host memory is read by the host at return: the layer waits for it */
  return !out || !bytes || !c->ops->check_buffer || c->ops->check_buffer(c, out, bytes, why, sizeof why);
}

mpu_result_t mpu__comm_order_caller(mpu_comm *c) {
  return mpu__comm_ordered(c, NULL, 0) ? c->ops->order_caller(c) : MPU_SUCCESS;
}

/* ---- the communication clock ---------------------------------------------- */

/* per thread: a rank of the threads backend is a thread, an MPI rank a process */
static _Thread_local double clock_seconds;
static _Thread_local uint64_t clock_calls;
static _Thread_local int clock_depth; /* a call inside a timed call is not timed twice */

double mpu__clock_start(void) {
  if (clock_depth++) return -1;
  return mpu__now();
}

mpu_result_t mpu__clock_add(double start, mpu_result_t result) {
  clock_depth--;
  if (start < 0) return result;
  clock_seconds += mpu__now() - start;
  clock_calls++;
  return result;
}

mpu_result_t mpu__clock_add_time(double start, mpu_result_t result) {
  uint64_t calls = clock_calls;
  mpu__clock_add(start, result);
  clock_calls = calls;
  return result;
}

void mpu_comm_clock(double *seconds, uint64_t *calls) {
  if (seconds) *seconds = clock_seconds;
  if (calls) *calls = clock_calls;
}

void mpu_comm_clock_reset(void) { clock_seconds = 0, clock_calls = 0; }

/* ---- making and ending communicators -------------------------------------- */

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

mpu_result_t mpu_comm_create_group(mpu_comm *comm, const int *members, int n, mpu_comm **out) {
  static const char fn[] = "mpu_comm_create_group";
  MPU_CHECK(mpu__comm_check(fn, comm));
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  MPU_CHECK(mpu__group_refuse(fn));
  if (!members || n <= 0 || n > comm->size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d members (want 1..%d and a list)", fn, n,
                      comm->size);
  int *sorted = malloc((size_t)n * sizeof(int));
  if (!sorted) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d members", fn, n);
  memcpy(sorted, members, (size_t)n * sizeof(int));
  qsort(sorted, (size_t)n, sizeof(int), cmp_int);
  mpu_result_t r = MPU_SUCCESS;
  int self = 0;
  for (int i = 0; i < n && r == MPU_SUCCESS; i++) {
    if (sorted[i] < 0 || sorted[i] >= comm->size)
      r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: member rank %d is outside 0..%d", fn,
                     sorted[i], comm->size - 1);
    else if (i && sorted[i] == sorted[i - 1])
      r = mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: member rank %d is listed twice", fn,
                     sorted[i]);
    self |= sorted[i] == comm->rank;
  }
  free(sorted);
  if (r != MPU_SUCCESS) return r;
  if (!self)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: the calling rank %d is not in the member list (only members call it)",
                      fn, comm->rank);
  MPU_CHECK(mpu__flush(comm));
  return comm->ops->create_group(comm, members, n, out);
}

/* Backend-independent split: everyone learns every (color, key), then each
 * color's members create their communicator among themselves. */
typedef struct split_entry {
  int key, rank;
} split_entry;

static int cmp_split(const void *a, const void *b) {
  const split_entry *x = a, *y = b;
  if (x->key != y->key) return (x->key > y->key) - (x->key < y->key);
  return (x->rank > y->rank) - (x->rank < y->rank);
}

static mpu_result_t generic_split(mpu_comm *comm, int color, int key, mpu_comm **out) {
  int mine[2] = {color, key};
  int *all = malloc((size_t)comm->size * 2 * sizeof(int));
  split_entry *group = malloc((size_t)comm->size * sizeof *group);
  int *members = malloc((size_t)comm->size * sizeof(int));
  mpu_result_t r = MPU_SUCCESS;
  if (!all || !group || !members) {
    r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_comm_split: %d ranks", comm->size);
    goto out;
  }
  mpu__call gather = mpu__call_describe(MPU_COLL_ALL_GATHER, 2, MPU_INT32, MPU_SUM, -1, mine, all);
  MPU_CHECK_GOTO(mpu__run_call(comm, &gather), r, out);
  if (color == MPU_COMM_SPLIT_NOCOLOR) {
    *out = NULL;
    goto out;
  }
  int n = 0;
  for (int i = 0; i < comm->size; i++)
    if (all[2 * i] == color) group[n++] = (split_entry){all[2 * i + 1], i};
  qsort(group, (size_t)n, sizeof *group, cmp_split);
  for (int i = 0; i < n; i++) members[i] = group[i].rank;
  MPU_CHECK_GOTO(comm->ops->create_group(comm, members, n, out), r, out);
out:
  free(all);
  free(group);
  free(members);
  return r;
}

mpu_result_t mpu_comm_split(mpu_comm *comm, int color, int key, mpu_comm **out) {
  static const char fn[] = "mpu_comm_split";
  MPU_CHECK(mpu__comm_check(fn, comm));
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  MPU_CHECK(mpu__group_refuse(fn));
  if (color < 0 && color != MPU_COMM_SPLIT_NOCOLOR)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: color %d is negative (use MPU_COMM_SPLIT_NOCOLOR to opt out)", fn,
                      color);
  MPU_CHECK(mpu__flush(comm));
  if (comm->ops->split) return comm->ops->split(comm, color, key, out);
  return generic_split(comm, color, key, out);
}

mpu_result_t mpu_comm_destroy(mpu_comm *comm) {
  if (!comm) return MPU_SUCCESS;
  if (mpu__group_holds(comm))
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "mpu_comm_destroy: the open mpu_group_start/end bracket holds a call on "
                      "this communicator (mpu_group_end first)");
  int taken = live_take(comm, 1);
  if (taken < 0)
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "mpu_comm_destroy: the world communicator belongs to mpu_launch, which "
                      "frees it when the rank returns");
  if (!taken)
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "mpu_comm_destroy: %p is not a live communicator (destroyed twice?)",
                      (void *)comm);
  mpu__detach_requests(comm);
  scratch_free(comm);
  comm->ops->destroy(comm);
  comm->magic = MPU_COMM_FREED;
  free(comm->world_ranks);
  free(comm);
  return MPU_SUCCESS;
}

mpu_result_t mpu_comm_abort(mpu_comm *comm) {
  MPU_CHECK(mpu__comm_check("mpu_comm_abort", comm));
  return comm->ops->abort(comm);
}

mpu_result_t mpu__comm_group_described(mpu_comm *comm, int pos, int size,
                                       mpu_result_t (*list)(const void *ctx, int *out, int size),
                                       void *ctx, void (*free_ctx)(void *ctx), mpu_comm **out) {
  MPU_CHECK(mpu__comm_check("described group", comm));
  if (!comm->ops->group_described)
    return mpu__error(MPU_ERR_UNSUPPORTED, "the %s backend makes no groups from descriptions",
                      comm->ops->name);
  return comm->ops->group_described(comm, pos, size, list, ctx, free_ctx, out);
}

mpu_result_t mpu__comm_for_host(mpu_comm *comm, const char *fn, mpu_comm **out) {
  MPU_CHECK(mpu__comm_check(fn, comm));
  mpu_comm_caps caps;
  caps_of(comm, &caps);
  if (caps.memory == MPU_MEMORY_HOST) return *out = comm, MPU_SUCCESS;
  if (comm->ops->host_twin && comm->ops->host_twin(comm, out) == MPU_SUCCESS) return MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                    "%s: the %s communicator takes device memory and has no host twin, and this "
                    "computes on host buffers (make the communicator over a host one, "
                    "mpu_comm_nccl_create, or pass a host group)",
                    fn, comm->ops->name);
}

mpu_result_t mpu_comm_host_twin(const mpu_comm *comm, mpu_comm **host) {
  static const char fn[] = "mpu_comm_host_twin";
  MPU_CHECK(mpu__comm_check(fn, comm));
  if (!host) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: host is NULL", fn);
  if (!comm->ops->host_twin)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: a %s communicator has no host twin", fn,
                      comm->ops->name);
  return comm->ops->host_twin(comm, host);
}
