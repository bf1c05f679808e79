/*
 * picture.h - a picture of ranks and their groups, for `mpu plan` and
 * `mpu mesh`: an SVG, or a self-contained HTML page (no network) in which
 * hovering or clicking a rank highlights each of its groups and lists its
 * getters.
 *
 * The caller places every rank on a grid (rows are labelled: pipeline stages,
 * mesh coordinates) and describes each kind of group by the group index of
 * every rank. Up to four kinds get a visual channel of their own in the main
 * grid (a frame, the fill colour, a stripe at the bottom and one at the top of
 * each cell, with a legend); every kind, those included, also gets a small
 * copy of the grid coloured by its groups, so that no kind goes undrawn.
 */
#ifndef MPU_TOOLS_PICTURE_H
#define MPU_TOOLS_PICTURE_H

#include <stdio.h>

#define PIC_MAX_KINDS 32

typedef struct pic_kind {
  char name[48];     /* as the JSON output names it: "tp", "dp_cp", "shard" */
  char caption[96];  /* what it is: "tensor-parallel group" */
  int ngroups;
  int *group_of;     /* [nranks]: the rank's group index, -1 where it is in none */
} pic_kind;

enum pic_channel { PIC_FRAME, PIC_FILL, PIC_STRIPE_LOW, PIC_STRIPE_HIGH, PIC_CHANNELS };

typedef struct pic {
  char title[512];
  int nranks, nrows, ncols;
  int *row, *col;       /* [nranks]: where each rank is drawn */
  char (*row_label)[96]; /* [nrows] */
  char row_caption[96]; /* what a row is, for the legend: "row = pipeline stage" */
  pic_kind kinds[PIC_MAX_KINDS];
  int nkinds;
  int channel[PIC_CHANNELS]; /* the kind each channel draws, -1 for none */
  char **info;          /* [nranks]: a JSON object of the rank's getters (HTML), or NULL */
} pic;

/* Allocate a picture of nranks ranks on an nrows x ncols grid; -1 if out of memory. */
int pic_init(pic *p, int nranks, int nrows, int ncols);
void pic_free(pic *p);

/* A new kind (its group_of all -1); NULL if there is no room or memory. */
pic_kind *pic_add_kind(pic *p, const char *name, const char *caption);

/* Rank r's getters as a JSON object (the picture takes the malloc'd string). */
void pic_set_info(pic *p, int r, char *json);

void pic_svg(const pic *p, FILE *f);
void pic_html(const pic *p, FILE *f);

/* A page around an SVG that is only a summary (too many ranks to draw). */
void pic_html_summary(FILE *f, const char *title, void (*svg)(void *arg, FILE *f), void *arg);

#endif
