/*
 * plan.h - what the files of `mpu plan` share: plan_cmd.c parses and
 * dispatches, plan_info.c prints a rank, plan_picture.c draws the layout,
 * plan_bench.c times its set-up.
 */
#ifndef MPU_TOOL_PLAN_H
#define MPU_TOOL_PLAN_H

#include <stdio.h>

#include "cli.h"
#include "mpu.h"
#include "picture.h"

/* print "mpu plan: what: <last error>" and exit 1 */
void plan_fail(const char *what);
int plan_cmp_int(const void *a, const void *b);
void plan_fprint_ranks(FILE *f, const int *v, int n);
void plan_print_ranks(const int *v, int n);
void plan_print_groups(const mpu_layout *l, mpu_group_kind kind, int json, int *buf);

void plan_print_info_json(FILE *f, const mpu_layout *l, const mpu_rank_info *x);
void plan_print_info_text(const mpu_layout *l, const mpu_rank_info *x);

/* Beyond a few thousand ranks a picture of every rank is neither readable nor
 * cheap: say the sizes and show rank 0's groups, a bounded amount of work. */
typedef struct plan_summary {
  const mpu_layout *l;
  const mpu_group_kind *kinds;
  int nkinds;
} plan_summary;
void plan_svg_summary(void *arg, FILE *f);
void plan_layout_title(const mpu_layout *l, char *t, size_t len);
void plan_layout_picture(const mpu_layout *l, const mpu_group_kind *kinds, int nkinds, int *buf,
                         pic *p);
void plan_picture(const mpu_layout *l, int *buf);

int plan_bench(cli_format format);

#endif
