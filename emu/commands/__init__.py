"""One module per `uprobe-emu` subcommand. Each defines NAME, HELP, add_arguments(parser) and run(args).

Adding a command is one module here plus one line in COMMAND_MODULES (emu/cli.py).
"""
