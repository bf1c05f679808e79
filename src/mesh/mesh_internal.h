/*
 * mesh_internal.h - the representation of a mesh (see mesh.c for why it is
 * made of factors).
 */
#ifndef MPU_MESH_INTERNAL_H
#define MPU_MESH_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "mpu/mesh.h"

#define MESH_MAX_FACTORS 24

/* size digits, each worth `stride` in the root's linear index space */
typedef struct mesh_factor {
  int64_t size, stride;
} mesh_factor;

/* a factor in decoding order (strides decreasing) */
typedef struct mesh_order {
  int64_t size, stride;
  int index; /* into factors[] or fixed[] */
  int fixed;
} mesh_order;

/* The caller's rank list: rank of each root index, and (rank, index) pairs
 * sorted by rank for the way back. Shared by derived meshes. */
typedef struct rank_list {
  _Atomic int refs;
  int64_t n;
  int *ranks;
  int64_t *by_rank;
} rank_list;

struct mpu_mesh {
  uint64_t magic;
  int ndim;
  int64_t shape[MPU_MESH_MAX_DIMS];
  char names[MPU_MESH_MAX_DIMS][MPU_MESH_NAME_MAX + 1];
  int first[MPU_MESH_MAX_DIMS], count[MPU_MESH_MAX_DIMS]; /* dim d: factors[first..first+count) */
  int nfactors;
  mesh_factor factors[MESH_MAX_FACTORS];
  int nfixed; /* dims a slice removed, at the digits of the rank it was sliced at */
  mesh_factor fixed[MESH_MAX_FACTORS];
  int64_t fixed_digit[MESH_MAX_FACTORS];
  int norder;
  mesh_order order[2 * MESH_MAX_FACTORS];
  int64_t offset; /* root index of coordinate (0, ..., 0) */
  int64_t root;   /* ranks in the root mesh */
  int64_t numel;  /* ranks in this mesh */
  rank_list *list; /* NULL: rank = root index */
};

/* The communicator a device mesh is laid over (mpu_device_mesh_init's or
 * from_comms' comm): what the memory of its groups' calls is. */
mpu_comm *mpu__device_mesh_base(const mpu_device_mesh *dm);

#endif
