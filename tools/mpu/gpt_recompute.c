/*
 * gpt_recompute.c - the demo GPT's activation recompute as the user sees it:
 * the option's words, and what each choice keeps per micro-batch.
 */
#include <stdio.h>
#include <string.h>

#include "gpt.h"

static const char *const names[3] = {"full", "selective", "none"};

int gpt_recompute_parse(const char *word) {
  for (int k = 0; k < 3; k++)
    if (!strcmp(word, names[k])) return k;
  return -1;
}

const char *gpt_recompute_name(int mode) { return mode >= 0 && mode < 3 ? names[mode] : "?"; }

const char *gpt_recompute_phrase(int mode, long layers, char *buf, size_t size) {
  if (mode == GPT_RECOMPUTE_FULL && layers > 0)
    snprintf(buf, size, "full recompute of the first %ld block%s per model chunk", layers,
             layers == 1 ? "" : "s");
  else if (mode == GPT_RECOMPUTE_FULL)
    snprintf(buf, size, "full recompute");
  else if (mode == GPT_RECOMPUTE_SELECTIVE)
    snprintf(buf, size, "selective recompute (the attention core)");
  else
    snprintf(buf, size, "no recompute");
  return buf;
}

mpu_result_t gpt_recompute_report(const gpt_ctx *ctx, const gpt_chunk *chunks, int n,
                                  mpu_comm *world, double saved[3]) {
  for (int k = 0; k < 3; k++) {
    saved[k] = 0;
    for (int c = 0; c < n; c++)
      saved[k] += (double)sizeof(float) *
                  (double)gpt_saved_floats(ctx, chunks[c].nlayers, chunks[c].first, chunks[c].last,
                                           k, k == GPT_RECOMPUTE_FULL ? 0 : ctx->cfg.recompute_layers);
  }
  if (ctx->cfg.recompute == GPT_RECOMPUTE_FULL && ctx->cfg.recompute_layers > 0) { /* what is run */
    saved[0] = 0;
    for (int c = 0; c < n; c++)
      saved[0] += (double)sizeof(float) *
                  (double)gpt_saved_floats(ctx, chunks[c].nlayers, chunks[c].first, chunks[c].last,
                                           0, ctx->cfg.recompute_layers);
  }
  return mpu_comm_all_reduce(world, saved, saved, 3, MPU_FLOAT64, MPU_MAX);
}

void gpt_recompute_print(const double saved[3], int mode) {
  printf("activations kept per micro-batch in flight (the most on a rank): %.1f KiB with "
         "recompute %s; full keeps %.1f KiB, selective %.1f KiB, none %.1f KiB (full saves %.1f KiB, "
         "selective %.1f KiB against none)\n",
         saved[mode] / 1024, names[mode], saved[0] / 1024, saved[1] / 1024, saved[2] / 1024,
         (saved[2] - saved[0]) / 1024, (saved[2] - saved[1]) / 1024);
}
