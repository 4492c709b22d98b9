"""`uprobe-emu check`: the unprobed reference and each design with verifiers, in one table."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from emu.commands.common import (
    add_binary,
    add_design_options,
    add_html_option,
    add_process_options,
    add_sched_options,
    add_verifier_options,
    check_writable,
    chosen_designs,
    command_line,
    guest_env,
    run_options,
    write_json,
)
from emu.errors import UsageError
from emu.violations import ViolationLog

if TYPE_CHECKING:
    from emu.check import DesignReport
    from emu.machine import RunResult

NAME = "check"
HELP = "run unprobed and under each design with verifiers; print one table"
DEFAULT_TIMEOUT_S = 300.0  # each run of check (unprobed, then each design) without --timeout: a batch never hangs


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_process_options(p)
    add_design_options(p, "all", "designs to compare (default all: built-in and --design-file ones)")
    p.add_argument("-p", "--probe", action="append", default=[], metavar="SPEC",
                   help="probe to attach (default: every scan-able site of the binary)")
    p.add_argument("--json", metavar="FILE", help="write the per-design results as JSON")
    add_html_option(p, "red-zone maps, differences and one hit's path per design")
    p.add_argument("--details", action="store_true", help="print every violation with its evidence")
    p.add_argument("--strict", action="store_true", help="exit 1 if any design has a violation or diverges")
    p.add_argument("--stdin", metavar="FILE", help="the guest's standard input, the same bytes for every run "
                                                  "(default: empty; - reads this command's own)")
    add_sched_options(p)
    add_verifier_options(p, "verifiers (default redzone,regs,resume,memory)")
    add_binary(p)


def run(args: argparse.Namespace) -> int:
    from emu.check import CheckRequest, check_table, run_check  # heavy: only when run
    from emu.verify.session import DEFAULT_VERIFIERS

    if args.verify is None:
        args.verify = DEFAULT_VERIFIERS
    if args.timeout is None:
        args.timeout = DEFAULT_TIMEOUT_S

    for path in (args.json, args.html):
        if path:
            check_writable(path)
    tracer = None
    if args.html:
        from emu.report.hitpath import HitTracer

        tracer = HitTracer
    request = CheckRequest(
        binary=args.binary, argv=[args.binary, *args.args], env=guest_env(args), specs=tuple(args.probe),
        designs=chosen_designs(args), verifiers=args.verify,
        options=run_options(args, sched_quantum=args.sched_quantum, sched_seed=args.sched_seed),
        shstk=args.shstk, rsb=args.rsb, tracer=tracer, stdin=_stdin(args.stdin),
    )
    reports = run_check(request)
    from emu.commands.diff import warn_ifunc_probes

    warn_ifunc_probes(args)
    print(check_table(reports))
    for report in reports:
        if report.error is not None:
            print(f"{report.design}: failed: {report.error}")
        refused = report.refused if args.details else report.refused[:3] if args.probe else []  # scanned: counted
        for why in refused:
            print(f"{report.design}: refused {why}")
        if args.probe and len(report.refused) > len(refused):
            print(f"{report.design}: ... {len(report.refused) - len(refused)} more refused (--details shows all)")
        if report.divergence:
            print(f"{report.design}: output differs from the unprobed run: {report.divergence}")
        shown = report.violations if args.details else report.violations[:3]
        for violation in shown:
            print(f"{report.design}: " + (violation.details_text() if args.details else violation.line()))
        if report.violations.total > len(shown):
            print(f"{report.design}: ... {report.violations.total - len(shown)} more ({more_help(report.violations)})")
    stopped = stopped_runs(reports)
    for who, result in stopped:
        print(f"{who}: {result.message}; its output is compared only as far as it ran")
    if args.json:
        write_json(args.json, {"designs": {r.design: r.to_json() for r in reports},
                               "reference": reference_json(reports[0].reference),
                               "limit": stopped[0][1].ending.value if stopped else None})
    if args.html:
        from emu.report.check_page import page

        page(reports, command_line(args)).write(args.html)
    bad = any(r.violations or not r.same_output or r.error for r in reports)
    if args.strict and bad:
        return 1
    return stopped[0][1].exit_status if stopped else 0


def stopped_runs(reports: Sequence[DesignReport]) -> list[tuple[str, RunResult]]:
    """(who, result) of each run a limit stopped, the unprobed one first."""
    from emu.runtypes import LIMITS

    runs = [("unprobed run", reports[0].reference)] + [(r.design, r.result) for r in reports]
    return [(who, r) for who, r in runs if r is not None and r.ending in LIMITS]


def reference_json(result: RunResult | None) -> dict[str, Any] | None:
    if result is None:
        return None
    return {"ending": result.ending.value, "exit_status": result.exit_status, "message": result.message}


def more_help(log: ViolationLog) -> str:
    """What the line after the shown violations says of the rest."""
    if log.dropped:
        return f"a run keeps the first {len(log):,} whole, and only counts the rest"
    return "--details shows all"


def _stdin(path: str | None) -> bytes:
    import sys

    if path is None:
        return b""
    try:
        if path == "-":
            return sys.stdin.buffer.read()
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise UsageError(f"--stdin {path}: {exc.strerror}") from None
