/*
 * picture.c - ranks on a grid and their groups, as SVG or a self-contained
 * HTML page (see picture.h).
 */
#include "cli.h"
#include "picture.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the main grid: 16 cells a line fit beside the HTML side panel in a 1400-pixel window */
#define CELL_W 40
#define CELL_H 32
#define GAP 4
#define PER_LINE 16 /* cells per drawn line: a long row wraps */
#define LINE_GAP 6
#define ROW_GAP 16
#define LEFT 170
#define MIN_WIDTH 880
/* the small grids, one per kind: a group number (9 px text) in every cell */
#define MINI_W 22
#define MINI_H 15
#define MINI_PER_LINE 16
#define MINI_ROW_GAP 4
#define PANEL_W (MINI_PER_LINE * MINI_W + 60)
#define TITLE_CHARS 92 /* a title line at 15 px */
#define CAPTION_CHARS 54 /* a small grid's caption line at 12 px: two lines at most */

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

/* Ten light colours that dark text reads on and that a reader tells apart;
 * group g gets colour g mod 10, its number says which group it is. */
static const char *const palette[10] = {"#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
                                        "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#fdd0a2"};
#define NONE_FILL "#eeeeee" /* a rank in no group of the kind */

static const char *colour(int g) { return g >= 0 ? palette[g % 10] : NONE_FILL; }

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

/* Every group of the kind holds one rank: nothing to tell apart, no colours. */
static int singletons(const pic *p, const pic_kind *k) {
  int members = 0;
  for (int r = 0; r < p->nranks; r++) members += k->group_of[r] >= 0;
  return k->ngroups > 1 && members == k->ngroups;
}

/* ---- geometry ------------------------------------------------------------------------ */

typedef struct geometry {
  int width, height, title_lines, legend_y, grid_y, minis_y;
  int lines;       /* drawn lines per row of the main grid */
  int mini_lines;  /* per row of a small grid */
  int panel_h, panels_per_line;
} geometry;

static geometry measure(const pic *p) {
  geometry g;
  int shown = p->ncols < PER_LINE ? p->ncols : PER_LINE;
  g.lines = p->ncols ? (p->ncols + PER_LINE - 1) / PER_LINE : 1;
  g.mini_lines = p->ncols ? (p->ncols + MINI_PER_LINE - 1) / MINI_PER_LINE : 1;
  g.width = LEFT + shown * (CELL_W + GAP) + 20;
  if (g.width < MIN_WIDTH) g.width = MIN_WIDTH;
  g.title_lines = ((int)strlen(p->title) + TITLE_CHARS - 1) / TITLE_CHARS;
  if (g.title_lines < 1) g.title_lines = 1;
  g.legend_y = 26 + 20 * g.title_lines;
  g.grid_y = g.legend_y + 22 * 4 + 10;
  int row_h = g.lines * (CELL_H + LINE_GAP) - LINE_GAP + ROW_GAP;
  g.minis_y = g.grid_y + p->nrows * row_h + 24;
  g.panel_h = 60 + p->nrows * (g.mini_lines * MINI_H + MINI_ROW_GAP) + 18;
  g.panels_per_line = (g.width - 20) / PANEL_W;
  if (g.panels_per_line < 1) g.panels_per_line = 1;
  int panel_lines = (p->nkinds + g.panels_per_line - 1) / g.panels_per_line;
  g.height = g.minis_y + 30 + panel_lines * g.panel_h + 10;
  return g;
}

static void cell_xy(const pic *p, const geometry *g, int r, int *x, int *y) {
  int row_h = g->lines * (CELL_H + LINE_GAP) - LINE_GAP + ROW_GAP;
  int line = p->col[r] / PER_LINE;
  *x = LEFT + (p->col[r] % PER_LINE) * (CELL_W + GAP);
  *y = g->grid_y + p->row[r] * row_h + line * (CELL_H + LINE_GAP);
}

/* ---- SVG ----------------------------------------------------------------------------- */

/* text wrapped at a space before `chars` a line (at most `lines` lines), so that no line runs
 * off the picture or into its neighbour */
static void wrapped(FILE *f, const char *s, int x, int y, int dy, size_t chars, int lines,
                    const char *attrs) {
  for (int line = 0; *s && line < lines; line++) {
    size_t n = strlen(s);
    if (n > chars) {
      n = chars;
      while (n > chars / 2 && s[n] != ' ') n--;
    }
    char buf[128];
    if (n >= sizeof buf) n = sizeof buf - 1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    fprintf(f, "<text x=\"%d\" y=\"%d\" %s>", x, y + dy * line, attrs);
    xml_text(f, buf);
    fprintf(f, "</text>\n");
    s += n;
    while (*s == ' ') s++;
  }
}

static void title(const pic *p, const geometry *g, FILE *f) {
  wrapped(f, p->title, 10, 24, 20, TITLE_CHARS, g->title_lines + 1,
          "font-size=\"15\" font-weight=\"bold\"");
}

static void legend(const pic *p, const geometry *g, FILE *f) {
  int y = g->legend_y, k = p->channel[PIC_FRAME];
  /* the frame: two cells in one frame */
  if (k >= 0) {
    fprintf(f, "<rect x=\"14\" y=\"%d\" width=\"17\" height=\"14\" fill=\"%s\"/><rect x=\"33\" "
               "y=\"%d\" width=\"17\" height=\"14\" fill=\"%s\"/><rect x=\"11\" y=\"%d\" width=\"42\" "
               "height=\"20\" fill=\"none\" stroke=\"#000\" stroke-width=\"2\"/>\n",
            y - 12, NONE_FILL, y - 12, NONE_FILL, y - 15);
    fprintf(f, "<text x=\"64\" y=\"%d\">frame = ", y);
    xml_text(f, p->kinds[k].caption);
    fprintf(f, " (");
    xml_text(f, p->kinds[k].name);
    fprintf(f, "), %d group%s</text>\n", p->kinds[k].ngroups, p->kinds[k].ngroups == 1 ? "" : "s");
    y += 22;
  }
  /* the colour: three cells of groups 0, 1, 2 with their numbers */
  k = p->channel[PIC_FILL];
  for (int i = 0; i < 3; i++)
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"13\" height=\"16\" fill=\"%s\"/><text x=\"%d\" "
               "y=\"%d\" font-size=\"10\" text-anchor=\"middle\">%d</text>\n",
            12 + 14 * i, y - 13, palette[i], 18 + 14 * i, y - 1, i);
  fprintf(f, "<text x=\"64\" y=\"%d\" id=\"colour-legend\">colour and the small number in a cell = ", y);
  if (k >= 0) {
    xml_text(f, p->kinds[k].caption);
    fprintf(f, " (");
    xml_text(f, p->kinds[k].name);
    fprintf(f, "), %d groups", p->kinds[k].ngroups);
  } else {
    fprintf(f, "none");
  }
  fprintf(f, "</text>\n");
  y += 22;
  fprintf(f, "<text x=\"64\" y=\"%d\">", y);
  xml_text(f, p->row_caption);
  fprintf(f, "; the large number is the rank</text>\n");
  y += 22;
  fprintf(f, "<text x=\"64\" y=\"%d\">small grids below: every kind, its group number in each "
             "cell (grey: in none)</text>\n", y);
}

static void main_grid(const pic *p, const geometry *g, FILE *f, const int *at) {
  int fk = p->channel[PIC_FILL];
  fprintf(f, "<g id=\"main\">\n");
  int row_h = g->lines * (CELL_H + LINE_GAP) - LINE_GAP + ROW_GAP;
  for (int row = 0; row < p->nrows; row++) {
    fprintf(f, "<text x=\"10\" y=\"%d\">", g->grid_y + row * row_h + 20);
    xml_text(f, p->row_label[row]);
    fprintf(f, "</text>\n");
  }
  for (int r = 0; r < p->nranks; r++) {
    int x, y, gi = fk >= 0 ? p->kinds[fk].group_of[r] : -1;
    cell_xy(p, g, r, &x, &y);
    fprintf(f, "<g class=\"cell\" data-rank=\"%d\"><rect class=\"bg\" x=\"%d\" y=\"%d\" width=\"%d\" "
               "height=\"%d\" fill=\"%s\"/><text x=\"%d\" y=\"%d\" text-anchor=\"middle\" "
               "font-size=\"13\" font-weight=\"bold\">%d</text><text class=\"gn\" x=\"%d\" y=\"%d\" "
               "text-anchor=\"middle\" font-size=\"10\" fill=\"#333\">",
            r, x, y, CELL_W, CELL_H, colour(gi), x + CELL_W / 2, y + 14, r, x + CELL_W / 2, y + 27);
    if (gi >= 0) fprintf(f, "%d", gi);
    fprintf(f, "</text></g>\n");
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
                x - 2, y - 2, (end - col) * (CELL_W + GAP) - GAP + 4, CELL_H + 4);
      }
      col = end;
    }
  fprintf(f, "</g>\n");
}

static void small_grids(const pic *p, const geometry *g, FILE *f) {
  fprintf(f, "<text x=\"10\" y=\"%d\" font-weight=\"bold\">every kind of group (the number: the "
             "rank's group)</text>\n", g->minis_y);
  for (int k = 0; k < p->nkinds; k++) {
    const pic_kind *kind = &p->kinds[k];
    int alone = singletons(p, kind);
    int px = 10 + (k % g->panels_per_line) * PANEL_W;
    int py = g->minis_y + 22 + (k / g->panels_per_line) * g->panel_h;
    fprintf(f, "<g class=\"kind\" data-kind=\"");
    xml_text(f, kind->name);
    fprintf(f, "\"><text x=\"%d\" y=\"%d\" font-weight=\"bold\">", px, py + 12);
    xml_text(f, kind->name);
    fprintf(f, "</text><text x=\"%d\" y=\"%d\">%d group%s%s</text>\n",
            px + 10 + 8 * (int)strlen(kind->name), py + 12, kind->ngroups,
            kind->ngroups == 1 ? "" : "s", alone ? ", each rank alone" : "");
    wrapped(f, kind->caption, px, py + 28, 14, CAPTION_CHARS, 2, "fill=\"#444\"");
    for (int r = 0; r < p->nranks; r++) {
      int line = p->col[r] / MINI_PER_LINE, gi = kind->group_of[r];
      int x = px + (p->col[r] % MINI_PER_LINE) * MINI_W;
      int y = py + 52 + p->row[r] * (g->mini_lines * MINI_H + MINI_ROW_GAP) + line * MINI_H;
      fprintf(f, "<g class=\"m\" data-rank=\"%d\"><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" "
                 "fill=\"%s\" stroke=\"#fff\"/>", r, x, y, MINI_W, MINI_H,
              alone && gi >= 0 ? palette[0] : colour(gi));
      if (gi >= 0 && !alone)
        fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"9\" text-anchor=\"middle\">%d</text>",
                x + MINI_W / 2, y + 11, gi);
      fprintf(f, "</g>\n");
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
  /* drawn at its own size (a cell's number stays legible at 4096 ranks; the page scrolls),
   * with a viewBox so that a program that shows it smaller scales it whole */
  fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" width=\"%d\" "
             "height=\"%d\" font-family=\"monospace\" font-size=\"12\">\n<rect width=\"100%%\" "
             "height=\"100%%\" fill=\"#fff\"/>\n",
          g.width, g.height, g.width, g.height);
  title(p, &g, f);
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
    "#side{width:400px;flex:none;height:100vh;overflow:auto;border-left:1px solid #ccc;"
    "padding:0 10px;box-sizing:border-box}"
    "#side table{border-collapse:collapse;width:100%}#side select{max-width:100%}"
    "#side th,#side td{text-align:left;padding:1px 6px 1px 0;vertical-align:top}"
    "#side th,#side td{overflow-wrap:anywhere}"
    "#getters th{font-weight:normal;color:#333}#getters td,#groups th{white-space:nowrap}"
    "[data-rank]{cursor:pointer}"
    ".cell.sel rect.bg{stroke:#d00;stroke-width:4}"
    ".active .m{opacity:.3}.active .m.hl{opacity:1}.active .m.hl rect{stroke:#000;stroke-width:1.5}";

/* Hover shows a rank, a click pins it; each kind's small grid outlines the
 * rank's group, and the side panel lists the groups and the getters. The
 * selector colours the main grid by any kind. */
static const char page_script[] =
    "const members = D.kinds.map(k => { const m = new Map();\n"
    "  k.g.forEach((g, r) => { if (g >= 0) { if (!m.has(g)) m.set(g, []); m.get(g).push(r); } });\n"
    "  return m; });\n"
    "const esc = s => String(s).replace(/[&<>]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;'})[c]);\n"
    "const sel = document.getElementById('colour-by');\n"
    "D.kinds.forEach((k, i) => { const o = document.createElement('option'); o.value = i;\n"
    "  o.textContent = k.name + ': ' + k.caption; sel.appendChild(o); });\n"
    "sel.value = D.fill;\n"
    "function colourBy(i) {\n"
    "  const k = D.kinds[i];\n"
    "  document.querySelectorAll('#main .cell').forEach(c => { const g = k.g[+c.dataset.rank];\n"
    "    c.querySelector('rect.bg').setAttribute('fill', g >= 0 ? D.palette[g % 10] : D.none);\n"
    "    c.querySelector('.gn').textContent = g >= 0 ? g : ''; });\n"
    "  document.getElementById('colour-legend').textContent = 'colour and the small number in a cell = '\n"
    "    + k.caption + ' (' + k.name + '), ' + k.n + ' groups';\n"
    "}\n"
    "sel.addEventListener('change', () => colourBy(+sel.value));\n"
    "/* a long group as runs: [0-63, 128-191] (128 ranks) */\n"
    "function list(ms) {\n"
    "  if (ms.length <= 16) return '[' + ms.join(', ') + ']';\n"
    "  const runs = []; let a = ms[0], b = ms[0];\n"
    "  for (const m of ms.slice(1).concat([null])) {\n"
    "    if (m === b + 1) { b = m; continue; }\n"
    "    runs.push(a === b ? '' + a : a + '-' + b); a = b = m; }\n"
    "  return '[' + runs.join(', ') + '] (' + ms.length + ' ranks)';\n"
    "}\n"
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
    "              (g >= 0 ? list(ms) : 'none') + '</td></tr>');\n"
    "  });\n"
    "  document.getElementById('sel').textContent = 'rank ' + r + (pinned === r ? ' (pinned)' : '');\n"
    "  document.getElementById('groups').innerHTML = rows.join('');\n"
    "  const info = D.info ? D.info[r] : null, names = D.names || {};\n"
    "  document.getElementById('getters').innerHTML = info ? Object.keys(info).map(key =>\n"
    "    '<tr data-key=\"' + esc(key) + '\"><th>' + esc(names[key] || key) + '</th><td>' +\n"
    "    esc(JSON.stringify(info[key])) + '</td></tr>').join('') : '';\n"
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
  fprintf(f, "</div>\n<div id=\"side\"><p><label>colour by <select id=\"colour-by\"></select>"
             "</label></p><h3 id=\"sel\">hover or click a rank</h3><table id=\"groups\"></table>"
             "<h4>");
  xml_text(f, p->info_caption ? p->info_caption : "getters");
  fprintf(f, "</h4><table id=\"getters\"></table></div>\n<script>\nconst D = {\"fill\": %d, "
             "\"none\": \"%s\", \"palette\": [",
          p->channel[PIC_FILL] >= 0 ? p->channel[PIC_FILL] : 0, NONE_FILL);
  for (int i = 0; i < 10; i++) fprintf(f, "%s\"%s\"", i ? ", " : "", palette[i]);
  fprintf(f, "],\n \"kinds\": [");
  for (int k = 0; k < p->nkinds; k++) {
    fprintf(f, "%s\n {\"name\": ", k ? "," : "");
    cli_json_string(f, p->kinds[k].name, 1);
    fprintf(f, ", \"caption\": ");
    cli_json_string(f, p->kinds[k].caption, 1);
    fprintf(f, ", \"n\": %d, \"g\": [", p->kinds[k].ngroups);
    for (int r = 0; r < p->nranks; r++) fprintf(f, "%s%d", r ? "," : "", p->kinds[k].group_of[r]);
    fprintf(f, "]}");
  }
  fprintf(f, "],\n \"names\": {");
  for (const pic_name *n = p->info_names; n && n->key; n++) {
    fprintf(f, "%s", n == p->info_names ? "" : ", ");
    cli_json_string(f, n->key, 1);
    fprintf(f, ": ");
    cli_json_string(f, n->shown, 1);
  }
  fprintf(f, "},\n \"info\": [");
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
