/*
 * schedule_cmd.c - `mpu plan --schedule`: a pipeline schedule's order of work
 * per stage and its timeline (text, JSON, SVG), with the bubble next to the
 * analytic (pp - 1) / (vp x micro-batches).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mpu.h"
#include "schedule_cmd.h"

static void fail(const char *what) {
  fprintf(stderr, "mpu plan: %s: %s\n", what, mpu_last_error());
  exit(1);
}

/* chunk c's colour: forwards light, backwards a darker shade of the same hue */
static const char *const chunk_light[6] = {"#aec7e8", "#98df8a", "#c5b0d5", "#ffbb78", "#9edae5",
                                           "#f7b6d2"};
static const char *const chunk_dark[6] = {"#5b8fc7", "#4fa84a", "#9175b5", "#e08a3a", "#3fa8b8",
                                          "#d06fa0"};

/* The timeline: a row per stage, a block per forward (F) and backward (B) labelled
 * micro-batch.chunk where the label fits (a tooltip everywhere), coloured by chunk;
 * a time axis in units of one forward of a chunk; idle time hatched: the bubble. */
static void svg(const mpu_schedule_config *c, mpu_schedule_step **order, double **start, int n,
                double makespan, double bubble, double analytic) {
  enum { LEFT = 80, FONT = 11 };
  const double char_w = 6.7, row = 36;
  double units = makespan * c->vp; /* one forward of a chunk takes 1/vp */
  double scale = 900.0 / makespan; /* pixels per model forward */
  if (scale / c->vp < 46) scale = 46.0 * c->vp; /* room for "F 12.3" in a forward */
  if (makespan * scale > 6000) scale = 6000 / makespan;
  int W = (int)(LEFT + makespan * scale + 110), H = (int)(104 + row * c->pp + 56);
  if (W < 900) W = 900;
  printf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
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
  /* legend: F and B of each chunk, and idle */
  int lx = 10;
  for (int ch = 0; ch < c->vp && ch < 6; ch++) {
    printf("<rect x=\"%d\" y=\"48\" width=\"38\" height=\"16\" fill=\"%s\"/><text x=\"%d\" y=\"60\">"
           "F .%d</text><rect x=\"%d\" y=\"48\" width=\"38\" height=\"16\" fill=\"%s\"/><text "
           "x=\"%d\" y=\"60\">B .%d</text>\n", lx, chunk_light[ch], lx + 3, ch, lx + 40,
           chunk_dark[ch], lx + 43, ch);
    lx += 90;
  }
  printf("<rect x=\"%d\" y=\"48\" width=\"38\" height=\"16\" fill=\"url(#idle)\"/><text x=\"%d\" "
         "y=\"60\">idle</text><text x=\"%d\" y=\"60\">F m.c / B m.c: forward / backward of "
         "micro-batch m, model chunk c</text>\n", lx, lx + 44, lx + 90);
  double top = 78;
  for (int p = 0; p < c->pp; p++) {
    double y = top + row * p, idle = makespan;
    printf("<text x=\"10\" y=\"%.1f\">stage %d</text>\n", y + row / 2 + 1, p);
    printf("<rect class=\"idle\" x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
           "fill=\"url(#idle)\"><title>stage %d idle</title></rect>\n", LEFT, y, makespan * scale,
           row - 6, p);
    for (int i = 0; i < n; i++) {
      const mpu_schedule_step *s = &order[p][i];
      double cost = (s->phase == 'F' ? 1.0 : c->backward_cost) / c->vp, w = cost * scale;
      int ch = s->chunk % 6;
      char label[32];
      snprintf(label, sizeof label, "%c %d.%d", s->phase == 'F' ? 'F' : 'B', s->microbatch,
               s->chunk);
      idle -= cost;
      printf("<g class=\"block\"><title>stage %d: %s of micro-batch %d, chunk %d, from %.3g to "
             "%.3g</title><rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" "
             "stroke=\"#fff\"/>",
             p, s->phase == 'F' ? "forward" : "backward", s->microbatch, s->chunk,
             start[p][i] * c->vp, (start[p][i] + cost) * c->vp, LEFT + start[p][i] * scale, y, w,
             row - 6, s->phase == 'F' ? chunk_light[ch] : chunk_dark[ch]);
      if (w >= char_w * (double)strlen(label) + 4)
        printf("<text x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>",
               LEFT + start[p][i] * scale + w / 2, y + row / 2 + 1, label);
      printf("</g>\n");
    }
    printf("<text x=\"%.1f\" y=\"%.1f\">idle %.3g</text>\n", LEFT + makespan * scale + 8,
           y + row / 2 + 1, idle * c->vp);
  }
  /* the time axis, in forwards of a chunk, a tick where the labels do not crowd */
  double axis_y = top + row * c->pp + 4, px_per_unit = scale / c->vp;
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
  if (format == CLI_SVG) {
    svg(c, order, start, n, makespan, bubble, analytic);
  } else if (format == CLI_JSON) {
    printf("{\"schedule\": \"%s\", \"pp\": %d, \"vp\": %d, \"microbatches\": %d, "
           "\"group_size\": %d, \"forward_only\": %s, \"makespan\": %.6g, \"bubble\": %.6g, "
           "\"analytic_bubble\": %.6g,\n \"stages\": [", mpu_schedule_name(c->kind), c->pp, c->vp,
           c->microbatches, c->kind == MPU_SCHEDULE_INTERLEAVED ? (c->group_size ? c->group_size : c->pp) : 0,
           c->forward_only ? "true" : "false", makespan, bubble, analytic);
    for (int p = 0; p < c->pp; p++) {
      int w;
      mpu_schedule_count(c, p, &n, &w);
      printf("%s\n  {\"stage\": %d, \"warmup\": %d, \"steps\": [", p ? "," : "", p, w);
      for (int i = 0; i < n; i++)
        printf("%s[\"%c\", %d, %d, %.6g]", i ? ", " : "", order[p][i].phase,
               order[p][i].microbatch, order[p][i].chunk, start[p][i]);
      printf("]}");
    }
    printf("\n ]}\n");
  } else {
    printf("%s schedule: pp %d, vp %d, %d micro-batches; steps as phase micro-batch.chunk\n",
           mpu_schedule_name(c->kind), c->pp, c->vp, c->microbatches);
    for (int p = 0; p < c->pp; p++) {
      int w;
      mpu_schedule_count(c, p, &n, &w);
      printf("  stage %-3d (%d warm-up)", p, w);
      for (int i = 0; i < n; i++)
        printf(" %c%d.%d", order[p][i].phase, order[p][i].microbatch, order[p][i].chunk);
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
