/*
 * plan_bench.c - `mpu plan --bench`: the cost of setting a layout up, every
 * rank creating every group it belongs to.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "mpu.h"
#include "plan.h"
#include "plan_names.h"

static double now_us(void) { return cli_now() * 1e6; }

typedef struct init_bench {
  mpu_layout_config cfg;
  int megatron_way;
  double us; /* rank 0's time between two barriers around the initialisation */
} init_bench;

/* Megatron's way: every rank walks every group of every kind; members create
 * it, and as torch's new_group is collective over the whole world, everyone
 * then meets at a world barrier. */
static mpu_result_t every_rank_every_group(mpu_comm *world, const mpu_layout *l, int rank,
                                           mpu_comm **made, int *nmade) {
  int W = mpu_layout_config_of(l)->world_size, *m = malloc(((size_t)W + 3) * sizeof(int)), n,
      count;
  mpu_result_t r = m ? MPU_SUCCESS : MPU_ERR_OUT_OF_MEMORY;
  for (int k = 0; k < MPU_GROUP_KIND_COUNT && !r; k++) {
    if (!mpu_layout_has(l, (mpu_group_kind)k)) continue;
    mpu_layout_num_groups(l, (mpu_group_kind)k, &count);
    for (int g = 0; g < count && !r; g++) {
      mpu_layout_group_at(l, (mpu_group_kind)k, g, m, (size_t)W + 3, &n);
      for (int i = 0; i < n && !r; i++)
        if (m[i] == rank) r = mpu_comm_create_group(world, m, n, &made[(*nmade)++]);
      if (!r) r = mpu_comm_barrier(world);
    }
  }
  free(m);
  return r;
}

static mpu_result_t init_rank(mpu_comm *world, void *arg) {
  init_bench *b = arg;
  int rank;
  mpu_comm_rank(world, &rank);
  mpu_state *s = NULL;
  mpu_comm *made[64];
  int nmade = 0;
  mpu_layout *l = NULL;
  mpu_result_t r = mpu_layout_create(&b->cfg, &l);
  if (r) return r;
  mpu_comm_barrier(world);
  double t0 = now_us();
  r = b->megatron_way ? every_rank_every_group(world, l, rank, made, &nmade)
                      : mpu_state_init(world, &b->cfg, &s);
  if (!r) r = mpu_comm_barrier(world);
  if (rank == 0) b->us = now_us() - t0;
  for (int i = 0; i < nmade; i++) mpu_comm_destroy(made[i]);
  mpu_state_destroy(s);
  mpu_layout_free(l);
  return r;
}

int plan_bench(cli_format format) {
  static const char *const rows_text[2][2] = {{"W 4096, tp 8, pp 8, fp8", "W 1048576, tp 8, pp 8, fp8"},
                                              {"W 4096, tp 8, pp 8, cp 2, ep 4",
                                               "W 1048576, tp 8, pp 8, cp 2, ep 4"}};
  double info_us[2][2], mock_us[2][2], init_us[2][2];
  for (int f = 0; f < 2; f++)
    for (int big = 0; big < 2; big++) {
      mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
      c.flavor = f ? MPU_FLAVOR_CORE : MPU_FLAVOR_DEEPSPEED;
      c.world_size = big ? 1 << 20 : 4096;
      c.tp = 8, c.pp = 8;
      if (f) c.cp = 2, c.ep = 4;
      else c.fp8 = 1;
      mpu_layout *l;
      if (mpu_layout_create(&c, &l)) plan_fail("layout");
      mpu_rank_info info = MPU_RANK_INFO_INIT;
      int iters = 20000;
      double t0 = now_us();
      for (int i = 0; i < iters; i++)
        if (mpu_layout_rank_info(l, c.world_size - 1 - (i & 7), &info)) plan_fail("rank info");
      info_us[f][big] = (now_us() - t0) / iters;
      mpu_layout_free(l);
    }
  for (int f = 0; f < 2; f++)
    for (int w = 0; w < 2; w++) {
      mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
      c.flavor = f ? MPU_FLAVOR_CORE : MPU_FLAVOR_DEEPSPEED;
      c.world_size = w ? 1 << 24 : 1 << 20;
      c.tp = 8, c.pp = 8;
      if (f) c.cp = 2, c.ep = 4;
      double best = 1e30;
      for (int rep = 0; rep < 5; rep++) {
        mpu_state *st;
        double t0 = now_us();
        if (mpu_state_mock(c.world_size - 1, &c, 1, &st)) plan_fail("mpu_state_mock");
        double t = now_us() - t0;
        mpu_state_destroy(st);
        best = t < best ? t : best;
      }
      mock_us[f][w] = best;
    }
  for (int f = 0; f < 2; f++) {
    double t[2][5];
    for (int way = 0; way < 2; way++)
      for (int rep = 0; rep < 5; rep++) {
        init_bench b = {MPU_LAYOUT_CONFIG_INIT, way, 0};
        b.cfg.flavor = f ? MPU_FLAVOR_CORE : MPU_FLAVOR_DEEPSPEED;
        b.cfg.world_size = 64, b.cfg.tp = 4, b.cfg.pp = 4;
        if (mpu_launch(64, init_rank, &b, NULL, NULL)) plan_fail("init bench");
        t[way][rep] = b.us;
        cli_progress_share((f * 10 + way * 5 + rep + 1) / 20.0);
        cli_progress("mpu plan --bench: state initialisation %d/20", f * 10 + way * 5 + rep + 1);
      }
    for (int way = 0; way < 2; way++) { /* median of 5 */
      for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
          if (t[way][j] < t[way][i]) {
            double x = t[way][i];
            t[way][i] = t[way][j];
            t[way][j] = x;
          }
      init_us[f][way] = t[way][2];
    }
  }
  cli_progress_done();
  static const char *const mock_text[2][2] = {{"W 1048576, tp 8, pp 8, dp only", "W 16777216, tp 8, pp 8, dp only"},
                                              {"W 1048576, tp 8, pp 8, cp 2, ep 4",
                                               "W 16777216, tp 8, pp 8, cp 2, ep 4"}};
  const char *flavor[2] = {mpu_flavor_name(MPU_FLAVOR_DEEPSPEED), mpu_flavor_name(MPU_FLAVOR_CORE)};
  if (format == CLI_JSON) {
    printf("{\"rank_info_us\": [");
    for (int f = 0; f < 2; f++)
      for (int b = 0; b < 2; b++)
        printf("%s\n  {\"flavor\": \"%s\", \"layout\": \"%s\", \"us\": %.4g}", f || b ? "," : "",
               flavor[f], rows_text[f][b], info_us[f][b]);
    printf("],\n \"state_mock_us\": [");
    for (int f = 0; f < 2; f++)
      for (int w = 0; w < 2; w++)
        printf("%s\n  {\"flavor\": \"%s\", \"layout\": \"%s\", \"us\": %.4g}", f || w ? "," : "",
               flavor[f], mock_text[f][w], mock_us[f][w]);
    printf("],\n \"state_init_64_ranks_us\": [");
    for (int f = 0; f < 2; f++)
      printf("%s\n  {\"flavor\": \"%s\", \"layout\": \"tp 4, pp 4, dp 4\", \"members_only\": "
             "%.4g, \"every_rank_every_group\": %.4g}", f ? "," : "", flavor[f], init_us[f][0],
             init_us[f][1]);
    printf("]}\n");
    return 0;
  }
  printf("# mpu plan --bench: one rank's groups and getters (mpu_layout_rank_info), mean of "
         "repeated calls for the last rank\n");
  printf("  %-10s %-44s %12s\n", "flavour", "layout", "time");
  for (int f = 0; f < 2; f++)
    for (int b = 0; b < 2; b++)
      printf("  %-10s %-44s %9.2f us\n", flavor[f], rows_text[f][b], info_us[f][b]);
  printf("\n# one rank's whole parallel state on the fake backend (mpu_state_mock: every group a\n"
         "# communicator, made from its description), best of 5, last rank\n");
  for (int f = 0; f < 2; f++)
    for (int w = 0; w < 2; w++)
      printf("  %-10s %-44s %9.2f us\n", flavor[f], mock_text[f][w], mock_us[f][w]);
  printf("\n# initialising the parallel state of 64 thread ranks (tp 4, pp 4, dp 4), threads "
         "backend,\n# rank 0's time between barriers, median of 5\n");
  for (int f = 0; f < 2; f++)
    printf("  %-10s mpu (members only) %10.0f us   every rank every group %10.0f us   (%.1fx)\n",
           flavor[f], init_us[f][0], init_us[f][1], init_us[f][1] / init_us[f][0]);
  return 0;
}
