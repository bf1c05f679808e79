/*
 * schedule_cmd.c - `mpu plan --schedule`: a pipeline schedule's order of work
 * per stage and its timeline (text, JSON, SVG), with the bubble next to the
 * analytic (pp - 1) / (vp x micro-batches).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
#define SVG_WIDTH 1380
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

/* chunk c's colour: forwards light, backwards a darker shade of the same hue */
static const char *const chunk_light[6] = {"#aec7e8", "#98df8a", "#c5b0d5", "#ffbb78", "#9edae5",
                                           "#f7b6d2"};
static const char *const chunk_dark[6] = {"#5b8fc7", "#4fa84a", "#9175b5", "#e08a3a", "#3fa8b8",
                                          "#d06fa0"};

/* The timeline: a row per stage, a block per forward (F) and backward (B) labelled
 * "F m.c", else "m.c", else "m" (micro-batch m, chunk c), whichever fits (a tooltip
 * everywhere), coloured by chunk, light forwards and dark backwards; a time axis in
 * units of one forward of a chunk; idle time hatched: the bubble. Past
 * SVG_MAX_STEPS steps each stage's three phases are drawn instead of its blocks,
 * and past SVG_MAX_STAGES stages the first and the last half of them. The drawing
 * is at most SVG_WIDTH wide, with a viewBox and width 100%: it scales to the
 * window, and a 1400-pixel one shows all of it with text at its own size. */
static void svg(const mpu_schedule_config *c, mpu_schedule_step **order, double **start, int n,
                double makespan, double bubble, double analytic) {
  enum { LEFT = 80, FONT = 11 };
  static const char *const phase_fill[3] = {"#8fb8ea", "#c3b4e0", "#f2b27a"};
  const double char_w = 6.7, row = 36;
  int rows = c->pp <= SVG_MAX_STAGES ? c->pp : SVG_MAX_STAGES + 1;
  int whole = (int64_t)n * c->pp <= SVG_MAX_STEPS;
  double units = makespan * c->vp; /* one forward of a chunk takes 1/vp */
  double scale = 900.0 / makespan; /* pixels per model forward */
  if (whole && scale / c->vp < 46) scale = 46.0 * c->vp; /* room for "F 12.3" in a forward */
  if (LEFT + makespan * scale + 110 > SVG_WIDTH) scale = (SVG_WIDTH - LEFT - 110) / makespan;
  int W = (int)(LEFT + makespan * scale + 110), H = (int)(104 + row * rows + 56 + (whole ? 0 : 40));
  if (W < 900) W = 900;
  printf("<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" width=\"100%%\" "
         "font-family=\"monospace\" font-size=\"%d\">\n<defs><pattern id=\"idle\" width=\"6\" "
         "height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\"><rect "
         "width=\"6\" height=\"6\" fill=\"#eee\"/><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" "
         "stroke=\"#bbb\" stroke-width=\"2\"/></pattern></defs>\n<rect width=\"100%%\" "
         "height=\"100%%\" fill=\"#fff\"/>\n", W, H, FONT);
  printf("<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">%s schedule: pp %d, vp %d, "
         "%d micro-batches%s</text>\n", mpu_schedule_name(c->kind), c->pp, c->vp, c->microbatches,
         c->forward_only ? ", forward only" : "");
  printf("<text x=\"10\" y=\"38\">bubble (hatched, idle) %.4f of the ideal time; analytic "
         "(pp-1)/(vp m) = %.4f; a backward costs %g forwards</text>\n", bubble, analytic,
         c->backward_cost);
  if (whole) {
    /* legend: F and B of each chunk, and idle */
    int lx = 10;
    for (int ch = 0; ch < c->vp && ch < 6; ch++) {
      printf("<rect x=\"%d\" y=\"48\" width=\"38\" height=\"16\" fill=\"%s\"/><text x=\"%d\" "
             "y=\"60\">F .%d</text><rect x=\"%d\" y=\"48\" width=\"38\" height=\"16\" fill=\"%s\"/>"
             "<text x=\"%d\" y=\"60\">B .%d</text>\n", lx, chunk_light[ch], lx + 3, ch, lx + 40,
             chunk_dark[ch], lx + 43, ch);
      lx += 90;
    }
    printf("<rect x=\"%d\" y=\"48\" width=\"38\" height=\"16\" fill=\"url(#idle)\"/><text "
           "x=\"%d\" y=\"60\">idle</text><text x=\"%d\" y=\"60\">F m.c / B m.c: forward / "
           "backward of micro-batch m, model chunk c (narrow blocks: m.c or m)</text>\n", lx,
           lx + 44, lx + 90);
  } else {
    /* legend: the three phases, and idle */
    int lx = 10;
    for (int k = 0; k < 3; k++) {
      printf("<rect x=\"%d\" y=\"48\" width=\"38\" height=\"16\" fill=\"%s\"/><text x=\"%d\" "
             "y=\"60\">%s</text>\n", lx, phase_fill[k], lx + 44, phase_names[k]);
      lx += 130;
    }
    printf("<rect x=\"%d\" y=\"48\" width=\"38\" height=\"16\" fill=\"url(#idle)\"/><text "
           "x=\"%d\" y=\"60\">idle</text>\n", lx, lx + 44);
  }
  double top = 78;
  for (int p = 0; p < c->pp; p++) {
    int at = shown(p, c->pp, SVG_MAX_STAGES);
    if (at < 0) continue;
    if (c->pp > SVG_MAX_STAGES && p == c->pp - SVG_MAX_STAGES / 2)
      printf("<text x=\"10\" y=\"%.1f\">... stages %d to %d are not drawn (at most %d stages are: "
             "the first and the last half)</text>\n", top + row * (at - 1) + row / 2 + 1,
             SVG_MAX_STAGES / 2, p - 1, SVG_MAX_STAGES);
    double y = top + row * at, idle = makespan;
    printf("<text x=\"10\" y=\"%.1f\">stage %d</text>\n", y + row / 2 + 1, p);
    printf("<rect class=\"idle\" x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
           "fill=\"url(#idle)\"><title>stage %d idle</title></rect>\n", LEFT, y, makespan * scale,
           row - 6, p);
    if (!whole) {
      phase_span ph[3];
      phases(c, order[p], start[p], n, p, ph);
      for (int i = 0; i < n; i++) idle -= (order[p][i].phase == 'F' ? 1.0 : c->backward_cost) / c->vp;
      for (int k = 0; k < 3; k++)
        if (ph[k].steps)
          printf("<g class=\"phase\"><title>stage %d: %s, %d steps, from %.3g to %.3g</title><rect "
                 "x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"/></g>\n",
                 p, phase_names[k], ph[k].steps, ph[k].from * c->vp, ph[k].to * c->vp,
                 LEFT + ph[k].from * scale, y, (ph[k].to - ph[k].from) * scale, row - 6,
                 phase_fill[k]);
      printf("<text x=\"%.1f\" y=\"%.1f\">idle %.3g</text>\n", LEFT + makespan * scale + 8,
             y + row / 2 + 1, idle * c->vp);
      continue;
    }
    for (int i = 0; i < n; i++) {
      const mpu_schedule_step *s = &order[p][i];
      double cost = (s->phase == 'F' ? 1.0 : c->backward_cost) / c->vp, w = cost * scale;
      int ch = s->chunk % 6;
      char labels[3][32], *label = NULL;
      snprintf(labels[0], sizeof labels[0], "%c %d.%d", s->phase == 'F' ? 'F' : 'B',
               s->microbatch, s->chunk);
      snprintf(labels[1], sizeof labels[1], "%d.%d", s->microbatch, s->chunk);
      snprintf(labels[2], sizeof labels[2], "%d", s->microbatch);
      for (int k = 0; k < 3 && !label; k++)
        if (w >= char_w * (double)strlen(labels[k]) + 4) label = labels[k];
      idle -= cost;
      printf("<g class=\"block\"><title>stage %d: %s of micro-batch %d, chunk %d, from %.3g to "
             "%.3g</title><rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
             "stroke=\"#fff\"/>",
             p, s->phase == 'F' ? "forward" : "backward", s->microbatch, s->chunk,
             start[p][i] * c->vp, (start[p][i] + cost) * c->vp, LEFT + start[p][i] * scale, y, w,
             row - 6, s->phase == 'F' ? chunk_light[ch] : chunk_dark[ch]);
      if (label)
        printf("<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>",
               LEFT + start[p][i] * scale + w / 2, y + row / 2 + 1, label);
      printf("</g>\n");
    }
    printf("<text x=\"%.1f\" y=\"%.1f\">idle %.3g</text>\n", LEFT + makespan * scale + 8,
           y + row / 2 + 1, idle * c->vp);
  }
  /* the time axis, in forwards of a chunk, a tick where the labels do not crowd */
  double axis_y = top + row * rows + 4, px_per_unit = scale / c->vp;
  int step = 1;
  while (px_per_unit * step < 40) step *= 2;
  printf("<line x1=\"%d\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\"/>\n", LEFT, axis_y,
         LEFT + makespan * scale, axis_y);
  for (int t = 0; t <= (int)(units + 1e-9); t += step)
    printf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\"/><text x=\"%.1f\" "
           "y=\"%.1f\" text-anchor=\"middle\">%d</text>\n", LEFT + t * px_per_unit, axis_y,
           LEFT + t * px_per_unit, axis_y + 5, LEFT + t * px_per_unit, axis_y + 17, t);
  printf("<text x=\"%d\" y=\"%.1f\">time, in forwards of one model chunk (a backward takes %g)"
         "</text>\n", LEFT, axis_y + 36, c->backward_cost);
  if (!whole)
    printf("<text x=\"%d\" y=\"%.1f\">%lld steps are too many to draw one by one (at most %d):"
           "</text>\n<text x=\"%d\" y=\"%.1f\">each stage's warm-up forwards, steady 1F1B and "
           "cool-down backwards are drawn; --format json gives the phase times</text>\n", LEFT,
           axis_y + 56, (long long)n * c->pp, SVG_MAX_STEPS, LEFT, axis_y + 72);
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
