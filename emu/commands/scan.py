"""`uprobe-emu scan`: list a binary's probe sites and what each design does with them (no emulation)."""

from __future__ import annotations

import argparse

from emu.commands.common import check_writable
from emu.errors import EmuError

NAME = "scan"
HELP = "list probe sites (USDT notes, 5-/10-byte NOPs) and which designs optimize them"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="write the sites as a JSON list of objects")
    p.add_argument("--kernel", default="all", metavar="all|D1,D2", help="designs to judge each site for (default all)")
    p.add_argument("--no-inline", action="store_true",
                   help="skip the linear sweep inside functions: USDT notes and symbol entries only")
    p.add_argument("binary", metavar="BINARY")


def run(args: argparse.Namespace) -> int:
    import json

    from emu.check import designs_from  # heavy (pyelftools, capstone): only when run
    from emu.scan import scan_file, scan_table

    if args.json:
        check_writable(args.json)
    result = scan_file(args.binary, designs_from(args.kernel), inline=not args.no_inline)
    print(scan_table(result))
    if args.json:
        try:
            with open(args.json, "w") as fh:
                json.dump(result.to_json(), fh, indent=2)
                fh.write("\n")
        except OSError as exc:
            raise EmuError(f"cannot write {args.json}: {exc.strerror}") from None
    return 0
