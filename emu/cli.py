"""Command line: parses, calls the library, renders. Each subcommand lives in emu/commands/."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Sequence
from types import ModuleType

from emu import __version__, hotpath
from emu.commands.common import PROG, stderr_line
from emu.errors import EXIT_HARNESS_ERROR, EmuError, UsageError

# Module names under emu/commands/, each defining the command of the same NAME (imported when used).
COMMAND_MODULES: tuple[str, ...] = ("run", "check", "bench", "scan", "patch", "diff", "race", "fuzz", "replay",
                                    "mutate", "survey")
_VERBOSE = re.compile(r"^(-v+|--verbose)$")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given ``argv`` that plainly names its command, only that command's part.

    argparse makes a help formatter for every argument, which for every command's arguments is a
    visible part of a short run: a run builds what it parses. Anything else (--help, a prefix of an
    option, no command) gets all."""
    parser = _Parser(prog=PROG, description="Run x86-64 Linux binaries under Unicorn on a fake kernel.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__} ({hotpath.implementation()})")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (repeat for debug)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    named = _named_command(argv)
    for name in COMMAND_MODULES if named is None else (named,):
        module = command_module(name)
        module.add_arguments(sub.add_parser(module.NAME, help=module.HELP))
    return parser


def command_module(name: str) -> ModuleType:
    return importlib.import_module(f"emu.commands.{name}")


def _log_more(verbose: int) -> None:
    """-v: info, -vv: debug. Without it the logging module is not even loaded (a short run notices it):
    the package logs nothing at WARNING or above (a harness error is an exception, a guest's is its status)."""
    import logging

    logging.basicConfig(level=logging.WARNING - 10 * min(verbose, 2), format=f"{PROG}: %(message)s")


def _named_command(argv: Sequence[str] | None) -> str | None:
    """The command when ``argv`` is only -v/--verbose flags, then a command name."""
    for arg in argv or ():
        if not _VERBOSE.match(arg):
            return arg if arg in COMMAND_MODULES else None
    return None


def die_by_signal(signo: int) -> None:
    """End this process with ``signo``, as the guest ended: shells, `timeout --preserve-status` and
    test runners see a death by that signal. No core dump (RLIMIT_CORE 0, as the guest had)."""
    import os
    import resource
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    if signo != signal.SIGKILL:  # SIGKILL can be neither caught nor blocked
        signal.signal(signo, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signo})
    os.kill(os.getpid(), signo)
    os._exit(128 + signo)  # not reached for a signal whose default action kills


def main(argv: Sequence[str] | None = None) -> int:
    """The tool's status: a guest's exit status or a harness error's code; -N when the guest died
    of signal N. Run as the program (no ``argv``), the tool then dies of that signal itself."""
    as_program = argv is None
    try:
        argv = sys.argv[1:] if argv is None else argv
        args = build_parser(argv).parse_args(argv)
        if args.verbose:
            _log_more(args.verbose)
        status: int = command_module(args.command).run(args)
        if status < 0 and as_program:
            die_by_signal(-status)
        return status
    except EmuError as err:
        stderr_line(f"{PROG}: {err}")
        return err.exit_status
    except KeyboardInterrupt:
        stderr_line(f"{PROG}: interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_HARNESS_ERROR
