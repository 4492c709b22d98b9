"""`uprobe-emu diff`: run natively with probes (host kernel) and emulated, and compare."""

from __future__ import annotations

import argparse

from emu.commands.common import PROG, add_binary, cpu_count, guest_env, int_arg, stderr_line

NAME = "diff"
HELP = "run natively with the host kernel's uprobes and emulated (linux-6.18); print agreement or the first difference"
EXIT_DIFFERENT = 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-p", "--probe", action="append", default=[], metavar="SPEC", help="probe (in the executable)")
    p.add_argument("--kernel", default="linux-6.18", metavar="DESIGN", help="emulated design (default linux-6.18)")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="set an environment variable")
    p.add_argument("--clear-env", action="store_true", help="run both sides with an empty environment")
    p.add_argument("--cpus", type=cpu_count, default=1, metavar="N",
                   help="CPUs the emulated side is told it has (default 1; the native side has the host's)")
    p.add_argument("--aslr", type=int_arg, metavar="SEED",
                   help="emulate with the layout randomized from SEED and run natively with ASLR on: addresses "
                        "(/proc/self/maps) are then not compared")
    add_binary(p)


def run(args: argparse.Namespace) -> int:
    from emu.diff import run_diff  # heavy: only when run

    report = run_diff(args.binary, [args.binary, *args.args], args.probe, guest_env(args), args.kernel,
                      cpus=args.cpus, aslr=args.aslr)
    warn_ifunc_probes(args)
    difference = report.first_difference()
    counts = ", ".join(f"{s}={n}" for s, n in zip(report.specs, report.hits, strict=True))
    if difference is None:
        sites = ", ".join(b.hex() for b in report.sites)
        print(f"agree: stdout, stderr, exit status {report.exit_status}"
              + (f", hits {counts}, site bytes at exit {sites}" if counts else "")
              + (", /proc/self/maps at exit" if report.native.maps else ""))
        return 0
    print(f"differ: {difference}")
    return EXIT_DIFFERENT


def warn_ifunc_probes(args: argparse.Namespace) -> None:
    """A probe in an ifunc variant: the emulated CPU may make glibc call another one (emu/ifunc.py)."""
    if not args.probe:
        return
    from emu.ifunc import ifunc_probes

    for found in ifunc_probes(args.binary, [args.binary, *args.args], guest_env(args), args.probe):
        stderr_line(f"{PROG}: {found.line()}")
