"""Command line: parses, calls the library, renders. Each subcommand lives in emu/commands/."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from types import ModuleType

from emu import __version__
from emu.commands import bench, check, diff, fuzz, patch, race, replay, run, scan
from emu.commands.common import PROG, stderr_line
from emu.errors import EXIT_HARNESS_ERROR, EmuError, UsageError

COMMAND_MODULES: tuple[ModuleType, ...] = (run, check, bench, scan, patch, diff, race, fuzz, replay)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Run x86-64 Linux binaries under Unicorn on a fake kernel.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (repeat for debug)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in COMMAND_MODULES:
        module.add_arguments(sub.add_parser(module.NAME, help=module.HELP))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), format=f"{PROG}: %(message)s")
        module = next(m for m in COMMAND_MODULES if args.command == m.NAME)
        status: int = module.run(args)
        return status
    except EmuError as err:
        stderr_line(f"{PROG}: {err}")
        return err.exit_status
    except KeyboardInterrupt:
        stderr_line(f"{PROG}: interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_HARNESS_ERROR
