/*
 * layout_internal.h - what layout_create.c (the checks and the rank
 * generators) and layout.c (the queries) share.
 */
#ifndef MPU_STATE_LAYOUT_INTERNAL_H
#define MPU_STATE_LAYOUT_INTERNAL_H

#include "mpu/layout.h"
#include "mpu/mesh.h"

#define NTOKENS 5

struct mpu_layout {
  mpu_layout_config cfg;
  int dp;
  /* core flavours: the grid is ranks offset .. offset + grid - 1 of the
   * world (core: offset 0, grid = world) */
  int grid, offset;
  int etp, edp;                 /* core-0.19: expert tensor and data parallel sizes */
  int intra_dp_cp, intra_edp;   /* core-0.19: a distributed-optimizer instance's share */
  /* The rank generators as meshes whose dims are the order's tokens
   * reversed (first token = fastest = last dim). core: wo_ep counts ep
   * within dp, w_ep apart from it; core-0.19: wo_ep is the dense generator
   * (tp, cp, dp, pp) and w_ep the expert one (etp, ep, expert dp, pp). */
  int ntok_wo, ntok_w;
  char tok_wo[NTOKENS][3], tok_w[NTOKENS][3];
  mpu_mesh *wo_ep, *w_ep;
};

#endif
