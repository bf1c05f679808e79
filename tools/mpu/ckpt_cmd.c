/*
 * ckpt_cmd.c - `mpu ckpt`: look into a distributed checkpoint (inspect:
 * tensors, shapes, layout, step, bytes per rank file, every piece's CRC-32
 * checked) and merge it into one safetensors file.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "mpu.h"

static void help(void) {
  printf("usage: mpu ckpt inspect DIR [--format text|json]\n"
         "       mpu ckpt merge DIR OUT.safetensors [--all]\n"
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
         "\n"
         "options:\n"
         "  --format text|json  inspect's output format (default text)\n"
         "  --all               merge the optimizer's moments (<name>.exp_avg, .exp_avg_sq) too\n"
         "  -h, --help          this text\n"
         "\n");
  cli_help_exit_status("the checkpoint is incomplete or damaged, or it cannot be read or written");
  printf("\n"
         "examples:\n"
         "  mpu demo gpt --save ckpt\n"
         "  mpu ckpt inspect ckpt\n"
         "  mpu ckpt inspect ckpt --format json\n"
         "  mpu ckpt merge ckpt model.safetensors --all\n");
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
    mpu_ckpt_close(ck);
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
  mpu_ckpt_close(ck);
  return 0;
}

int cmd_ckpt(int argc, char **argv) {
  static const struct option longs[] = {{"format", required_argument, 0, 'F'},
                                        {"all", no_argument, 0, 'a'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  cli_format format = CLI_TEXT;
  int all = 0, c, given_format = 0;
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
    case 'h': help(); return 0;
    case ':': cli_usage_error("ckpt", "option '%s' needs a value", argv[optind - 1]);
    default: cli_usage_error("ckpt", "unknown option '%s'", argv[optind - 1]);
    }
  }
  int n = argc - optind;
  const char *sub = n > 0 ? argv[optind] : NULL;
  if (!sub) cli_usage_error("ckpt", "which? (inspect DIR, merge DIR OUT.safetensors)");
  if (!strcmp(sub, "inspect")) {
    if (n != 2) cli_usage_error("ckpt", "inspect wants one directory");
    if (all) cli_usage_error("ckpt", "--all is merge's option");
    return inspect(argv[optind + 1], format);
  }
  if (!strcmp(sub, "merge")) {
    if (n != 3) cli_usage_error("ckpt", "merge wants a directory and an output file");
    if (given_format) cli_usage_error("ckpt", "--format is inspect's option");
    mpu_ckpt *ck = NULL;
    if (mpu_ckpt_open(argv[optind + 1], &ck) || mpu_ckpt_merge(ck, argv[optind + 2], all)) {
      fprintf(stderr, "mpu ckpt merge: %s\n", mpu_last_error());
      mpu_ckpt_close(ck);
      return 1;
    }
    mpu_ckpt_close(ck);
    printf("mpu ckpt merge: wrote %s\n", argv[optind + 2]);
    return 0;
  }
  cli_usage_error("ckpt", "unknown subcommand '%s' (inspect, merge)", sub);
}
