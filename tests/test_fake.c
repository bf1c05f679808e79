/*
 * test_fake.c - the fake backend: rank R of a W-rank world on one machine,
 * where collectives over several ranks move nothing and a group of one is
 * exact; plus the handle checks that need a single thread (double destroy).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "mpu.h"

static void test_create(void **state) {
  (void)state;
  mpu_comm *c = NULL;
  assert_int_equal(mpu_comm_fake_create(4096, 4096, &c), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "rank 4096 of 4096"));
  assert_int_equal(mpu_comm_fake_create(-1, 8, &c), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_comm_fake_create(0, 0, &c), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_comm_fake_create(0, 1, NULL), MPU_ERR_INVALID_ARGUMENT);
  assert_null(c);
  assert_int_equal(mpu_comm_fake_create(3000, 4096, &c), MPU_SUCCESS);
  int r, s, w;
  assert_int_equal(mpu_comm_rank(c, &r), MPU_SUCCESS);
  assert_int_equal(mpu_comm_size(c, &s), MPU_SUCCESS);
  assert_int_equal(mpu_comm_world_rank(c, 17, &w), MPU_SUCCESS);
  assert_int_equal(r, 3000);
  assert_int_equal(s, 4096);
  assert_int_equal(w, 17);
  assert_string_equal(mpu_comm_backend(c), "fake");
  assert_int_equal(mpu_comm_destroy(c), MPU_SUCCESS);
}

/* Over many ranks nothing moves: outputs keep what they held. */
static void test_collectives_move_nothing(void **state) {
  (void)state;
  mpu_comm *c;
  assert_int_equal(mpu_comm_fake_create(3, 8, &c), MPU_SUCCESS);
  float in[64], outb[64 * 8];
  for (int i = 0; i < 64; i++) in[i] = (float)i;
  memset(outb, 0x11, sizeof outb);
  unsigned char pattern[sizeof outb];
  memcpy(pattern, outb, sizeof outb);
  assert_int_equal(mpu_comm_all_reduce(c, in, outb, 64, MPU_FLOAT32, MPU_SUM), MPU_SUCCESS);
  assert_int_equal(mpu_comm_all_gather(c, in, outb, 64, MPU_FLOAT32), MPU_SUCCESS);
  assert_int_equal(mpu_comm_reduce_scatter(c, outb, in, 8, MPU_FLOAT32, MPU_MAX), MPU_SUCCESS);
  assert_int_equal(mpu_comm_reduce(c, in, outb, 64, MPU_FLOAT32, MPU_SUM, 3), MPU_SUCCESS);
  assert_int_equal(mpu_comm_all_to_all(c, in, outb, 8, MPU_FLOAT32), MPU_SUCCESS);
  assert_int_equal(mpu_comm_broadcast(c, outb, 64, MPU_FLOAT32, 0), MPU_SUCCESS);
  assert_int_equal(mpu_comm_send(c, in, 64, MPU_FLOAT32, 4), MPU_SUCCESS);
  assert_int_equal(mpu_comm_recv(c, outb, 64, MPU_FLOAT32, 4), MPU_SUCCESS);
  assert_int_equal(mpu_comm_barrier(c), MPU_SUCCESS);
  assert_memory_equal(outb, pattern, sizeof outb);
  for (int i = 0; i < 64; i++) assert_true(in[i] == (float)i);
  /* and bad calls fail exactly as on a real backend */
  assert_int_equal(mpu_comm_all_reduce(c, NULL, outb, 1, MPU_FLOAT32, MPU_SUM),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_comm_broadcast(c, outb, 1, MPU_FLOAT32, 8), MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_comm_reduce_scatter(c, in, outb, SIZE_MAX / 4, MPU_FLOAT32, MPU_SUM),
                   MPU_ERR_INVALID_ARGUMENT);
  assert_int_equal(mpu_comm_abort(c), MPU_SUCCESS);
  assert_int_equal(mpu_comm_destroy(c), MPU_SUCCESS);
}

/* A group of one is exact, as on every backend. */
static void test_group_of_one(void **state) {
  (void)state;
  mpu_comm *c;
  assert_int_equal(mpu_comm_fake_create(0, 1, &c), MPU_SUCCESS);
  int32_t in[5] = {1, -2, 3, -4, 5}, res[5] = {0};
  assert_int_equal(mpu_comm_all_reduce(c, in, res, 5, MPU_INT32, MPU_AVG), MPU_SUCCESS);
  assert_memory_equal(res, in, sizeof in);
  memset(res, 0, sizeof res);
  assert_int_equal(mpu_comm_all_gather(c, in, res, 5, MPU_INT32), MPU_SUCCESS);
  assert_memory_equal(res, in, sizeof in);
  memset(res, 0, sizeof res);
  assert_int_equal(mpu_comm_all_to_all(c, in, res, 5, MPU_INT32), MPU_SUCCESS);
  assert_memory_equal(res, in, sizeof in);
  memset(res, 0, sizeof res);
  assert_int_equal(mpu_comm_reduce(c, in, res, 5, MPU_INT32, MPU_MIN, 0), MPU_SUCCESS);
  assert_memory_equal(res, in, sizeof in);
  /* messages to itself arrive, in order, and are checked */
  int32_t got[5];
  assert_int_equal(mpu_comm_send(c, in, 5, MPU_INT32, 0), MPU_SUCCESS);
  assert_int_equal(mpu_comm_send(c, in + 1, 2, MPU_INT32, 0), MPU_SUCCESS);
  assert_int_equal(mpu_comm_recv(c, got, 5, MPU_INT32, 0), MPU_SUCCESS);
  assert_memory_equal(got, in, sizeof in);
  assert_int_equal(mpu_comm_recv(c, got, 3, MPU_INT32, 0), MPU_ERR_MISMATCH);
  assert_int_equal(mpu_comm_recv(c, got, 2, MPU_INT32, 0), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_send(c, in, 5, MPU_INT32, 0), MPU_SUCCESS); /* freed on destroy */
  mpu_comm *s = NULL;
  assert_int_equal(mpu_comm_split(c, 3, 0, &s), MPU_SUCCESS);
  assert_non_null(s);
  assert_int_equal(mpu_comm_destroy(s), MPU_SUCCESS);
  assert_int_equal(mpu_comm_destroy(c), MPU_SUCCESS);
}

static void test_groups(void **state) {
  (void)state;
  mpu_comm *c, *g = NULL, *s = (mpu_comm *)1;
  assert_int_equal(mpu_comm_fake_create(3000, 4096, &c), MPU_SUCCESS);
  int members[3] = {2999, 3000, 3001}, r, n, w;
  assert_int_equal(mpu_comm_create_group(c, members, 3, &g), MPU_SUCCESS);
  mpu_comm_rank(g, &r);
  mpu_comm_size(g, &n);
  mpu_comm_world_rank(g, 2, &w);
  assert_int_equal(r, 1);
  assert_int_equal(n, 3);
  assert_int_equal(w, 3001);
  int outside[2] = {1, 2};
  mpu_comm *bad = NULL;
  assert_int_equal(mpu_comm_create_group(c, outside, 2, &bad), MPU_ERR_INVALID_ARGUMENT);
  assert_null(bad);
  assert_int_equal(mpu_comm_split(c, 1, 0, &s), MPU_ERR_UNSUPPORTED);
  assert_non_null(strstr(mpu_last_error(), "mpu_comm_create_group"));
  assert_int_equal(mpu_comm_split(c, MPU_COMM_SPLIT_NOCOLOR, 0, &s), MPU_SUCCESS);
  assert_null(s);
  assert_int_equal(mpu_comm_destroy(g), MPU_SUCCESS);
  assert_int_equal(mpu_comm_destroy(c), MPU_SUCCESS);
}

static void test_double_destroy(void **state) {
  (void)state;
  mpu_comm *c;
  assert_int_equal(mpu_comm_fake_create(0, 2, &c), MPU_SUCCESS);
  assert_int_equal(mpu_comm_destroy(c), MPU_SUCCESS);
  assert_int_equal(mpu_comm_destroy(c), MPU_ERR_INVALID_USAGE);
  assert_non_null(strstr(mpu_last_error(), "destroyed twice"));
  assert_int_equal(mpu_comm_destroy(NULL), MPU_SUCCESS);
  int stack_thing = 0;
  assert_int_equal(mpu_comm_destroy((mpu_comm *)&stack_thing), MPU_ERR_INVALID_USAGE);
}

/* A million-rank world is as cheap as a small one. */
static void test_huge_world(void **state) {
  (void)state;
  mpu_comm *c;
  assert_int_equal(mpu_comm_fake_create(999999, 1000000, &c), MPU_SUCCESS);
  float x = 1, y = 2;
  assert_int_equal(mpu_comm_all_reduce(c, &x, &y, 1, MPU_FLOAT32, MPU_SUM), MPU_SUCCESS);
  assert_true(y == 2);
  assert_int_equal(mpu_comm_destroy(c), MPU_SUCCESS);
}

/* Benchmark sizes that overflow are refused, never allocated short. */
static void test_bench_sizes(void **state) {
  (void)state;
  mpu_comm *c = NULL;
  assert_int_equal(mpu_comm_fake_create(0, 4096, &c), MPU_SUCCESS);
  mpu_bench_config cfg = MPU_BENCH_CONFIG_INIT;
  mpu_bench_result res = MPU_BENCH_RESULT_INIT;
  cfg.iters = 1;
  cfg.warmup = 0;
  const size_t huge[] = {SIZE_MAX, SIZE_MAX - 63, SIZE_MAX / 2, (size_t)PTRDIFF_MAX + 1};
  for (int k = 0; k < MPU_COLL_COUNT; k++)
    for (size_t i = 0; i < sizeof huge / sizeof *huge; i++) {
      cfg.collective = (mpu_collective)k;
      cfg.bytes = huge[i];
      mpu_result_t r = mpu_bench_collective(c, &cfg, &res);
      assert_true(r == MPU_ERR_INVALID_ARGUMENT || r == MPU_ERR_OUT_OF_MEMORY);
    }
  mpu_comm_destroy(c);
}

/* nccl-tests -a (the mean over the ranks: rank 0's, average, min, max) and -z 1
 * (a barrier before every call) run; anything else is refused. */
static void test_bench_average_and_barrier(void **state) {
  (void)state;
  mpu_comm *c = NULL;
  assert_int_equal(mpu_comm_fake_create(0, 1, &c), MPU_SUCCESS);
  mpu_bench_config cfg = MPU_BENCH_CONFIG_INIT;
  cfg.bytes = 64, cfg.iters = 3, cfg.warmup = 0;
  assert_int_equal(cfg.average, MPU_BENCH_SLOWEST);
  for (int a = MPU_BENCH_SLOWEST; a <= MPU_BENCH_MAX; a++) {
    mpu_bench_result res = MPU_BENCH_RESULT_INIT;
    cfg.average = a, cfg.barrier = a & 1;
    assert_int_equal(mpu_bench_collective(c, &cfg, &res), MPU_SUCCESS);
    assert_true(res.mean_us > 0 && res.min_us <= res.mean_us * 3 + 1);
  }
  mpu_bench_result res = MPU_BENCH_RESULT_INIT;
  cfg.average = MPU_BENCH_MAX + 1;
  assert_int_equal(mpu_bench_collective(c, &cfg, &res), MPU_ERR_INVALID_ARGUMENT);
  cfg.average = MPU_BENCH_SLOWEST - 1;
  assert_int_equal(mpu_bench_collective(c, &cfg, &res), MPU_ERR_INVALID_ARGUMENT);
  mpu_comm_destroy(c);
}

/* The bench's result check knows every integer dtype: each reducing
 * collective and op on 3 threads ranks, checked, finds no wrong element. */
static mpu_result_t bench_int_dtypes(mpu_comm *world, void *arg) {
  (void)arg;
  static const mpu_dtype dts[] = {MPU_INT8, MPU_UINT32, MPU_UINT64};
  static const mpu_collective colls[] = {MPU_COLL_ALL_REDUCE, MPU_COLL_REDUCE_SCATTER,
                                         MPU_COLL_REDUCE};
  for (size_t d = 0; d < sizeof dts / sizeof *dts; d++)
    for (size_t k = 0; k < sizeof colls / sizeof *colls; k++)
      for (int op = 0; op < MPU_OP_COUNT; op++) {
        mpu_bench_config cfg = MPU_BENCH_CONFIG_INIT;
        mpu_bench_result res = MPU_BENCH_RESULT_INIT;
        cfg.collective = colls[k], cfg.dtype = dts[d], cfg.op = (mpu_op)op;
        cfg.bytes = 3 * 64 * mpu_dtype_size(dts[d]), cfg.iters = 1, cfg.warmup = 0, cfg.check = 1;
        mpu_result_t r = mpu_bench_collective(world, &cfg, &res);
        if (r) return r;
        if (res.wrong != 0) return MPU_ERR_INTERNAL;
      }
  return MPU_SUCCESS;
}

static void test_bench_int_dtypes(void **state) {
  (void)state;
  mpu_result_t results[3];
  assert_int_equal(mpu_launch(3, bench_int_dtypes, NULL, results, NULL), MPU_SUCCESS);
  for (int r = 0; r < 3; r++) assert_int_equal(results[r], MPU_SUCCESS);
}

/* Every entry point refuses a destroyed handle without reading it (ASan and
 * valgrind run this): MPU_ERR_INVALID_USAGE, as the docs promise. */
static void test_destroyed_handle(void **state) {
  (void)state;
  mpu_comm *c = NULL, *out = NULL;
  assert_int_equal(mpu_comm_fake_create(0, 1, &c), MPU_SUCCESS);
  assert_int_equal(mpu_comm_destroy(c), MPU_SUCCESS);
  float x = 1, y;
  int v, members[1] = {0};
  mpu_request *req = NULL;
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  void *p = NULL;
  assert_int_equal(mpu_comm_rank(c, &v), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_size(c, &v), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_world_rank(c, 0, &v), MPU_ERR_INVALID_USAGE);
  assert_string_equal(mpu_comm_backend(c), "invalid");
  assert_int_equal(mpu_comm_all_reduce(c, &x, &y, 1, MPU_FLOAT32, MPU_SUM), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_all_gather(c, &x, &y, 1, MPU_FLOAT32), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_reduce_scatter(c, &x, &y, 1, MPU_FLOAT32, MPU_SUM), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_broadcast(c, &x, 1, MPU_FLOAT32, 0), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_reduce(c, &x, &y, 1, MPU_FLOAT32, MPU_SUM, 0), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_all_to_all(c, &x, &y, 1, MPU_FLOAT32), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_barrier(c), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_iall_reduce(c, &x, &y, 1, MPU_FLOAT32, MPU_SUM, &req), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_send(c, &x, 1, MPU_FLOAT32, 0), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_recv(c, &x, 1, MPU_FLOAT32, 0), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_sendrecv(c, &x, 1, 0, &y, 1, 0, MPU_FLOAT32), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_create_group(c, members, 1, &out), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_split(c, 0, 0, &out), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_abort(c), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_capabilities(c, &caps), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_stream(c, &p), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_mem_alloc(c, 8, &p), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_copy2d(c, &y, 4, &x, 4, 4, 1), MPU_ERR_INVALID_USAGE);
  assert_int_equal(mpu_comm_destroy(c), MPU_ERR_INVALID_USAGE);
  assert_null(out);
}

static mpu_result_t nothing(mpu_comm *world, void *arg) {
  (void)world, (void)arg;
  return MPU_SUCCESS;
}

/* Options structs can grow: an older, shorter one is taken (newer fields
 * default), a larger one (from a newer library) is refused. */
static void test_option_sizes(void **state) {
  (void)state;
  mpu_comm *c = NULL;
  assert_int_equal(mpu_comm_fake_create(0, 1, &c), MPU_SUCCESS);
  mpu_bench_config cfg = MPU_BENCH_CONFIG_INIT;
  mpu_bench_result res = MPU_BENCH_RESULT_INIT;
  cfg.bytes = 64, cfg.iters = 2, cfg.warmup = 0;
  cfg.native = 12345; /* past the first version's end: must not be read */
  cfg.size = offsetof(mpu_bench_config, native);
  assert_int_equal(mpu_bench_collective(c, &cfg, &res), MPU_SUCCESS);
  assert_true(res.native_us < 0);
  cfg.size = sizeof cfg + 8;
  assert_int_equal(mpu_bench_collective(c, &cfg, &res), MPU_ERR_INVALID_ARGUMENT);
  cfg.size = 4;
  assert_int_equal(mpu_bench_collective(c, &cfg, &res), MPU_ERR_INVALID_ARGUMENT);
  mpu_comm_destroy(c);
  mpu_launch_options o = MPU_LAUNCH_OPTIONS_INIT;
  o.size = sizeof o + 16;
  assert_int_equal(mpu_launch(2, nothing, NULL, NULL, &o), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "MPU_LAUNCH_OPTIONS_INIT"));
  mpu_layout_config lc = MPU_LAYOUT_CONFIG_INIT;
  mpu_layout *l = NULL;
  lc.size = 0;
  assert_int_equal(mpu_layout_create(&lc, &l), MPU_ERR_INVALID_ARGUMENT);
  assert_null(l);
  /* result structs say how much the caller's version holds */
  lc = (mpu_layout_config)MPU_LAYOUT_CONFIG_INIT;
  lc.world_size = 8;
  assert_int_equal(mpu_layout_create(&lc, &l), MPU_SUCCESS);
  mpu_rank_info info = MPU_RANK_INFO_INIT;
  assert_int_equal(mpu_layout_rank_info(l, 3, &info), MPU_SUCCESS);
  assert_int_equal(info.rank, 3);
  assert_int_equal(info.size, sizeof info);
  info.size = sizeof info + 4;
  assert_int_equal(mpu_layout_rank_info(l, 3, &info), MPU_ERR_INVALID_ARGUMENT);
  info.size = 0;
  assert_int_equal(mpu_layout_rank_info(l, 3, &info), MPU_ERR_INVALID_ARGUMENT);
  assert_non_null(strstr(mpu_last_error(), "MPU_RANK_INFO_INIT"));
  mpu_layout_free(l);
  res.size = 2;
  assert_int_equal(mpu_comm_fake_create(0, 1, &c), MPU_SUCCESS);
  cfg.size = sizeof cfg;
  assert_int_equal(mpu_bench_collective(c, &cfg, &res), MPU_ERR_INVALID_ARGUMENT);
  mpu_comm_destroy(c);
}

/* One rank's state on the fake backend describes its groups instead of
 * listing them: every group's size, this rank's place and (asked for) every
 * member must still be the layout's, for both flavours and several ranks. */
static void test_mock_groups_are_the_layouts(void **state) {
  (void)state;
  for (int f = 0; f < 2; f++) {
    mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
    c.flavor = f ? MPU_FLAVOR_CORE : MPU_FLAVOR_DEEPSPEED;
    c.world_size = 64, c.tp = 2, c.pp = 4;
    if (f) c.cp = 2, c.ep = 2, c.vp = 2;
    else c.fp8 = 1;
    mpu_layout *l;
    assert_int_equal(mpu_layout_create(&c, &l), MPU_SUCCESS);
    int want[67], n;
    for (int rank = 0; rank < 64; rank += 7) {
      mpu_state *s;
      assert_int_equal(mpu_state_mock(rank, &c, 1, &s), MPU_SUCCESS);
      for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++) {
        if (!mpu_layout_has(l, (mpu_group_kind)k)) continue;
        assert_int_equal(mpu_layout_group(l, (mpu_group_kind)k, rank, want, 67, &n), MPU_SUCCESS);
        mpu_comm *g = NULL;
        mpu_result_t r = mpu_state_comm(s, (mpu_group_kind)k, &g);
        if (!n) continue; /* not in an embedding group */
        assert_int_equal(r, MPU_SUCCESS);
        int size, me, w;
        assert_int_equal(mpu_comm_size(g, &size), MPU_SUCCESS);
        assert_int_equal(mpu_comm_rank(g, &me), MPU_SUCCESS);
        assert_int_equal(size, n);
        assert_int_equal(want[me], rank);
        for (int i = 0; i < n; i++) {
          assert_int_equal(mpu_comm_world_rank(g, i, &w), MPU_SUCCESS);
          assert_int_equal(w, want[i]);
        }
        /* a group of the described group: its members are listed on demand */
        mpu_comm *sub = NULL;
        assert_int_equal(mpu_comm_create_group(g, &me, 1, &sub), MPU_SUCCESS);
        assert_int_equal(mpu_comm_world_rank(sub, 0, &w), MPU_SUCCESS);
        assert_int_equal(w, rank);
        mpu_comm_destroy(sub);
      }
      mpu_state_destroy(s);
    }
    mpu_layout_free(l);
  }
}

/* ... which makes one rank of 16,777,216 cheap: no member list is built. */
static void test_mock_huge(void **state) {
  (void)state;
  mpu_layout_config c = MPU_LAYOUT_CONFIG_INIT;
  c.world_size = 1 << 24, c.tp = 8, c.pp = 8, c.cp = 2, c.ep = 4;
  mpu_state *s;
  assert_int_equal(mpu_state_mock((1 << 24) - 1, &c, 1, &s), MPU_SUCCESS);
  mpu_comm *dp;
  int size, w;
  assert_int_equal(mpu_state_comm(s, MPU_GROUP_DP, &dp), MPU_SUCCESS);
  assert_int_equal(mpu_comm_size(dp, &size), MPU_SUCCESS);
  assert_int_equal(size, (1 << 24) / (8 * 8 * 2));
  assert_int_equal(mpu_comm_world_rank(dp, 0, &w), MPU_SUCCESS);
  assert_int_equal(w, (1 << 24) - 1 - (size - 1) * 16); /* dp stride: tp x cp */
  mpu_state_destroy(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_create),       cmocka_unit_test(test_collectives_move_nothing),
      cmocka_unit_test(test_bench_int_dtypes),
      cmocka_unit_test(test_group_of_one), cmocka_unit_test(test_groups),
      cmocka_unit_test(test_double_destroy), cmocka_unit_test(test_huge_world),
      cmocka_unit_test(test_bench_sizes),
      cmocka_unit_test(test_bench_average_and_barrier),
      cmocka_unit_test(test_destroyed_handle),
      cmocka_unit_test(test_option_sizes),
      cmocka_unit_test(test_mock_groups_are_the_layouts),
      cmocka_unit_test(test_mock_huge),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
