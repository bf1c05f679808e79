/*
 * test_dtensor_torch.c - mpu's DTensor pieces are torch 2.15's, checked
 * against torch's own answers kept as tables (dtensor_torch_table.h,
 * written by test_dtensor_torch.py --write-table), so the check runs where
 * no torch is installed:
 *   - every rank's local shape and offset for every spec of Replicate and
 *     Shard placements on meshes (4), (2, 2), (2, 4), (2, 2, 2) with shapes
 *     (5, 3), (7, 9), (1, 4), (2, 7, 3): torch's
 *     compute_local_shape_and_global_offset, empty nested shards included;
 *   - after mpu_redistribute, the ranks' lines (shapes, offsets, the bits
 *     of every piece; dtensor_cases.h) hash to what torch's
 *     redistribute_local_tensor gave, for every placement pair torch carries
 *     out on (4), (2, 2), (2, 4) (on (2, 2, 2), 300 sampled pairs per shape):
 *     Partial(sum|avg|max|min), float32, float64, bfloat16 and int32,
 *     negative shard dims.
 * A few hand-derived cases, readable without the tables, sit beside them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "dtensor_cases.h"
#include "dtensor_torch_table.h"

static uint64_t fnv1a(const char *s) {
  uint64_t h = 0xcbf29ce484222325u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3u;
  return h;
}

/* A case line whose source and destination are the spec: every rank's
 * " shape offset" of the source, joined by '|' */
static int offsets_of(const char *spec, char *out, size_t len) {
  job j = {0};
  int ranks;
  mpu_mesh *mesh;
  if (case_parse(spec, &j, &ranks) || mpu_mesh_create(j.mdim, j.mshape, NULL, NULL, &mesh)) return -1;
  size_t w = 0;
  for (int r = 0; r < ranks && w < len; r++) {
    int64_t shape[MPU_TENSOR_MAX_DIMS], off[MPU_TENSOR_MAX_DIMS];
    if (mpu_dtensor_local_shape(mesh, r, &j.src, shape, off)) return mpu_mesh_free(mesh), -1;
    if (r) w += (size_t)snprintf(out + w, len - w, "|");
    w += (size_t)print_dims(out + w, len - w, shape, j.src.ndim);
    w += (size_t)print_dims(out + w, len - w, off, j.src.ndim);
  }
  mpu_mesh_free(mesh);
  return 0;
}

static void test_offsets_are_torchs(void **state) {
  (void)state;
  size_t n = sizeof torch_offsets / sizeof *torch_offsets, bad = 0;
  for (size_t k = 0; k < n; k++) {
    char got[1024];
    assert_int_equal(offsets_of(torch_offsets[k].spec, got, sizeof got), 0);
    if (strcmp(got, torch_offsets[k].want)) {
      if (bad++ < 10)
        fprintf(stderr, "%s:\n  torch %s\n  mpu   %s\n", torch_offsets[k].spec,
                torch_offsets[k].want, got);
    }
  }
  assert_true(n > 150);
  assert_int_equal(bad, 0);
}

static void test_pieces_are_torchs(void **state) {
  (void)state;
  size_t n = sizeof torch_pieces / sizeof *torch_pieces, bad = 0;
  job j = {0};
  char *all = malloc((size_t)MAXR * LINE);
  assert_non_null(all);
  for (size_t k = 0; k < n; k++) {
    int ranks;
    assert_int_equal(case_parse(torch_pieces[k].line, &j, &ranks), 0);
    assert_int_equal(case_run(&j, ranks), MPU_SUCCESS);
    size_t w = 0;
    for (int r = 0; r < ranks; r++) w += (size_t)sprintf(all + w, "%s%s", r ? "\n" : "", j.out[r]);
    if (fnv1a(all) != torch_pieces[k].hash && bad++ < 10)
      fprintf(stderr, "case %s differs from torch; mpu gives\n%s\n", torch_pieces[k].line, all);
  }
  case_free(&j);
  free(all);
  assert_true(n > 3500);
  assert_int_equal(bad, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_offsets_are_torchs),
      cmocka_unit_test(test_pieces_are_torchs),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
