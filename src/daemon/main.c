/* main.c - the inferd binary: `inferd serve [flags]` (or flags alone) runs the server; the
 * other subcommands are tools around the same engine; a bare `inferd` prints the usage. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "serve.h"

/* The subcommands, in the order usage lists them; `inferd --flag ...` (no subcommand) is `serve`,
 * as a unit file or an older script may run it. */
typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *args, *what;
} main_cmd;

static const main_cmd main_cmds[] = {
    {"serve", serve_main, "-m MODEL.gguf [flags]", "run the HTTP server (see inferd serve --help)"},
    {"generate", cli_generate, "-m MODEL.gguf -p TEXT", "one completion, streamed to the terminal"},
    {"info", cli_info, "MODEL.gguf", "metadata and tensors of a GGUF file"},
    {"mkmodel", cli_mkmodel, "-o OUT.gguf [...]", "write a synthetic model (tests, benchmarks)"},
    {"bench", cli_bench, "-m MODEL.gguf [...]", "prefill/decode throughput without HTTP"},
};

static void usage(FILE *out)
{
    fprintf(out, "inferd %s - OpenAI-compatible inference server\n\n", INFERD_VERSION);
    for (size_t i = 0; i < sizeof main_cmds / sizeof main_cmds[0]; i++) {
        char lhs[64];
        snprintf(lhs, sizeof lhs, "inferd %s %s", main_cmds[i].name, main_cmds[i].args);
        fprintf(out, "%s %-39s %s\n", i == 0 ? "usage:" : "      ", lhs, main_cmds[i].what);
    }
    fprintf(out, "       %-39s %s\n", "inferd --help | --version", "this text | the version");
}

int main(int argc, char **argv)
{
    if (argc < 2) { /* a bare `inferd` is someone asking what it does */
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0) {
        printf("inferd %s\n", INFERD_VERSION);
        return 0;
    }
    /* Flags only: the server, as `inferd --config FILE` or `inferd -m MODEL` has always run it. */
    if (cmd[0] == '-') return serve_main(argc, argv);
    for (size_t i = 0; i < sizeof main_cmds / sizeof main_cmds[0]; i++)
        if (strcmp(cmd, main_cmds[i].name) == 0) return main_cmds[i].run(argc - 1, argv + 1);
    fprintf(stderr, "inferd: unknown subcommand '%s'; the subcommands are:", cmd);
    for (size_t i = 0; i < sizeof main_cmds / sizeof main_cmds[0]; i++) fprintf(stderr, " %s", main_cmds[i].name);
    fprintf(stderr, " (inferd --help shows what each does)\n");
    return 2;
}
