/* main.c - the inferd binary: `inferd [serve] [flags]` runs the server; the other
 * subcommands are tools around the same engine. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "serve.h"

static void usage(FILE *out)
{
    fprintf(out,
            "inferd %s - OpenAI-compatible inference server\n"
            "\n"
            "usage: inferd [serve] -m MODEL.gguf [flags]   run the HTTP server (see inferd serve --help)\n"
            "       inferd generate -m MODEL.gguf -p TEXT   one completion, streamed to the terminal\n"
            "       inferd info MODEL.gguf                  metadata and tensors of a GGUF file\n"
            "       inferd mkmodel -o OUT.gguf [...]        write a synthetic model (tests, benchmarks)\n"
            "       inferd bench -m MODEL.gguf [...]        prefill/decode throughput without HTTP\n",
            INFERD_VERSION);
}

int main(int argc, char **argv)
{
    if (argc >= 2) {
        const char *cmd = argv[1];
        if (strcmp(cmd, "serve") == 0) return serve_main(argc - 1, argv + 1);
        if (strcmp(cmd, "generate") == 0) return cli_generate(argc - 1, argv + 1);
        if (strcmp(cmd, "info") == 0) return cli_info(argc - 1, argv + 1);
        if (strcmp(cmd, "mkmodel") == 0) return cli_mkmodel(argc - 1, argv + 1);
        if (strcmp(cmd, "bench") == 0) return cli_bench(argc - 1, argv + 1);
        if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(cmd, "--version") == 0) {
            printf("inferd %s\n", INFERD_VERSION);
            return 0;
        }
    }
    /* No subcommand: flags go to the server, as a service unit would run it. */
    return serve_main(argc, argv);
}
