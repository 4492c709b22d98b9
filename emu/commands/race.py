"""`uprobe-emu race`: every interleaving of a thread through a probe site with one patching event;
with --signals, a signal at every instruction boundary of a hit instead (emu/race/signals.py)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Sequence
from typing import Any

from emu.commands.common import (
    add_design_options,
    add_html_option,
    add_process_options,
    check_writable,
    chosen_designs,
    command_line,
    guest_env,
    positive_int,
    run_options,
    write_json,
)
from emu.errors import UsageError

NAME = "race"
HELP = "explore races between a thread in a probe site and the kernel patching it"
EVENTS = ("attach", "optimize", "detach", "reattach")
HANDLERS = ("stack", "altstack", "longjmp")  # emu.race.signals.Handler, not imported until run


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_process_options(p)
    add_design_options(p, "all", "designs to explore (default all: built-in and --design-file ones)")
    p.add_argument("-p", "--probe", action="append", default=[], metavar="SPEC",
                   help="the probe whose site thread 1 enters; for reattach give a second -p: the probe "
                        "attached and optimized after the first is detached")
    p.add_argument("--event", choices=EVENTS,
                   help="the patching event: attach (INT3), optimize (first hit), detach (of an optimized "
                        "site), reattach (detach, then attach another probe) (default optimize)")
    p.add_argument("--signals", action="store_true",
                   help="instead of a patching event: a signal at every instruction boundary of one hit (site, "
                        "trampoline or slot, XOL step, return trampoline), one run each per handler; the program "
                        "takes the handler as its first argument (as elf_samples/sig_race does)")
    p.add_argument("--handler", metavar="H,H",
                   help=f"with --signals: the handlers to run, of {', '.join(HANDLERS)} (default all)")
    p.add_argument("--hit", type=positive_int, metavar="N",
                   help="with --signals: which hit of the probe the signal lands in (default 2: an optimizing "
                        "design's first hit traps and optimizes, the second takes its trampoline)")
    p.add_argument("--json", metavar="FILE", help="write every design's outcomes as JSON")
    add_html_option(p, "per design, the grid of interleavings (or of boundaries and handlers) coloured by "
                       "outcome, and an example of each")
    p.add_argument("binary", metavar="BINARY")
    p.add_argument("args", nargs="*", metavar="ARGS", help="the guest's arguments (after -- if they start with -)")


def run(args: argparse.Namespace) -> int:
    if not args.probe:
        raise UsageError("race needs a probe: -p SPEC (e.g. -p uprobe:t_nop5)")
    for path in (args.json, args.html):
        if path:
            check_writable(path)
    return _signals(args) if args.signals else _event(args)


def _event(args: argparse.Namespace) -> int:
    from emu.race import explore_designs, reports_json  # heavy: only when run

    if args.handler is not None or args.hit is not None:
        raise UsageError("--handler and --hit go with --signals")
    args.event = args.event or "optimize"
    if len(args.probe) > (2 if args.event == "reattach" else 1):
        raise UsageError(f"too many -p for --event {args.event} (reattach takes two, the others one)")
    reports = explore_designs(args.binary, args.probe, chosen_designs(args), args.event,
                              [args.binary, *args.args], run_options(args), guest_env(args))
    return _emit(args, reports, reports_json, "emu.report.race_page")


def _signals(args: argparse.Namespace) -> int:
    from emu.race.signal_report import signal_reports_json  # heavy: only when run
    from emu.race.signals import Target, explore_signal_designs, parse_handlers

    if args.event is not None:
        raise UsageError("--signals explores one hit, not a patching event: drop --event")
    if len(args.probe) > 1:
        raise UsageError("--signals takes one -p (the probe whose hit the signal lands in)")
    handlers = parse_handlers(args.handler or ",".join(HANDLERS))
    target = Target(args.binary, args.probe[0], args.hit or Target.hit, tuple(args.args), guest_env(args),
                    run_options(args))
    reports = explore_signal_designs(target, chosen_designs(args), handlers)
    return _emit(args, reports, signal_reports_json, "emu.report.race_signals_page")


def _emit(args: argparse.Namespace, reports: Sequence[Any], as_json: Callable[[Any], Any],
          page_module: str) -> int:
    """The reports as text, and as JSON and an HTML page if asked (the page's module loads only then)."""
    print("\n\n".join(r.render() for r in reports))
    if args.json:
        write_json(args.json, as_json(reports))
    if args.html:
        importlib.import_module(page_module).page(reports, command_line(args)).write(args.html)
    return 0
