/* placeholder until the subcommand lands */
#include <stdio.h>
#include "cli.h"
int cli_generate(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "inferd generate: not built yet\n");
    return 2;
}
