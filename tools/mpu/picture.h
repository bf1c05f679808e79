/*
 * picture.h - a picture of ranks and their groups, for `mpu plan` and
 * `mpu mesh`: an SVG, or a self-contained HTML page (no network) in which
 * hovering or clicking a rank highlights each of its groups and lists its
 * getters.
 *
 * The caller places every rank on a grid (rows are labelled: pipeline stages,
 * mesh coordinates) and describes each kind of group by the group index of
 * every rank. The main grid frames one kind's groups (tp) and colours the
 * cells by one kind at a time, the cell carrying its rank and that kind's
 * group number (the HTML page has a selector of the kind to colour by); every
 * kind also gets a small grid of its own with the group number in every
 * cell, so that no kind goes undrawn and none depends on telling colours
 * apart. The geometry fits a 1400-pixel window beside the HTML side panel,
 * and no text is smaller than 9 pixels.
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

enum pic_channel { PIC_FRAME, PIC_FILL, PIC_CHANNELS };

/* One line of the HTML side panel's table: a key of the per-rank JSON
 * (pic.info) and how the user knows it (Megatron's getter name). */
typedef struct pic_name {
  const char *key, *shown;
} pic_name;

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
  const char *info_caption;  /* the side panel's heading for info: "getters", "coordinates" */
  const pic_name *info_names; /* {key, shown} pairs ending with {NULL, NULL}; NULL: the keys */
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
