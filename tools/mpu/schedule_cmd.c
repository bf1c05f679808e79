/*
 * schedule_cmd.c - `mpu plan --schedule`: a pipeline schedule's order of work
 * per stage and its timeline (text, JSON, SVG), with the bubble next to the
 * analytic (pp - 1) / (vp x micro-batches).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "mpu.h"
#include "schedule_cmd.h"

/* What a reader can take in: beyond these many steps (all stages together)
 * the picture draws each stage's three phases instead of its steps, and the
 * text and JSON give each stage's counts and phase times instead of listing
 * the steps (as the layout picture summarises more than 4096 ranks). */
#define SVG_MAX_STEPS 8192
#define LIST_MAX_STEPS 65536
/* and past these many stages the first and the last half of them are
 * given, with a line for the ones between */
#define SVG_MAX_STAGES 64
#define LIST_MAX_STAGES 4096

/* Stage p's place among the stages shown (max of pp), or -1 when it is not
 * shown; the row after the first half is the line for the ones left out. */
static int shown(int p, int pp, int max) {
  if (pp <= max || p < max / 2) return p;
  return p >= pp - max / 2 ? p - (pp - max) + 1 : -1;
}

static void fail(const char *what) {
  fprintf(stderr, "mpu plan: %s: %s\n", what, mpu_last_error());
  exit(1);
}

/* A stage's order in its three phases: the warm-up forwards, the steady
 * one-forward-one-backward steps and the cool-down backwards, each with its
 * step count and the time from its first start to its last end. */
typedef struct phase_span {
  int steps;
  double from, to;
} phase_span;

static const char *const phase_names[3] = {"warm-up", "steady", "cool-down"};

static void phases(const mpu_schedule_config *c, const mpu_schedule_step *order,
                   const double *start, int n, int stage, phase_span ph[3]) {
  int n0, warmup;
  mpu_schedule_count(c, stage, &n0, &warmup);
  int cool = c->forward_only ? 0 : warmup, bounds[4] = {0, warmup, n - cool, n};
  for (int k = 0; k < 3; k++) {
    int a = bounds[k], z = bounds[k + 1];
    ph[k].steps = z - a;
    ph[k].from = ph[k].to = 0;
    if (z <= a) continue;
    const mpu_schedule_step *last = &order[z - 1];
    ph[k].from = start[a];
    ph[k].to = start[z - 1] + (last->phase == 'F' ? 1.0 : c->backward_cost) / c->vp;
  }
}

static void svg(const mpu_schedule_config *c, mpu_schedule_step **order, double **start, int n,
                double makespan, double bubble, double analytic) {
  double scale = 900.0 / makespan, row = 34;
  int rows = c->pp <= SVG_MAX_STAGES ? c->pp : SVG_MAX_STAGES + 1;
  int W = 1000, H = (int)(80 + row * rows + 40);
  printf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
         "font-family=\"monospace\" font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" "
         "fill=\"#fff\"/>\n", W, H);
  printf("<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">%s schedule: pp %d, vp %d, "
         "%d micro-batches%s</text>\n", mpu_schedule_name(c->kind), c->pp, c->vp, c->microbatches,
         c->forward_only ? ", forward only" : "");
  printf("<text x=\"10\" y=\"38\">bubble %.4f of the ideal time (analytic (pp-1)/(vp m) = %.4f); "
         "forward 1, backward %g per model; grey = idle</text>\n", bubble, analytic,
         c->backward_cost);
  printf("<rect x=\"10\" y=\"48\" width=\"14\" height=\"10\" fill=\"#8fb8ea\"/><text x=\"28\" "
         "y=\"57\">forward (micro-batch.chunk)</text><rect x=\"210\" y=\"48\" width=\"14\" "
         "height=\"10\" fill=\"#f2b27a\"/><text x=\"228\" y=\"57\">backward</text>\n");
  int whole = (int64_t)n * c->pp <= SVG_MAX_STEPS;
  if (!whole)
    printf("<text x=\"10\" y=\"%.1f\">%lld steps are too many to draw one by one (at most %d): "
           "each stage's warm-up forwards, steady 1F1B and cool-down backwards are drawn; "
           "--format json gives the phase times</text>\n", 80 + row * rows + 20,
           (long long)n * c->pp, SVG_MAX_STEPS);
  for (int p = 0; p < c->pp; p++) {
    int at = shown(p, c->pp, SVG_MAX_STAGES);
    if (at < 0) continue;
    if (c->pp > SVG_MAX_STAGES && p == c->pp - SVG_MAX_STAGES / 2)
      printf("<text x=\"10\" y=\"%.1f\">... stages %d to %d are not drawn (at most %d stages are: "
             "the first and the last half)</text>\n", 70 + row * (at - 1) + row / 2 + 4,
             SVG_MAX_STAGES / 2, p - 1, SVG_MAX_STAGES);
    double y = 70 + row * at;
    printf("<text x=\"10\" y=\"%.1f\">stage %d</text>\n", y + row / 2 + 4, p);
    printf("<rect x=\"80\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#ddd\"/>\n", y,
           makespan * scale, row - 6);
    if (!whole) {
      phase_span ph[3];
      phases(c, order[p], start[p], n, p, ph);
      static const char *const fill[3] = {"#8fb8ea", "#c3b4e0", "#f2b27a"};
      for (int k = 0; k < 3; k++)
        if (ph[k].steps)
          printf("<g><title>stage %d: %s, %d steps, %.3f to %.3f</title><rect x=\"%.2f\" "
                 "y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"/></g>\n",
                 p, phase_names[k], ph[k].steps, ph[k].from, ph[k].to, 80 + ph[k].from * scale, y,
                 (ph[k].to - ph[k].from) * scale, row - 6, fill[k]);
      continue;
    }
    for (int i = 0; i < n; i++) {
      const mpu_schedule_step *s = &order[p][i];
      double w = (s->phase == 'F' ? 1.0 : c->backward_cost) / c->vp * scale;
      printf("<g><title>stage %d: %s micro-batch %d, chunk %d, at %.3f</title><rect x=\"%.2f\" "
             "y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" stroke=\"#fff\"/>",
             p, s->phase == 'F' ? "forward" : "backward", s->microbatch, s->chunk, start[p][i],
             80 + start[p][i] * scale, y, w, row - 6, s->phase == 'F' ? "#8fb8ea" : "#f2b27a");
      if (w > 22)
        printf("<text x=\"%.2f\" y=\"%.1f\">%d.%d</text>", 80 + start[p][i] * scale + 2,
               y + row / 2 + 1, s->microbatch, s->chunk);
      printf("</g>\n");
    }
  }
  printf("</svg>\n");
}

int plan_schedule(const mpu_schedule_config *c, cli_format format) {
  int n, warmup;
  if (mpu_schedule_count(c, 0, &n, &warmup)) {
    fprintf(stderr, "mpu plan: %s\n", mpu_last_error());
    return CLI_USAGE_EXIT;
  }
  mpu_schedule_step **order = calloc((size_t)c->pp, sizeof *order);
  double **start = calloc((size_t)c->pp, sizeof *start), makespan, bubble;
  if (!order || !start) fail("out of memory");
  for (int p = 0; p < c->pp; p++) {
    order[p] = malloc((size_t)n * sizeof **order);
    start[p] = malloc((size_t)n * sizeof **start);
    if (!order[p] || !start[p] || mpu_schedule_order(c, p, order[p], (size_t)n, &n)) fail("order");
  }
  if (mpu_schedule_timeline(c, start, &makespan, &bubble)) fail("timeline");
  double analytic = (double)(c->pp - 1) / ((double)c->vp * c->microbatches);
  int listed = (int64_t)n * c->pp <= LIST_MAX_STEPS;
  if (format == CLI_SVG) {
    svg(c, order, start, n, makespan, bubble, analytic);
  } else if (format == CLI_JSON) {
    printf("{\"schedule\": \"%s\", \"pp\": %d, \"vp\": %d, \"microbatches\": %d, "
           "\"group_size\": %d, \"forward_only\": %s, \"makespan\": %.6g, \"bubble\": %.6g, "
           "\"analytic_bubble\": %.6g,\n \"steps_listed\": %s, \"list_max_steps\": %d, "
           "\"stages_listed\": %d, \"list_max_stages\": %d,\n \"stages\": [",
           mpu_schedule_name(c->kind), c->pp, c->vp,
           c->microbatches, c->kind == MPU_SCHEDULE_INTERLEAVED ? (c->group_size ? c->group_size : c->pp) : 0,
           c->forward_only ? "true" : "false", makespan, bubble, analytic,
           listed ? "true" : "false", LIST_MAX_STEPS,
           c->pp <= LIST_MAX_STAGES ? c->pp : LIST_MAX_STAGES, LIST_MAX_STAGES);
    for (int p = 0; p < c->pp; p++) {
      if (shown(p, c->pp, LIST_MAX_STAGES) < 0) continue;
      int w;
      mpu_schedule_count(c, p, &n, &w);
      phase_span ph[3];
      phases(c, order[p], start[p], n, p, ph);
      printf("%s\n  {\"stage\": %d, \"warmup\": %d, \"count\": %d, \"phases\": [", p ? "," : "",
             p, w, n);
      for (int k = 0; k < 3; k++)
        printf("%s{\"phase\": \"%s\", \"steps\": %d, \"from\": %.6g, \"to\": %.6g}", k ? ", " : "",
               phase_names[k], ph[k].steps, ph[k].from, ph[k].to);
      printf("]");
      if (listed) {
        printf(", \"steps\": [");
        for (int i = 0; i < n; i++)
          printf("%s[\"%c\", %d, %d, %.6g]", i ? ", " : "", order[p][i].phase,
                 order[p][i].microbatch, order[p][i].chunk, start[p][i]);
        printf("]");
      }
      printf("}");
    }
    printf("\n ]}\n");
  } else {
    printf("%s schedule: pp %d, vp %d, %d micro-batches; steps as phase micro-batch.chunk\n",
           mpu_schedule_name(c->kind), c->pp, c->vp, c->microbatches);
    if (!listed)
      printf("  (%lld steps are too many to list, at most %d: each stage's phases instead)\n",
             (long long)n * c->pp, LIST_MAX_STEPS);
    for (int p = 0; p < c->pp; p++) {
      if (shown(p, c->pp, LIST_MAX_STAGES) < 0) continue;
      if (c->pp > LIST_MAX_STAGES && p == c->pp - LIST_MAX_STAGES / 2)
        printf("  ... stages %d to %d are not listed (at most %d stages are: the first and the "
               "last half)\n", LIST_MAX_STAGES / 2, p - 1, LIST_MAX_STAGES);
      int w;
      mpu_schedule_count(c, p, &n, &w);
      printf("  stage %-3d (%d warm-up)", p, w);
      if (listed)
        for (int i = 0; i < n; i++)
          printf(" %c%d.%d", order[p][i].phase, order[p][i].microbatch, order[p][i].chunk);
      else {
        phase_span ph[3];
        phases(c, order[p], start[p], n, p, ph);
        for (int k = 0; k < 3; k++)
          printf("%s %s %d steps %.4g..%.4g", k ? "," : "", phase_names[k], ph[k].steps,
                 ph[k].from, ph[k].to);
      }
      printf("\n");
    }
    printf("timeline (forward 1, backward %g per model): %.4g time units; bubble %.4f of the "
           "ideal time, analytic (pp-1)/(vp m) = %.4f\n", c->backward_cost, makespan, bubble,
           analytic);
  }
  for (int p = 0; p < c->pp; p++) free(order[p]), free(start[p]);
  free(order), free(start);
  return 0;
}
