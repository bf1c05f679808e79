/*
 * device_mesh.c - communicators for the groups of a mesh.
 *
 * A device mesh is a mesh laid over the ranks of a communicator, plus a cache
 * of communicators keyed by their ordered member list: whatever way a group
 * is asked for (a dim, several dims, a dim of a slice or of a flattened mesh),
 * the same members give the same communicator. Each one is made with
 * mpu_comm_create_group among its members only, so a rank only ever makes
 * the communicators of groups it belongs to.
 */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "mesh/mesh_internal.h"
#include "mpu/mesh.h"

typedef struct cached_comm {
  int *members;
  int64_t n;
  mpu_comm *comm;
  int owned; /* made here (destroyed with the device mesh) or the caller's */
} cached_comm;

struct mpu_device_mesh {
  mpu_mesh *mesh;
  mpu_comm *comm; /* whose ranks the mesh is over */
  int rank;
  cached_comm *cache;
  int ncache, cap;
};

void mpu_device_mesh_free(mpu_device_mesh *dm) {
  if (!dm) return;
  for (int i = 0; i < dm->ncache; i++) {
    if (dm->cache[i].owned) mpu_comm_destroy(dm->cache[i].comm);
    free(dm->cache[i].members);
  }
  free(dm->cache);
  mpu_mesh_free(dm->mesh);
  free(dm);
}

const mpu_mesh *mpu_device_mesh_mesh(const mpu_device_mesh *dm) { return dm ? dm->mesh : NULL; }

int mpu_device_mesh_rank(const mpu_device_mesh *dm) { return dm ? dm->rank : -1; }

mpu_comm *mpu__device_mesh_base(const mpu_device_mesh *dm) { return dm ? dm->comm : NULL; }

static cached_comm *find(mpu_device_mesh *dm, const int *members, int64_t n) {
  for (int i = 0; i < dm->ncache; i++)
    if (dm->cache[i].n == n && !memcmp(dm->cache[i].members, members, (size_t)n * sizeof(int)))
      return &dm->cache[i];
  return NULL;
}

/* Remember comm for members (copied); owned comms are destroyed on failure. */
static mpu_result_t remember(mpu_device_mesh *dm, const int *members, int64_t n, mpu_comm *comm,
                             int owned) {
  if (dm->ncache == dm->cap) {
    int cap = dm->cap ? 2 * dm->cap : 8;
    cached_comm *grown = realloc(dm->cache, (size_t)cap * sizeof *grown);
    if (!grown) goto oom;
    dm->cache = grown;
    dm->cap = cap;
  }
  int *copy = malloc((size_t)n * sizeof(int));
  if (!copy) goto oom;
  memcpy(copy, members, (size_t)n * sizeof(int));
  dm->cache[dm->ncache++] = (cached_comm){copy, n, comm, owned};
  return MPU_SUCCESS;
oom:
  if (owned) mpu_comm_destroy(comm);
  return mpu__error(MPU_ERR_OUT_OF_MEMORY, "device mesh: caching a communicator");
}

/* The communicator over members (ranks of dm->comm, this rank among them). */
static mpu_result_t comm_over(mpu_device_mesh *dm, const int *members, int64_t n,
                              mpu_comm **out) {
  cached_comm *c = find(dm, members, n);
  if (!c) {
    mpu_comm *made;
    MPU_CHECK(mpu_comm_create_group(dm->comm, members, (int)n, &made));
    MPU_CHECK(remember(dm, members, n, made, 1));
    c = &dm->cache[dm->ncache - 1];
  }
  *out = c->comm;
  return MPU_SUCCESS;
}

mpu_result_t mpu_device_mesh_group_comm(mpu_device_mesh *dm, const mpu_mesh *mesh,
                                        const int *dims, int ndims, mpu_comm **out) {
  static const char fn[] = "mpu_device_mesh_group_comm";
  if (!dm || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  const mpu_mesh *m = mesh ? mesh : dm->mesh;
  if (!mpu_mesh_contains(m, dm->rank))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: this rank (%d) is not in the mesh it asks a group of", fn, dm->rank);
  int64_t n = 0;
  mpu_result_t r = mpu_mesh_group(m, dm->rank, dims, ndims, NULL, 0, &n);
  if (r != MPU_SUCCESS && n <= 0) return r; /* bad dims: the message says which */
  int *members = malloc((size_t)n * sizeof(int));
  if (!members) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: group of %lld", fn, (long long)n);
  r = mpu_mesh_group(m, dm->rank, dims, ndims, members, (size_t)n, &n);
  if (!r) r = comm_over(dm, members, n, out);
  free(members);
  return r;
}

mpu_result_t mpu_device_mesh_comm(mpu_device_mesh *dm, int dim, mpu_comm **out) {
  return mpu_device_mesh_group_comm(dm, NULL, &dim, 1, out);
}

mpu_result_t mpu_device_mesh_comm_by_name(mpu_device_mesh *dm, const char *name, mpu_comm **out) {
  int dim;
  if (!dm) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_device_mesh_comm_by_name: NULL");
  MPU_CHECK(mpu_mesh_dim_index(dm->mesh, name, &dim));
  return mpu_device_mesh_comm(dm, dim, out);
}

static mpu_result_t new_device_mesh(mpu_comm *comm, mpu_mesh *mesh, mpu_device_mesh **out) {
  mpu_device_mesh *dm = calloc(1, sizeof *dm);
  if (!dm) {
    mpu_mesh_free(mesh);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "device mesh");
  }
  dm->mesh = mesh;
  dm->comm = comm;
  mpu_comm_rank(comm, &dm->rank);
  *out = dm;
  return MPU_SUCCESS;
}

mpu_result_t mpu_device_mesh_init(mpu_comm *comm, int ndim, const int64_t *shape,
                                  const char *const *names, mpu_mesh_init_mode mode,
                                  mpu_device_mesh **out) {
  static const char fn[] = "mpu_device_mesh_init";
  int size;
  MPU_CHECK(mpu_comm_size(comm, &size));
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  if (mode != MPU_MESH_LAZY && mode != MPU_MESH_EAGER)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: mode %d", fn, (int)mode);
  mpu_mesh *mesh;
  MPU_CHECK(mpu_mesh_create(ndim, shape, names, NULL, &mesh));
  if (mpu_mesh_numel(mesh) != size) {
    char desc[160];
    mpu_result_t r = mpu__error(MPU_ERR_INVALID_ARGUMENT,
                                "%s: mesh %s has %lld ranks but the communicator has %d", fn,
                                mpu_mesh_describe(mesh, desc, sizeof desc),
                                (long long)mpu_mesh_numel(mesh), size);
    mpu_mesh_free(mesh);
    return r;
  }
  mpu_device_mesh *dm = NULL;
  MPU_CHECK(new_device_mesh(comm, mesh, &dm));
  for (int d = 0; mode == MPU_MESH_EAGER && d < ndim; d++) {
    mpu_comm *c;
    mpu_result_t r = mpu_device_mesh_comm(dm, d, &c);
    if (r) {
      mpu_device_mesh_free(dm);
      return r;
    }
  }
  *out = dm;
  return MPU_SUCCESS;
}

/* Row-major index of coords in shape. */
static int64_t flat_index(const int64_t *coords, const int64_t *shape, int ndim) {
  int64_t i = 0;
  for (int d = 0; d < ndim; d++) i = i * shape[d] + coords[d];
  return i;
}

mpu_result_t mpu_device_mesh_from_comms(mpu_comm *comm, int ndim, mpu_comm *const *comms,
                                        const char *const *names, mpu_device_mesh **out) {
  static const char fn[] = "mpu_device_mesh_from_comms";
  int size, rank;
  MPU_CHECK(mpu_comm_size(comm, &size));
  MPU_CHECK(mpu_comm_rank(comm, &rank));
  if (!out || !comms || ndim < 1 || ndim > MPU_MESH_MAX_DIMS)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d communicators (want 1..%d), out %s", fn,
                      ndim, MPU_MESH_MAX_DIMS, out ? "set" : "NULL");
  int64_t shape[MPU_MESH_MAX_DIMS], numel = 1, widest = size;
  int32_t mine[MPU_MESH_MAX_DIMS];
  for (int d = 0; d < ndim; d++) {
    int s, r;
    MPU_CHECK(mpu_comm_size(comms[d], &s));
    MPU_CHECK(mpu_comm_rank(comms[d], &r));
    shape[d] = s;
    mine[d] = r;
    if (numel <= INT32_MAX) numel *= s;
    if (s > widest) widest = s;
  }
  /* everyone learns every rank's coordinates (a local check failing on one
   * rank only must not leave the others waiting, so all take part) */
  int32_t *all = malloc((size_t)size * MPU_MESH_MAX_DIMS * sizeof(int32_t));
  int *ranks = malloc((size_t)size * sizeof(int));
  int *group = malloc((size_t)size * sizeof(int));
  int *theirs = malloc((size_t)widest * sizeof(int)); /* a comm may be wrong, and bigger */
  mpu_mesh *mesh = NULL;
  mpu_result_t r = MPU_SUCCESS;
  if (!all || !ranks || !group || !theirs) {
    r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d ranks", fn, size);
    goto out;
  }
  MPU_CHECK_GOTO(mpu_comm_all_gather(comm, mine, all, ndim, MPU_INT32), r, out);
  int ok = numel == size;
  for (int i = 0; i < size; i++) ranks[i] = -1;
  for (int w = 0; ok && w < size; w++) {
    int64_t c[MPU_MESH_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
      c[d] = all[w * ndim + d];
      if (c[d] >= shape[d]) ok = 0; /* its communicator along d is bigger than mine */
    }
    if (!ok) break;
    int64_t at = flat_index(c, shape, ndim);
    if (ranks[at] >= 0) ok = 0; /* two ranks claim one coordinate */
    else ranks[at] = w;
  }
  if (ok) MPU_CHECK_GOTO(mpu_mesh_create(ndim, shape, names, ranks, &mesh), r, out);
  /* each communicator must hold exactly this rank's group along its dim */
  for (int d = 0; d < ndim; d++) {
    int64_t n = 0;
    MPU_CHECK_GOTO(mpu_comm_all_gather(comms[d], &rank, theirs, 1, MPU_INT32), r, out);
    if (ok && (mpu_mesh_group(mesh, rank, &d, 1, group, (size_t)size, &n) || n != shape[d] ||
               memcmp(group, theirs, (size_t)n * sizeof(int))))
      ok = 0;
  }
  int32_t verdict = ok, everyone = 0;
  MPU_CHECK_GOTO(mpu_comm_all_reduce(comm, &verdict, &everyone, 1, MPU_INT32, MPU_MIN), r, out);
  if (!everyone) {
    r = mpu__error(MPU_ERR_INVALID_ARGUMENT,
                   "%s: the %d communicators do not form a mesh over the %d ranks (sizes "
                   "multiply to %lld; each coordinate must be held once and each communicator "
                   "must hold the ranks that differ along its dim only)",
                   fn, ndim, size, (long long)numel);
    goto out;
  }
  mpu_device_mesh *dm = NULL;
  MPU_CHECK_GOTO(new_device_mesh(comm, mesh, &dm), r, out);
  mesh = NULL; /* the device mesh has it */
  for (int d = 0; d < ndim && !r; d++) { /* the caller's communicators serve the dims */
    int64_t n;
    r = mpu_mesh_group(dm->mesh, rank, &d, 1, group, (size_t)size, &n);
    if (!r) r = remember(dm, group, n, comms[d], 0);
  }
  if (r) mpu_device_mesh_free(dm);
  else *out = dm;
out:
  mpu_mesh_free(mesh);
  free(all);
  free(ranks);
  free(group);
  free(theirs);
  return r;
}
