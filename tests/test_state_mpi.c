/*
 * test_state_mpi.c - the parallel state and a device mesh over the MPI
 * backend (run under mpirun with 8 processes): every group kind's
 * communicator sums exactly its members, as on thread ranks.
 */
#include <stdio.h>
#include <string.h>

#include "mpu.h"
#include "mpu/comm_mpi.h"

static int fail(int rank, const char *what) {
  fprintf(stderr, "FAILED on rank %d: %s: %s\n", rank, what, mpu_last_error());
  fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return 1;
}

/* all_reduce of world ranks over c equals the sum of members[0..n-1] */
static int sums(mpu_comm *c, int rank, const int *members, int n) {
  int64_t mine = rank, got = 0, want = 0;
  for (int i = 0; i < n; i++) want += members[i];
  if (mpu_comm_all_reduce(c, &mine, &got, 1, MPU_INT64, MPU_SUM)) return 0;
  return got == want;
}

static int check_layout(mpu_comm *world, int rank, mpu_layout_config cfg) {
  mpu_state *s = NULL;
  if (mpu_state_init(world, &cfg, &s)) return fail(rank, "state init");
  const mpu_layout *l = mpu_state_layout(s);
  int members[64], n;
  for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++) {
    if (!mpu_layout_has(l, (mpu_group_kind)k)) continue;
    if (mpu_layout_group(l, (mpu_group_kind)k, rank, members, 64, &n)) return fail(rank, "group");
    if (!n) continue;
    mpu_comm *c;
    if (mpu_state_comm(s, (mpu_group_kind)k, &c) || !sums(c, rank, members, n))
      return fail(rank, mpu_group_kind_name(cfg.flavor, (mpu_group_kind)k));
  }
  mpu_state_destroy(s);
  return 0;
}

int main(int argc, char **argv) {
  mpu_comm *world;
  if (mpu_comm_mpi_world(&argc, &argv, &world)) return fail(-1, "MPI world");
  int rank, size, passed = 0;
  mpu_comm_rank(world, &rank);
  mpu_comm_size(world, &size);
  if (size != 8) {
    if (rank == 0) fprintf(stderr, "run with 8 processes\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  mpu_layout_config ds = MPU_LAYOUT_CONFIG_INIT;
  ds.flavor = MPU_FLAVOR_DEEPSPEED, ds.world_size = 8, ds.tp = 2, ds.pp = 2, ds.fp8 = 1;
  check_layout(world, rank, ds), passed++;
  mpu_layout_config core = MPU_LAYOUT_CONFIG_INIT;
  core.world_size = 8, core.tp = 2, core.pp = 2, core.cp = 2;
  check_layout(world, rank, core), passed++;
  core.cp = 1, core.ep = 2;
  snprintf(core.order, sizeof core.order, "tp-ep-dp-pp");
  check_layout(world, rank, core), passed++;
  /* core-0.19: expert tensor parallelism, hierarchical cp, two distributed-
   * optimizer instances, gloo twins; then a grid of 4 at offset 4 */
  mpu_layout_config c19 = MPU_LAYOUT_CONFIG_INIT;
  c19.flavor = MPU_FLAVOR_CORE_019, c19.world_size = 8, c19.tp = 2, c19.pp = 2, c19.cp = 2;
  c19.ep = 2, c19.etp = 1, c19.hcp[0] = 2, c19.n_hcp = 1, c19.dist_opt_instances = 2;
  check_layout(world, rank, c19), passed++;
  mpu_layout_config grid = MPU_LAYOUT_CONFIG_INIT;
  grid.flavor = MPU_FLAVOR_CORE_019, grid.world_size = 8, grid.tp = 2;
  grid.rank_offset = 4, grid.local_world_size = 4;
  check_layout(world, rank, grid), passed++;

  /* a (2, 4) device mesh: each dim's communicator sums its group */
  const char *names[] = {"replicate", "shard"};
  int64_t shape[] = {2, 4};
  mpu_device_mesh *dm;
  if (mpu_device_mesh_init(world, 2, shape, names, MPU_MESH_EAGER, &dm)) return fail(rank, "mesh");
  for (int d = 0; d < 2; d++) {
    int g[8];
    int64_t n;
    mpu_comm *c;
    if (mpu_mesh_group(mpu_device_mesh_mesh(dm), rank, &d, 1, g, 8, &n) ||
        mpu_device_mesh_comm(dm, d, &c) || !sums(c, rank, g, (int)n))
      return fail(rank, names[d]);
  }
  mpu_device_mesh_free(dm);
  passed++;
  mpu_comm_destroy(world);
  if (rank == 0) printf("%d passed, 0 failed\n", passed);
  mpu_mpi_finalize();
  return 0;
}
