/*
 * ckpt_cmd.c - `mpu ckpt`: look into a distributed checkpoint (inspect:
 * tensors, shapes, layout, step, bytes per rank file, every piece's CRC-32
 * checked), merge it into one safetensors file, and export it in
 * transformers' sharded layout.
 */
#include <ctype.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "mpu.h"
#include "read_text.h"

static void help(void) {
  printf("usage: mpu ckpt inspect DIR [--format text|json]\n"
         "       mpu ckpt merge DIR OUT.safetensors [--all]\n"
         "       mpu ckpt export DIR OUT [--name-map FILE] [--max-shard-size N] [--all]\n"
         "\n"
         "Distributed checkpoints (mpu/checkpoint.h, `mpu demo gpt --save DIR`): one folder per\n"
         "saved iteration (DIR/iter_0000010/) and DIR/latest_checkpointed_iteration.txt naming\n"
         "the newest; in each, one safetensors file per rank and an index.json that says where\n"
         "every piece of every global tensor is. DIR may be the root (its newest complete\n"
         "iteration is read) or one iteration's folder.\n"
         "\n"
         "  inspect DIR    the step, the layout that saved it, the optimizer, every tensor with\n"
         "                 its shape and pieces, and the bytes of each rank's file; reads every\n"
         "                 piece and checks its CRC-32. Exits 0 if the checkpoint is complete and\n"
         "                 intact (its pieces hold every element once), 1 if not (a save that\n"
         "                 did not finish has no index).\n"
         "  merge DIR OUT  write every parameter whole into one safetensors file, which\n"
         "                 safetensors.numpy.load_file / safetensors.torch.load_file read;\n"
         "                 OUT is a new or regular file, never one of the checkpoint's own,\n"
         "                 written through OUT.tmp and renamed.\n"
         "  export DIR OUT the same tensors in transformers' sharded layout: OUT/model-00001-of-\n"
         "                 0000N.safetensors files of whole tensors and model.safetensors.index.json\n"
         "                 (metadata.total_size, weight_map), which transformers' from_pretrained\n"
         "                 reads, and torch.distributed.checkpoint.load through mpu's\n"
         "                 python/mpu_dcp.py (docs/checkpoint.md).\n"
         "\n"
         "options:\n"
         "  --format text|json  inspect's output format (default text)\n"
         "  --all               merge or export the optimizer's moments (<name>.exp_avg, .exp_avg_sq)\n"
         "                      too\n"
         "  --name-map FILE     export: lines 'MPU_NAME OTHER_NAME' (# starts a comment); the named\n"
         "                      tensors are written under the other name, the rest keep theirs\n"
         "  --max-shard-size N  export: a file's bytes at most, as 512M or 5G (default 5 GB, as\n"
         "                      transformers); a larger tensor gets a file of its own\n"
         "  -h, --help          this text\n"
         "\n");
  cli_help_exit_status("the checkpoint is incomplete or damaged, or it cannot be read or written");
  printf("\n"
         "examples:\n"
         "  mpu demo gpt --save ckpt\n"
         "  mpu ckpt inspect ckpt\n"
         "  mpu ckpt inspect ckpt --format json\n"
         "  mpu ckpt merge ckpt model.safetensors --all\n"
         "  mpu ckpt export ckpt hf --max-shard-size 64K\n");
}

static void print_shape(const int64_t *shape, int ndim) {
  printf("[");
  for (int d = 0; d < ndim; d++) printf("%s%" PRId64, d ? ", " : "", shape[d]);
  printf("]");
}

static int inspect(const char *dir, cli_format format) {
  mpu_ckpt *ck = NULL;
  char folder[4096]; /* a root's newest complete iteration */
  if (mpu_ckpt_latest(dir, folder, sizeof folder) || mpu_ckpt_open(folder, &ck) || mpu_ckpt_verify(ck)) {
    fprintf(stderr, "mpu ckpt inspect: %s\n", mpu_last_error());
    mpu_ckpt_free(ck);
    return 1;
  }
  mpu_ckpt_info in;
  mpu_ckpt_get_info(ck, &in);
  const mpu_ckpt_layout *l = &in.layout;
  uint64_t total = 0, params = 0;
  for (int i = 0; i < in.ntensors; i++) {
    mpu_ckpt_tensor_info t;
    mpu_ckpt_tensor_at(ck, i, &t);
    total += t.bytes;
    if (t.kind == MPU_CKPT_PARAM) params += t.bytes / 4;
  }
  if (format == CLI_JSON) {
    printf("{\"dir\": ");
    cli_json_string(stdout, dir, 0);
    printf(", \"folder\": ");
    cli_json_string(stdout, folder, 0);
    printf(", \"complete\": true, \"step\": %" PRId64 ", \"layout\": {\"world\": %d, "
           "\"tp\": %d, \"pp\": %d, \"vp\": %d, \"dp\": %d, \"cp\": %d, \"ep\": %d, \"zero1\": %s, "
           "\"flavor\": ",
           in.step, l->world, l->tp, l->pp, l->vp, l->dp, l->cp, l->ep, l->zero1 ? "true" : "false");
    cli_json_string(stdout, l->flavor, 0);
    printf("}, \"optimizer_step\": %" PRId64 ", \"parameters\": %" PRIu64 ", \"bytes\": %" PRIu64
           ",\n \"files\": [",
           in.optimizer_step, params, total);
    for (int f = 0; f < in.nfiles; f++) {
      const char *name;
      uint64_t bytes;
      mpu_ckpt_file_at(ck, f, &name, &bytes);
      printf("%s\n  {\"name\": ", f ? "," : "");
      cli_json_string(stdout, name, 0);
      printf(", \"bytes\": %" PRIu64 "}", bytes);
    }
    printf("\n ],\n \"tensors\": [");
    for (int i = 0; i < in.ntensors; i++) {
      mpu_ckpt_tensor_info t;
      mpu_ckpt_tensor_at(ck, i, &t);
      printf("%s\n  {\"name\": ", i ? "," : "");
      cli_json_string(stdout, t.name, 0);
      printf(", \"kind\": \"%s\", \"dtype\": \"%s\", \"shape\": ", mpu_ckpt_kind_name(t.kind),
             t.dtype);
      print_shape(t.shape, t.ndim);
      printf(", \"pieces\": %d}", t.npieces);
    }
    printf("\n ]}\n");
  } else {
    char size[32];
    printf("# checkpoint %s: complete (every piece's CRC-32 checked), step %" PRId64 "\n", folder, in.step);
    printf("layout: %d ranks, tp %d x pp %d (vp %d) x dp %d%s, cp %d, ep %d, flavour %s\n", l->world,
           l->tp, l->pp, l->vp, l->dp, l->zero1 ? " (ZeRO-1)" : "", l->cp, l->ep, l->flavor);
    if (in.has_adamw)
      printf("optimizer: AdamW lr %g, betas (%g, %g), eps %g, weight decay %g, clip %g, step %" PRId64 "\n",
             in.adamw.lr, in.adamw.beta1, in.adamw.beta2, in.adamw.eps, in.adamw.weight_decay,
             in.adamw.clip_grad, in.optimizer_step);
    printf("%" PRIu64 " parameters; %d tensors, %s in all\n", params, in.ntensors,
           cli_format_size((size_t)total, size, sizeof size));
    printf("%-40s %-10s %-16s %6s\n", "tensor", "kind", "shape", "pieces");
    for (int i = 0; i < in.ntensors; i++) {
      mpu_ckpt_tensor_info t;
      mpu_ckpt_tensor_at(ck, i, &t);
      char shape[64] = "";
      for (int d = 0; d < t.ndim; d++)
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%" PRId64, d ? "x" : "", t.shape[d]);
      printf("%-40s %-10s %-16s %6d\n", t.name,
             mpu_ckpt_kind_name(t.kind),
             shape, t.npieces);
    }
    printf("%-24s %12s\n", "file", "bytes");
    for (int f = 0; f < in.nfiles; f++) {
      const char *name;
      uint64_t bytes;
      mpu_ckpt_file_at(ck, f, &name, &bytes);
      printf("%-24s %12" PRIu64 "\n", name, bytes);
    }
  }
  mpu_ckpt_free(ck);
  return 0;
}

/* The pairs of a --name-map file: "MPU_NAME OTHER_NAME" a line, '#' to the
 * line's end a comment; *text holds the names (free it and *names). */
static int read_name_map(const char *path, char **text, const char ***names, int *n) {
  unsigned char *buf;
  size_t len;
  if (cli_read_text("--name-map", path, (size_t)16 << 20, &buf, &len)) {
    fprintf(stderr, "mpu ckpt export: %s\n", mpu_last_error());
    return -1;
  }
  char *t = realloc(buf, len + 1);
  if (!t) {
    free(buf);
    fprintf(stderr, "mpu ckpt export: out of memory reading %s\n", path);
    return -1;
  }
  t[len] = '\0';
  *text = t, *names = NULL, *n = 0;
  int cap = 0, line = 1;
  for (char *p = t; *p; line++) {
    char *end = strchr(p, '\n'), *hash;
    if (end) *end = '\0';
    if ((hash = strchr(p, '#'))) *hash = '\0';
    char *word[3] = {0};
    int w = 0;
    for (char *q = p; *q && w < 3;) {
      while (*q && isspace((unsigned char)*q)) *q++ = '\0';
      if (!*q) break;
      word[w++] = q;
      while (*q && !isspace((unsigned char)*q)) q++;
    }
    if (w != 0 && w != 2) {
      fprintf(stderr, "mpu ckpt export: %s line %d: want 'MPU_NAME OTHER_NAME'\n", path, line);
      return -1;
    }
    if (w == 2) {
      if (*n == cap) {
        cap = cap ? 2 * cap : 64;
        const char **g = realloc(*names, (size_t)cap * 2 * sizeof *g);
        if (!g) {
          fprintf(stderr, "mpu ckpt export: out of memory reading %s\n", path);
          return -1;
        }
        *names = g;
      }
      (*names)[2 * *n] = word[0], (*names)[2 * *n + 1] = word[1];
      (*n)++;
    }
    if (!end) break;
    p = end + 1;
  }
  return 0;
}

static int export(const char *dir, const char *out, const char *map, size_t max, int all) {
  mpu_ckpt_export_options o = MPU_CKPT_EXPORT_OPTIONS_INIT;
  o.max_shard_bytes = max, o.all = all;
  char *text = NULL;
  const char **names = NULL;
  int rc = 1;
  mpu_ckpt *ck = NULL;
  if (map && read_name_map(map, &text, &names, &o.nnames)) goto out;
  o.names = names;
  if (mpu_ckpt_open(dir, &ck) || mpu_ckpt_export(ck, out, &o)) {
    fprintf(stderr, "mpu ckpt export: %s\n", mpu_last_error());
    goto out;
  }
  printf("mpu ckpt export: wrote %s/model.safetensors.index.json\n", out);
  rc = 0;
out:
  mpu_ckpt_free(ck);
  free(text), free(names);
  return rc;
}

int cmd_ckpt(int argc, char **argv) {
  static const struct option longs[] = {{"format", required_argument, 0, 'F'},
                                        {"all", no_argument, 0, 'a'},
                                        {"name-map", required_argument, 0, 'N'},
                                        {"max-shard-size", required_argument, 0, 'S'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  cli_format format = CLI_TEXT;
  int all = 0, c, given_format = 0;
  const char *map = NULL;
  size_t max_shard = 0;
  opterr = 0;
  optind = 1;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    switch (c) {
    case 'F':
      if (cli_parse_format(optarg, &format))
        cli_usage_error("ckpt", "--format wants text or json, not '%s'", optarg);
      given_format = 1;
      break;
    case 'a': all = 1; break;
    case 'N': map = optarg; break;
    case 'S':
      if (cli_parse_size(optarg, &max_shard) || max_shard == 0)
        cli_usage_error("ckpt", "--max-shard-size wants a size above 0 such as 512M, not '%s'", optarg);
      break;
    case 'h': help(); return 0;
    case ':': cli_usage_error("ckpt", "option '%s' needs a value", argv[optind - 1]);
    default: cli_usage_error("ckpt", "unknown option '%s'", argv[optind - 1]);
    }
  }
  int n = argc - optind;
  const char *sub = n > 0 ? argv[optind] : NULL;
  if (!sub) cli_usage_error("ckpt", "which? (inspect DIR, merge DIR OUT.safetensors, export DIR OUT)");
  if (strcmp(sub, "export") && (map || max_shard))
    cli_usage_error("ckpt", "--name-map and --max-shard-size are export's options");
  if (!strcmp(sub, "inspect")) {
    if (n != 2) cli_usage_error("ckpt", "inspect wants one directory");
    if (all) cli_usage_error("ckpt", "--all is merge's and export's option");
    return inspect(argv[optind + 1], format);
  }
  if (!strcmp(sub, "merge")) {
    if (n != 3) cli_usage_error("ckpt", "merge wants a directory and an output file");
    if (given_format) cli_usage_error("ckpt", "--format is inspect's option");
    mpu_ckpt *ck = NULL;
    if (mpu_ckpt_open(argv[optind + 1], &ck) || mpu_ckpt_merge(ck, argv[optind + 2], all)) {
      fprintf(stderr, "mpu ckpt merge: %s\n", mpu_last_error());
      mpu_ckpt_free(ck);
      return 1;
    }
    mpu_ckpt_free(ck);
    printf("mpu ckpt merge: wrote %s\n", argv[optind + 2]);
    return 0;
  }
  if (!strcmp(sub, "export")) {
    if (n != 3) cli_usage_error("ckpt", "export wants a directory and an output directory");
    if (given_format) cli_usage_error("ckpt", "--format is inspect's option");
    return export(argv[optind + 1], argv[optind + 2], map, max_shard, all);
  }
  cli_usage_error("ckpt", "unknown subcommand '%s' (inspect, merge, export)", sub);
}
