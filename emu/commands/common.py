"""Argument types, process options and output helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from emu.errors import EmuError, UsageError

if TYPE_CHECKING:
    from emu.designs import Design
    from emu.machine import RunOptions

PROG = "uprobe-emu"


def int_arg(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def positive_int(text: str) -> int:
    value = int_arg(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return max(value, 1e-6)


def cpu_count(text: str) -> int:
    """The ``--cpus N`` argument: 1..MAX_CPUS."""
    from emu.cpumodel import MAX_CPUS

    value = int_arg(text)
    if not 1 <= value <= MAX_CPUS:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_CPUS}, got {text!r}")
    return value


SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size_arg(text: str) -> int:
    """A byte count: 512M, 2G, 1048576; ``none`` (0) for no limit."""
    if text.strip().lower() == "none":
        return 0
    body = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = body[-1:] if body[-1:] in SIZE_UNITS and not body[-1:].isdigit() else ""
    try:
        value = int(body[: len(body) - len(unit)]) * SIZE_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size (like 512M or 2G): {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def clock_arg(text: str) -> int:
    """The ``--clock`` argument, as the guest's wall clock at start in ns: ``now`` (this host's time as
    the command starts, so every run it makes starts the same), a UTC date or date and time, or
    ``@SECONDS`` since the epoch (as date -d takes it)."""
    import datetime

    if text == "now":
        return time.time_ns()
    if text.startswith("@"):
        return int_arg(text[1:]) * 10**9
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not now, a date (2026-12-05, 2026-12-05T09:30:00) or @SECONDS: {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp()) * 10**9 + when.microsecond * 1000


def add_process_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rootfs", default="/", metavar="DIR",
                   help="guest root directory (never written: guest writes stay in memory; default /)")
    p.add_argument("--read-only", action="store_true",
                   help="mount the guest's file system read-only: every write is EROFS")
    p.add_argument("--memory-limit", type=size_arg, metavar="SIZE",
                   help="cap on the memory all guest processes map together (mmap/brk/fork get ENOMEM); "
                        "default: an eighth of the host's RAM; 'none' for no cap")
    p.add_argument("--max-insns", type=positive_int, metavar="N", help="stop the guest after N instructions")
    p.add_argument("--timeout", type=positive_float, metavar="S", help="stop the guest after S seconds")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="set a guest environment variable")
    p.add_argument("--clear-env", action="store_true", help="start the guest with an empty environment")
    p.add_argument("--exe-base", type=int_arg, metavar="ADDR", help="load address of a PIE executable")
    p.add_argument("--interp-base", type=int_arg, metavar="ADDR", help="load address of the interpreter")
    p.add_argument("--seed", type=int_arg, default=0, help="seed for getrandom and AT_RANDOM (default 0)")
    p.add_argument("--clock", type=clock_arg, metavar="WHEN",
                   help="the guest's wall clock at start: now, a UTC date (2026-12-05[T09:30:00]) or @SECONDS "
                        "(default 2026-01-01, the same every run)")
    p.add_argument("--cpus", type=cpu_count, default=None, metavar="N",
                   help="CPUs the guest is told it has: sched_getaffinity, sysconf, /proc/cpuinfo, "
                        "/sys/devices/system/cpu, CPUID (default 1: the emulator runs every thread on one)")
    p.add_argument("--aslr", type=int_arg, metavar="SEED",
                   help="randomize the layout as Linux does (randomize_va_space=2), from SEED (default: ASLR off)")


def add_binary(p: argparse.ArgumentParser) -> None:
    p.add_argument("binary", metavar="BINARY")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="ARGS")


def guest_env(args: argparse.Namespace) -> dict[str, str]:
    env = {} if args.clear_env else dict(os.environ)
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env wants K=V, got {item!r}")
        env[key] = value
    return env


def run_options(args: argparse.Namespace, **extra: Any) -> RunOptions:
    from emu.kernel.dispatch import KernelConfig
    from emu.machine import RunOptions

    if not os.path.isdir(args.rootfs):
        raise UsageError(f"--rootfs {args.rootfs}: not a directory")
    from emu.kernel.state import default_memory_limit

    cpus = {} if args.cpus is None else {"cpus": args.cpus}
    limit = default_memory_limit() if args.memory_limit is None else args.memory_limit or None
    clock = {} if args.clock is None else {"realtime_start_ns": args.clock}
    kernel = KernelConfig(rootfs=args.rootfs, seed=args.seed, read_only=args.read_only, memory_limit=limit, **cpus,
                          **clock)
    return RunOptions(kernel=kernel, exe_base=args.exe_base, interp_base=args.interp_base,
                      max_insns=args.max_insns, timeout_s=args.timeout, aslr=args.aslr, **extra)


def add_sched_options(p: argparse.ArgumentParser) -> None:
    from emu.kernel.sched import DEFAULT_QUANTUM

    """--sched-quantum and --sched-seed: how a multi-threaded guest's threads take turns."""
    p.add_argument("--sched-quantum", type=positive_int, default=DEFAULT_QUANTUM, metavar="N",
                   help=f"instructions a thread runs before the next one (default {DEFAULT_QUANTUM})")
    p.add_argument("--sched-seed", type=int, metavar="S",
                   help="random preemption: slice lengths (1..N) and the next thread drawn from seed S")


def add_design_options(p: argparse.ArgumentParser, kernel_default: str | None, kernel_help: str) -> None:
    """--kernel and --design-file, as every command choosing designs takes them."""
    p.add_argument("--kernel", default=kernel_default, metavar="DESIGN" if kernel_default != "all" else "all|D1,D2",
                   help=kernel_help)
    p.add_argument("--design-file", action="append", default=[], metavar="FILE.py",
                   help="load designs from a Python file (emu.designs API); refused before anything runs if "
                        "inconsistent. Repeatable")


def add_one_design_option(p: argparse.ArgumentParser) -> None:
    """--kernel DESIGN and --design-file, for a command that runs one design (see chosen_design)."""
    from emu.designs import DEFAULT_DESIGN, DESIGNS

    add_design_options(p, None, f"kernel design: {', '.join(DESIGNS)} or one --design-file defines "
                                f"(default: the file's first design, else {DEFAULT_DESIGN})")


def chosen_design(args: argparse.Namespace) -> str:
    """One design: --kernel, else the first design of --design-file, else the default."""
    from emu.designs import DEFAULT_DESIGN, get_design

    loaded = _design_files(args)
    name: str = args.kernel or (loaded[0].name if loaded else DEFAULT_DESIGN)
    return get_design(name).name


def _design_files(args: argparse.Namespace) -> list[Design]:
    """The designs of --design-file, each file run within the command's --timeout if it has one
    (emu/designs/file.py, with runpy and traceback, loads only if a file is given)."""
    if not args.design_file:
        return []
    from emu.designs.file import load_design_files

    return load_design_files(args.design_file, getattr(args, "timeout", None))


def chosen_designs(args: argparse.Namespace) -> tuple[str, ...]:
    """Several designs: --kernel all|D1,D2 over the built-in designs and those --design-file defines."""
    from emu.check import designs_from

    _design_files(args)
    return designs_from(args.kernel)


def stderr_line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def check_writable(path: str) -> None:
    """Fail before the run, not after it, when the result cannot be saved."""
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise EmuError(f"cannot write {path}: {exc.strerror}") from None


def write_json(path: str, payload: dict[str, Any]) -> None:
    import json

    try:
        with open(path, "w") as fh:
            json.dump(payload, fh, indent=2, sort_keys=True)
            fh.write("\n")
    except OSError as exc:
        raise EmuError(f"cannot write {path}: {exc.strerror}") from None


def add_html_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--html", metavar="FILE", help=f"write a self-contained HTML page: {what}")


def command_line(args: argparse.Namespace) -> str:
    """The command and its guest, for a page's subtitle."""
    import shlex

    guest = [args.binary, *args.args] if getattr(args, "binary", None) else []
    return shlex.join([PROG, args.command, *guest])


def verifier_list(text: str) -> tuple[Any, ...]:
    """The ``--verify LIST`` argument (the verifier modules load only when a command uses them)."""
    from emu.verify.session import parse_verifiers

    return parse_verifiers(text)


def rsb_depth_arg(text: str) -> int:
    """The ``--rsb N`` argument."""
    from emu.callret.rsb import rsb_depth

    return rsb_depth(text)


def add_verifier_options(p: argparse.ArgumentParser, verify_help: str) -> None:
    """--verify, --shstk and --rsb, as run and check both take them."""
    p.add_argument("--verify", metavar="LIST", type=verifier_list, default=None, help=verify_help)
    p.add_argument("--shstk", action="store_true",
                   help="run a CET shadow stack; a ret it disagrees with (#CP on real hardware) is a violation")
    p.add_argument("--rsb", metavar="N", type=rsb_depth_arg, nargs="?", const=16, default=None,
                   help="model an N-entry return stack buffer (default 16): predicted and mispredicted returns, "
                        "per run and per probe hit")
