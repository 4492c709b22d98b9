"""Command line: parses, calls the library, renders. No emulation logic lives here."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections.abc import Sequence

from emu import __version__
from emu.check import CheckRequest, check_table, designs_from, run_check
from emu.designs import DEFAULT_DESIGN, DESIGNS
from emu.errors import EXIT_HARNESS_ERROR, EmuError, UsageError
from emu.guestio import GuestIO
from emu.kernel.dispatch import KernelConfig
from emu.kernel.uprobes.consumers import Consumer, Hit
from emu.libprobes import LibraryProbe
from emu.machine import Attachment, Machine, RunOptions, RunResult
from emu.verify.session import DEFAULT_VERIFIERS, VerifySession, parse_verifiers

PROG = "uprobe-emu"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return max(value, 1e-6)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Run x86-64 Linux binaries under Unicorn on a fake kernel.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (repeat for debug)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run a binary; the exit status is the guest's")
    _add_process_options(run)
    run.add_argument("--strace", action="store_true", help="print each syscall on stderr, like strace")
    run.add_argument("--json", metavar="FILE", help="write the run's result as JSON")
    run.add_argument("--kernel", default=DEFAULT_DESIGN, metavar="DESIGN",
                     help=f"kernel design: {', '.join(DESIGNS)} (default {DEFAULT_DESIGN})")
    run.add_argument("-p", "--probe", action="append", default=[], metavar="SPEC",
                     help="attach a probe: uprobe:SYM[+OFF], uprobe:0xADDR, uretprobe:SYM, usdt:PROVIDER:NAME")
    run.add_argument("--print-args", action="store_true", help="print each USDT hit with its decoded arguments")
    run.add_argument("--verify", metavar="LIST", type=parse_verifiers, default=(),
                     help="verifiers to run on every probe hit: redzone,regs,resume (default: none)")
    run.add_argument("binary", metavar="BINARY")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")
    check = sub.add_parser("check", help="run unprobed and under each design with verifiers; print one table")
    _add_process_options(check)
    check.add_argument("--kernel", default="all", metavar="all|D1,D2", help="designs to compare (default all)")
    check.add_argument("-p", "--probe", action="append", default=[], metavar="SPEC",
                       help="probe to attach (default: every scan-able site of the binary)")
    check.add_argument("--verify", metavar="LIST", type=parse_verifiers, default=DEFAULT_VERIFIERS,
                       help="verifiers (default redzone,regs,resume)")
    check.add_argument("--json", metavar="FILE", help="write the per-design results as JSON")
    check.add_argument("--details", action="store_true", help="print every violation with its evidence")
    check.add_argument("--strict", action="store_true", help="exit 1 if any design has a violation or diverges")
    check.add_argument("binary", metavar="BINARY")
    check.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")
    return parser


def _add_process_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rootfs", default="/", metavar="DIR", help="guest root directory (read-only; default /)")
    p.add_argument("--max-insns", type=_positive_int, metavar="N", help="stop the guest after N instructions")
    p.add_argument("--timeout", type=_positive_float, metavar="S", help="stop the guest after S seconds")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="set a guest environment variable")
    p.add_argument("--clear-env", action="store_true", help="start the guest with an empty environment")
    p.add_argument("--exe-base", type=_int, metavar="ADDR", help="load address of a PIE executable")
    p.add_argument("--interp-base", type=_int, metavar="ADDR", help="load address of the interpreter")
    p.add_argument("--seed", type=_int, default=0, help="seed for getrandom and AT_RANDOM (default 0)")


def _guest_env(args: argparse.Namespace) -> dict[str, str]:
    env = {} if args.clear_env else dict(os.environ)
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env wants K=V, got {item!r}")
        env[key] = value
    return env


def _options(args: argparse.Namespace, **extra: object) -> RunOptions:
    if not os.path.isdir(args.rootfs):
        raise UsageError(f"--rootfs {args.rootfs}: not a directory")
    kernel = KernelConfig(rootfs=args.rootfs, seed=args.seed)
    return RunOptions(
        kernel=kernel,
        exe_base=args.exe_base,
        interp_base=args.interp_base,
        max_insns=args.max_insns,
        timeout_s=args.timeout,
        **extra,  # type: ignore[arg-type]
    )


def _stderr_line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def cmd_run(args: argparse.Namespace) -> int:
    if args.json:
        _check_writable(args.json)
    options = _options(args, count_insns=bool(args.json), strace=_stderr_line if args.strace else None,
                       design=args.kernel)
    machine = Machine(args.binary, [args.binary, *args.args], _guest_env(args), options, GuestIO.terminal())
    for spec in args.probe:
        _attach(machine, spec, args.print_args)
    session = VerifySession(machine, args.verify) if args.verify else None
    result = machine.run()
    _report_ending(result)
    shown: list[Attachment | LibraryProbe] = [a for a in machine.attachments if not a.library]
    shown += machine.libraries.probes
    if shown:
        _stderr_line(probe_table(shown))
    violations = session.violations if session else []
    for violation in violations:
        _stderr_line(f"{PROG}: {violation.line()}")
    if args.json:
        payload = result.to_json()
        payload["violations"] = [v.to_json() for v in violations]
        _write_json(args.json, payload)
    return result.exit_status


def cmd_check(args: argparse.Namespace) -> int:
    if args.json:
        _check_writable(args.json)
    request = CheckRequest(
        binary=args.binary, argv=[args.binary, *args.args], env=_guest_env(args), specs=tuple(args.probe),
        designs=designs_from(args.kernel), verifiers=args.verify, options=_options(args),
    )
    reports = run_check(request)
    print(check_table(reports))
    for report in reports:
        if report.divergence:
            print(f"{report.design}: output differs from the unprobed run: {report.divergence}")
        shown = report.violations if args.details else report.violations[:3]
        for violation in shown:
            print(f"{report.design}: " + (violation.details_text() if args.details else violation.line()))
        if len(report.violations) > len(shown):
            print(f"{report.design}: ... {len(report.violations) - len(shown)} more (--details shows all)")
    if args.json:
        _write_json(args.json, {"designs": {r.design: r.to_json() for r in reports}})
    bad = any(r.violations or not r.same_output for r in reports)
    return 1 if args.strict and bad else 0


def _attach(machine: Machine, spec: str, print_args: bool) -> Attachment | LibraryProbe:
    consumer = Consumer()
    attachment = machine.attach(spec, consumer)
    note = attachment.resolved.usdt if isinstance(attachment, Attachment) else None
    if print_args and note is not None:
        def show(hit: Hit) -> None:
            values = [arg.read(hit.regs, hit.read) for arg in note.args]
            _stderr_line(f"{spec} @ {hit.address:#x}: " + " ".join(f"arg{i}={v}" for i, v in enumerate(values)))

        consumer.handler = show
    return attachment


def probe_table(attachments: list[Attachment | LibraryProbe]) -> str:
    """Per-probe summary: spec, address, hits, paths taken, optimized."""
    rows = [("probe", "address", "hits", "path", "optimized")]
    for att in attachments:
        s = att.summary()
        paths = ",".join(f"{k}:{v}" for k, v in sorted(s["paths"].items())) or "-"
        address = f"{s['address']:#x}" if s["address"] is not None else "not mapped"
        rows.append((s["spec"], address, str(s["hits"]), paths, "yes" if s["optimized"] else "no"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _report_ending(result: RunResult) -> None:
    if result.message:
        _stderr_line(f"{PROG}: {result.message}")


def _check_writable(path: str) -> None:
    """Fail before the run, not after it, when the result cannot be saved."""
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise EmuError(f"cannot write {path}: {exc.strerror}") from None


def _write_json(path: str, payload: dict) -> None:
    try:
        with open(path, "w") as fh:
            json.dump(payload, fh, indent=2, sort_keys=True)
            fh.write("\n")
    except OSError as exc:
        raise EmuError(f"cannot write {path}: {exc.strerror}") from None


COMMANDS = {"run": cmd_run, "check": cmd_check}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), format=f"{PROG}: %(message)s")
        return COMMANDS[args.command](args)
    except EmuError as err:
        _stderr_line(f"{PROG}: {err}")
        return err.exit_status
    except KeyboardInterrupt:
        _stderr_line(f"{PROG}: interrupted")
        return 130
    except BrokenPipeError:
        return EXIT_HARNESS_ERROR
