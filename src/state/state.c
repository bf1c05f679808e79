/*
 * state.c - the parallel state of one rank: a layout, a communicator per
 * group it belongs to, the getters with Megatron's virtual-stage and
 * override rules, and the seeded streams.
 *
 * The answers right after init come from the layout (mpu_layout_rank_info);
 * what can change afterwards (virtual rank, split rank, the _MPU_ overrides)
 * is kept here and applied by the getters exactly where the original reads
 * it.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/services.h"
#include "core/error.h"
#include "core/options.h"
#include "mpu/state.h"

#define STATE_MAGIC UINT64_C(0x6d70752d73746174) /* "mpu-stat" */

struct mpu_state {
  uint64_t magic;
  mpu_layout *layout;
  mpu_comm *world;
  int owns_world;                        /* the mock's fake world */
  mpu_rank_info base;                    /* the getters' answers at init */
  mpu_comm *comms[MPU_GROUP_KIND_COUNT]; /* NULL where this rank has no group */
  mpu_comm *nccl[MPU_GROUP_KIND_COUNT];  /* after mpu_state_enable_nccl: over comms[k] */
  unsigned char borrowed[MPU_GROUP_KIND_COUNT]; /* comms[k] is an alias's (mpu_layout_alias_of) */
  int *pipe;                             /* this rank's pipeline, global ranks */
  int vp_rank, vp_size, split_rank;      /* -1: None */
  int tp_size_ov, tp_rank_ov, pp_size_ov, pp_rank_ov; /* -1: not overridden */
  int sp_size_ov, sp_rank_ov, sdp_size_ov, sdp_rank_ov; /* seed 003's; -1: None */
  int training;                          /* seed 003's _TRAINING_MODE */
  mpu_rng default_rng;
  mpu_rng_tracker tracker;
  struct scratch *buffers, *retired;     /* mpu_state_memory_buffer's, by (name, dtype) */
};

/* One buffer of the global memory buffer. */
typedef struct scratch {
  struct scratch *next;
  char name[64];
  mpu_dtype dtype;
  size_t numel;
  void *data;
} scratch;

static void scratch_free(scratch *b) {
  while (b) {
    scratch *next = b->next;
    free(b->data);
    free(b);
    b = next;
  }
}

static _Thread_local mpu_state *current;

/* ---- random streams ------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *x) {
  uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

void mpu_rng_seed(mpu_rng *g, uint64_t seed) {
  for (int i = 0; i < 4; i++) g->s[i] = splitmix(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t mpu_rng_next(mpu_rng *g) {
  uint64_t *s = g->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

float mpu_rng_uniform(mpu_rng *g) { return (float)(mpu_rng_next(g) >> 40) * (1.0f / 16777216.0f); }

float mpu_rng_normal(mpu_rng *g, float mean, float std) {
  /* Box-Muller on two uniforms in (0, 1] and [0, 1) */
  double u1 = ((double)(mpu_rng_next(g) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = (double)(mpu_rng_next(g) >> 11) * (1.0 / 9007199254740992.0);
  double r = __builtin_sqrt(-2.0 * __builtin_log(u1));
  return mean + std * (float)(r * __builtin_cos(6.283185307179586 * u2));
}

void mpu_rng_tracker_reset(mpu_rng_tracker *t) {
  if (t) memset(t, 0, sizeof *t);
}

mpu_result_t mpu_rng_tracker_add(mpu_rng_tracker *t, const char *name, uint64_t seed) {
  if (!t || !name || !*name || strlen(name) >= sizeof t->names[0])
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_rng_tracker_add: bad tracker or name");
  for (int i = 0; i < t->nseeds; i++) /* Megatron checks the seed first */
    if (t->seeds[i] == seed)
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "seed %llu already exists",
                        (unsigned long long)seed);
  for (int i = 0; i < t->n; i++)
    if (!strcmp(t->names[i], name))
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "rng state %s already exists", name);
  if (t->n == MPU_RNG_TRACKER_MAX || t->nseeds == MPU_RNG_TRACKER_MAX)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_rng_tracker_add: more than %d streams",
                      MPU_RNG_TRACKER_MAX);
  t->seeds[t->nseeds++] = seed;
  strcpy(t->names[t->n], name);
  mpu_rng_seed(&t->rngs[t->n++], seed);
  return MPU_SUCCESS;
}

mpu_result_t mpu_rng_tracker_fork(mpu_rng_tracker *t, const char *name, mpu_rng **out) {
  if (!t || !name || !out)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_rng_tracker_fork: NULL argument");
  for (int i = 0; i < t->n; i++)
    if (!strcmp(t->names[i], name)) return *out = &t->rngs[i], MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT, "rng state %s is not added", name);
}

mpu_result_t mpu_rng_tracker_get_states(const mpu_rng_tracker *t, mpu_rng_states *out) {
  if (!t || !out)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_rng_tracker_get_states: NULL argument");
  memset(out, 0, sizeof *out);
  out->n = t->n;
  memcpy(out->names, t->names, sizeof out->names);
  memcpy(out->rngs, t->rngs, sizeof out->rngs);
  return MPU_SUCCESS;
}

mpu_result_t mpu_rng_tracker_set_states(mpu_rng_tracker *t, const mpu_rng_states *states) {
  static const char fn[] = "mpu_rng_tracker_set_states";
  if (!t || !states) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL argument", fn);
  if (states->n < 0 || states->n > MPU_RNG_TRACKER_MAX)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: %d streams (want 0..%d)", fn, states->n,
                      MPU_RNG_TRACKER_MAX);
  for (int i = 0; i < states->n; i++) /* names must be strings, or fork would read past them */
    if (!memchr(states->names[i], 0, sizeof states->names[i]) || !states->names[i][0])
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: stream %d has no name", fn, i);
  t->n = states->n;
  memcpy(t->names, states->names, sizeof t->names);
  memcpy(t->rngs, states->rngs, sizeof t->rngs);
  return MPU_SUCCESS;
}

/* ---- lifecycle ----------------------------------------------------------------------- */

mpu_state *mpu_state_current(void) { return current; }
void mpu_state_set_current(mpu_state *s) { current = s; }

void mpu_state_destroy(mpu_state *s) {
  if (!s || s->magic != STATE_MAGIC) return;
  for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++)
    if (!s->borrowed[k]) mpu_comm_destroy(s->nccl[k]);
  for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++)
    if (!s->borrowed[k]) mpu_comm_destroy(s->comms[k]);
  if (s->owns_world) mpu_comm_destroy(s->world);
  mpu_layout_free(s->layout);
  free(s->pipe);
  scratch_free(s->buffers);
  scratch_free(s->retired);
  s->magic = 0;
  if (current == s) current = NULL;
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
  void *dev = NULL;
  MPU_CHECK(mpu_comm_mem_alloc(c, total, &dev));
  mpu_result_t r = mpu_comm_copy2d(c, dev, total, buf, total, total, 1);
  if (!r) r = gather ? mpu_comm_all_gather(c, (char *)dev + (size_t)rank * bytes, dev, bytes, MPU_UINT8)
                     : mpu_comm_broadcast(c, dev, bytes, MPU_UINT8, root);
  if (!r) r = mpu_comm_copy2d(c, buf, total, dev, total, total, 1);
  mpu_comm_mem_free(c, dev);
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
  s->world = world;
  s->tp_size_ov = s->tp_rank_ov = s->pp_size_ov = s->pp_rank_ov = -1;
  /* seed 003's initialize: training mode on, and the sp size override set
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
   * make their communicator together */
  for (int k = 0; k < MPU_GROUP_KIND_COUNT && s->base.in_grid; k++) {
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
    MPU_CHECK_GOTO(mpu_layout_group(s->layout, (mpu_group_kind)k, rank, members, cap, &n), r,
                   fail);
    if (k == MPU_GROUP_PP) memcpy(s->pipe, members, (size_t)n * sizeof(int));
    if (by_split) {
      int color = MPU_COMM_SPLIT_NOCOLOR, key = 0;
      for (int i = 0; i < n; i++) {
        if (color < 0 || members[i] < color) color = members[i];
        if (members[i] == rank) key = i; /* Megatron's member order */
      }
      MPU_CHECK_GOTO(mpu_comm_split(world, color, key, &s->comms[k]), r, fail);
    } else if (n) {
      MPU_CHECK_GOTO(mpu_comm_create_group(world, members, n, &s->comms[k]), r, fail);
    }
  }
  free(members);
  mpu_state_manual_seed(s, 0);
  current = s;
  *out = s;
  return MPU_SUCCESS;
fail:
  free(members);
  mpu_state_destroy(s);
  return r;
}

/* ---- getters ---------------------------------------------------------------------------- */

/* s, or the current state; an error if neither. */
static mpu_result_t resolve(const char *fn, const mpu_state *s, const mpu_state **out) {
  *out = NULL;
  if (!s) s = current;
  if (!s)
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "%s: the parallel state is not initialized (call mpu_state_init first)", fn);
  if (s->magic != STATE_MAGIC)
    return mpu__error(MPU_ERR_INVALID_USAGE, "%s: %p is not a live state", fn, (const void *)s);
  *out = s;
  return MPU_SUCCESS;
}

#define STATE(fn, s, out_ptr)                              \
  const mpu_state *st = NULL;                              \
  MPU_CHECK(resolve(fn, s, &st));                          \
  if (!(out_ptr)) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: NULL output", fn)

/* A core-0.19 grid at an offset: a rank outside it is in no group, and the
 * getters that read a group have nothing to answer (the original asserts). */
static mpu_result_t in_grid(const char *fn, const mpu_state *st) {
  if (st->base.in_grid) return MPU_SUCCESS;
  int first, size;
  mpu_layout_grid(st->layout, &first, &size);
  return mpu__error(MPU_ERR_INVALID_USAGE,
                    "%s: rank %d is outside this state's grid (ranks %d..%d) and in no group", fn,
                    st->base.rank, first, first + size - 1);
}

/* STATE, for getters that answer from this rank's groups */
#define GRID_STATE(fn, s, out_ptr) \
  STATE(fn, s, out_ptr);           \
  MPU_CHECK(in_grid(fn, st))

int mpu_state_is_initialized(const mpu_state *s) {
  const mpu_state *st = s ? s : current;
  return st && st->magic == STATE_MAGIC;
}

const mpu_layout *mpu_state_layout(const mpu_state *s) {
  const mpu_state *st = s ? s : current;
  return st && st->magic == STATE_MAGIC ? st->layout : NULL;
}

mpu_comm *mpu_state_world(const mpu_state *s) {
  const mpu_state *st = s ? s : current;
  return st && st->magic == STATE_MAGIC ? st->world : NULL;
}

static int tp_size(const mpu_state *s) { return s->tp_size_ov >= 0 ? s->tp_size_ov : s->base.tp_size; }
static int tp_rank(const mpu_state *s) { return s->tp_rank_ov >= 0 ? s->tp_rank_ov : s->base.tp_rank; }
static int pp_size(const mpu_state *s) { return s->pp_size_ov >= 0 ? s->pp_size_ov : s->base.pp_size; }
static int pp_rank(const mpu_state *s) { return s->pp_rank_ov >= 0 ? s->pp_rank_ov : s->base.pp_rank; }

static int first_stage(const mpu_state *s, int ignore_virtual) {
  if (!ignore_virtual && s->vp_size >= 0 && s->vp_rank != 0) return 0;
  return pp_rank(s) == 0;
}

static int last_stage(const mpu_state *s, int ignore_virtual) {
  if (!ignore_virtual && s->vp_size >= 0 && s->vp_rank != s->vp_size - 1) return 0;
  return pp_rank(s) == pp_size(s) - 1;
}

static int before_split(const mpu_state *s, int stage) {
  if (pp_size(s) == 1 || s->split_rank < 0) return 1;
  return stage < s->split_rank;
}

static int after_split(const mpu_state *s, int stage) {
  if (pp_size(s) == 1 || s->split_rank < 0) return 1;
  return stage >= s->split_rank;
}

static int in_embedding(const mpu_state *s, int ignore_virtual) {
  const int *e = s->base.embedding_global_ranks;
  int n = s->base.n_embedding, rank = s->base.rank, in = 0;
  for (int i = 0; i < n; i++) in |= e[i] == rank;
  if (!in || ignore_virtual) return in;
  if (rank == e[0]) return first_stage(s, 0);
  if (rank == e[n - 1]) return last_stage(s, 0);
  return 1;
}

/* pipe[index] with the pipeline size the getters see (overrides may make it odd) */
static mpu_result_t pipe_at(const char *fn, const mpu_state *s, int index, int *rank) {
  if (index < 0 || index >= s->base.pp_size)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "%s: pipeline position %d is outside this rank's %d-stage pipeline "
                      "(check the pipeline overrides)",
                      fn, index, s->base.pp_size);
  *rank = s->pipe[index];
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_info(const mpu_state *s, mpu_rank_info *info) {
  STATE("mpu_state_info", s, info);
  mpu_rank_info x = st->base;
  x.tp_rank = tp_rank(st);
  x.tp_size = tp_size(st);
  if (mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED && x.tp_size > 0)
    x.tp_src = (x.rank / x.tp_size) * x.tp_size;
  x.pp_rank = pp_rank(st);
  x.pp_size = pp_size(st);
  if (x.pp_size > 0 && x.pp_size <= st->base.pp_size) {
    x.pp_last = st->pipe[x.pp_size - 1];
    x.pp_next = st->pipe[(x.pp_rank + 1) % x.pp_size];
    x.pp_prev = st->pipe[((x.pp_rank - 1) % x.pp_size + x.pp_size) % x.pp_size];
  }
  x.vp_rank = st->vp_rank;
  x.vp_size = st->vp_size;
  /* is_rank_in_embedding_group()'s default: ignore_virtual False before
   * core_v0.19.0, True in it */
  x.in_embedding_group =
      in_embedding(st, mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_CORE_019);
  if (mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED) { /* its getters only */
    x.is_first_stage = first_stage(st, 1);
    x.is_last_stage = last_stage(st, 1);
    x.stage_before_split = before_split(st, x.pp_rank);
    x.stage_after_split = after_split(st, x.pp_rank);
    x.stage_at_split = before_split(st, x.pp_rank) && after_split(st, x.pp_rank + 1);
  }
  return mpu__give_out("mpu_state_info", "info", "MPU_RANK_INFO_INIT", info, &x, sizeof x,
                       MPU_RANK_INFO_MIN_SIZE);
}

mpu_result_t mpu_state_enable_nccl(mpu_state *s, const mpu_nccl_options *options) {
  static const char fn[] = "mpu_state_enable_nccl";
  const mpu_state *found = NULL;
  MPU_CHECK(resolve(fn, s, &found));
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
  mpu_comm *probe = NULL;
  mpu_result_t r = MPU_SUCCESS;
  if (o.device < 0) { /* the world's NCCL communicator knows the local rank's device */
    MPU_CHECK(mpu_comm_nccl_create(st->world, &o, &probe));
    mpu_comm_caps caps = {.size = sizeof caps};
    r = mpu_comm_capabilities(probe, &caps);
    o.device = caps.device;
    mpu_comm_destroy(probe);
    if (r) return r;
  }
  /* every rank walks the kinds in init's order, so groups form together;
   * gloo twins stay host groups (that is what they are for) */
  for (int k = 0; k < MPU_GROUP_KIND_COUNT && !r; k++)
    if (st->comms[k] && !st->borrowed[k] && !mpu_group_kind_is_gloo((mpu_group_kind)k))
      r = mpu_comm_nccl_create(st->comms[k], &o, &st->nccl[k]);
  for (int k = 0; k < MPU_GROUP_KIND_COUNT && !r; k++)
    if (st->borrowed[k]) st->nccl[k] = st->nccl[mpu_layout_alias_of(st->layout, (mpu_group_kind)k)];
  if (r)
    for (int k = 0; k < MPU_GROUP_KIND_COUNT; k++) {
      if (!st->borrowed[k]) mpu_comm_destroy(st->nccl[k]);
      st->nccl[k] = NULL;
    }
  return r;
}

static mpu_group_kind seen_as(const mpu_state *st, mpu_group_kind kind);

mpu_result_t mpu_state_host_comm(const mpu_state *s, mpu_group_kind kind, mpu_comm **out) {
  STATE("mpu_state_host_comm", s, out);
  if ((unsigned)kind < MPU_GROUP_KIND_COUNT) kind = seen_as(st, kind);
  if ((unsigned)kind >= MPU_GROUP_KIND_COUNT || !st->comms[kind])
    return mpu__error(MPU_ERR_INVALID_USAGE, "mpu_state_host_comm: rank %d is in no group of kind %d",
                      st->base.rank, (int)kind);
  *out = st->comms[kind];
  return MPU_SUCCESS;
}

/* Seed 003: get_data_parallel_group() answers with the sequence-data group
 * (equal to the data-parallel group when sp is 1), as get_data_parallel_
 * world_size and _rank do; the plain group stays reachable through
 * mpu_state_plain_dp_comm. Core has no such alias. */
static mpu_group_kind seen_as(const mpu_state *st, mpu_group_kind kind) {
  int ds = mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED;
  return ds && kind == MPU_GROUP_DP ? MPU_GROUP_SDP : kind;
}

mpu_result_t mpu_state_plain_dp_comm(const mpu_state *s, mpu_comm **out) {
  STATE("mpu_state_plain_dp_comm", s, out);
  if (!st->comms[MPU_GROUP_DP])
    return mpu__error(MPU_ERR_INVALID_USAGE, "mpu_state_plain_dp_comm: rank %d is in no dp group",
                      st->base.rank);
  *out = st->nccl[MPU_GROUP_DP] ? st->nccl[MPU_GROUP_DP] : st->comms[MPU_GROUP_DP];
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_comm(const mpu_state *s, mpu_group_kind kind, mpu_comm **out) {
  STATE("mpu_state_comm", s, out);
  if ((unsigned)kind < MPU_GROUP_KIND_COUNT) kind = seen_as(st, kind);
  if (!mpu_layout_has(st->layout, kind))
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_state_comm: the %s layout has no %s groups",
                      mpu_flavor_name(mpu_layout_config_of(st->layout)->flavor),
                      mpu_group_kind_name(mpu_layout_config_of(st->layout)->flavor, kind));
  if (!st->comms[kind])
    return mpu__error(MPU_ERR_INVALID_USAGE, "mpu_state_comm: rank %d is in no %s group",
                      st->base.rank,
                      mpu_group_kind_name(mpu_layout_config_of(st->layout)->flavor, kind));
  *out = st->nccl[kind] ? st->nccl[kind] : st->comms[kind];
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_group_rank(const mpu_state *s, mpu_group_kind kind, int *rank) {
  mpu_comm *c;
  MPU_CHECK(mpu_state_comm(s, kind, &c));
  return mpu_comm_rank(c, rank);
}

mpu_result_t mpu_state_group_size(const mpu_state *s, mpu_group_kind kind, int *size) {
  mpu_comm *c;
  MPU_CHECK(mpu_state_comm(s, kind, &c));
  return mpu_comm_size(c, size);
}

mpu_result_t mpu_state_src_rank(const mpu_state *s, mpu_group_kind kind, int *rank) {
  GRID_STATE("mpu_state_src_rank", s, rank);
  int ds = mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED;
  if (ds && kind == MPU_GROUP_TP) return mpu_state_tp_src_rank(st, rank);
  if (ds && kind == MPU_GROUP_SP) {
    *rank = (st->base.rank / st->base.sp_size) * st->base.sp_size;
    return MPU_SUCCESS;
  }
  int pos, size; /* dp: get_data_parallel_src_rank reads the plain group's ranks */
  return mpu_layout_locate(st->layout, kind, st->base.rank, &pos, &size, rank);
}

#define GETTER(name, expr)                                    \
  mpu_result_t mpu_state_##name(const mpu_state *s, int *v) { \
    GRID_STATE("mpu_state_" #name, s, v);                     \
    *v = (expr);                                              \
    return MPU_SUCCESS;                                       \
  }

GETTER(tp_rank, tp_rank(st))
GETTER(tp_size, tp_size(st))
GETTER(tp_src_rank, mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED
                        ? (st->base.rank / tp_size(st)) * tp_size(st)
                        : st->base.tp_src)
GETTER(pp_rank, pp_rank(st))
GETTER(pp_size, pp_size(st))
GETTER(dp_rank, st->base.dp_rank)
/* seed 003: get_data_parallel_world_size() is get_sequence_data_parallel_
 * world_size(), so an sdp size override moves it too (deepspeed only) */
GETTER(dp_size, mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED &&
                        st->sdp_size_ov >= 0
                    ? st->sdp_size_ov
                    : st->base.dp_size)
GETTER(dp_src_rank, st->base.dp_src)
GETTER(mp_rank, st->base.mp_rank)
GETTER(mp_size, st->base.mp_size)
GETTER(is_stage_at_split, before_split(st, pp_rank(st)) && after_split(st, pp_rank(st) + 1))
GETTER(cp_rank, st->base.cp_rank)
GETTER(cp_size, st->base.cp_size)
GETTER(ep_rank, st->base.ep_rank)
GETTER(ep_size, st->base.ep_size)
/* core_v0.8.0 has no expert tensor group: the tensor group serves (its getters fall back to it) */
GETTER(etp_rank, st->base.etp_size > 0 ? st->base.etp_rank : tp_rank(st))
GETTER(etp_size, st->base.etp_size > 0 ? st->base.etp_size : tp_size(st))
GETTER(edp_rank, st->base.edp_rank)
GETTER(edp_size, st->base.edp_size)

/* module globals in the original, answered on every rank */
#define GLOBAL_GETTER(name, expr)                             \
  mpu_result_t mpu_state_##name(const mpu_state *s, int *v) { \
    STATE("mpu_state_" #name, s, v);                          \
    *v = (expr);                                              \
    return MPU_SUCCESS;                                       \
  }

GLOBAL_GETTER(vp_rank, st->vp_rank)
GLOBAL_GETTER(vp_size, st->vp_size)
GLOBAL_GETTER(split_rank, st->split_rank)
GLOBAL_GETTER(in_position_embedding_group, st->base.in_position_embedding_group)

mpu_result_t mpu_state_is_pp_first_stage(const mpu_state *s, int ignore_virtual, int *yes) {
  GRID_STATE("mpu_state_is_pp_first_stage", s, yes);
  *yes = first_stage(st, ignore_virtual);
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_is_pp_last_stage(const mpu_state *s, int ignore_virtual, int *yes) {
  GRID_STATE("mpu_state_is_pp_last_stage", s, yes);
  *yes = last_stage(st, ignore_virtual);
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_in_embedding_group(const mpu_state *s, int ignore_virtual, int *yes) {
  STATE("mpu_state_in_embedding_group", s, yes);
  *yes = in_embedding(st, ignore_virtual);
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_is_stage_before_split(const mpu_state *s, int stage, int *yes) {
  GRID_STATE("mpu_state_is_stage_before_split", s, yes);
  *yes = before_split(st, stage < 0 ? pp_rank(st) : stage);
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_is_stage_after_split(const mpu_state *s, int stage, int *yes) {
  GRID_STATE("mpu_state_is_stage_after_split", s, yes);
  *yes = after_split(st, stage < 0 ? pp_rank(st) : stage);
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_pp_first_rank(const mpu_state *s, int *rank) {
  GRID_STATE("mpu_state_pp_first_rank", s, rank);
  return pipe_at("mpu_state_pp_first_rank", st, 0, rank);
}

mpu_result_t mpu_state_pp_last_rank(const mpu_state *s, int *rank) {
  GRID_STATE("mpu_state_pp_last_rank", s, rank);
  return pipe_at("mpu_state_pp_last_rank", st, pp_size(st) - 1, rank);
}

mpu_result_t mpu_state_pp_next_rank(const mpu_state *s, int *rank) {
  GRID_STATE("mpu_state_pp_next_rank", s, rank);
  int n = pp_size(st);
  return pipe_at("mpu_state_pp_next_rank", st, n > 0 ? (pp_rank(st) + 1) % n : -1, rank);
}

mpu_result_t mpu_state_pp_prev_rank(const mpu_state *s, int *rank) {
  GRID_STATE("mpu_state_pp_prev_rank", s, rank);
  int n = pp_size(st); /* Python's % is never negative */
  return pipe_at("mpu_state_pp_prev_rank", st, n > 0 ? ((pp_rank(st) - 1) % n + n) % n : -1, rank);
}

/* ---- setters ----------------------------------------------------------------------------- */

static mpu_result_t mutable_state(const char *fn, mpu_state *s, mpu_state **out) {
  const mpu_state *st = NULL;
  MPU_CHECK(resolve(fn, s, &st));
  *out = (mpu_state *)st;
  return MPU_SUCCESS;
}

#define SETTER(name, field, lo)                                                       \
  mpu_result_t mpu_state_##name(mpu_state *s, int v) {                                \
    mpu_state *st = NULL;                                                             \
    MPU_CHECK(mutable_state("mpu_state_" #name, s, &st));                             \
    if (v < (lo))                                                                     \
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_state_" #name ": %d (want >= %d)", v, lo); \
    st->field = v;                                                                    \
    return MPU_SUCCESS;                                                               \
  }

SETTER(set_vp_rank, vp_rank, -1)
SETTER(set_vp_size, vp_size, -1)
SETTER(set_split_rank, split_rank, -1)
SETTER(set_tp_size, tp_size_ov, -1)
SETTER(set_tp_rank, tp_rank_ov, -1)
SETTER(set_pp_size, pp_size_ov, -1)
SETTER(set_pp_rank, pp_rank_ov, -1)

/* ---- seed 003: sequence parallelism, training and eval mode ----------------------------- */

static mpu_result_t deepspeed_only(const char *fn, const mpu_state *st) {
  if (mpu_layout_config_of(st->layout)->flavor == MPU_FLAVOR_DEEPSPEED) return MPU_SUCCESS;
  return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                    "%s: the core layout has no sequence-parallel groups (a deepspeed-flavour call)",
                    fn);
}

static int sp_size(const mpu_state *s) {
  return s->sp_size_ov >= 0 ? s->sp_size_ov : s->training ? s->base.sp_size : 1;
}

#define SEQ_GETTER(name, expr)                                \
  mpu_result_t mpu_state_##name(const mpu_state *s, int *v) { \
    STATE("mpu_state_" #name, s, v);                          \
    MPU_CHECK(deepspeed_only("mpu_state_" #name, st));        \
    *v = (expr);                                              \
    return MPU_SUCCESS;                                       \
  }

SEQ_GETTER(sp_size, sp_size(st))
SEQ_GETTER(sp_rank, st->sp_rank_ov >= 0 ? st->sp_rank_ov : st->training ? st->base.sp_rank : 0)
SEQ_GETTER(sdp_size, st->sdp_size_ov >= 0 ? st->sdp_size_ov : st->base.sdp_size)
SEQ_GETTER(sdp_rank, st->sdp_rank_ov >= 0 ? st->sdp_rank_ov : st->base.sdp_rank)

mpu_result_t mpu_state_sp_src_rank(const mpu_state *s, int *rank) {
  STATE("mpu_state_sp_src_rank", s, rank);
  MPU_CHECK(deepspeed_only("mpu_state_sp_src_rank", st));
  int n = sp_size(st);
  if (n <= 0) /* Python: ZeroDivisionError */
    return mpu__error(MPU_ERR_INVALID_USAGE,
                      "mpu_state_sp_src_rank: the sequence-parallel size is overridden to %d", n);
  *rank = (st->base.rank / n) * n;
  return MPU_SUCCESS;
}

#define SEQ_SETTER(name, field)                                                       \
  mpu_result_t mpu_state_##name(mpu_state *s, int v) {                                \
    mpu_state *st = NULL;                                                             \
    MPU_CHECK(mutable_state("mpu_state_" #name, s, &st));                             \
    MPU_CHECK(deepspeed_only("mpu_state_" #name, st));                                \
    if (v < -1)                                                                       \
      return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_state_" #name ": %d (want >= -1)", v); \
    st->field = v;                                                                    \
    return MPU_SUCCESS;                                                               \
  }

SEQ_SETTER(set_sp_size, sp_size_ov)
SEQ_SETTER(set_sp_rank, sp_rank_ov)
SEQ_SETTER(set_sdp_size, sdp_size_ov)
SEQ_SETTER(set_sdp_rank, sdp_rank_ov)

mpu_result_t mpu_state_is_training_mode(const mpu_state *s, int *yes) {
  STATE("mpu_state_is_training_mode", s, yes);
  *yes = st->training;
  return MPU_SUCCESS;
}

static mpu_result_t set_mode(const char *fn, mpu_state *s, int training) {
  mpu_state *st = NULL;
  MPU_CHECK(mutable_state(fn, s, &st));
  st->training = training;
  return MPU_SUCCESS;
}

mpu_result_t mpu_state_set_training_mode(mpu_state *s) {
  return set_mode("mpu_state_set_training_mode", s, 1);
}

mpu_result_t mpu_state_set_eval_mode(mpu_state *s) {
  return set_mode("mpu_state_set_eval_mode", s, 0);
}

/* a live state of the deepspeed flavour, given or current */
static int live_deepspeed(const mpu_state *s) {
  return mpu_state_is_initialized(s) &&
         mpu_layout_config_of((s ? s : current)->layout)->flavor == MPU_FLAVOR_DEEPSPEED;
}

int mpu_state_sp_is_initialized(const mpu_state *s) { return live_deepspeed(s); }
int mpu_state_sdp_is_initialized(const mpu_state *s) { return live_deepspeed(s); }

int mpu_state_is_uninitialized(const mpu_state *s) { return !mpu_state_is_initialized(s); }

/* ---- the global memory buffer ---------------------------------------------------------- */

mpu_result_t mpu_state_memory_buffer(mpu_state *s, const char *name, mpu_dtype dtype, int ndim,
                                     const int64_t *shape, mpu_tensor *out) {
  static const char fn[] = "mpu_state_memory_buffer";
  mpu_state *st = NULL;
  MPU_CHECK(mutable_state(fn, s, &st));
  if (!name || !*name || strlen(name) >= sizeof st->buffers->name || !out)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "%s: want a name of 1..63 characters and an out",
                      fn);
  /* the shape's checks (dims, byte size in size_t) are the tensor view's */
  static char probe;
  mpu_tensor want;
  MPU_CHECK(mpu_tensor_init(&want, &probe, dtype, ndim, shape));
  size_t numel = mpu_tensor_numel(&want), bytes = mpu_tensor_nbytes(&want);
  scratch *b = st->buffers;
  while (b && (b->dtype != dtype || strcmp(b->name, name))) b = b->next;
  if (!b || b->numel < numel) {
    scratch *grown = calloc(1, sizeof *grown);
    void *data = grown ? aligned_alloc(64, (bytes + 63) / 64 * 64 + 64) : NULL;
    if (!data) {
      free(grown);
      return mpu__error(MPU_ERR_OUT_OF_MEMORY, "%s: %zu bytes for '%s'", fn, bytes, name);
    }
    strcpy(grown->name, name); /* length checked above */
    grown->dtype = dtype, grown->numel = numel, grown->data = data;
    if (b) { /* retire the smaller one: views of it stay valid until destroy */
      scratch **p = &st->buffers;
      while (*p != b) p = &(*p)->next;
      *p = b->next;
      b->next = st->retired;
      st->retired = b;
    }
    grown->next = st->buffers;
    st->buffers = b = grown;
  }
  return mpu_tensor_init(out, b->data, dtype, ndim, shape);
}

mpu_result_t mpu_state_manual_seed(mpu_state *s, uint64_t seed) {
  mpu_state *st = NULL;
  MPU_CHECK(mutable_state("mpu_state_manual_seed", s, &st));
  /* model_parallel_cuda_manual_seed: the default stream gets the seed, the
   * tensor-parallel one seed + 2718 + tp rank; core_v0.8.0 also tracks the
   * data-parallel stream (the seed) and the expert one (seed + 1024 + 100 ep
   * rank + tp rank; core_v0.19.0: + the expert tensor rank), in this order.
   * A rank outside a core-0.19 grid has no ranks: its streams use 0. */
  int in = st->base.in_grid;
  uint64_t tp = in ? (uint64_t)tp_rank(st) : 0, ep = in ? (uint64_t)st->base.ep_rank : 0;
  mpu_flavor flavor = mpu_layout_config_of(st->layout)->flavor;
  uint64_t etp = flavor == MPU_FLAVOR_CORE_019 && in ? (uint64_t)st->base.etp_rank : tp;
  mpu_rng_seed(&st->default_rng, seed);
  mpu_rng_tracker_reset(&st->tracker);
  int core = flavor != MPU_FLAVOR_DEEPSPEED;
  if (core) MPU_CHECK(mpu_rng_tracker_add(&st->tracker, MPU_DATA_PARALLEL_RNG, seed));
  MPU_CHECK(mpu_rng_tracker_add(&st->tracker, MPU_MODEL_PARALLEL_RNG, seed + 2718 + tp));
  if (core)
    MPU_CHECK(mpu_rng_tracker_add(&st->tracker, MPU_EXPERT_PARALLEL_RNG,
                                  seed + 1024 + 100 * ep + etp));
  return MPU_SUCCESS;
}

mpu_rng *mpu_state_default_rng(mpu_state *s) {
  mpu_state *st = NULL;
  return mutable_state("mpu_state_default_rng", s, &st) ? NULL : &st->default_rng;
}

mpu_rng_tracker *mpu_state_rng_tracker(mpu_state *s) {
  mpu_state *st = NULL;
  return mutable_state("mpu_state_rng_tracker", s, &st) ? NULL : &st->tracker;
}

/* ---- testing helpers ------------------------------------------------------------------------ */

typedef struct with_state_ctx {
  mpu_layout_config cfg;
  uint64_t seed;
  mpu_state_fn fn;
  void *arg;
} with_state_ctx;

/* One rank's with-state run: init, seed, fn, destroy always (so the next
 * test starts clean), and the state current before comes back. */
static mpu_result_t run_with_state(mpu_comm *world, const mpu_layout_config *cfg, uint64_t seed,
                                   mpu_state_fn fn, void *arg) {
  mpu_state *before = current, *s = NULL;
  /* BioNeMo's helpers put back the random state they found: here, the
   * streams of the state that was current (its default stream and every
   * tracked one), whatever fn drew from them */
  int had = before && before->magic == STATE_MAGIC;
  mpu_rng saved_default;
  mpu_rng_tracker saved_tracker;
  if (had) saved_default = before->default_rng, saved_tracker = before->tracker;
  mpu_result_t r = mpu_state_init(world, cfg, &s);
  if (!r) r = mpu_state_manual_seed(s, seed);
  if (!r) r = fn(s, arg);
  mpu_state_destroy(s);
  current = before;
  if (had) before->default_rng = saved_default, before->tracker = saved_tracker;
  return r;
}

static mpu_result_t with_state_rank(mpu_comm *world, void *arg) {
  with_state_ctx *ctx = arg;
  return run_with_state(world, &ctx->cfg, ctx->seed, ctx->fn, ctx->arg);
}

mpu_result_t mpu_with_state_on(mpu_comm *world, const mpu_layout_config *cfg, uint64_t seed,
                               mpu_state_fn fn, void *arg) {
  if (!world || !cfg || !fn)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT,
                      "mpu_with_state_on: NULL communicator, config or function");
  return run_with_state(world, cfg, seed, fn, arg);
}

mpu_result_t mpu_with_state(int nranks, const mpu_layout_config *cfg, uint64_t seed,
                            mpu_state_fn fn, void *arg, mpu_result_t *results,
                            const mpu_launch_options *options) {
  if (!cfg || !fn)
    return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_with_state: NULL config or function");
  mpu_layout_config full = MPU_LAYOUT_CONFIG_INIT;
  MPU_CHECK(mpu__take_options("mpu_with_state", "config", "MPU_LAYOUT_CONFIG_INIT",
                              cfg, sizeof full,
                              MPU_LAYOUT_CONFIG_MIN_SIZE, &full));
  with_state_ctx ctx = {full, seed, fn, arg};
  ctx.cfg.world_size = nranks;
  /* a bad config fails here, once, before any thread starts */
  mpu_layout *check;
  MPU_CHECK(mpu_layout_create(&ctx.cfg, &check));
  mpu_layout_free(check);
  return mpu_launch(nranks, with_state_rank, &ctx, results, options);
}

mpu_result_t mpu_state_mock(int rank, const mpu_layout_config *cfg, uint64_t seed,
                            mpu_state **out) {
  if (!cfg || !out) return mpu__error(MPU_ERR_INVALID_ARGUMENT, "mpu_state_mock: NULL argument");
  mpu_comm *world;
  MPU_CHECK(mpu_comm_fake_create(rank, cfg->world_size, &world));
  mpu_state *s = NULL;
  mpu_result_t r = mpu_state_init(world, cfg, &s);
  if (r) {
    mpu_comm_destroy(world);
    return r;
  }
  s->owns_world = 1;
  r = mpu_state_manual_seed(s, seed);
  if (r) {
    mpu_state_destroy(s);
    return r;
  }
  *out = s;
  return MPU_SUCCESS;
}

void mpu_state_reset(void) { mpu_state_destroy(current); }
