/* cli.h - the subcommands of the inferd binary. Each takes argv after the subcommand name
 * (argv[0] is the subcommand) and returns the process exit code. */
#ifndef INFERD_CLI_H
#define INFERD_CLI_H

int cli_generate(int argc, char **argv); /* one completion on the terminal */
int cli_info(int argc, char **argv);     /* metadata and tensor table of a GGUF */
int cli_mkmodel(int argc, char **argv);  /* write a synthetic GGUF */
int cli_bench(int argc, char **argv);    /* engine throughput without HTTP */

#endif
