/*
 * mpu/mesh.h - an N-d mesh of ranks with named dims (PyTorch's DeviceMesh),
 * and the communicators of its groups.
 *
 * The mesh itself is arithmetic with no communication: a shape of up to eight
 * dims, optional unique names, over the ranks 0..W-1 laid out row-major (or
 * over a rank list the caller gives). Every query answers for one rank in
 * O(dims) or O(group size), with no per-world tables, so a mesh of a million
 * ranks holds a few hundred bytes.
 *
 *   shape (2, 4), names ("replicate", "shard"):
 *
 *              shard 0  1  2  3
 *   replicate 0      0  1  2  3      group along "shard" of rank 5: 4 5 6 7
 *             1      4  5  6  7      group along "replicate" of rank 5: 1 5
 *
 * Sub-meshes: a slice keeps some dims (in the order asked) and fixes the
 * others at a given rank's coordinates (PyTorch's mesh["a", "b"]); a flatten
 * replaces several dims by one (PyTorch's _flatten: "dp", "cp" -> "dp_cp");
 * a reshape splits one dim into several ("dp" -> "dp_outer", "dp_inner").
 * Derived meshes are independent objects: free each with mpu_mesh_free.
 *
 * The device mesh (mpu_device_mesh) adds communicators: for the group along
 * any dims that contains this rank, created with mpu_comm_create_group among
 * that group's members only, up front or on first use.
 */
#ifndef MPU_MESH_H
#define MPU_MESH_H

#include <stddef.h>
#include <stdint.h>

#include "mpu/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPU_MESH_MAX_DIMS 8
#define MPU_MESH_NAME_MAX 31 /* characters in a dim name */

typedef struct mpu_mesh mpu_mesh;

/*
 * A mesh of the given shape (ndim 1..8, each size >= 1, product <= INT_MAX).
 * names: NULL (unnamed dims) or ndim distinct non-empty names of letters,
 * digits and '_'. ranks: NULL for 0..W-1 row-major, or W distinct ranks >= 0
 * in row-major order of the mesh (copied). On error *out is unchanged and the
 * message names the offending value.
 */
MPU_API mpu_result_t mpu_mesh_create(int ndim, const int64_t *shape, const char *const *names,
                                     const int *ranks, mpu_mesh **out);

/* Free a mesh (NULL is accepted). */
MPU_API void mpu_mesh_free(mpu_mesh *mesh);

MPU_API int mpu_mesh_ndim(const mpu_mesh *mesh);              /* 0 for NULL */
MPU_API int64_t mpu_mesh_numel(const mpu_mesh *mesh);         /* ranks in the mesh */
MPU_API mpu_result_t mpu_mesh_dim_size(const mpu_mesh *mesh, int dim, int64_t *size);
MPU_API const char *mpu_mesh_dim_name(const mpu_mesh *mesh, int dim); /* "" if unnamed */

/* Index of the dim called name. */
MPU_API mpu_result_t mpu_mesh_dim_index(const mpu_mesh *mesh, const char *name, int *dim);

/* Bytes the mesh holds (independent of the number of ranks unless it was
 * given an explicit rank list). */
MPU_API size_t mpu_mesh_memory(const mpu_mesh *mesh);

/* Is rank in the mesh? */
MPU_API int mpu_mesh_contains(const mpu_mesh *mesh, int rank);

/* coords[0..ndim-1] of rank. MPU_ERR_INVALID_ARGUMENT if rank is not in the mesh. */
MPU_API mpu_result_t mpu_mesh_coords(const mpu_mesh *mesh, int rank, int64_t *coords);

/* rank's coordinate along dim: its rank in the group along dim
 * (PyTorch's get_local_rank). */
MPU_API mpu_result_t mpu_mesh_local_rank(const mpu_mesh *mesh, int rank, int dim,
                                         int64_t *local);

/* The rank at coords[0..ndim-1]. */
MPU_API mpu_result_t mpu_mesh_rank_at(const mpu_mesh *mesh, const int64_t *coords, int *rank);

/*
 * The group along dims[0..ndims-1] (distinct) that contains rank: the ranks
 * whose coordinates differ from rank's only along those dims, in row-major
 * order of those dims as listed. out must hold the group size (the product of
 * those dims' sizes; *n receives it); cap is out's length.
 */
MPU_API mpu_result_t mpu_mesh_group(const mpu_mesh *mesh, int rank, const int *dims, int ndims,
                                    int *out, size_t cap, int64_t *n);

/*
 * Every group along dims: *ngroups groups of *group_size ranks, group g at
 * out[g * group_size], groups ordered row-major by the other dims'
 * coordinates. out must hold numel ranks.
 */
MPU_API mpu_result_t mpu_mesh_groups(const mpu_mesh *mesh, const int *dims, int ndims, int *out,
                                     size_t cap, int64_t *ngroups, int64_t *group_size);

/* Look names up: dims[i] = index of names[i]. */
MPU_API mpu_result_t mpu_mesh_dims_of(const mpu_mesh *mesh, const char *const *names, int n,
                                      int *dims);

/* The sub-mesh of dims[0..ndims-1] (in that order) that contains rank. */
MPU_API mpu_result_t mpu_mesh_slice(const mpu_mesh *mesh, int rank, const int *dims, int ndims,
                                    mpu_mesh **out);

/* The same by names, as PyTorch's mesh["a", "b"]. */
MPU_API mpu_result_t mpu_mesh_slice_names(const mpu_mesh *mesh, int rank,
                                          const char *const *names, int n, mpu_mesh **out);

/* The mesh with dims[0..ndims-1] replaced by one dim called name (their
 * sizes multiplied, row-major in the order listed), placed where the first
 * listed dim was; the other dims keep their order. */
MPU_API mpu_result_t mpu_mesh_flatten(const mpu_mesh *mesh, const int *dims, int ndims,
                                      const char *name, mpu_mesh **out);

/* The mesh with dim split into nparts dims of sizes[] (their product must be
 * the dim's size; row-major: sizes[0] varies slowest) called names[]. */
MPU_API mpu_result_t mpu_mesh_reshape_dim(const mpu_mesh *mesh, int dim, int nparts,
                                          const int64_t *sizes, const char *const *names,
                                          mpu_mesh **out);

/* Write "(replicate=2, shard=4)" into buf (always terminated). Returns buf. */
MPU_API char *mpu_mesh_describe(const mpu_mesh *mesh, char *buf, size_t len);

/* ---- communicators of a mesh ---------------------------------------------- */

typedef struct mpu_device_mesh mpu_device_mesh;

typedef enum mpu_mesh_init_mode {
  MPU_MESH_LAZY = 0,  /* a group's communicator is made on first request; every member of
                         that group must request it (collective over the members) */
  MPU_MESH_EAGER = 1, /* one communicator per dim, made by mpu_device_mesh_init */
} mpu_mesh_init_mode;

/*
 * init_device_mesh: a mesh of `shape` over the ranks of comm (its product must
 * be comm's size), with a communicator for the group along each dim made now
 * (EAGER, collective over comm) or when asked for (LAZY). comm stays the
 * caller's and must outlive the device mesh.
 */
MPU_API mpu_result_t mpu_device_mesh_init(mpu_comm *comm, int ndim, const int64_t *shape,
                                          const char *const *names, mpu_mesh_init_mode mode,
                                          mpu_device_mesh **out);

/*
 * DeviceMesh.from_group: wrap existing communicators, one per dim, as a
 * device mesh. Collective over comm (whose ranks the mesh is laid over): the
 * ranks exchange their coordinates, and the communicators must form a mesh
 * (every coordinate once, and comms[d] of each rank holding exactly the ranks
 * that differ from it along d) or every rank gets MPU_ERR_INVALID_ARGUMENT.
 * The communicators stay the caller's.
 */
MPU_API mpu_result_t mpu_device_mesh_from_comms(mpu_comm *comm, int ndim, mpu_comm *const *comms,
                                                const char *const *names, mpu_device_mesh **out);

/* Destroy the communicators the device mesh made and free it (NULL accepted). */
MPU_API void mpu_device_mesh_free(mpu_device_mesh *dm);

MPU_API const mpu_mesh *mpu_device_mesh_mesh(const mpu_device_mesh *dm);
MPU_API int mpu_device_mesh_rank(const mpu_device_mesh *dm); /* this rank; -1 for NULL */

/* The communicator of this rank's group along dim (get_group(mesh_dim=...)). */
MPU_API mpu_result_t mpu_device_mesh_comm(mpu_device_mesh *dm, int dim, mpu_comm **out);
MPU_API mpu_result_t mpu_device_mesh_comm_by_name(mpu_device_mesh *dm, const char *name,
                                                  mpu_comm **out);

/*
 * The communicator of this rank's group along dims of `mesh` (NULL: the
 * device mesh's own; or a slice, flatten or reshape of it), e.g. the
 * flattened "dp_cp" dim. Made on first request (collective over the group's
 * members), then cached: the same group always gives the same communicator,
 * owned by the device mesh.
 */
MPU_API mpu_result_t mpu_device_mesh_group_comm(mpu_device_mesh *dm, const mpu_mesh *mesh,
                                                const int *dims, int ndims, mpu_comm **out);

#ifdef __cplusplus
}
#endif

#endif /* MPU_MESH_H */
