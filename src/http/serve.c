/* placeholder until the server lands */
#include <stdio.h>
#include "../cli/cli.h"
int cli_serve(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "inferd serve: not built yet\n");
    return 2;
}
