/*
 * main() of the `pinpool` command-line tool: the tool is cli_main()
 * (pinpool.c), which the Python package also calls (`python3 -m pinpool`).
 */
#include "cli.h"

int main(int argc, char **argv) { return cli_main(argc, argv); }
