"""`uprobe-emu patch`: every code write the emulated kernel makes at each probe site, in order."""

from __future__ import annotations

import argparse

from emu.commands.common import (
    add_binary,
    add_one_design_option,
    add_process_options,
    check_writable,
    chosen_design,
    guest_env,
    run_options,
    write_json,
)

NAME = "patch"
HELP = "show the bytes and disassembly of each probe site before and after every patch step"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_process_options(p)
    p.add_argument("-p", "--probe", action="append", default=[], required=True, metavar="SPEC",
                   help="probe to attach: uprobe:SYM[+OFF], uprobe:0xADDR, uretprobe:SYM, usdt:PROVIDER:NAME")
    add_one_design_option(p)
    p.add_argument("--no-run", action="store_true",
                   help="do not run the program: optimize each site directly, as its first hit would")
    p.add_argument("--json", metavar="FILE", help="write the steps as JSON")
    add_binary(p)


def run(args: argparse.Namespace) -> int:
    from emu.patchview import record_patches, render  # heavy: only when run

    if args.json:
        check_writable(args.json)
    report = record_patches(args.binary, args.probe, chosen_design(args), argv=[args.binary, *args.args],
                            env=guest_env(args), options=run_options(args), run=not args.no_run)
    print(render(report))
    if args.json:
        write_json(args.json, {"design": report.design, "sites": [h.to_json() for h in report.sites]})
    return 0
