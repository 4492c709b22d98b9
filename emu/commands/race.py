"""`uprobe-emu race`: every interleaving of a thread through a probe site with one patching event."""

from __future__ import annotations

import argparse

from emu.commands.common import (
    add_design_options,
    add_html_option,
    add_process_options,
    check_writable,
    chosen_designs,
    command_line,
    guest_env,
    run_options,
    write_json,
)
from emu.errors import UsageError

NAME = "race"
HELP = "explore races between a thread in a probe site and the kernel patching it"
EVENTS = ("attach", "optimize", "detach", "reattach")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_process_options(p)
    add_design_options(p, "all", "designs to explore (default all: built-in and --design-file ones)")
    p.add_argument("-p", "--probe", action="append", default=[], metavar="SPEC",
                   help="the probe whose site thread 1 enters; for reattach give a second -p: the probe "
                        "attached and optimized after the first is detached")
    p.add_argument("--event", choices=EVENTS, default="optimize",
                   help="the patching event: attach (INT3), optimize (first hit), detach (of an optimized "
                        "site), reattach (detach, then attach another probe) (default optimize)")
    p.add_argument("--json", metavar="FILE", help="write every design's outcomes as JSON")
    add_html_option(p, "per design, the grid of interleavings coloured by outcome, and an example of each")
    p.add_argument("binary", metavar="BINARY")
    p.add_argument("args", nargs="*", metavar="ARGS", help="the guest's arguments (after -- if they start with -)")


def run(args: argparse.Namespace) -> int:
    from emu.race import explore_designs, reports_json  # heavy: only when run

    if not args.probe:
        raise UsageError("race needs a probe: -p SPEC (e.g. -p uprobe:t_nop5)")
    if len(args.probe) > (2 if args.event == "reattach" else 1):
        raise UsageError(f"too many -p for --event {args.event} (reattach takes two, the others one)")
    for path in (args.json, args.html):
        if path:
            check_writable(path)
    reports = explore_designs(args.binary, args.probe, chosen_designs(args), args.event,
                              [args.binary, *args.args], run_options(args), guest_env(args))
    print("\n\n".join(r.render() for r in reports))
    if args.json:
        write_json(args.json, reports_json(reports))
    if args.html:
        from emu.report.race_page import page

        page(reports, command_line(args)).write(args.html)
    return 0
