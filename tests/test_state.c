/*
 * test_state.c - the parallel state: real communicators on thread ranks (an
 * all_reduce over each group kind sums exactly its members), getters against
 * the layout, virtual stages and overrides, seeded streams, the with-state
 * helper's clean-up after failures, and mocking rank 3000 of 4096.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"
#ifdef MPU_TEST_NCCL
#include "nccl_double/switches.h" /* double_count */
#endif

static mpu_layout_config ds(int tp, int pp, int sp, int vp, int split, int fp8) {
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  c.flavor = MPU_FLAVOR_DEEPSPEED;
  c.world_size = 0;
  c.tp = tp, c.pp = pp, c.sp = sp, c.vp = vp, c.split_rank = split, c.fp8 = fp8;
  return c;
}

static mpu_layout_config core(int tp, int pp, int cp, int ep, const char *order) {
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  c.world_size = 0;
  c.tp = tp, c.pp = pp, c.cp = cp, c.ep = ep;
  snprintf(c.order, sizeof c.order, "%s", order ? order : "");
  return c;
}

static mpu_layout_config core19(int tp, int pp, int cp, int ep, int etp, int inst,
                                 const char *order) {
  mpu_layout_config c = core(tp, pp, cp, ep, order);
  c.flavor = MPU_FLAVOR_CORE_019;
  c.etp = etp, c.dist_opt_instances = inst;
  return c;
}

/* the rank of the state `s` the rank function holds */
static int state_rank(const mpu_state *s) {
  int r = 0;
  mpu_comm_rank(mpu_state_world(s), &r);
  return r;
}
#define TEST_RANK state_rank(s)
#include "test_helpers.h"

/* Every group kind: the sum of world ranks over the comm is the sum of its
 * members. arg: NULL, or the NCCL options (MPU_TEST_NCCL). */
static mpu_result_t groups_move_data(mpu_state *s, void *arg) {
  const mpu_nccl_options *nccl = arg;
  (void)nccl;
  const mpu_layout *l = mpu_state_layout(s);
  int rank, members[64], n;
  mpu_comm_rank(mpu_state_world(s), &rank);
#ifdef MPU_TEST_NCCL /* the same checks on NCCL communicators (test double) */
  RCHECK(!mpu_state_enable_nccl(s, nccl), "enable NCCL: %s", mpu_last_error());
#endif
  RCHECK(mpu_state_is_initialized(NULL) && mpu_state_current() == s, "not the current state");
  int ds = mpu_layout_config_of(l)->flavor == MPU_FLAVOR_DEEPSPEED;
  mpu_rank_info info = MPU_RANK_INFO_INIT;
  RCHECK(!mpu_layout_rank_info(l, rank, &info), "rank info");
  if (!info.in_grid) { /* outside a core-0.19 grid: no group, and the getters say so */
    int v;
    mpu_comm *c;
    for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++)
      RCHECK(mpu_state_comm(s, (mpu_group_kind)k, &c) != MPU_SUCCESS, "a comm outside the grid");
    RCHECK(mpu_state_tp_rank(s, &v) == MPU_ERR_INVALID_USAGE, "tp rank outside the grid");
    RCHECK(mpu_state_pp_next_rank(s, &v) == MPU_ERR_INVALID_USAGE, "pp next outside the grid");
    RCHECK(!mpu_state_in_embedding_group(s, 1, &v) && !v, "embedding outside the grid");
    return MPU_SUCCESS;
  }
  for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++) {
    if (!mpu_layout_has(l, (mpu_group_kind)k)) continue;
    /* Megatron-DeepSpeed: the deepspeed flavour's data-parallel group is the sequence-data one */
    mpu_group_kind as = ds && k == MPU_GROUP_DP ? MPU_GROUP_SDP : (mpu_group_kind)k;
    RCHECK(!mpu_layout_group(l, as, rank, members, 64, &n), "group");
    mpu_comm *c = NULL;
    mpu_result_t r = mpu_state_comm(s, (mpu_group_kind)k, &c);
    if (!n) {
      RCHECK(r == MPU_ERR_INVALID_USAGE, "kind %d: a comm for a rank in no group", k);
      continue;
    }
    RCHECK(r == MPU_SUCCESS, "kind %d: %s", k, mpu_last_error());
    int64_t mine = rank, sum = 0, want = 0;
    for (int i = 0; i < n; i++) want += members[i];
    RCHECK(!test_coll(c, 'r', &mine, &sum, 1, MPU_INT64, MPU_SUM), "all_reduce: %s",
           mpu_last_error());
    RCHECK(sum == want, "kind %s: sum %lld, want %lld",
           mpu_group_kind_name(mpu_layout_config_of(l)->flavor, k), (long long)sum,
           (long long)want);
    mpu_comm *host = NULL;
    RCHECK(!mpu_state_host_comm(s, (mpu_group_kind)k, &host), "host comm");
    sum = 0;
    RCHECK(!test_coll(host, 'r', &mine, &sum, 1, MPU_INT64, MPU_SUM) && sum == want,
           "host twin of kind %d: sum %lld", k, (long long)sum);
    mpu_group_kind alias = mpu_layout_alias_of(l, (mpu_group_kind)k);
    if ((int)alias != k) { /* the original's one process group under two names */
      mpu_comm *other = NULL;
      RCHECK(!mpu_state_comm(s, alias, &other) && other == c, "kind %d: not its alias's comm", k);
    }
#ifdef MPU_TEST_NCCL
    if (mpu_group_kind_is_gloo((mpu_group_kind)k)) /* gloo twins stay on the host */
      RCHECK(c == host && strcmp(mpu_comm_backend(c), "nccl"), "gloo kind %d on %s", k,
             mpu_comm_backend(c));
    else
      RCHECK(!strcmp(mpu_comm_backend(c), "nccl") && strcmp(mpu_comm_backend(host), "nccl"),
             "kind %d: %s over %s", k, mpu_comm_backend(c), mpu_comm_backend(host));
#else
    RCHECK(c == host, "without NCCL the state's communicator is the host one");
#endif
    int gr;
    RCHECK(!mpu_state_group_rank(s, (mpu_group_kind)k, &gr) && members[gr] == rank,
           "kind %d: group rank %d", k, gr);
  }
  /* the plain data-parallel group under its own name */
  mpu_comm *plain = NULL;
  RCHECK(!mpu_state_plain_dp_comm(s, &plain), "plain dp: %s", mpu_last_error());
  RCHECK(!mpu_layout_group(l, MPU_GROUP_DP, rank, members, 64, &n), "dp group");
  int64_t mine = rank, sum = 0, want_sum = 0;
  for (int i = 0; i < n; i++) want_sum += members[i];
  RCHECK(!test_coll(plain, 'r', &mine, &sum, 1, MPU_INT64, MPU_SUM) && sum == want_sum,
         "plain dp: sum %lld, want %lld", (long long)sum, (long long)want_sum);
  if (ds) { /* the communicator, the size and the rank agree, as Megatron-DeepSpeed's getters */
    mpu_comm *dpc;
    int size, r, want_size, want_rank;
    RCHECK(!mpu_state_comm(s, MPU_GROUP_DP, &dpc) && !mpu_comm_size(dpc, &size) &&
               !mpu_comm_rank(dpc, &r) && !mpu_state_dp_size(s, &want_size) &&
               !mpu_state_dp_rank(s, &want_rank),
           "dp getters");
    RCHECK(size == want_size && r == want_rank, "dp comm %d of %d, getters %d of %d", r, size,
           want_rank, want_size);
  }
  /* getters agree with the layout */
  mpu_rank_info want = MPU_RANK_INFO_INIT, got = MPU_RANK_INFO_INIT;
  RCHECK(!mpu_layout_rank_info(l, rank, &want) && !mpu_state_info(s, &got), "info");
  RCHECK(!memcmp(&want, &got, sizeof want), "state info differs from the layout's");
  int v;
  RCHECK(!mpu_state_tp_rank(NULL, &v) && v == want.tp_rank, "tp rank");
  RCHECK(!mpu_state_pp_next_rank(NULL, &v) && v == want.pp_next, "pp next");
  RCHECK(!mpu_state_pp_prev_rank(NULL, &v) && v == want.pp_prev, "pp prev");
  RCHECK(!mpu_state_dp_src_rank(NULL, &v) && v == want.dp_src, "dp src");
  RCHECK(!mpu_state_src_rank(NULL, MPU_GROUP_DP, &v) && v == want.dp_src, "dp src by kind");
  RCHECK(!mpu_state_src_rank(NULL, MPU_GROUP_TP, &v) && v == want.tp_src, "tp src by kind");
  RCHECK(!mpu_state_src_rank(NULL, MPU_GROUP_PP, &v) && v == want.pp_first, "pp src by kind");
  return MPU_SUCCESS;
}

static void run(int n, mpu_layout_config c) {
  memset(messages, 0, sizeof messages);
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.check_calls = 1;
  o.timeout_s = 60;
  mpu_result_t r = mpu_with_state(n, &c, 42, groups_move_data, NULL, NULL, &o);
  if (r) {
    for (int k = 0; k < n; k++)
      if (messages[k][0]) print_error("rank %d: %s\n", k, messages[k]);
    fail_msg("%s", mpu_last_error());
  }
}

static void test_communicators(void **state) {
  (void)state;
  run(8, ds(2, 2, 1, 0, -1, 0));  /* the mpu/mappings.py walkthrough's layout */
  run(16, ds(2, 4, 1, 2, 2, 1));
  run(8, ds(1, 1, 4, 0, -1, 1));  /* DeepSpeed-Ulysses */
  run(16, core(2, 2, 2, 2, NULL));
  run(16, core(2, 2, 1, 4, "tp-ep-dp-pp"));
  run(1, core(1, 1, 1, 1, NULL));
  /* core-0.19: every kind it builds, aliases and gloo twins included */
  mpu_layout_config c = core19(2, 2, 2, 2, 1, 2, NULL);
  c.hcp[0] = 2, c.n_hcp = 1;
  run(16, c);
  run(16, core19(1, 2, 2, 2, 2, 2, NULL));
  run(8, core19(2, 2, 1, 1, 0, 1, "tp-pp-dp")); /* pp not last, edp = dp */
  c = core19(2, 2, 1, 1, 0, 1, NULL);            /* a grid of 8 at offset 4 of 16 */
  c.rank_offset = 4, c.local_world_size = 8, c.gloo = 0;
  run(16, c);
}

/* Every valid core-0.19 config of up to 32 ranks (a variant of the order,
 * instances, hcp, vp and gloo per shape): every rank's state, made on the
 * fake backend, answers every getter and every group as the layout does. */
static int sweep_one(const mpu_layout_config *cfg) {
  mpu_layout *l = NULL;
  if (mpu_layout_create(cfg, &l)) return 0;
  int W = cfg->world_size, members[64], n, checked = 0;
  for (int rank = 0; rank < W; rank++) {
    mpu_state *s = NULL;
    if (mpu_state_mock(rank, cfg, 7, &s)) fail_msg("mock rank %d: %s", rank, mpu_last_error());
    mpu_rank_info want = MPU_RANK_INFO_INIT, got = MPU_RANK_INFO_INIT;
    assert_int_equal(mpu_layout_rank_info(l, rank, &want), MPU_SUCCESS);
    assert_int_equal(mpu_state_info(s, &got), MPU_SUCCESS);
    assert_memory_equal(&want, &got, sizeof want);
    for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++) {
      if (!mpu_layout_has(l, (mpu_group_kind)k)) continue;
      assert_int_equal(mpu_layout_group(l, (mpu_group_kind)k, rank, members, 64, &n), MPU_SUCCESS);
      int size = -1, grank = -1;
      mpu_result_t r = mpu_state_group_size(s, (mpu_group_kind)k, &size);
      if (!n) {
        assert_int_not_equal(r, MPU_SUCCESS);
        continue;
      }
      assert_int_equal(r, MPU_SUCCESS);
      assert_int_equal(mpu_state_group_rank(s, (mpu_group_kind)k, &grank), MPU_SUCCESS);
      if (size != n || members[grank] != rank)
        fail_msg("%s W %d rank %d: %s rank %d of %d, layout has %d members",
                 mpu_flavor_name(cfg->flavor), W, rank,
                 mpu_group_kind_name(cfg->flavor, (mpu_group_kind)k), grank, size, n);
      checked++;
    }
    int v;
    if (want.in_grid) {
      assert_int_equal(mpu_state_etp_rank(s, &v), MPU_SUCCESS);
      assert_int_equal(v, want.etp_rank);
      assert_int_equal(mpu_state_edp_size(s, &v), MPU_SUCCESS);
      assert_int_equal(v, want.edp_size);
    } else {
      assert_int_equal(mpu_state_etp_rank(s, &v), MPU_ERR_INVALID_USAGE);
    }
    mpu_state_destroy(s);
  }
  mpu_layout_free(l);
  return checked > 0 || W == 0;
}

static void test_core019_sweep(void **state) {
  (void)state;
  static const char *const orders[] = {"", "tp-pp-dp", "tp-cp-dp-pp", "tp-dp-ep-pp"};
  int valid = 0, every = getenv("MPU_TEST_FEW_THREADS") ? 5 : 1, combo = 0;
  for (int W = 1; W <= 32; W++)
    for (int tp = 1; tp <= W; tp++)
      for (int pp = 1; pp <= W; pp++)
        for (int cp = 1; cp <= W; cp++) {
          if (W % (tp * pp * cp)) continue;
          for (int ep = 1; ep <= W; ep++)
            for (int etp = 0; etp <= W; etp++) {
              if (W % ep || (etp && W % etp)) continue;
              if (combo++ % every) continue;
              mpu_layout_config c = core19(tp, pp, cp, ep, etp, 1, orders[combo % 4]);
              c.world_size = W;
              int dp_cp = W / (tp * pp), edp = W / ((etp ? etp : tp) * ep * pp);
              c.dist_opt_instances = combo % 3 == 0 && dp_cp % 2 == 0 && edp > 0 && edp % 2 == 0 ? 2 : 1;
              if (cp % 2 == 0 && combo % 2) c.hcp[0] = 2, c.hcp[1] = cp / 2, c.n_hcp = 2;
              if (pp > 1 && combo % 5 == 0) c.vp = 2;
              c.gloo = combo % 7 != 0;
              if (combo % 11 == 0 && W % 2 == 0) /* a grid of half the world, at its end */
                c.local_world_size = W / 2, c.rank_offset = W / 2;
              valid += sweep_one(&c);
            }
        }
  print_message("core-0.19: %d valid layouts of up to 32 ranks, every rank's state checked\n",
                valid);
  assert_true(valid > 100);
}

#ifdef MPU_TEST_NCCL
/* A world that is an NCCL communicator without a host twin (as one from
 * torchrun's environment): the state makes its groups by splitting. */
static mpu_result_t state_over_nccl_world(mpu_comm *threads_world, void *arg) {
  const mpu_layout_config *cfg = arg;
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.keep_host = 0;
  o.timeout_s = 20; /* a split a rank never joins fails after this, it does not hang */
  mpu_comm *world = NULL;
  mpu_state *s = NULL;
  mpu_result_t r = mpu_comm_nccl_create(threads_world, &o, &world);
  if (!r) r = mpu_state_init(world, cfg, &s);
  const mpu_layout *l = s ? mpu_state_layout(s) : NULL;
  int rank = 0, members[64], n;
  mpu_comm_rank(threads_world, &rank);
  for (int k = 0; !r && k < MPU_GROUP_KIND_COUNT; k++) {
    mpu_comm *c = NULL;
    if (!mpu_layout_has(l, (mpu_group_kind)k)) continue;
    if ((r = mpu_layout_group(l, (mpu_group_kind)k, rank, members, 64, &n)) || !n) continue;
    if ((r = mpu_state_comm(s, (mpu_group_kind)k, &c))) break;
    int64_t mine = rank, sum = 0, want = 0;
    for (int i = 0; i < n; i++) want += members[i];
    int gr = -1;
    if ((r = test_coll(c, 'r', &mine, &sum, 1, MPU_INT64, MPU_SUM)) ||
        (r = mpu_comm_rank(c, &gr)))
      break;
    if (sum != want || members[gr] != rank || strcmp(mpu_comm_backend(c), "nccl")) {
      snprintf(messages[rank], sizeof messages[rank], "kind %d: sum %lld want %lld, rank %d", k,
               (long long)sum, (long long)want, gr);
      r = MPU_ERR_INTERNAL;
    }
  }
  mpu_state_destroy(s);
  mpu_comm_destroy(world);
  return r;
}

static void test_state_by_split(void **state) {
  (void)state;
  mpu_layout_config layouts[] = {ds(2, 2, 1, 0, -1, 0), core(2, 2, 2, 1, NULL),
                                 core(2, 1, 1, 2, "tp-ep-dp-pp")};
  for (size_t i = 0; i < sizeof layouts / sizeof *layouts; i++) {
    memset(messages, 0, sizeof messages);
    mpu_result_t r = mpu_launch(8, state_over_nccl_world, &layouts[i], NULL, NULL);
    if (r) {
      for (int k = 0; k < 8; k++)
        if (messages[k][0]) print_error("rank %d: %s\n", k, messages[k]);
      fail_msg("layout %zu: %s", i, mpu_last_error());
    }
  }
}

/* mpu_state_enable_nccl bootstraps NCCL once (a world communicator per
 * rank) and makes every group by ncclCommSplit of it with splitShare, not
 * one bootstrap per group; the groups are still Megatron's exactly. */
static mpu_result_t enable_by_split(mpu_state *s, void *arg) {
  (void)arg;
  RCHECK(!mpu_state_enable_nccl(s, NULL), "enable NCCL: %s", mpu_last_error());
  int rank = state_rank(s), members[64], n;
  const mpu_layout *l = mpu_state_layout(s);
  for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++) {
    mpu_comm *c = NULL;
    if (!mpu_layout_has(l, (mpu_group_kind)k) || mpu_group_kind_is_gloo((mpu_group_kind)k))
      continue;
    RCHECK(!mpu_layout_group(l, (mpu_group_kind)k, rank, members, 64, &n), "group");
    if (!n) continue;
    RCHECK(!mpu_state_comm(s, (mpu_group_kind)k, &c), "kind %d: %s", k, mpu_last_error());
    int gr = -1, size = 0;
    RCHECK(!mpu_comm_rank(c, &gr) && !mpu_comm_size(c, &size) && size == n && members[gr] == rank,
           "kind %d: rank %d of %d", k, gr, size);
    int64_t mine = rank, sum = 0, want = 0;
    for (int i = 0; i < n; i++) want += members[i];
    RCHECK(!test_coll(c, 'r', &mine, &sum, 1, MPU_INT64, MPU_SUM) && sum == want,
           "kind %d: sum %lld want %lld", k, (long long)sum, (long long)want);
  }
  return MPU_SUCCESS;
}

static void test_enable_nccl_by_split(void **state) {
  (void)state;
  long inits = double_count("init"), splits = double_count("split");
  long shared = double_count("split_shared");
  memset(messages, 0, sizeof messages);
  mpu_layout_config c = core(2, 2, 2, 1, NULL);
  if (mpu_with_state(8, &c, 42, enable_by_split, NULL, NULL, NULL)) {
    for (int k = 0; k < 8; k++)
      if (messages[k][0]) print_error("rank %d: %s\n", k, messages[k]);
    fail_msg("%s", mpu_last_error());
  }
  inits = double_count("init") - inits;
  splits = double_count("split") - splits;
  shared = double_count("split_shared") - shared;
  print_message("enable_nccl over 8 ranks: %ld NCCL bootstraps, %ld splits (%ld sharing)\n", inits,
                splits, shared);
  assert_int_equal(inits, 8); /* one world communicator per rank */
  assert_true(splits >= 8 * 4 && shared == 0); /* groups share nothing unless asked */
}

/* A core-0.19 grid of 2 at rank offset 2 of a 4-rank NCCL world without a
 * host twin: ranks 0 and 1, outside the grid, take part in every split with
 * MPU_COMM_SPLIT_NOCOLOR (NCCL's split is collective over the parent), so
 * every rank initialises, well within the communicator's deadline. */
static void test_grid_at_offset_by_split(void **state) {
  (void)state;
  mpu_layout_config c = core19(2, 1, 1, 1, 0, 1, NULL);
  c.rank_offset = 2, c.local_world_size = 2, c.gloo = 0;
  memset(messages, 0, sizeof messages);
  double t0 = test_now();
  mpu_result_t results[4];
  mpu_result_t r = mpu_launch(4, state_over_nccl_world, &c, results, NULL);
  double took = test_now() - t0;
  for (int k = 0; k < 4; k++)
    if (results[k]) print_error("rank %d: %s %s\n", k, mpu_result_name(results[k]), messages[k]);
  if (r) fail_msg("grid at offset 2: %s", mpu_last_error());
  assert_true(took < 20);
}
#endif

/* Ranks given different configs all fail at init, naming the rank and field. */
static mpu_result_t differing_configs(mpu_comm *world, void *arg) {
  int which = *(int *)arg, rank;
  mpu_comm_rank(world, &rank);
  mpu_layout_config c = core(1, 1, 1, 1, NULL);
  c.world_size = 0;
  if (rank == 2 && which == 0) c.tp = 2;
  if (rank == 3 && which == 1) snprintf(c.order, sizeof c.order, "tp-dp-cp-ep-pp");
  mpu_state *s = NULL;
  mpu_result_t r = mpu_state_init(world, &c, &s);
  const char *want = which == 0 ? "rank 2's tp differs from rank 0's (2 vs 1)" : "rank 3's order";
  if (r != MPU_ERR_MISMATCH || !strstr(mpu_last_error(), want)) {
    snprintf(messages[rank], sizeof messages[rank], "%s: %s", mpu_result_name(r), mpu_last_error());
    mpu_state_destroy(s);
    return MPU_ERR_INTERNAL;
  }
  return MPU_SUCCESS;
}

static void test_differing_configs(void **state) {
  (void)state;
  for (int which = 0; which < 2; which++) {
    memset(messages, 0, sizeof messages);
    mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
    o.timeout_s = 30;
    mpu_result_t r = mpu_launch(4, differing_configs, &which, NULL, &o);
    if (r) {
      for (int k = 0; k < 4; k++)
        if (messages[k][0]) print_error("rank %d: %s\n", k, messages[k]);
      fail_msg("%s", mpu_last_error());
    }
  }
}

static void test_before_init(void **state) {
  (void)state;
  mpu_state_reset();
  int v;
  assert_false(mpu_state_is_initialized(NULL));
  assert_int_equal(mpu_state_tp_rank(NULL, &v), MPU_ERR_INVALID_USAGE);
  assert_non_null(strstr(mpu_last_error(), "not initialized"));
  assert_int_equal(mpu_state_pp_next_rank(NULL, &v), MPU_ERR_INVALID_USAGE);
  mpu_comm *c;
  assert_int_equal(mpu_state_comm(NULL, MPU_GROUP_TP, &c), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_state_manual_seed(NULL, 1), MPU_ERR_INVALID_USAGE);
  assert_null(mpu_state_default_rng(NULL));
}

/* A failing test, and an aborting one, leave nothing behind: the next runs. */
static mpu_result_t fails_on_one(mpu_state *s, void *arg) {
  (void)arg;
  int rank;
  mpu_comm_rank(mpu_state_world(s), &rank);
  if (rank == 1) return MPU_ERR_INTERNAL;
  mpu_comm *dp;
  mpu_state_comm(s, MPU_GROUP_DP, &dp);
  return mpu_comm_barrier(mpu_state_world(s)); /* fails: rank 1 is gone */
}

static mpu_result_t aborts(mpu_state *s, void *arg) {
  (void)arg;
  int rank;
  mpu_comm_rank(mpu_state_world(s), &rank);
  if (rank == 2) return mpu_comm_abort(mpu_state_world(s));
  return mpu_comm_barrier(mpu_state_world(s));
}

static void test_cleanup(void **state) {
  (void)state;
  mpu_layout_config c = ds(2, 2, 1, 0, -1, 0);
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.timeout_s = 30;
  mpu_result_t results[4];
  for (int i = 0; i < 20; i++) {
    assert_int_not_equal(mpu_with_state(4, &c, 1, fails_on_one, NULL, results, &o), MPU_SUCCESS);
    assert_int_equal(results[1], MPU_ERR_INTERNAL);
    assert_int_equal(results[0], MPU_ERR_ABORTED);
    assert_int_not_equal(mpu_with_state(4, &c, 1, aborts, NULL, results, &o), MPU_SUCCESS);
    assert_int_equal(results[3], MPU_ERR_ABORTED);
    run(4, c);
  }
  assert_null(mpu_state_current());
  /* a bad config fails before any thread starts, with the original's message */
  mpu_layout_config bad = ds(3, 1, 1, 0, -1, 0);
  assert_int_equal(mpu_with_state(8, &bad, 1, groups_move_data, NULL, NULL, &o),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "world_size (8) is not divisible"));
}

/* Seeds: the default stream is the same on all tp ranks; the tp stream is
 * seed + 2718 + tp rank and differs between them. */
static mpu_result_t streams(mpu_state *s, void *arg) {
  (void)arg;
  int tp;
  mpu_state_tp_rank(s, &tp);
  mpu_rng *def = mpu_state_default_rng(s), *tps = NULL, ref;
  RCHECK(!mpu_rng_tracker_fork(mpu_state_rng_tracker(s), MPU_MODEL_PARALLEL_RNG, &tps), "fork");
  uint64_t d = mpu_rng_next(def), t = mpu_rng_next(tps), all_d[8], all_t[8];
  mpu_rng_seed(&ref, 42 + 2718 + (uint64_t)tp);
  RCHECK(t == mpu_rng_next(&ref), "tp stream is not seed + 2718 + tp rank");
  mpu_comm *tpc;
  mpu_state_comm(s, MPU_GROUP_TP, &tpc);
  RCHECK(!test_coll(tpc, 'g', &d, all_d, 1, MPU_INT64, MPU_SUM), "gather");
  RCHECK(!test_coll(tpc, 'g', &t, all_t, 1, MPU_INT64, MPU_SUM), "gather");
  RCHECK(all_d[0] == all_d[1], "default streams differ within a tp group");
  RCHECK(all_t[0] != all_t[1], "tp streams are equal within a tp group");
  RCHECK(mpu_rng_tracker_add(mpu_state_rng_tracker(s), MPU_MODEL_PARALLEL_RNG, 7) ==
             MPU_ERR_INVALID_ARGUMENT,
         "a second stream of one name was accepted");
  RCHECK(mpu_rng_tracker_add(mpu_state_rng_tracker(s), "other", 42 + 2718 + (uint64_t)tp) ==
             MPU_ERR_INVALID_ARGUMENT,
         "a second stream of one seed was accepted");
  mpu_rng *none;
  RCHECK(mpu_rng_tracker_fork(mpu_state_rng_tracker(s), "nope", &none) == MPU_ERR_INVALID_ARGUMENT,
         "fork of a missing stream");
  return MPU_SUCCESS;
}

/* core_v0.8.0's three streams, with their seeds, and saving and restoring
 * every stream (a checkpoint, or recomputing activations with the same
 * dropout masks). */
static mpu_result_t core_streams(mpu_state *s, void *arg) {
  (void)arg;
  int tp, ep;
  mpu_rank_info info = MPU_RANK_INFO_INIT;
  RCHECK(!mpu_state_tp_rank(s, &tp) && !mpu_state_info(s, &info), "getters");
  ep = info.ep_rank;
  mpu_rng_tracker *t = mpu_state_rng_tracker(s);
  const char *names[3] = {MPU_DATA_PARALLEL_RNG, MPU_MODEL_PARALLEL_RNG, MPU_EXPERT_PARALLEL_RNG};
  uint64_t seeds[3] = {42, 42 + 2718 + (uint64_t)tp, 42 + 1024 + 100 * (uint64_t)ep + (uint64_t)tp};
  RCHECK(t->n == 3, "%d streams, want 3", t->n);
  for (int i = 0; i < 3; i++) {
    mpu_rng *g, ref;
    RCHECK(!strcmp(t->names[i], names[i]), "stream %d is %s, want %s", i, t->names[i], names[i]);
    RCHECK(!mpu_rng_tracker_fork(t, names[i], &g), "fork %s", names[i]);
    mpu_rng_seed(&ref, seeds[i]);
    RCHECK(mpu_rng_next(g) == mpu_rng_next(&ref), "%s is not seeded with %llu", names[i],
           (unsigned long long)seeds[i]);
  }
  /* save, draw, restore, draw again: the same numbers */
  mpu_rng_states saved;
  mpu_rng *mp;
  RCHECK(!mpu_rng_tracker_get_states(t, &saved) && !mpu_rng_tracker_fork(t, MPU_MODEL_PARALLEL_RNG, &mp),
         "get_states");
  uint64_t first = mpu_rng_next(mp), again;
  RCHECK(!mpu_rng_tracker_set_states(t, &saved), "set_states: %s", mpu_last_error());
  RCHECK(!mpu_rng_tracker_fork(t, MPU_MODEL_PARALLEL_RNG, &mp), "fork after set_states");
  again = mpu_rng_next(mp);
  RCHECK(first == again, "restored stream drew %llu, first %llu", (unsigned long long)again,
         (unsigned long long)first);
  /* set_states replaces the streams, not the remembered seeds (as Megatron's) */
  mpu_rng_states none;
  memset(&none, 0, sizeof none);
  RCHECK(!mpu_rng_tracker_set_states(t, &none) && t->n == 0, "set_states to none");
  RCHECK(mpu_rng_tracker_add(t, "again", 42) == MPU_ERR_INVALID_ARGUMENT, "a used seed came back");
  RCHECK(!mpu_rng_tracker_set_states(t, &saved) && t->n == 3, "set_states back");
  saved.n = MPU_RNG_TRACKER_MAX + 1;
  RCHECK(mpu_rng_tracker_set_states(t, &saved) == MPU_ERR_INVALID_ARGUMENT, "bad count taken");
  saved.n = 1;
  memset(saved.names[0], 'x', sizeof saved.names[0]);
  RCHECK(mpu_rng_tracker_set_states(t, &saved) == MPU_ERR_INVALID_ARGUMENT, "unterminated name taken");
  /* two streams of one name: a tracker is a dict of names, so refused, and
   * the refused call leaves the tracker as it was */
  mpu_rng_states twice;
  RCHECK(!mpu_rng_tracker_get_states(t, &twice) && twice.n == 3, "get_states");
  strcpy(twice.names[2], twice.names[0]);
  RCHECK(mpu_rng_tracker_set_states(t, &twice) == MPU_ERR_INVALID_ARGUMENT &&
             strstr(mpu_last_error(), "repeats the name"),
         "two streams of one name taken: %s", mpu_last_error());
  RCHECK(t->n == 3 && !strcmp(t->names[2], names[2]), "a refused set_states changed the tracker");
  return MPU_SUCCESS;
}

static void test_core_streams(void **state) {
  (void)state;
  mpu_layout_config c = core(2, 1, 1, 2, NULL);
  memset(messages, 0, sizeof messages);
  mpu_result_t r = mpu_with_state(8, &c, 42, core_streams, NULL, NULL, NULL);
  if (r) fail_msg("%s / %s / %s", messages[0], messages[1], mpu_last_error());
}

/* Megatron-DeepSpeed's sequence getters and setters, and training/eval mode: the
 * override initialize sets keeps the sp size in eval mode; the rank drops
 * to 0 there; clearing the override gives 1. */
static mpu_result_t sequence(mpu_state *s, void *arg) {
  (void)arg;
  int rank, v;
  mpu_comm_rank(mpu_state_world(s), &rank);
  RCHECK(mpu_state_sp_is_initialized(NULL) && mpu_state_sdp_is_initialized(s) &&
             !mpu_state_is_uninitialized(NULL),
         "initialized flags");
  RCHECK(!mpu_state_is_training_mode(s, &v) && v == 1, "training mode after init");
  RCHECK(!mpu_state_sp_size(s, &v) && v == 4, "sp size %d", v);
  RCHECK(!mpu_state_sp_rank(s, &v) && v == rank % 4, "sp rank %d", v);
  RCHECK(!mpu_state_sp_src_rank(s, &v) && v == rank / 4 * 4, "sp src %d", v);
  RCHECK(!mpu_state_sdp_size(s, &v) && v == 8, "sdp size %d", v);
  RCHECK(!mpu_state_sdp_rank(s, &v) && v == rank, "sdp rank %d", v);
  RCHECK(!mpu_state_set_eval_mode(NULL) && !mpu_state_is_training_mode(s, &v) && v == 0, "eval");
  RCHECK(!mpu_state_sp_size(s, &v) && v == 4, "eval keeps the overridden sp size, got %d", v);
  RCHECK(!mpu_state_sp_rank(s, &v) && v == 0, "eval sp rank %d", v);
  RCHECK(!mpu_state_set_sp_size(s, -1) && !mpu_state_sp_size(s, &v) && v == 1, "eval, None: %d", v);
  RCHECK(!mpu_state_sp_src_rank(s, &v) && v == rank, "eval src %d", v);
  RCHECK(!mpu_state_set_training_mode(s) && !mpu_state_sp_size(s, &v) && v == 4, "training, None");
  RCHECK(!mpu_state_set_sp_rank(s, 2) && !mpu_state_sp_rank(s, &v) && v == 2, "sp rank override");
  RCHECK(!mpu_state_set_sdp_size(s, 3) && !mpu_state_sdp_size(s, &v) && v == 3, "sdp override");
  RCHECK(!mpu_state_dp_size(s, &v) && v == 3, "dp size follows the sdp override, got %d", v);
  RCHECK(!mpu_state_set_sdp_rank(s, 1) && !mpu_state_sdp_rank(s, &v) && v == 1, "sdp rank override");
  RCHECK(!mpu_state_set_sdp_size(s, -1) && !mpu_state_sdp_size(s, &v) && v == 8, "sdp None");
  RCHECK(!mpu_state_dp_size(s, &v) && v == 8, "dp size back, got %d", v);
  RCHECK(mpu_state_set_sp_size(s, -2) == MPU_ERR_INVALID_ARGUMENT, "-2 taken");
  RCHECK(!mpu_state_set_sp_size(s, 0) && mpu_state_sp_src_rank(s, &v) == MPU_ERR_INVALID_USAGE,
         "sp size 0: src rank must fail, not divide by zero");
  return MPU_SUCCESS;
}

static mpu_result_t sequence_on_core(mpu_state *s, void *arg) {
  (void)arg;
  int v;
  RCHECK(mpu_state_sp_size(s, &v) == MPU_ERR_INVALID_ARGUMENT, "core answered sp size");
  RCHECK(mpu_state_set_sp_rank(s, 1) == MPU_ERR_INVALID_ARGUMENT, "core took an sp rank");
  RCHECK(!mpu_state_sp_is_initialized(s) && !mpu_state_sdp_is_initialized(NULL), "core sp init");
  RCHECK(!mpu_state_set_eval_mode(s) && !mpu_state_is_training_mode(s, &v) && v == 0, "core eval");
  return MPU_SUCCESS;
}

static void test_sequence_and_modes(void **state) {
  (void)state;
  assert_true(mpu_state_is_uninitialized(NULL));
  assert_false(mpu_state_sp_is_initialized(NULL));
  int v;
  assert_int_equal(mpu_state_sp_size(NULL, &v), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_state_set_training_mode(NULL), MPU_ERR_INVALID_USAGE);
  mpu_layout_config c = ds(1, 1, 4, 0, -1, 0);
  memset(messages, 0, sizeof messages);
  mpu_result_t r = mpu_with_state(8, &c, 42, sequence, NULL, NULL, NULL);
  if (r) fail_msg("%s / %s / %s", messages[0], messages[1], mpu_last_error());
  mpu_layout_config k = core(2, 1, 1, 1, NULL);
  r = mpu_with_state(4, &k, 42, sequence_on_core, NULL, NULL, NULL);
  if (r) fail_msg("%s / %s", messages[0], mpu_last_error());
}

/* The global memory buffer: one buffer per (name, dtype), reused, grown on
 * demand with earlier views still valid, freed with the state. */
static mpu_result_t memory_buffer(mpu_state *s, void *arg) {
  (void)arg;
  mpu_tensor a, b, c, d, e;
  int64_t s48[2] = {4, 8}, s216[2] = {2, 16}, s64[1] = {64}, big[2] = {INT64_MAX / 2, 4};
  RCHECK(!mpu_state_memory_buffer(s, "mpu", MPU_FLOAT32, 2, s48, &a), "get: %s", mpu_last_error());
  RCHECK(a.ndim == 2 && a.shape[1] == 8 && !a.owns_data && a.data, "view");
  for (int i = 0; i < 32; i++) ((float *)a.data)[i] = (float)i;
  RCHECK(!mpu_state_memory_buffer(s, "mpu", MPU_FLOAT32, 2, s216, &b) && b.data == a.data,
         "same size: reused");
  RCHECK(((float *)b.data)[31] == 31.0f, "contents kept");
  RCHECK(!mpu_state_memory_buffer(s, "mpu", MPU_FLOAT32, 1, s64, &c) && c.data != a.data,
         "grown");
  RCHECK(((float *)a.data)[31] == 31.0f, "an earlier view still reads its memory"); /* ASan: no UAF */
  RCHECK(!mpu_state_memory_buffer(s, "mpu", MPU_FLOAT32, 2, s48, &d) && d.data == c.data,
         "the grown buffer serves smaller asks");
  RCHECK(!mpu_state_memory_buffer(s, "mpu", MPU_BFLOAT16, 2, s48, &e) && e.data != c.data,
         "another dtype: another buffer");
  RCHECK(mpu_state_memory_buffer(s, "", MPU_FLOAT32, 1, s64, &e) == MPU_ERR_INVALID_ARGUMENT, "empty name");
  RCHECK(mpu_state_memory_buffer(s, "x", MPU_FLOAT32, 2, big, &e) == MPU_ERR_INVALID_ARGUMENT,
         "a size past size_t");
  RCHECK(mpu_state_memory_buffer(s, "x", MPU_FLOAT32, 9, s64, &e) == MPU_ERR_INVALID_ARGUMENT,
         "nine dims");
  return MPU_SUCCESS;
}

static void test_memory_buffer(void **state) {
  (void)state;
  mpu_layout_config c = ds(2, 1, 1, 0, -1, 0);
  memset(messages, 0, sizeof messages);
  mpu_result_t r = mpu_with_state(2, &c, 42, memory_buffer, NULL, NULL, NULL);
  if (r) fail_msg("%s / %s / %s", messages[0], messages[1], mpu_last_error());
  int64_t one = 1;
  mpu_tensor t;
  assert_int_equal(mpu_state_memory_buffer(NULL, "a", MPU_FLOAT32, 1, &one, &t), MPU_ERR_INVALID_USAGE);
}

/* mpu_with_state_on: the helper around ranks the caller already runs; the
 * state current before comes back afterwards. */
static mpu_result_t inside(mpu_state *s, void *arg) {
  int *calls = arg, tp;
  RCHECK(mpu_state_current() == s && !mpu_state_tp_size(NULL, &tp) && tp == 2, "inside");
  __atomic_add_fetch(calls, 1, __ATOMIC_RELAXED);
  return MPU_SUCCESS;
}

static mpu_result_t fails_inside(mpu_state *s, void *arg) {
  (void)s, (void)arg;
  return mpu_fail(MPU_ERR_INTERNAL, "the test body failed");
}

/* a test body that draws from the state that was current before (as code
 * using the global RNG would): the helper must put those streams back */
static mpu_result_t draws_from(mpu_state *s, void *arg) {
  mpu_state *outer = arg;
  mpu_rng *mp = NULL;
  RCHECK(!mpu_rng_tracker_fork(mpu_state_rng_tracker(outer), MPU_MODEL_PARALLEL_RNG, &mp), "fork");
  for (int i = 0; i < 5; i++) mpu_rng_next(mp), mpu_rng_next(mpu_state_default_rng(outer));
  RCHECK(!mpu_state_manual_seed(outer, 99), "reseed");
  return MPU_SUCCESS;
}

static mpu_result_t own_ranks(mpu_comm *world, void *arg) {
  int *calls = arg;
  mpu_layout_config c = ds(2, 1, 1, 0, -1, 0);
  mpu_state *mine = NULL;
  mpu_result_t r = mpu_state_init(world, &c, &mine); /* a state of the caller's, current */
  mpu_rng_states found;
  mpu_rng default_found;
  if (!r) r = mpu_state_manual_seed(mine, 5);
  if (!r) mpu_rng_next(mpu_state_default_rng(mine)); /* a state somewhere in its stream */
  if (!r) r = mpu_rng_tracker_get_states(mpu_state_rng_tracker(mine), &found);
  if (!r) default_found = *mpu_state_default_rng(mine);
  if (!r) r = mpu_with_state_on(world, &c, 7, draws_from, mine);
  mpu_rng_states after;
  if (!r) r = mpu_rng_tracker_get_states(mpu_state_rng_tracker(mine), &after);
  if (!r && (memcmp(&found, &after, sizeof found) ||
             memcmp(&default_found, mpu_state_default_rng(mine), sizeof default_found)))
    r = mpu_fail(MPU_ERR_INTERNAL, "the random streams found were not put back");
  if (!r) r = mpu_with_state_on(world, &c, 7, inside, calls);
  if (!r && mpu_state_current() != mine) r = mpu_fail(MPU_ERR_INTERNAL, "the state before did not come back");
  if (!r && mpu_with_state_on(world, &c, 7, fails_inside, NULL) != MPU_ERR_INTERNAL)
    r = mpu_fail(MPU_ERR_INTERNAL, "the body's failure was not returned");
  if (!r && mpu_state_current() != mine) r = mpu_fail(MPU_ERR_INTERNAL, "not restored after a failure");
  if (!r && mpu_with_state_on(NULL, &c, 7, inside, calls) != MPU_ERR_INVALID_ARGUMENT)
    r = mpu_fail(MPU_ERR_INTERNAL, "NULL world taken");
  mpu_state_destroy(mine);
  return r;
}

static void test_with_state_on(void **state) {
  (void)state;
  int calls = 0;
  memset(messages, 0, sizeof messages);
  mpu_result_t r = mpu_launch(4, own_ranks, &calls, NULL, NULL);
  if (r) fail_msg("%s / %s", messages[0], mpu_last_error());
  assert_int_equal(calls, 4);
}

static void test_streams(void **state) {
  (void)state;
  mpu_layout_config c = ds(2, 1, 1, 0, -1, 0);
  memset(messages, 0, sizeof messages);
  mpu_result_t r = mpu_with_state(4, &c, 42, streams, NULL, NULL, NULL);
  if (r) fail_msg("%s / %s / %s", messages[0], messages[1], mpu_last_error());
  mpu_rng a, b;
  mpu_rng_seed(&a, 5);
  mpu_rng_seed(&b, 5);
  for (int i = 0; i < 100; i++) assert_true(mpu_rng_next(&a) == mpu_rng_next(&b));
  double sum = 0, sq = 0;
  for (int i = 0; i < 20000; i++) {
    float u = mpu_rng_uniform(&a), z = mpu_rng_normal(&b, 0, 1);
    assert_true(u >= 0 && u < 1);
    sum += z, sq += (double)z * z;
  }
  assert_true(sum / 20000 > -0.05 && sum / 20000 < 0.05);
  assert_true(sq / 20000 > 0.95 && sq / 20000 < 1.05);
}

/* Rank 3000 of 4096 on one machine. */
static void test_mock(void **state) {
  (void)state;
  mpu_layout_config c = ds(8, 4, 1, 2, 1, 1);
  c.world_size = 4096;
  mpu_state *s = NULL;
  assert_int_equal(mpu_state_mock(3000, &c, 42, &s), MPU_SUCCESS);
  assert_ptr_equal(mpu_state_current(), s);
  mpu_rank_info want = MPU_RANK_INFO_INIT, got = MPU_RANK_INFO_INIT;
  assert_int_equal(mpu_layout_rank_info(mpu_state_layout(s), 3000, &want), MPU_SUCCESS);
  assert_int_equal(mpu_state_info(NULL, &got), MPU_SUCCESS);
  assert_memory_equal(&want, &got, sizeof want);
  assert_int_equal(got.tp_rank, 3000 % 8);
  assert_int_equal(got.pp_rank, 3000 / 1024);
  int v;
  mpu_comm *dp;
  assert_int_equal(mpu_state_comm(NULL, MPU_GROUP_DP, &dp), MPU_SUCCESS);
  assert_int_equal(mpu_comm_size(dp, &v), MPU_SUCCESS);
  assert_int_equal(v, 4096 / 32);
  assert_int_equal(mpu_state_group_rank(NULL, MPU_GROUP_DP, &v), MPU_SUCCESS);
  assert_int_equal(v, got.dp_rank);
  float x = 1, y = 0;
  assert_int_equal(test_coll(dp, 'r', &x, &y, 1, MPU_FLOAT32, MPU_SUM), MPU_SUCCESS);
  assert_true(y == 0); /* the fake backend moves nothing */

  /* virtual stages: at virtual rank 0 a last-stage rank is not last */
  assert_int_equal(mpu_state_is_pp_last_stage(NULL, 0, &v), MPU_SUCCESS);
  assert_false(v);
  assert_int_equal(mpu_state_is_pp_last_stage(NULL, 1, &v), MPU_SUCCESS);
  assert_false(v); /* 3000 is on stage 2 of 4 */
  assert_int_equal(mpu_state_is_stage_at_split(NULL, &v), MPU_SUCCESS);
  assert_false(v); /* split rank 1: stage 2 is after it */
  mpu_state_reset();
  assert_null(mpu_state_current());
}

static void test_virtual_and_overrides(void **state) {
  (void)state;
  mpu_layout_config c = ds(1, 4, 1, 2, -1, 0);
  c.world_size = 4;
  mpu_state *s = NULL;
  int v;
  assert_int_equal(mpu_state_mock(3, &c, 1, &s), MPU_SUCCESS); /* the last stage */
  assert_int_equal(mpu_state_vp_size(s, &v), 0);
  assert_int_equal(v, 2);
  assert_int_equal(mpu_state_is_pp_last_stage(s, 0, &v), 0);
  assert_false(v);
  assert_int_equal(mpu_state_in_embedding_group(s, 0, &v), 0);
  assert_false(v);
  assert_int_equal(mpu_state_in_embedding_group(s, 1, &v), 0);
  assert_true(v);
  assert_int_equal(mpu_state_set_vp_rank(s, 1), 0);
  assert_int_equal(mpu_state_is_pp_last_stage(s, 0, &v), 0);
  assert_true(v);
  assert_int_equal(mpu_state_in_embedding_group(s, 0, &v), 0);
  assert_true(v);
  assert_int_equal(mpu_state_is_pp_first_stage(s, 1, &v), 0);
  assert_false(v);
  /* overrides: the getters answer with them */
  assert_int_equal(mpu_state_set_pp_rank(s, 0), 0);
  assert_int_equal(mpu_state_pp_rank(s, &v), 0);
  assert_int_equal(v, 0);
  assert_int_equal(mpu_state_pp_next_rank(s, &v), 0);
  assert_int_equal(v, 1);
  assert_int_equal(mpu_state_set_pp_size(s, 2), 0);
  assert_int_equal(mpu_state_pp_last_rank(s, &v), 0);
  assert_int_equal(v, 1);
  assert_int_equal(mpu_state_set_pp_size(s, 9), 0);
  assert_int_equal(mpu_state_pp_last_rank(s, &v), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_state_set_pp_size(s, -1), 0); /* cleared */
  assert_int_equal(mpu_state_set_tp_size(s, 4), 0);
  assert_int_equal(mpu_state_tp_size(s, &v), 0);
  assert_int_equal(v, 4);
  assert_int_equal(mpu_state_tp_src_rank(s, &v), 0);
  assert_int_equal(v, 0); /* (3 // 4) * 4 */
  assert_int_equal(mpu_state_set_tp_rank(s, -7), MPU_ERR_INVALID_ARGUMENT);
  /* split rank, set afterwards */
  assert_int_equal(mpu_state_set_pp_rank(s, -1), 0);
  assert_int_equal(mpu_state_set_split_rank(s, 2), 0);
  assert_int_equal(mpu_state_is_stage_before_split(s, -1, &v), 0);
  assert_false(v);
  assert_int_equal(mpu_state_is_stage_after_split(s, 1, &v), 0);
  assert_false(v);
  mpu_state_destroy(s);
  assert_null(mpu_state_current());
}

/* Set up and tear down many times (mock and threads). */
/* Several grids in one job: 16 ranks make two grids of 8 (ranks 0-7 and
 * 8-15, a grid at an offset, as an RL actor and critic would), each its own
 * state over its own communicator, and both train at once; and two states
 * over the same 8 ranks (tp 2 and tp 4) live side by side. Each state's
 * groups hold its own ranks and move data among them only. */
static mpu_result_t train(mpu_state *s, double lr, double *w) {
  mpu_comm *dp, *tp;
  int dp_rank;
  RCHECK(!mpu_state_comm(s, MPU_GROUP_DP, &dp) && !mpu_state_comm(s, MPU_GROUP_TP, &tp),
         "comms: %s", mpu_last_error());
  RCHECK(!mpu_comm_rank(dp, &dp_rank), "dp rank");
  *w = 1.0;
  for (int step = 0; step < 5; step++) {
    /* the gradient of replica r is (r + 1) w; averaged over the replicas, summed over tp */
    double g = (dp_rank + 1) * *w;
    RCHECK(!test_coll(dp, 'r', &g, &g, 1, MPU_FLOAT64, MPU_AVG), "dp: %s", mpu_last_error());
    RCHECK(!test_coll(tp, 'r', &g, &g, 1, MPU_FLOAT64, MPU_SUM), "tp: %s", mpu_last_error());
    *w -= lr * g;
  }
  return MPU_SUCCESS;
}

static mpu_result_t two_grids(mpu_comm *world, void *arg) {
  (void)arg;
  int rank, members[8];
  mpu_comm_rank(world, &rank);
  int grid = rank / 8;
  for (int i = 0; i < 8; i++) members[i] = grid * 8 + i;
  mpu_comm *half = NULL;
  mpu_result_t r = mpu_comm_create_group(world, members, 8, &half);
  if (r) return r;
  mpu_layout_config c = ds(2, 2, 1, 0, -1, 0);
  mpu_state *s = NULL, *other = NULL;
  if ((r = mpu_state_init(half, &c, &s))) goto out;
  /* every group of this grid holds ranks of this grid only */
  for (int k = 0; k < MPU_GROUP_KIND_COUNT && !r; k++) {
    mpu_comm *g = NULL;
    if (!mpu_layout_has(mpu_state_layout(s), (mpu_group_kind)k) ||
        mpu_state_comm(s, (mpu_group_kind)k, &g))
      continue;
    int n, w;
    mpu_comm_size(g, &n);
    for (int i = 0; i < n && !r; i++)
      if (mpu_comm_world_rank(g, i, &w) || w / 8 != grid)
        r = mpu_fail(MPU_ERR_INTERNAL, "grid %d: a group holds world rank %d", grid, w);
  }
  mpu_state_set_current(s);
  /* one GPU per world rank: by default a rank's device is its local rank in
   * the grid, so the grids would share GPUs 0-7, and a cudaFree of one grid's
   * rank, which waits for the whole device, would wait for the other grid's
   * collective on it (a deadlock on a GPU too) */
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  o.device = rank;
  if (!r) r = groups_move_data(s, &o);
  /* both grids train at once, each with its own learning rate */
  double w = 0, lr = grid ? 0.01 : 0.02, want = 1.0;
  for (int step = 0; step < 5; step++) { /* the same operations: mean of w and 2w, twice (tp 2) */
    double g = (1 * want + 2 * want) / 2;
    want -= lr * (g + g);
  }
  if (!r) r = train(s, lr, &w);
  if (!r && w != want) r = mpu_fail(MPU_ERR_INTERNAL, "grid %d trained to %g, want %g", grid, w, want);
  /* a second state over the same ranks, another layout, alongside the first */
  mpu_layout_config c4 = ds(4, 1, 1, 0, -1, 0);
  if (!r) r = mpu_state_init(half, &c4, &other);
  if (!r && mpu_state_current() != other) r = mpu_fail(MPU_ERR_INTERNAL, "not current");
  if (!r) r = groups_move_data(other, &o);
  int tp_first = -1, tp_second = -1;
  if (!r) r = mpu_state_tp_size(s, &tp_first);
  if (!r) r = mpu_state_tp_size(other, &tp_second);
  if (!r && (tp_first != 2 || tp_second != 4))
    r = mpu_fail(MPU_ERR_INTERNAL, "tp sizes %d and %d, want 2 and 4", tp_first, tp_second);
out:
  mpu_state_destroy(other);
  mpu_state_destroy(s);
  mpu_result_t d = half ? mpu_comm_destroy(half) : MPU_SUCCESS;
  return r ? r : d;
}

static void test_two_grids(void **state) {
  (void)state;
  memset(messages, 0, sizeof messages);
  mpu_result_t r = mpu_launch(16, two_grids, NULL, NULL, NULL);
  if (r) {
    for (int k = 0; k < 16; k++)
      if (messages[k][0]) print_error("rank %d: %s\n", k, messages[k]);
    fail_msg("%s", mpu_last_error());
  }
}

static void test_cycles(void **state) {
  (void)state;
  mpu_layout_config c = core(2, 2, 2, 2, NULL);
  c.world_size = 64;
  for (int i = 0; i < 1000; i++) {
    mpu_state *s = NULL;
    assert_int_equal(mpu_state_mock(i % 64, &c, (uint64_t)i, &s), MPU_SUCCESS);
    mpu_state_destroy(s);
  }
  mpu_layout_config t = ds(2, 2, 1, 0, -1, 0);
  for (int i = 0; i < 50; i++) run(8, t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_before_init), cmocka_unit_test(test_communicators),
      cmocka_unit_test(test_cleanup),     cmocka_unit_test(test_streams),
      cmocka_unit_test(test_mock),        cmocka_unit_test(test_virtual_and_overrides),
      cmocka_unit_test(test_cycles),      cmocka_unit_test(test_differing_configs),
      cmocka_unit_test(test_two_grids),   cmocka_unit_test(test_core_streams),
      cmocka_unit_test(test_sequence_and_modes), cmocka_unit_test(test_memory_buffer),
      cmocka_unit_test(test_with_state_on), cmocka_unit_test(test_core019_sweep),
#ifdef MPU_TEST_NCCL
      cmocka_unit_test(test_state_by_split),
      cmocka_unit_test(test_grid_at_offset_by_split),
      cmocka_unit_test(test_enable_nccl_by_split),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
