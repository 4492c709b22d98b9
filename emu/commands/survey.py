"""`uprobe-emu survey`: every probe site under some paths, its red zone, and which designs it is a hazard for."""

from __future__ import annotations

import argparse
import os
from collections import Counter
from typing import TYPE_CHECKING

from emu.commands.common import (
    add_design_options,
    add_html_option,
    check_writable,
    chosen_designs,
    command_line,
    positive_int,
    stderr_line,
    write_json,
)
from emu.errors import UsageError

if TYPE_CHECKING:
    from emu.survey.corpus import Entry

NAME = "survey"
HELP = "static red-zone survey of every probe site in the ELF files under PATHs, per design"


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    from emu.survey.store import DEFAULT_DB

    add_design_options(p, "all", "designs to judge each site for (default all: built-in and --design-file ones)")
    p.add_argument("--json", metavar="FILE", help="write the totals and every site as JSON")
    p.add_argument("--report", metavar="FILE.md", help="write a Markdown report (totals, hazardous sites, packages)")
    add_html_option(p, "per design and per package: hazards, confirmations, unknowns, the corpus's proof")
    p.add_argument("--db", default=DEFAULT_DB, metavar="FILE",
                   help=f"SQLite results database, reused by the next survey (default ./{DEFAULT_DB})")
    p.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="run the analyses on this Dask scheduler's workers (default: a local cluster)")
    p.add_argument("--jobs", type=positive_int, default=_cpus(), metavar="N",
                   help="local worker processes (default: the CPUs this process may use)")
    p.add_argument("--corpus", metavar="FILE.toml",
                   help="also run these command lines under check for every design, and compare (see README)")
    p.add_argument("--record-native", action="store_true",
                   help="run each --corpus entry natively, write what it prints to FILE.native.json beside "
                        "the corpus, and stop (every survey then compares the unprobed emulated runs with it)")
    p.add_argument("--max-files", type=positive_int, metavar="N",
                   help="analyse at most N new files, then stop (the next run goes on)")
    p.add_argument("paths", nargs="*", metavar="PATH", help="files and directories to survey (with --corpus: "
                                                             "besides the entries' binaries)")


def run(args: argparse.Namespace) -> int:
    from emu.designs import get_design
    from emu.dist import dask_executor
    from emu.survey.corpus import load_corpus
    from emu.survey.engine import run_corpus, survey
    from emu.survey.native import load as load_records
    from emu.survey.native import record_path
    from emu.survey.report import markdown, packages, summary_text, to_json
    from emu.survey.store import Store, designs_key

    if not args.paths and not args.corpus:
        raise UsageError("survey: give a PATH to survey, or a --corpus")
    if args.record_native and not args.corpus:
        raise UsageError("survey: --record-native records a --corpus")
    designs = [get_design(n) for n in chosen_designs(args)]
    for path in (args.json, args.report, args.html):
        if path:
            check_writable(path)
    entries = load_corpus(args.corpus) if args.corpus else []
    if args.record_native:
        return _record(entries, record_path(args.corpus))
    records = load_records(record_path(args.corpus)) if args.corpus else {}
    paths = [*args.paths, *dict.fromkeys(e.binary for e in entries)]  # "all sites" are the static survey's
    store = Store(args.db, designs_key(designs))
    try:
        with dask_executor(args.scheduler, args.jobs)() as pool:
            outcome = survey(paths, designs, store, pool, args.max_files, progress=True)
            if entries and outcome.complete:
                run_corpus(entries, designs, store, pool, outcome, progress=True, records=records)
            elif entries:
                stderr_line("uprobe-emu: the corpus runs wait until the static survey is complete (run again)")
    finally:
        store.close()
    print(summary_text(outcome, designs))
    if args.json:
        write_json(args.json, to_json(outcome, designs))
    owners = packages(sorted(outcome.walk.elf)) if args.report or args.html else {}
    if args.report:
        _write(args.report, markdown(outcome, designs, owners))
    if args.html:
        from emu.report.survey_page import page

        page(outcome, designs, owners, command_line(args)).write(args.html)
    return 0


def _record(entries: list[Entry], path: str) -> int:
    from emu.survey.native import record

    records = record(entries, path)
    endings = Counter(r.output.ending.split(" ")[0].rstrip(":") for r in records.values())
    print(f"recorded {len(records)} entries natively in {path}: {endings['exit']} exited, "
          f"{endings['signal']} killed by a signal, {endings['stopped']} stopped by their timeout")
    return 0


def _write(path: str, text: str) -> None:
    from emu.errors import EmuError

    try:
        with open(path, "w") as fh:
            fh.write(text)
    except OSError as exc:
        raise EmuError(f"cannot write {path}: {exc.strerror}") from None
