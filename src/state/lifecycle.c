/*
 * lifecycle.c - making and ending one rank's parallel state: every rank
 * agrees on the config, then the groups' communicators (from descriptions
 * where the backend can, by split where it must), NCCL groups on request,
 * destroy; and the registry of live states every entry point checks.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "state/state_internal.h"
#include "comm/services.h"
#include "core/options.h"
#include "core/registry.h"

_Thread_local mpu_state *mpu__state_current;

/* ---- live states ------------------------------------------------------------- */

static mpu__registry live = MPU__REGISTRY_INIT(mpu_state, next_live);

void mpu__state_live_add(mpu_state *s) { mpu__registry_add(&live, s); }

static int live_find(const mpu_state *s, int take) {
  return take ? mpu__registry_take(&live, s, NULL) == 1 : mpu__registry_find(&live, s);
}

int mpu__state_is_live(const mpu_state *s) { return live_find(s, 0); }

mpu_result_t mpu__state_resolve(const char *fn, const mpu_state *s, const mpu_state **out) {
  *out = NULL;
  if (!s) s = mpu__state_current;
  if (!s)
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "%s: the parallel state is not initialized (call mpu_state_init first)", fn);
  if (!live_find(s, 0))
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "%s: %p is not a live state (destroyed, or never made)", fn, (const void *)s);
  *out = s;
  return MPU_SUCCESS;
}

mpu_result_t mpu__state_mutable(const char *fn, mpu_state *s, mpu_state **out) {
  const mpu_state *st = NULL;
  MPU_CHECK(mpu__state_resolve(fn, s, &st));
  *out = (mpu_state *)st; /* resolve hands back the caller's own state */
  return MPU_SUCCESS;
}

/* ---- lifecycle ----------------------------------------------------------------------- */

mpu_state *mpu_state_current(void) { return mpu__state_current; }
void mpu_state_set_current(mpu_state *s) { mpu__state_current = s; }

void mpu_state_destroy(mpu_state *s) {
  if (!s) return;
  if (!live_find(s, 1)) { /* never read: it may be freed memory */
    mpu__error(MPU_ERR_INVALID_USAGE, "mpu_state_destroy: %p is not a live state (destroyed twice?)",
               (void *)s);
    return;
  }
  for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++)
    if (!s->borrowed[k]) mpu_comm_destroy(s->nccl[k]);
  for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++)
    if (!s->borrowed[k]) mpu_comm_destroy(s->comms[k]);
  if (s->owns_world) mpu_comm_destroy(s->world);
  mpu_layout_free(s->layout);
  free(s->pipe);
  mpu__state_scratch_free(s->buffers);
  mpu__state_scratch_free(s->retired);
  s->magic = 0;
  if (mpu__state_current == s) mpu__state_current = NULL;
  free(s);
}

/* ---- every rank must init with the same config ------------------------------ */

enum { NFIELDS = 17 };
static const char *const field_names[NFIELDS] = {
    "flavor", "world_size", "tp", "pp", "vp", "split_rank", "sp", "cp", "ep", "fp8",
    "etp", "hcp", "dist_opt_instances", "gloo", "rank_offset", "local_world_size", "order"};

/* The config as numbers (the order and the hcp sizes as hashes), and their digest. */
static uint64_t config_fields(const mpu_layout_config *c, int64_t f[NFIELDS]) {
  uint64_t h = 1469598103934665603u, hh = 1469598103934665603u; /* FNV-1a */
  for (const char *p = c->order; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211u;
  for (int i = 0; i < c->n_hcp && i < MPU_HCP_MAX_LEVELS; i++)
    hh = (hh ^ (uint64_t)c->hcp[i]) * 1099511628211u;
  int64_t v[NFIELDS] = {c->flavor, c->world_size, c->tp, c->pp, c->vp, c->split_rank,
                        c->sp,     c->cp,         c->ep, c->fp8, c->etp, (int64_t)(hh >> 1),
                        c->dist_opt_instances, c->gloo, c->rank_offset, c->local_world_size,
                        (int64_t)(h >> 1)};
  uint64_t d = 1469598103934665603u;
  for (int i = 0; i < NFIELDS; i++) {
    f[i] = v[i];
    for (int b = 0; b < 8; b++) d = (d ^ (((uint64_t)v[i] >> (8 * b)) & 0xff)) * 1099511628211u;
  }
  return d;
}

/* An all_gather or broadcast of host bytes on any communicator: through
 * device memory when the communicator moves device buffers. */
static mpu_result_t host_collective(mpu_comm *c, int gather, void *buf, size_t bytes, int root,
                                    int n) {
  mpu_comm_caps caps;
  memset(&caps, 0, sizeof caps);
  caps.size = sizeof caps;
  MPU_CHECK(mpu_comm_capabilities(c, &caps));
  int rank;
  MPU_CHECK(mpu_comm_rank(c, &rank));
  size_t total = gather ? bytes * (size_t)n : bytes;
  if (caps.memory == MPU_MEMORY_HOST)
    return gather ? mpu_comm_all_gather(c, (char *)buf + (size_t)rank * bytes, buf, bytes, MPU_UINT8)
                  : mpu_comm_broadcast(c, buf, bytes, MPU_UINT8, root);
  void *dev = NULL; /* the communicator's scratch: no cudaMalloc/cudaFree per call */
  MPU_CHECK(mpu__comm_scratch(c, total, &dev));
  mpu_result_t r = mpu_comm_copy2d(c, dev, total, buf, total, total, 1);
  if (!r) r = gather ? mpu_comm_all_gather(c, (char *)dev + (size_t)rank * bytes, dev, bytes, MPU_UINT8)
                     : mpu_comm_broadcast(c, dev, bytes, MPU_UINT8, root);
  if (!r) r = mpu_comm_copy2d(c, buf, total, dev, total, total, 1);
  return r;
}

/* Collective over world: MPU_ERR_MISMATCH on every rank, naming the first
 * rank whose config differs from rank 0's and the field, if any does. A fake
 * rank cannot see the others' configs and is trusted. */
static mpu_result_t agree_on_config(mpu_comm *world, const mpu_layout_config *c) {
  static const char fn[] = "mpu_state_init";
  int n, rank;
  MPU_CHECK(mpu_comm_size(world, &n));
  MPU_CHECK(mpu_comm_rank(world, &rank));
  mpu_comm_caps caps = {.size = sizeof caps};
  MPU_CHECK(mpu_comm_capabilities(world, &caps));
  if (n == 1 || !caps.moves_data) return MPU_SUCCESS;
  int64_t mine[NFIELDS], first[NFIELDS], other[NFIELDS];
  uint64_t *digests = calloc((size_t)n, sizeof *digests);
  if (!digests) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %d digests", fn, n);
  digests[rank] = config_fields(c, mine);
  mpu_result_t r = host_collective(world, 1, digests, sizeof *digests, 0, n);
  int odd = -1;
  for (int k = 1; !r && k < n && odd < 0; k++)
    if (digests[k] != digests[0]) odd = k;
  free(digests);
  if (r || odd < 0) return r;
  /* name the field: rank 0's and the odd rank's fields, to everyone */
  memcpy(first, mine, sizeof first);
  memcpy(other, mine, sizeof other);
  MPU_CHECK(host_collective(world, 0, first, sizeof first, 0, n));
  MPU_CHECK(host_collective(world, 0, other, sizeof other, odd, n));
  int f = 0;
  while (f < NFIELDS - 1 && first[f] == other[f]) f++;
  return mpu__error(MPU_ERR_MISMATCH,
                    "%s: ranks were given different configs: rank %d's %s differs from rank 0's "
                    "(%lld vs %lld%s)",
                    fn, odd, field_names[f], (long long)other[f], (long long)first[f],
                    f == NFIELDS - 1 ? ", as hashes of the order text"
                    : f == 11        ? ", as hashes of the sizes"
                                     : "");
}

/* A described group's members, listed on demand (mpu__comm_group_described). */
typedef struct group_ref {
  const mpu_layout *layout; /* the state's: it outlives the state's communicators */
  mpu_group_kind kind;
  int rank;
} group_ref;

static mpu_result_t list_group(const void *ctx, int *out, int size) {
  const group_ref *g = ctx;
  int n = 0;
  MPU_CHECK(mpu_layout_group(g->layout, g->kind, g->rank, out, (size_t)size, &n));
  return n == size ? MPU_SUCCESS
                   : mpu__error(MPU_ERR_INTERNAL, "group of %d listed %d members", size, n);
}

static mpu_result_t described_group(mpu_comm *world, const mpu_layout *l, mpu_group_kind kind,
                                    int rank, mpu_comm **out) {
  int pos, n, first;
  MPU_CHECK(mpu_layout_locate(l, kind, rank, &pos, &n, &first));
  group_ref *ref = malloc(sizeof *ref);
  if (!ref) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "mpu_state_init: group reference");
  *ref = (group_ref){l, kind, rank};
  mpu_result_t r = mpu__comm_group_described(world, pos, n, list_group, ref, free, out);
  if (r) free(ref);
  return r;
}

/* A group made by splitting the world: its color is its least member (no
 * color for a rank in no group), its key the rank's place in Megatron's
 * member order. */
static void split_color(const int *members, int n, int rank, int *color, int *key) {
  *color = MPU_COMM_SPLIT_NOCOLOR;
  *key = 0;
  for (int i = 0; i < n; i++) {
    if (*color < 0 || members[i] < *color) *color = members[i];
    if (members[i] == rank) *key = i;
  }
}

mpu_result_t mpu_state_init(mpu_comm *world, const mpu_layout_config *cfg, mpu_state **out) {
  static const char fn[] = "mpu_state_init";
  int size, rank;
  MPU_CHECK(mpu_comm_size(world, &size));
  MPU_CHECK(mpu_comm_rank(world, &rank));
  if (!cfg || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  mpu_layout_config full = MPU_LAYOUT_CONFIG_INIT;
  MPU_CHECK(mpu__take_options(fn, "config", "MPU_LAYOUT_CONFIG_INIT",
                              cfg, sizeof full, MPU_LAYOUT_CONFIG_MIN_SIZE, &full));
  cfg = &full;
  /* before any rank can fail on its own: ranks with different configs must
   * all fail together, not hang in the first collective */
  MPU_CHECK(agree_on_config(world, cfg));
  mpu_layout_config c = *cfg;
  if (c.world_size == 0) c.world_size = size;
  if (c.world_size != size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: the config is for a world of %d ranks, the communicator has %d", fn,
                      c.world_size, size);
  mpu_state *s = calloc(1, sizeof *s);
  if (!s) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  s->magic = STATE_MAGIC;
  mpu__state_live_add(s); /* destroy (on failure below) takes it out again */
  s->world = world;
  s->tp_size_ov = s->tp_rank_ov = s->pp_size_ov = s->pp_rank_ov = -1;
  /* Megatron-DeepSpeed's initialize: training mode on, and the sp size override set
   * (on every rank); the other sequence overrides stay None */
  s->training = 1;
  s->sp_rank_ov = s->sdp_size_ov = s->sdp_rank_ov = -1;
  s->sp_size_ov = c.flavor == MPU_FLAVOR_DEEPSPEED ? c.sp : -1;
  s->vp_rank = c.vp ? 0 : -1;
  s->vp_size = c.vp ? c.vp : -1;
  s->split_rank = c.split_rank;
  mpu_result_t r;
  int *members = NULL;
  MPU_CHECK_GOTO(mpu_layout_create(&c, &s->layout), r, fail);
  s->base.size = sizeof s->base;
  MPU_CHECK_GOTO(mpu_layout_rank_info(s->layout, rank, &s->base), r, fail);
  /* On the fake backend (one rank of a huge world) every group except the
   * small pipeline and embedding ones is made from its description: this
   * rank's place and the group's size, O(dims), never its member list. */
  mpu_comm_caps caps = {.size = sizeof caps};
  MPU_CHECK(mpu_comm_capabilities(world, &caps));
  int described = caps.described_groups;
  size_t cap = described ? (size_t)c.pp + 3 : (size_t)size + 3; /* embedding groups: up to 3 */
  members = malloc(cap * sizeof(int));
  s->pipe = malloc((size_t)c.pp * sizeof(int));
  if (!members || !s->pipe) {
    r = mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
    goto fail;
  }
  /* A world that cannot make groups among members only (an NCCL world from
   * torchrun's environment, without a host twin) makes them by splitting:
   * collective over every rank, each naming its group by its least member. */
  int by_split = caps.groups_by_split;
  /* every rank walks the kinds in one order, so the members of each group
   * make their communicator together; a split is collective over the whole
   * world, so ranks outside a core-0.19 grid take part too, with no color */
  for (int k = 0; k < MPU_GROUP_KIND_COUNT && (s->base.in_grid || by_split); k++) {
    int n = 0;
    if (!mpu_layout_has(s->layout, (mpu_group_kind)k)) continue;
    mpu_group_kind alias = mpu_layout_alias_of(s->layout, (mpu_group_kind)k);
    if ((int)alias != k) { /* the original's same process group: one communicator */
      s->comms[k] = s->comms[alias];
      s->borrowed[k] = 1;
      continue;
    }
    if (described && k != MPU_GROUP_PP && k != MPU_GROUP_EMBEDDING &&
        k != MPU_GROUP_POSITION_EMBEDDING) {
      MPU_CHECK_GOTO(described_group(world, s->layout, (mpu_group_kind)k, rank, &s->comms[k]), r,
                     fail);
      continue;
    }
    if (s->base.in_grid)
      MPU_CHECK_GOTO(mpu_layout_group(s->layout, (mpu_group_kind)k, rank, members, cap, &n), r,
                     fail);
    if (k == MPU_GROUP_PP) memcpy(s->pipe, members, (size_t)n * sizeof(int));
    if (by_split) {
      int color, key;
      split_color(members, n, rank, &color, &key);
      MPU_CHECK_GOTO(mpu_comm_split(world, color, key, &s->comms[k]), r, fail);
    } else if (n) {
      MPU_CHECK_GOTO(mpu_comm_create_group(world, members, n, &s->comms[k]), r, fail);
    }
  }
  free(members);
  mpu_state_manual_seed(s, 0);
  mpu__state_current = s;
  *out = s;
  return MPU_SUCCESS;
fail:
  free(members);
  mpu_state_destroy(s);
  return r;
}

mpu_result_t mpu_state_enable_nccl(mpu_state *s, const mpu_nccl_options *options) {
  static const char fn[] = "mpu_state_enable_nccl";
  const mpu_state *found = NULL;
  MPU_CHECK(mpu__state_resolve(fn, s, &found));
  mpu_state *st = (mpu_state *)found; /* resolve hands back the caller's own state */
  if (!mpu_nccl_available())
    return mpu__error(MPU_ERR_UNSUPPORTED, "%s: this build of mpu has no NCCL backend", fn);
  for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++)
    if (st->nccl[k]) return mpu__error(MPU_ERR_INVALID_USAGE, "%s: NCCL is enabled already", fn);
  /* one device for every group of this rank: pick it once over the world */
  mpu_nccl_options o = MPU_NCCL_OPTIONS_INIT;
  if (options) {
    if (options->size == 0 || options->size > sizeof o)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: options.size is %zu", fn, options->size);
    memcpy(&o, options, options->size);
    o.size = sizeof o;
  }
  /* One NCCL communicator over the world, and every group an ncclCommSplit of
   * it (sharing its resources only when options.share_resources asks)
   * instead of a bootstrap of its own. Every rank walks the kinds in init's order and
   * takes part in every split: a rank in no group of a kind (outside a
   * core-0.19 grid, or in no embedding group) with no color. Gloo twins stay
   * host groups (that is what they are for). */
  mpu_comm *world = NULL;
  int rank = 0, size = 0;
  MPU_CHECK(mpu_comm_rank(st->world, &rank));
  MPU_CHECK(mpu_comm_size(st->world, &size));
  int *members = malloc(((size_t)size + 3) * sizeof(int)); /* embedding groups: up to 3 more */
  if (!members) return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s", fn);
  mpu_result_t r = mpu_comm_nccl_create(st->world, &o, &world);
  for (int k = 0; k < MPU_GROUP_KIND_COUNT && !r; k++) {
    if (!mpu_layout_has(st->layout, (mpu_group_kind)k) ||
        (int)mpu_layout_alias_of(st->layout, (mpu_group_kind)k) != k ||
        mpu_group_kind_is_gloo((mpu_group_kind)k))
      continue;
    int n = 0, color, key;
    if (st->base.in_grid)
      r = mpu_layout_group(st->layout, (mpu_group_kind)k, rank, members, size + 3, &n);
    split_color(members, n, rank, &color, &key);
    if (!r) r = mpu_comm_split(world, color, key, &st->nccl[k]);
  }
  free(members);
  mpu_comm_destroy(world); /* the groups keep anything they share with it */
  for (int k = 0; k < MPU_GROUP_KIND_COUNT && !r; k++)
    if (st->borrowed[k]) st->nccl[k] = st->nccl[mpu_layout_alias_of(st->layout, (mpu_group_kind)k)];
  if (r)
    for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++) {
      if (!st->borrowed[k]) mpu_comm_destroy(st->nccl[k]);
      st->nccl[k] = NULL;
    }
  return r;
}

