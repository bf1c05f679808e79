/*
 * plan_compare.h - `mpu plan --compare`: one layout's sizes in the three
 * flavours side by side, and the bounded look at one group that it and the
 * layout's summary picture share.
 */
#ifndef MPU_TOOLS_PLAN_COMPARE_H
#define MPU_TOOLS_PLAN_COMPARE_H

#include <stdio.h>

#include "mpu.h"

/* Past this many ranks, groups are summarised instead of listed or drawn:
 * neither a person nor a page reads more, and the work stays bounded. */
#define PLAN_LIST_MAX_RANKS 4096
/* the members a summary shows of one group */
#define PLAN_PEEK_MEMBERS_MAX 12
/* groups up to this size are listed to show them; larger ones only located */
#define PLAN_PEEK_LIST_MAX (1 << 20)

/* A group's first members, in Megatron's order, with bounded work. */
typedef struct plan_group_peek {
  int rank;      /* whose group: the grid's first rank */
  int size;      /* its members (0: that rank is in no group of the kind) */
  int up_to;     /* size is only the most a group of the kind has (not computed) */
  int listed;    /* how many of them are in members[] */
  int members[PLAN_PEEK_MEMBERS_MAX];
} plan_group_peek;

/* The grid's first rank's group of kind: its first members where it has at
 * most PLAN_PEEK_LIST_MAX, else only member 0 (located, not listed); an
 * embedding group, found by walking its pipeline, only its largest size when
 * the pipeline is longer than that. 0, or -1 with
 * mpu_last_error() set. */
int plan_group_peek_of(const mpu_layout *l, mpu_group_kind kind, plan_group_peek *peek);

/* The three flavours of cfg (its flavor is not read) side by side on out, as
 * text or JSON: every group up to PLAN_LIST_MAX_RANKS ranks, each kind's
 * count, size and first group past it. Returns 0; 2 (CLI_USAGE_EXIT) with
 * one line on err when every flavour refuses; 1 with one line on err when
 * memory runs out. */
int plan_compare(FILE *out, FILE *err, const mpu_layout_config *cfg, int json);

#endif
