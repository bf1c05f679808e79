/*
 * plan_names.h - what `mpu plan`'s pictures call the kinds of group and the
 * per-rank getters.
 */
#ifndef MPU_TOOLS_PLAN_NAMES_H
#define MPU_TOOLS_PLAN_NAMES_H

#include <stddef.h>

#include "mpu.h"
#include "picture.h"

/* "data-parallel group", "expert tensor-parallel group", ...; buf holds the ones
 * that are made (hierarchical context-parallel levels) */
const char *plan_kind_caption(mpu_flavor flavor, mpu_group_kind k, char *buf, size_t len);

/* the per-rank JSON's keys by the parallel_state getters that answer them
 * ({NULL, NULL} ends it) */
extern const pic_name plan_getter_names[];

#endif
