/* placeholder until the subcommand lands */
#include <stdio.h>
#include "cli.h"
int cli_mkmodel(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "inferd mkmodel: not built yet\n");
    return 2;
}
