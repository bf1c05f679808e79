/*
 * demo.c - `mpu demo <name>`: small programs that show a layer at work and
 * check themselves.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cmd_demo_gpt(int argc, char **argv);
int cmd_demo_hsdp(int argc, char **argv);
int cmd_demo_mappings(int argc, char **argv);
int cmd_demo_train(int argc, char **argv);

static const struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} demos[] = {
    {"gpt", cmd_demo_gpt, "the main job: a small GPT with tp (and sp) x pp (interleaved) x dp (ZeRO-1), checked against one rank"},
    {"hsdp", cmd_demo_hsdp, "hybrid sharded data parallel on a 2-d device mesh (the DeviceMesh tutorial)"},
    {"mappings", cmd_demo_mappings, "the walkthrough of Megatron-DeepSpeed's mpu/mappings.py"},
    {"train", cmd_demo_train, "train with tp x pp x dp on thread ranks, checked against one rank"},
};

static void usage(void) {
  printf("usage: mpu demo <name> [options]\n\ndemos:\n");
  for (size_t i = 0; i < sizeof demos / sizeof demos[0]; i++)
    printf("  %-8s %s\n", demos[i].name, demos[i].summary);
  printf("\nEach demo checks what it computed (against one rank, or the values Megatron's and\n"
         "PyTorch's sources print) and says PASS or FAIL. 'mpu demo <name> --help' describes a\n"
         "demo's options.\n"
         "\n"
         "options:\n"
         "  -h, --help  this text\n"
         "\n");
  cli_help_exit_status("the demo's check failed, or a run failed");
  printf("\n"
         "examples:\n"
         "  mpu demo gpt --steps 10\n"
         "  mpu demo mappings --format json\n");
}

int cmd_demo(int argc, char **argv) {
  if (argc < 2) cli_usage_error("demo", "which demo? (gpt, hsdp, mappings, train)");
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage();
    return 0;
  }
  for (size_t i = 0; i < sizeof demos / sizeof demos[0]; i++)
    if (!strcmp(argv[1], demos[i].name)) return demos[i].run(argc - 1, argv + 1);
  cli_usage_error("demo", "unknown demo '%s'", argv[1]);
}
