"""`uprobe-emu replay FILE`: re-run a saved fuzz finding, in the layout it records (its ASLR seed,
if any), and say whether it still reproduces."""

from __future__ import annotations

import argparse

NAME = "replay"
HELP = "re-run a saved fuzz finding (exit 1: reproduces, 0: does not)"
EXIT_REPRODUCES = 1
EXIT_GONE = 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kernel", metavar="D", help="replay under this design instead of the recorded one")
    p.add_argument("--design-file", action="append", default=[], metavar="FILE.py",
                   help="load designs from a Python file (needed to replay a finding of a user design)")
    p.add_argument("--trust-design-file", action="store_true",
                   help="run the design file the finding names (it is Python: by default replay runs only the "
                        "files named with --design-file)")
    p.add_argument("file", metavar="FILE", help="the finding's .json (or its .elf)")


def run(args: argparse.Namespace) -> int:
    from emu.designs import get_design
    from emu.designs.file import load_design_files
    from emu.fuzz.findings import replay

    load_design_files(args.design_file)
    design = get_design(args.kernel).name if args.kernel else None
    verdict, used = replay(args.file, design, args.trust_design_file)
    under = used if verdict.aslr is None else f"{used} (--aslr {verdict.aslr})"  # the layout the record names
    if not verdict.finding:
        print(f"{under}: does not reproduce: the probed run matches the unprobed one, no violations")
        return EXIT_GONE
    print(f"{under}: reproduces")
    for line in verdict.differences + verdict.violations:
        print(f"  {line}")
    return EXIT_REPRODUCES
