"""`uprobe-emu fuzz`: generate red-zone leaf functions around probe sites and hunt for designs
that change what they compute; findings are shrunk and saved with a replay command."""

from __future__ import annotations

import argparse
import os
import sys

from emu.commands.common import (
    add_design_options,
    add_html_option,
    check_writable,
    chosen_designs,
    int_arg,
    positive_float,
    positive_int,
    stderr_line,
    write_json,
)
from emu.errors import UsageError

NAME = "fuzz"
HELP = "fuzz the red zone around probe sites under one or all designs"
EXIT_FINDINGS = 1
EXIT_INTERRUPTED = 130
DEFAULT_CASES = 1000


def non_negative_int(text: str) -> int:
    value = int_arg(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def aslr_arg(text: str) -> int:
    """The ``--aslr SEED`` argument: the seeds a finding's record can hold (0 to 2**64-1)."""
    from emu.fuzz.case import aslr_seed

    value = int_arg(text)
    try:
        aslr_seed(value)
    except UsageError:
        raise argparse.ArgumentTypeError(f"must be 0 to 2**64-1, got {text!r}") from None
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_design_options(p, "linux-6.18", "design(s) to fuzz: a name, D1,D2 or all (default linux-6.18)")
    limit = p.add_mutually_exclusive_group()
    limit.add_argument("--cases", type=positive_int, metavar="N", help=f"cases in the campaign (default {DEFAULT_CASES})")
    limit.add_argument("--time", type=positive_float, metavar="S", help="run for S seconds instead")
    p.add_argument("--seed", type=non_negative_int, default=0, help="campaign seed (default 0): same seed, same cases")
    p.add_argument("--start", type=non_negative_int, default=0, metavar="INDEX", help="first case index (to resume)")
    p.add_argument("--aslr", type=aslr_arg, metavar="SEED",
                   help="run every case in a process laid out as Linux does with ASLR on (randomize_va_space=2), "
                        "from SEED: the stack, mmap area and vDSO move; the fuzz program stays at its fixed "
                        "non-PIE addresses (default: ASLR off)")
    p.add_argument("--jobs", type=positive_int, default=1, metavar="J",
                   help="worker processes, or with --scheduler the tasks the campaign is split into (default 1)")
    p.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="run the J shares as tasks on this Dask scheduler's workers; findings come back here")
    p.add_argument("--shard", default="0/1", metavar="I/N", help="run shard I of N of the campaign (default 0/1)")
    p.add_argument("--out", default="fuzz-findings", metavar="DIR", help="where findings go (default fuzz-findings)")
    p.add_argument("--json", metavar="FILE", help="write cases, findings, cases_per_s, first_finding_case")
    add_html_option(p, "findings over cases per design, each saved finding's code with the violating store marked")


def resume_command(args: argparse.Namespace, index: int) -> str:
    import shlex

    parts = ["uprobe-emu", "fuzz", "--kernel", args.kernel, "--seed", str(args.seed), "--start", str(index)]
    if args.aslr is not None:
        parts += ["--aslr", str(args.aslr)]
    for path in args.design_file:
        parts += ["--design-file", path]
    if args.time:
        parts += ["--time", str(args.time)]
    else:
        parts += ["--cases", str(args.start + (args.cases or DEFAULT_CASES) - index)]
    parts += ["--jobs", str(args.jobs), "--shard", args.shard, "--out", args.out]
    if getattr(args, "scheduler", None):
        parts += ["--scheduler", args.scheduler]
    if args.json:
        parts += ["--json", args.json]
    return shlex.join(parts)


def run(args: argparse.Namespace) -> int:
    from emu.fuzz.campaign import CampaignConfig, run_campaign
    from emu.fuzz.partition import parse_shard
    from emu.fuzz.progress import progress_for, write_summary

    for path in (args.json, args.html):
        if path:
            check_writable(path)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: {exc.strerror}") from None
    cases = None if args.time else (args.cases or DEFAULT_CASES)
    config = CampaignConfig(designs=chosen_designs(args), seed=args.seed, start=args.start, cases=cases,
                            time_s=args.time, jobs=args.jobs, shard=parse_shard(args.shard), out=args.out,
                            scheduler=args.scheduler, aslr=args.aslr)
    progress = progress_for(sys.stderr, cases)
    try:
        stats = run_campaign(config, progress)
    finally:
        progress.close()
    write_summary(stats)
    if args.json:
        write_json(args.json, stats.to_json())
    if args.html:
        from emu.report.fuzz_page import page

        layout = "" if args.aslr is None else f" --aslr {args.aslr}"
        page(stats, f"uprobe-emu fuzz --kernel {args.kernel} --seed {args.seed}{layout}").write(args.html)
    if stats.interrupted:
        resume = stats.resume_index()
        stderr_line(f"uprobe-emu: interrupted after {stats.cases} cases; findings so far are in {args.out}")
        if resume is not None:
            stderr_line(f"uprobe-emu: resume with: {resume_command(args, resume)}")
        return EXIT_INTERRUPTED
    return EXIT_FINDINGS if stats.findings else 0
