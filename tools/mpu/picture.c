/*
 * picture.c - ranks on a grid and their groups, as SVG or a self-contained
 * HTML page (see picture.h).
 */
#include "picture.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the main grid */
#define CELL_W 48
#define CELL_H 34
#define GAP 6
#define PER_LINE 32 /* cells per drawn line: a long row wraps */
#define LINE_GAP 8
#define ROW_GAP 18
#define LEFT 190
#define STRIPE 6
/* the small grids, one per kind */
#define MINI 9
#define MINI_PITCH 10
#define MINI_PER_LINE 64
#define PANEL_MIN_W 340

int pic_init(pic *p, int nranks, int nrows, int ncols) {
  memset(p, 0, sizeof *p);
  p->nranks = nranks, p->nrows = nrows, p->ncols = ncols;
  for (int c = 0; c < PIC_CHANNELS; c++) p->channel[c] = -1;
  p->row = calloc((size_t)nranks, sizeof *p->row);
  p->col = calloc((size_t)nranks, sizeof *p->col);
  p->row_label = calloc((size_t)nrows, sizeof *p->row_label);
  p->info = calloc((size_t)nranks, sizeof *p->info);
  if (!p->row || !p->col || !p->row_label || !p->info) {
    pic_free(p);
    return -1;
  }
  return 0;
}

void pic_free(pic *p) {
  for (int k = 0; k < p->nkinds; k++) free(p->kinds[k].group_of);
  for (int r = 0; p->info && r < p->nranks; r++) free(p->info[r]);
  free(p->info);
  free(p->row);
  free(p->col);
  free(p->row_label);
  memset(p, 0, sizeof *p);
}

pic_kind *pic_add_kind(pic *p, const char *name, const char *caption) {
  if (p->nkinds == PIC_MAX_KINDS) return NULL;
  pic_kind *k = &p->kinds[p->nkinds];
  memset(k, 0, sizeof *k);
  if (!(k->group_of = malloc((size_t)p->nranks * sizeof(int)))) return NULL;
  for (int r = 0; r < p->nranks; r++) k->group_of[r] = -1;
  snprintf(k->name, sizeof k->name, "%s", name);
  snprintf(k->caption, sizeof k->caption, "%s", caption);
  p->nkinds++;
  return k;
}

void pic_set_info(pic *p, int r, char *json) {
  free(p->info[r]);
  p->info[r] = json;
}

/* ---- colours and text -------------------------------------------------------------- */

/* Group i's colour: hues a golden angle apart, so that neighbouring groups
 * (the ones a reader compares) are never close, and two lightnesses. */
static void colour(char *buf, size_t len, int i, int dark) {
  double hue = fmod(i * 137.508, 360.0);
  if (dark) snprintf(buf, len, "hsl(%.0f,70%%,%d%%)", hue, i % 2 ? 38 : 48);
  else snprintf(buf, len, "hsl(%.0f,65%%,%d%%)", hue, i % 2 ? 70 : 82);
}

static void xml_text(FILE *f, const char *s) {
  for (; *s; s++) switch (*s) {
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '&': fputs("&amp;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&#39;", f); break;
    default: fputc(*s, f);
    }
}

/* a JSON string that is also safe inside <script> */
static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20 || c == '<' || c == '>' || c == '&') fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

/* ---- geometry ------------------------------------------------------------------------ */

typedef struct geometry {
  int width, height, legend_y, grid_y, minis_y;
  int lines;       /* drawn lines per row of the main grid */
  int mini_lines;  /* per row of a small grid */
  int panel_w, panel_h, panels_per_line;
} geometry;

static int legend_entries(const pic *p) {
  int n = 2; /* rows, and the small grids */
  for (int c = 0; c < PIC_CHANNELS; c++) n += p->channel[c] >= 0;
  return n;
}

static geometry measure(const pic *p) {
  geometry g;
  int shown = p->ncols < PER_LINE ? p->ncols : PER_LINE;
  g.lines = p->ncols ? (p->ncols + PER_LINE - 1) / PER_LINE : 1;
  g.mini_lines = p->ncols ? (p->ncols + MINI_PER_LINE - 1) / MINI_PER_LINE : 1;
  g.width = LEFT + shown * (CELL_W + GAP) + 20;
  if (g.width < 1000) g.width = 1000;
  g.legend_y = 48;
  g.grid_y = g.legend_y + 20 * legend_entries(p) + 16;
  int row_h = g.lines * (CELL_H + LINE_GAP) - LINE_GAP + ROW_GAP;
  g.minis_y = g.grid_y + p->nrows * row_h + 24;
  int mini_w = (p->ncols < MINI_PER_LINE ? p->ncols : MINI_PER_LINE) * MINI_PITCH;
  g.panel_w = (mini_w > PANEL_MIN_W ? mini_w : PANEL_MIN_W) + 24;
  g.panel_h = 40 + p->nrows * (g.mini_lines * MINI_PITCH + 4) + 16;
  g.panels_per_line = (g.width - 20) / g.panel_w;
  if (g.panels_per_line < 1) g.panels_per_line = 1;
  int panel_lines = (p->nkinds + g.panels_per_line - 1) / g.panels_per_line;
  g.height = g.minis_y + 24 + panel_lines * g.panel_h + 10;
  return g;
}

static void cell_xy(const pic *p, const geometry *g, int r, int *x, int *y) {
  int row_h = g->lines * (CELL_H + LINE_GAP) - LINE_GAP + ROW_GAP;
  int line = p->col[r] / PER_LINE;
  *x = LEFT + (p->col[r] % PER_LINE) * (CELL_W + GAP);
  *y = g->grid_y + p->row[r] * row_h + line * (CELL_H + LINE_GAP);
}

/* ---- SVG ----------------------------------------------------------------------------- */

static void legend(const pic *p, const geometry *g, FILE *f) {
  static const char *what[PIC_CHANNELS] = {"frame", "colour", "bottom stripe", "top stripe"};
  int y = g->legend_y;
  char c[48];
  for (int ch = 0; ch < PIC_CHANNELS; ch++) {
    int k = p->channel[ch];
    if (k < 0) continue;
    const pic_kind *kind = &p->kinds[k];
    switch (ch) {
    case PIC_FRAME:
      fprintf(f, "<rect x=\"12\" y=\"%d\" width=\"40\" height=\"13\" fill=\"none\" stroke=\"#000\" "
                 "stroke-width=\"2\"/>\n", y - 11);
      break;
    case PIC_FILL:
      for (int i = 0; i < 3; i++) {
        colour(c, sizeof c, i, 0);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"13\" fill=\"%s\"/>\n", 12 + 14 * i,
                y - 11, c);
      }
      break;
    default:
      for (int i = 0; i < 3; i++) {
        colour(c, sizeof c, i, 1);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"%d\" fill=\"%s\"/>\n", 12 + 14 * i,
                ch == PIC_STRIPE_LOW ? y - 11 + 13 - STRIPE : y - 11, STRIPE, c);
      }
    }
    fprintf(f, "<text x=\"64\" y=\"%d\">%s = ", y, what[ch]);
    xml_text(f, kind->caption);
    fprintf(f, " (");
    xml_text(f, kind->name);
    fprintf(f, "), %d group%s%s</text>\n", kind->ngroups, kind->ngroups == 1 ? "" : "s",
            ch == PIC_FILL || ch >= PIC_STRIPE_LOW ? ", one colour each" : "");
    y += 20;
  }
  fprintf(f, "<text x=\"64\" y=\"%d\">", y);
  xml_text(f, p->row_caption);
  fprintf(f, "</text>\n");
  y += 20;
  fprintf(f, "<text x=\"64\" y=\"%d\">small grids below: every kind of group, one colour per "
             "group (ranks in none are grey)</text>\n", y);
}

static void main_grid(const pic *p, const geometry *g, FILE *f, const int *at) {
  char c[48];
  fprintf(f, "<g id=\"main\">\n");
  int row_h = g->lines * (CELL_H + LINE_GAP) - LINE_GAP + ROW_GAP;
  for (int row = 0; row < p->nrows; row++) {
    fprintf(f, "<text x=\"10\" y=\"%d\">", g->grid_y + row * row_h + 21);
    xml_text(f, p->row_label[row]);
    fprintf(f, "</text>\n");
  }
  for (int r = 0; r < p->nranks; r++) {
    int x, y;
    cell_xy(p, g, r, &x, &y);
    int fill = p->channel[PIC_FILL] >= 0 ? p->kinds[p->channel[PIC_FILL]].group_of[r] : -1;
    if (fill >= 0) colour(c, sizeof c, fill, 0);
    else snprintf(c, sizeof c, "#f2f2f2");
    fprintf(f, "<g class=\"cell\" data-rank=\"%d\"><rect class=\"bg\" x=\"%d\" y=\"%d\" width=\"%d\" "
               "height=\"%d\" fill=\"%s\"/>", r, x, y, CELL_W, CELL_H, c);
    for (int ch = PIC_STRIPE_LOW; ch <= PIC_STRIPE_HIGH; ch++) {
      int k = p->channel[ch], gi = k >= 0 ? p->kinds[k].group_of[r] : -1;
      if (gi < 0) continue;
      colour(c, sizeof c, gi, 1);
      fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\"/>", x,
              ch == PIC_STRIPE_LOW ? y + CELL_H - STRIPE : y, CELL_W, STRIPE, c);
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text></g>\n", x + CELL_W / 2,
            y + 22, r);
  }
  /* frames: around each run of neighbouring cells of one group, line by line */
  int k = p->channel[PIC_FRAME];
  for (int row = 0; k >= 0 && row < p->nrows; row++)
    for (int col = 0; col < p->ncols;) {
      int r = at[(size_t)row * p->ncols + col], gi = r >= 0 ? p->kinds[k].group_of[r] : -1, end = col + 1;
      while (gi >= 0 && end < p->ncols && end % PER_LINE && at[(size_t)row * p->ncols + end] >= 0 &&
             p->kinds[k].group_of[at[(size_t)row * p->ncols + end]] == gi)
        end++;
      if (gi >= 0) {
        int x, y;
        cell_xy(p, g, r, &x, &y);
        fprintf(f, "<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
                   "stroke=\"#000\" stroke-width=\"2\"/>\n",
                x - 3, y - 3, (end - col) * (CELL_W + GAP) - GAP + 6, CELL_H + 6);
      }
      col = end;
    }
  fprintf(f, "</g>\n");
}

static void small_grids(const pic *p, const geometry *g, FILE *f) {
  char c[48];
  fprintf(f, "<text x=\"10\" y=\"%d\" font-weight=\"bold\">every kind of group</text>\n",
          g->minis_y);
  for (int k = 0; k < p->nkinds; k++) {
    const pic_kind *kind = &p->kinds[k];
    int px = 10 + (k % g->panels_per_line) * g->panel_w;
    int py = g->minis_y + 24 + (k / g->panels_per_line) * g->panel_h;
    fprintf(f, "<g class=\"kind\" data-kind=\"");
    xml_text(f, kind->name);
    fprintf(f, "\"><text x=\"%d\" y=\"%d\">", px, py + 12);
    xml_text(f, kind->name);
    fprintf(f, ": %d group%s</text><text x=\"%d\" y=\"%d\" fill=\"#555\">", kind->ngroups,
            kind->ngroups == 1 ? "" : "s", px, py + 26);
    xml_text(f, kind->caption);
    fprintf(f, "</text>\n");
    for (int r = 0; r < p->nranks; r++) {
      int line = p->col[r] / MINI_PER_LINE;
      int x = px + (p->col[r] % MINI_PER_LINE) * MINI_PITCH;
      int y = py + 36 + p->row[r] * (g->mini_lines * MINI_PITCH + 4) + line * MINI_PITCH;
      if (kind->group_of[r] >= 0) colour(c, sizeof c, kind->group_of[r], 0);
      else snprintf(c, sizeof c, "#e4e4e4");
      fprintf(f, "<rect class=\"m\" data-rank=\"%d\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                 "fill=\"%s\"/>\n", r, x, y, MINI, MINI, c);
    }
    fprintf(f, "</g>\n");
  }
}

void pic_svg(const pic *p, FILE *f) {
  geometry g = measure(p);
  int *at = malloc((size_t)p->nrows * (size_t)p->ncols * sizeof(int) + 1);
  if (!at) {
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\"><text>out of memory</text></svg>\n");
    return;
  }
  for (size_t i = 0; i < (size_t)p->nrows * (size_t)p->ncols; i++) at[i] = -1;
  for (int r = 0; r < p->nranks; r++) at[(size_t)p->row[r] * p->ncols + p->col[r]] = r;
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
             "font-family=\"monospace\" font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" "
             "fill=\"#fff\"/>\n<text x=\"10\" y=\"24\" font-size=\"15\" font-weight=\"bold\">",
          g.width, g.height);
  xml_text(f, p->title);
  fprintf(f, "</text>\n");
  legend(p, &g, f);
  main_grid(p, &g, f, at);
  small_grids(p, &g, f);
  fprintf(f, "</svg>\n");
  free(at);
}

/* ---- HTML ---------------------------------------------------------------------------- */

static const char page_style[] =
    "body{margin:0;display:flex;font-family:monospace;font-size:13px}"
    "#pic{flex:1;overflow:auto;height:100vh}"
    "#side{width:420px;height:100vh;overflow:auto;border-left:1px solid #ccc;padding:0 12px}"
    "#side th{text-align:left;padding-right:8px;vertical-align:top}"
    "[data-rank]{cursor:pointer}"
    ".cell.sel rect.bg{stroke:#d00;stroke-width:4}"
    ".active .m{opacity:.25}.active .m.hl{opacity:1;stroke:#000;stroke-width:1.5}";

/* Hover shows a rank, a click pins it; each kind's small grid outlines the
 * rank's group, and the side panel lists the groups and the getters. */
static const char page_script[] =
    "const members = D.kinds.map(k => { const m = new Map();\n"
    "  k.g.forEach((g, r) => { if (g >= 0) { if (!m.has(g)) m.set(g, []); m.get(g).push(r); } });\n"
    "  return m; });\n"
    "const esc = s => String(s).replace(/[&<>]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;'})[c]);\n"
    "let pinned = null;\n"
    "function show(r) {\n"
    "  document.body.classList.add('active');\n"
    "  document.querySelectorAll('.hl, .sel').forEach(e => e.classList.remove('hl', 'sel'));\n"
    "  document.querySelectorAll('#main [data-rank=\"' + r + '\"]').forEach(e => e.classList.add('sel'));\n"
    "  const rows = [];\n"
    "  D.kinds.forEach((k, i) => {\n"
    "    const g = k.g[r], ms = g >= 0 ? members[i].get(g) : [];\n"
    "    const panel = document.querySelector('g.kind[data-kind=\"' + CSS.escape(k.name) + '\"]');\n"
    "    ms.forEach(m => panel.querySelector('[data-rank=\"' + m + '\"]').classList.add('hl'));\n"
    "    rows.push('<tr data-kind=\"' + esc(k.name) + '\"><th>' + esc(k.name) + '</th><td>' +\n"
    "              (g >= 0 ? '[' + ms.join(', ') + ']' : 'none') + '</td></tr>');\n"
    "  });\n"
    "  document.getElementById('sel').textContent = 'rank ' + r + (pinned === r ? ' (pinned)' : '');\n"
    "  document.getElementById('groups').innerHTML = rows.join('');\n"
    "  document.getElementById('getters').textContent = D.info ? JSON.stringify(D.info[r], null, 1) : '';\n"
    "}\n"
    "document.querySelectorAll('[data-rank]').forEach(e => {\n"
    "  const r = +e.dataset.rank;\n"
    "  e.addEventListener('mouseenter', () => show(r));\n"
    "  e.addEventListener('mouseleave', () => { if (pinned !== null) show(pinned); });\n"
    "  e.addEventListener('click', () => { pinned = r; show(r); });\n"
    "});\n";

static void page_head(FILE *f, const char *title) {
  fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>");
  xml_text(f, title);
  fprintf(f, "</title><style>%s</style></head><body>\n", page_style);
}

void pic_html(const pic *p, FILE *f) {
  page_head(f, p->title);
  fprintf(f, "<div id=\"pic\">\n");
  pic_svg(p, f);
  fprintf(f, "</div>\n<div id=\"side\"><h3 id=\"sel\">hover or click a rank</h3>"
             "<table id=\"groups\"></table><h4>getters</h4><pre id=\"getters\"></pre></div>\n"
             "<script>\nconst D = {\"kinds\": [");
  for (int k = 0; k < p->nkinds; k++) {
    fprintf(f, "%s\n {\"name\": ", k ? "," : "");
    json_string(f, p->kinds[k].name);
    fprintf(f, ", \"caption\": ");
    json_string(f, p->kinds[k].caption);
    fprintf(f, ", \"g\": [");
    for (int r = 0; r < p->nranks; r++) fprintf(f, "%s%d", r ? "," : "", p->kinds[k].group_of[r]);
    fprintf(f, "]}");
  }
  fprintf(f, "],\n \"info\": [");
  for (int r = 0; r < p->nranks; r++)
    fprintf(f, "%s%s", r ? ",\n  " : "", p->info[r] ? p->info[r] : "null");
  fprintf(f, "]};\n%s</script>\n</body></html>\n", page_script);
}

void pic_html_summary(FILE *f, const char *title, void (*svg)(void *arg, FILE *f), void *arg) {
  page_head(f, title);
  fprintf(f, "<div id=\"pic\">\n");
  svg(arg, f);
  fprintf(f, "</div>\n</body></html>\n");
}
