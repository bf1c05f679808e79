/*
 * mesh.c - the arithmetic of N-d meshes of ranks.
 *
 * A mesh lives in the linear index space 0..W-1 of the root mesh it was made
 * from (then mapped to ranks: identity, or the caller's rank list). Each dim
 * is a list of factors (size, stride) of that space, most significant first;
 * dims that a slice removed become fixed factors with one digit each. The
 * factors of a mesh and its fixed factors always partition the root's
 * mixed radix exactly, so an index decodes into digits by dividing by the
 * strides in decreasing order, and:
 *
 *   - a root mesh has one factor per dim, strides row-major;
 *   - a slice moves the dropped dims' factors to the fixed ones, with the
 *     digits of the rank it was sliced at;
 *   - a flatten concatenates the listed dims' factor lists into one dim;
 *   - a reshape cuts a dim's factor list (splitting a factor (a*b, s) into
 *     (a, s*b), (b, s) where needed).
 *
 * Nothing here is O(W) except a caller-given rank list.
 */
#include <ctype.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "mesh/mesh_internal.h"

#define MESH_MAGIC UINT64_C(0x6d70752d6d657368) /* "mpu-mesh" */

/* ---- the caller's rank list, shared by a mesh and its derived meshes ------- */

static int cmp_pair(const void *a, const void *b) {
  const int64_t *x = a, *y = b;
  return (x[0] > y[0]) - (x[0] < y[0]);
}

static void list_release(rank_list *l) {
  if (l && atomic_fetch_sub(&l->refs, 1) == 1) {
    free(l->ranks);
    free(l->by_rank);
    free(l);
  }
}

static mpu_result_t list_new(const int *ranks, int64_t n, rank_list **out) {
  rank_list *l = calloc(1, sizeof *l);
  if (l) {
    l->ranks = malloc((size_t)n * sizeof(int));
    l->by_rank = malloc((size_t)n * 2 * sizeof(int64_t));
  }
  if (!l || !l->ranks || !l->by_rank) {
    if (l) free(l->ranks), free(l->by_rank);
    free(l);
    return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_mesh_create: rank list of %lld", (long long)n);
  }
  atomic_init(&l->refs, 1);
  l->n = n;
  for (int64_t i = 0; i < n; i++) {
    if (ranks[i] < 0) {
      list_release(l);
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_mesh_create: ranks[%lld] = %d is negative",
                        (long long)i, ranks[i]);
    }
    l->ranks[i] = ranks[i];
    l->by_rank[2 * i] = ranks[i];
    l->by_rank[2 * i + 1] = i;
  }
  qsort(l->by_rank, (size_t)n, 2 * sizeof(int64_t), cmp_pair);
  for (int64_t i = 1; i < n; i++)
    if (l->by_rank[2 * i] == l->by_rank[2 * i - 2]) {
      int dup = (int)l->by_rank[2 * i];
      list_release(l);
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_mesh_create: rank %d is listed twice", dup);
    }
  *out = l;
  return MPU_SUCCESS;
}

/* Root linear index of rank, or -1 if no index maps to it. */
static int64_t index_of(const mpu_mesh *m, int rank) {
  if (rank < 0) return -1;
  if (!m->list) return rank < m->root ? rank : -1;
  int64_t lo = 0, hi = m->list->n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (m->list->by_rank[2 * mid] < rank) lo = mid + 1;
    else hi = mid;
  }
  return lo < m->list->n && m->list->by_rank[2 * lo] == rank ? m->list->by_rank[2 * lo + 1] : -1;
}

static int rank_of_index(const mpu_mesh *m, int64_t index) {
  return m->list ? m->list->ranks[index] : (int)index;
}

/* ---- factor bookkeeping ------------------------------------------------------ */

static int cmp_order(const void *a, const void *b) {
  const mesh_order *x = a, *y = b;
  return (x->stride < y->stride) - (x->stride > y->stride); /* descending */
}

/* Recompute the decoding order, offset, shape and numel from the factors. */
static void finalize(mpu_mesh *m) {
  m->norder = 0;
  m->numel = 1;
  for (int d = 0; d < m->ndim; d++) {
    int64_t size = 1;
    for (int j = 0; j < m->count[d]; j++) size *= m->factors[m->first[d] + j].size;
    m->shape[d] = size;
    m->numel *= size;
  }
  for (int f = 0; f < m->nfactors; f++)
    m->order[m->norder++] = (mesh_order){m->factors[f].size, m->factors[f].stride, f, 0};
  m->offset = 0;
  for (int f = 0; f < m->nfixed; f++) {
    m->order[m->norder++] = (mesh_order){m->fixed[f].size, m->fixed[f].stride, f, 1};
    m->offset += m->fixed_digit[f] * m->fixed[f].stride;
  }
  qsort(m->order, (size_t)m->norder, sizeof m->order[0], cmp_order);
}

/* Digits (one per factor) of root index L; 0 if L is outside the mesh (a
 * fixed digit differs). */
static int decode(const mpu_mesh *m, int64_t L, int64_t *digits) {
  for (int i = 0; i < m->norder; i++) {
    const mesh_order *o = &m->order[i];
    int64_t d = L / o->stride;
    L %= o->stride;
    if (o->fixed) {
      if (d != m->fixed_digit[o->index]) return 0;
    } else {
      digits[o->index] = d;
    }
  }
  return 1;
}

static int64_t coord_of(const mpu_mesh *m, const int64_t *digits, int d) {
  int64_t c = 0;
  for (int j = 0; j < m->count[d]; j++) {
    int f = m->first[d] + j;
    c = c * m->factors[f].size + digits[f];
  }
  return c;
}

/* Root index contribution of coordinate c along dim d. */
static int64_t index_along(const mpu_mesh *m, int d, int64_t c) {
  int64_t L = 0;
  for (int j = m->count[d] - 1; j >= 0; j--) {
    const mesh_factor *f = &m->factors[m->first[d] + j];
    L += (c % f->size) * f->stride;
    c /= f->size;
  }
  return L;
}

/* ---- checks --------------------------------------------------------------------- */

static mpu_result_t check_mesh(const char *fn, const mpu_mesh *m) {
  if (!m) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: mesh is NULL", fn);
  if (m->magic != MESH_MAGIC)
    return mpu__error(MPU_ERR_INVALID_USAGE, "%s: %p is not a live mesh", fn, (const void *)m);
  return MPU_SUCCESS;
}

static mpu_result_t check_dim(const char *fn, const mpu_mesh *m, int dim) {
  if (dim < 0 || dim >= m->ndim)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: dim %d is outside 0..%d", fn, dim,
                      m->ndim - 1);
  return MPU_SUCCESS;
}

/* dims[0..n-1]: valid and distinct; n in 1..ndim. */
static mpu_result_t check_dims(const char *fn, const mpu_mesh *m, const int *dims, int n) {
  if (!dims || n < 1 || n > m->ndim)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d dims (want 1..%d and a list)", fn, n,
                      m->ndim);
  for (int i = 0; i < n; i++) {
    MPU_CHECK(check_dim(fn, m, dims[i]));
    for (int j = 0; j < i; j++)
      if (dims[j] == dims[i])
        return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: dim %d is listed twice", fn, dims[i]);
  }
  return MPU_SUCCESS;
}

static mpu_result_t check_name(const char *fn, const char *name) {
  if (!name || !*name)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: a dim name is empty", fn);
  size_t len = strlen(name);
  if (len > MPU_MESH_NAME_MAX)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: dim name '%.40s...' is longer than %d", fn,
                      name, MPU_MESH_NAME_MAX);
  for (size_t i = 0; i < len; i++)
    if (!isalnum((unsigned char)name[i]) && name[i] != '_')
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: dim name '%s' has '%c' (use letters, digits and _)", fn, name,
                        name[i]);
  return MPU_SUCCESS;
}

/* Names of a finished mesh: non-empty ones distinct. */
static mpu_result_t check_unique_names(const char *fn, const mpu_mesh *m) {
  for (int i = 0; i < m->ndim; i++)
    for (int j = 0; j < i; j++)
      if (m->names[i][0] && !strcmp(m->names[i], m->names[j]))
        return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: dim name '%s' is used twice", fn,
                          m->names[i]);
  return MPU_SUCCESS;
}

/* Root index of rank, which must be in the mesh; fills digits. */
static mpu_result_t locate(const char *fn, const mpu_mesh *m, int rank, int64_t *digits) {
  int64_t L = index_of(m, rank);
  if (L < 0 || !decode(m, L, digits)) {
    char desc[160];
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: rank %d is not in the mesh %s", fn, rank,
                      mpu_mesh_describe(m, desc, sizeof desc));
  }
  return MPU_SUCCESS;
}

/* ---- making meshes ---------------------------------------------------------------- */

static mpu_mesh *mesh_clone(const mpu_mesh *m) {
  mpu_mesh *c = malloc(sizeof *c);
  if (!c) return NULL;
  *c = *m;
  if (c->list) atomic_fetch_add(&c->list->refs, 1);
  return c;
}

void mpu_mesh_free(mpu_mesh *m) {
  if (!m || m->magic != MESH_MAGIC) return;
  m->magic = 0;
  list_release(m->list);
  free(m);
}

mpu_result_t mpu_mesh_create(int ndim, const int64_t *shape, const char *const *names,
                             const int *ranks, mpu_mesh **out) {
  static const char fn[] = "mpu_mesh_create";
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  if (ndim < 1 || ndim > MPU_MESH_MAX_DIMS || !shape)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d dims (want 1..%d and a shape)", fn, ndim,
                      MPU_MESH_MAX_DIMS);
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 1)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: shape[%d] = %lld (want >= 1)", fn, d,
                        (long long)shape[d]);
    if (shape[d] > INT32_MAX || (numel *= shape[d]) > INT32_MAX)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "%s: the mesh has more than %d ranks (at shape[%d] = %lld)", fn,
                        INT32_MAX, d, (long long)shape[d]);
  }
  mpu_mesh *m = calloc(1, sizeof *m);
  if (!m) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  m->magic = MESH_MAGIC;
  m->ndim = ndim;
  m->root = numel;
  int64_t stride = numel;
  for (int d = 0; d < ndim; d++) {
    stride /= shape[d];
    m->first[d] = d;
    m->count[d] = 1;
    m->factors[d] = (mesh_factor){shape[d], stride};
    if (names) {
      mpu_result_t r = check_name(fn, names[d]);
      if (r) {
        free(m);
        return r;
      }
      snprintf(m->names[d], sizeof m->names[d], "%s", names[d]);
    }
  }
  m->nfactors = ndim;
  finalize(m);
  mpu_result_t r = check_unique_names(fn, m);
  if (!r && ranks) r = list_new(ranks, numel, &m->list);
  if (r) {
    free(m);
    return r;
  }
  *out = m;
  return MPU_SUCCESS;
}

/* A new mesh with m's fixed factors and root, and no dims yet. */
static mpu_mesh *derived(const mpu_mesh *m) {
  mpu_mesh *c = mesh_clone(m);
  if (c) {
    c->ndim = 0;
    c->nfactors = 0;
  }
  return c;
}

/* Append a dim to c with m's factors factors[first..first+count). */
static mpu_result_t add_dim(mpu_mesh *c, const char *name, const mesh_factor *factors, int count) {
  if (c->nfactors + count + c->nfixed > MESH_MAX_FACTORS)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mesh: more than %d factors (too many reshapes)",
                      MESH_MAX_FACTORS);
  int d = c->ndim++;
  c->first[d] = c->nfactors;
  c->count[d] = count;
  for (int j = 0; j < count; j++) c->factors[c->nfactors++] = factors[j];
  snprintf(c->names[d], sizeof c->names[d], "%s", name ? name : "");
  return MPU_SUCCESS;
}

static mpu_result_t finish(const char *fn, mpu_mesh *c, mpu_mesh **out) {
  finalize(c);
  mpu_result_t r = check_unique_names(fn, c);
  if (r) {
    mpu_mesh_free(c);
    return r;
  }
  *out = c;
  return MPU_SUCCESS;
}

mpu_result_t mpu_mesh_slice(const mpu_mesh *m, int rank, const int *dims, int ndims,
                            mpu_mesh **out) {
  static const char fn[] = "mpu_mesh_slice";
  int64_t digits[MESH_MAX_FACTORS];
  MPU_CHECK(check_mesh(fn, m));
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  MPU_CHECK(check_dims(fn, m, dims, ndims));
  MPU_CHECK(locate(fn, m, rank, digits));
  mpu_mesh *c = derived(m);
  if (!c) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  for (int i = 0; i < ndims; i++)
    add_dim(c, m->names[dims[i]], &m->factors[m->first[dims[i]]], m->count[dims[i]]);
  for (int d = 0; d < m->ndim; d++) { /* dims not kept: fixed at this rank's digits */
    int kept = 0;
    for (int i = 0; i < ndims; i++) kept |= dims[i] == d;
    for (int j = 0; !kept && j < m->count[d]; j++) {
      int f = m->first[d] + j;
      c->fixed[c->nfixed] = m->factors[f];
      c->fixed_digit[c->nfixed++] = digits[f];
    }
  }
  return finish(fn, c, out);
}

mpu_result_t mpu_mesh_slice_names(const mpu_mesh *m, int rank, const char *const *names, int n,
                                  mpu_mesh **out) {
  int dims[MPU_MESH_MAX_DIMS];
  MPU_CHECK(check_mesh("mpu_mesh_slice_names", m));
  if (n < 1 || n > m->ndim)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_mesh_slice_names: %d names (want 1..%d)", n,
                      m->ndim);
  MPU_CHECK(mpu_mesh_dims_of(m, names, n, dims));
  return mpu_mesh_slice(m, rank, dims, n, out);
}

mpu_result_t mpu_mesh_flatten(const mpu_mesh *m, const int *dims, int ndims, const char *name,
                              mpu_mesh **out) {
  static const char fn[] = "mpu_mesh_flatten";
  MPU_CHECK(check_mesh(fn, m));
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  MPU_CHECK(check_dims(fn, m, dims, ndims));
  MPU_CHECK(check_name(fn, name));
  mpu_mesh *c = derived(m);
  if (!c) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  mpu_result_t r = MPU_SUCCESS;
  for (int d = 0; d < m->ndim && !r; d++) {
    int listed = 0;
    for (int i = 0; i < ndims; i++) listed |= dims[i] == d;
    if (!listed) {
      r = add_dim(c, m->names[d], &m->factors[m->first[d]], m->count[d]);
    } else if (d == dims[0]) {
      mesh_factor merged[MESH_MAX_FACTORS];
      int count = 0;
      for (int i = 0; i < ndims; i++)
        for (int j = 0; j < m->count[dims[i]]; j++)
          merged[count++] = m->factors[m->first[dims[i]] + j];
      r = add_dim(c, name, merged, count);
    }
  }
  /* (the other listed dims are part of the flattened one) */
  if (r) {
    mpu_mesh_free(c);
    return r;
  }
  return finish(fn, c, out);
}

mpu_result_t mpu_mesh_reshape_dim(const mpu_mesh *m, int dim, int nparts, const int64_t *sizes,
                                  const char *const *names, mpu_mesh **out) {
  static const char fn[] = "mpu_mesh_reshape_dim";
  MPU_CHECK(check_mesh(fn, m));
  if (!out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
  MPU_CHECK(check_dim(fn, m, dim));
  if (nparts < 1 || !sizes || m->ndim - 1 + nparts > MPU_MESH_MAX_DIMS)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d parts (the mesh may have at most %d dims)",
                      fn, nparts, MPU_MESH_MAX_DIMS);
  int64_t product = 1;
  for (int p = 0; p < nparts; p++) {
    if (sizes[p] < 1)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: sizes[%d] = %lld (want >= 1)", fn, p,
                        (long long)sizes[p]);
    if ((product *= sizes[p]) > m->shape[dim]) break;
    if (names) MPU_CHECK(check_name(fn, names[p]));
  }
  if (product != m->shape[dim])
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: the sizes multiply to %lld, but dim %d has size %lld", fn,
                      (long long)product, dim, (long long)m->shape[dim]);
  /* cut dim's factors (most significant first) into parts of the given sizes */
  mesh_factor pieces[MPU_MESH_MAX_DIMS][MESH_MAX_FACTORS];
  int npieces[MPU_MESH_MAX_DIMS] = {0};
  int f = m->first[dim], end = m->first[dim] + m->count[dim];
  mesh_factor cur = f < end ? m->factors[f] : (mesh_factor){1, 1};
  for (int p = 0; p < nparts; p++) {
    int64_t need = sizes[p];
    while (need > 1) {
      if (cur.size == 1) {
        cur = m->factors[++f]; /* exists: the sizes multiply to the dim's size */
        continue;
      }
      if (need % cur.size == 0) { /* take the whole factor */
        pieces[p][npieces[p]++] = cur;
        need /= cur.size;
        cur.size = 1;
      } else if (cur.size % need == 0) { /* take its top part */
        int64_t rest = cur.size / need;
        pieces[p][npieces[p]++] = (mesh_factor){need, cur.stride * rest};
        cur.size = rest;
        need = 1;
      } else {
        return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                          "%s: dim %d cannot be cut as asked: part %d of size %lld straddles a "
                          "factor of size %lld",
                          fn, dim, p, (long long)sizes[p], (long long)cur.size);
      }
    }
  }
  mpu_mesh *c = derived(m);
  if (!c) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  mpu_result_t r = MPU_SUCCESS;
  for (int d = 0; d < m->ndim && !r; d++) {
    if (d != dim) {
      r = add_dim(c, m->names[d], &m->factors[m->first[d]], m->count[d]);
      continue;
    }
    for (int p = 0; p < nparts && !r; p++) r = add_dim(c, names ? names[p] : "", pieces[p], npieces[p]);
  }
  if (r) {
    mpu_mesh_free(c);
    return r;
  }
  return finish(fn, c, out);
}

/* ---- queries ---------------------------------------------------------------------- */

int mpu_mesh_ndim(const mpu_mesh *m) { return m && m->magic == MESH_MAGIC ? m->ndim : 0; }

int64_t mpu_mesh_numel(const mpu_mesh *m) {
  return m && m->magic == MESH_MAGIC ? m->numel : 0;
}

mpu_result_t mpu_mesh_dim_size(const mpu_mesh *m, int dim, int64_t *size) {
  MPU_CHECK(check_mesh("mpu_mesh_dim_size", m));
  MPU_CHECK(check_dim("mpu_mesh_dim_size", m, dim));
  if (!size) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_mesh_dim_size: size is NULL");
  *size = m->shape[dim];
  return MPU_SUCCESS;
}

const char *mpu_mesh_dim_name(const mpu_mesh *m, int dim) {
  if (!m || m->magic != MESH_MAGIC || dim < 0 || dim >= m->ndim) return "";
  return m->names[dim];
}

mpu_result_t mpu_mesh_dim_index(const mpu_mesh *m, const char *name, int *dim) {
  MPU_CHECK(check_mesh("mpu_mesh_dim_index", m));
  if (!name || !dim) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_mesh_dim_index: NULL");
  for (int d = 0; d < m->ndim; d++)
    if (m->names[d][0] && !strcmp(m->names[d], name)) return *dim = d, MPU_SUCCESS;
  char desc[160];
  return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mesh %s has no dim named '%s'",
                    mpu_mesh_describe(m, desc, sizeof desc), name);
}

mpu_result_t mpu_mesh_dims_of(const mpu_mesh *m, const char *const *names, int n, int *dims) {
  MPU_CHECK(check_mesh("mpu_mesh_dims_of", m));
  if (!names || !dims || n < 0)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_mesh_dims_of: NULL or negative count");
  for (int i = 0; i < n; i++) MPU_CHECK(mpu_mesh_dim_index(m, names[i], &dims[i]));
  return MPU_SUCCESS;
}

size_t mpu_mesh_memory(const mpu_mesh *m) {
  if (!m || m->magic != MESH_MAGIC) return 0;
  size_t bytes = sizeof *m;
  if (m->list)
    bytes += sizeof *m->list + (size_t)m->list->n * (sizeof(int) + 2 * sizeof(int64_t));
  return bytes;
}

int mpu_mesh_contains(const mpu_mesh *m, int rank) {
  int64_t digits[MESH_MAX_FACTORS];
  if (!m || m->magic != MESH_MAGIC) return 0;
  int64_t L = index_of(m, rank);
  return L >= 0 && decode(m, L, digits);
}

mpu_result_t mpu_mesh_coords(const mpu_mesh *m, int rank, int64_t *coords) {
  int64_t digits[MESH_MAX_FACTORS];
  MPU_CHECK(check_mesh("mpu_mesh_coords", m));
  if (!coords) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_mesh_coords: coords is NULL");
  MPU_CHECK(locate("mpu_mesh_coords", m, rank, digits));
  for (int d = 0; d < m->ndim; d++) coords[d] = coord_of(m, digits, d);
  return MPU_SUCCESS;
}

mpu_result_t mpu_mesh_local_rank(const mpu_mesh *m, int rank, int dim, int64_t *local) {
  int64_t digits[MESH_MAX_FACTORS];
  MPU_CHECK(check_mesh("mpu_mesh_local_rank", m));
  MPU_CHECK(check_dim("mpu_mesh_local_rank", m, dim));
  if (!local) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_mesh_local_rank: local is NULL");
  MPU_CHECK(locate("mpu_mesh_local_rank", m, rank, digits));
  *local = coord_of(m, digits, dim);
  return MPU_SUCCESS;
}

mpu_result_t mpu_mesh_rank_at(const mpu_mesh *m, const int64_t *coords, int *rank) {
  MPU_CHECK(check_mesh("mpu_mesh_rank_at", m));
  if (!coords || !rank) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_mesh_rank_at: NULL");
  int64_t L = m->offset;
  for (int d = 0; d < m->ndim; d++) {
    if (coords[d] < 0 || coords[d] >= m->shape[d])
      return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                        "mpu_mesh_rank_at: coordinate %lld along dim %d ('%s') is outside 0..%lld",
                        (long long)coords[d], d, m->names[d], (long long)m->shape[d] - 1);
    L += index_along(m, d, coords[d]);
  }
  *rank = rank_of_index(m, L);
  return MPU_SUCCESS;
}

/* Root index of the group member number k (row-major over dims as listed). */
static int64_t member_index(const mpu_mesh *m, int64_t base, const int *dims, int ndims,
                            int64_t k) {
  for (int i = ndims - 1; i >= 0; i--) {
    int64_t size = m->shape[dims[i]];
    base += index_along(m, dims[i], k % size);
    k /= size;
  }
  return base;
}

static int64_t group_size(const mpu_mesh *m, const int *dims, int ndims) {
  int64_t g = 1;
  for (int i = 0; i < ndims; i++) g *= m->shape[dims[i]];
  return g;
}

mpu_result_t mpu_mesh_group(const mpu_mesh *m, int rank, const int *dims, int ndims, int *out,
                            size_t cap, int64_t *n) {
  static const char fn[] = "mpu_mesh_group";
  int64_t digits[MESH_MAX_FACTORS];
  MPU_CHECK(check_mesh(fn, m));
  MPU_CHECK(check_dims(fn, m, dims, ndims));
  MPU_CHECK(locate(fn, m, rank, digits));
  int64_t g = group_size(m, dims, ndims);
  if (n) *n = g;
  if (!out || cap < (size_t)g)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: the group has %lld ranks, out holds %zu", fn,
                      (long long)g, out ? cap : 0);
  /* base: rank's index with its coordinates along dims taken out */
  int64_t base = index_of(m, rank);
  for (int i = 0; i < ndims; i++)
    base -= index_along(m, dims[i], coord_of(m, digits, dims[i]));
  for (int64_t k = 0; k < g; k++) out[k] = rank_of_index(m, member_index(m, base, dims, ndims, k));
  return MPU_SUCCESS;
}

mpu_result_t mpu_mesh_groups(const mpu_mesh *m, const int *dims, int ndims, int *out, size_t cap,
                             int64_t *ngroups, int64_t *gsize) {
  static const char fn[] = "mpu_mesh_groups";
  MPU_CHECK(check_mesh(fn, m));
  MPU_CHECK(check_dims(fn, m, dims, ndims));
  int64_t g = group_size(m, dims, ndims), count = m->numel / g;
  if (ngroups) *ngroups = count;
  if (gsize) *gsize = g;
  if (!out || cap < (size_t)m->numel)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %lld groups of %lld need %lld slots, out holds %zu",
                      fn, (long long)count, (long long)g, (long long)m->numel, out ? cap : 0);
  int others[MPU_MESH_MAX_DIMS], nothers = 0;
  for (int d = 0; d < m->ndim; d++) {
    int listed = 0;
    for (int i = 0; i < ndims; i++) listed |= dims[i] == d;
    if (!listed) others[nothers++] = d;
  }
  for (int64_t grp = 0; grp < count; grp++) {
    int64_t base = member_index(m, m->offset, others, nothers, grp);
    for (int64_t k = 0; k < g; k++)
      out[grp * g + k] = rank_of_index(m, member_index(m, base, dims, ndims, k));
  }
  return MPU_SUCCESS;
}

char *mpu_mesh_describe(const mpu_mesh *m, char *buf, size_t len) {
  if (!buf || !len) return buf;
  if (!m || m->magic != MESH_MAGIC) {
    snprintf(buf, len, "(invalid mesh)");
    return buf;
  }
  size_t used = (size_t)snprintf(buf, len, "(");
  for (int d = 0; d < m->ndim && used < len; d++)
    used += (size_t)snprintf(buf + used, len - used, "%s%s%s%lld", d ? ", " : "", m->names[d],
                             m->names[d][0] ? "=" : "", (long long)m->shape[d]);
  if (used < len) snprintf(buf + used, len - used, ")");
  return buf;
}
