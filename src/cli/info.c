/* placeholder until the subcommand lands */
#include <stdio.h>
#include "cli.h"
int cli_info(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "inferd info: not built yet\n");
    return 2;
}
