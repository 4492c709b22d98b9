"""Campaign progress on stderr: a rich progress bar on a terminal, a plain line every few seconds
otherwise; and the final per-design table."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from emu.fuzz.campaign import Stats
from emu.render import table

PLAIN_EVERY_S = 2.0


def _findings_text(stats: Stats) -> str:
    return ", ".join(f"{d}={s.findings}" for d, s in stats.designs.items())


class PlainProgress:
    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.last = time.perf_counter()

    def __call__(self, stats: Stats) -> None:
        now = time.perf_counter()
        if now - self.last < PLAIN_EVERY_S:
            return
        self.last = now
        self.stream.write(f"fuzz: {stats.cases} cases, {stats.rate:.0f} cases/s, findings {_findings_text(stats)}\n")
        self.stream.flush()

    def close(self) -> None:
        pass


class RichProgress:
    def __init__(self, stream: TextIO, total: int | None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(TextColumn("fuzz"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[rate]} cases/s  findings {task.fields[found]}"),
                                 console=Console(file=stream), transient=False)
        self.total = total
        self.task = self.progress.add_task("fuzz", total=total, rate="0", found="")
        self.progress.start()
        self.last = 0.0

    def __call__(self, stats: Stats) -> None:
        now = time.perf_counter()
        if now - self.last < 0.1 and stats.cases != self.total:
            return
        self.last = now
        self.progress.update(self.task, completed=stats.cases, rate=f"{stats.rate:.0f}", found=_findings_text(stats))

    def close(self) -> None:
        self.progress.stop()


def progress_for(stream: TextIO, total: int | None) -> Any:
    if stream.isatty():
        try:
            return RichProgress(stream, total)
        except ImportError:
            pass
    return PlainProgress(stream)


def summary_table(stats: Stats) -> str:
    rows: list[tuple[str, ...]] = [("design", "cases", "findings", "first finding", "saved", "fewest stores")]
    for design, st in stats.designs.items():
        fewest = min((r["stores"] for r in st.saved), default=None)
        rows.append((design, str(stats.cases), str(st.findings), "-" if st.first_case is None else str(st.first_case),
                     str(len(st.saved)), "-" if fewest is None else str(fewest)))
    return table(rows)


def write_summary(stats: Stats, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    out.write(summary_table(stats) + "\n")
    layout = "" if stats.config.aslr is None else f", aslr {stats.config.aslr}"
    out.write(f"{stats.cases} cases in {stats.elapsed:.1f} s ({stats.rate:.0f} cases/s), seed {stats.config.seed}{layout}\n")
    for st in stats.designs.values():
        for record in st.saved:
            out.write(f"{record['design']}: case {record['index']} ({record['stores']} stores after shrinking): "
                      f"{record['summary'][:160]}\n    replay: {record['replay']}\n")
