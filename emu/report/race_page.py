"""The race page: per design and event, the grid of interleavings (rows: which of the kernel's
writes land before thread 1 enters and which while it is stopped; columns: the instruction
boundary where it is stopped) coloured by outcome, and the example interleaving of each outcome."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import drawsvg as dw

from emu.race.outcome import CLEAN
from emu.race.report import Interleaving, RaceReport
from emu.report import svg
from emu.report.html import Page

CLEAN_COLOUR = "#7fc97f"
OUTCOME_COLOURS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#1f77b4", "#bcbd22", "#17becf", "#7f7f7f")
CELL, LABEL_W, TOP = 14, 170, 40


def colours(outcomes: Counter[str]) -> dict[str, str]:
    """Clean is green; the others take the palette in order of frequency (the same on every page)."""
    others = [key for key, _ in outcomes.most_common() if key != CLEAN]
    out = {key: OUTCOME_COLOURS[i % len(OUTCOME_COLOURS)] for i, key in enumerate(others)}
    return {CLEAN: CLEAN_COLOUR, **out}


def outcome_legend(d: dw.Drawing, y: float, colour: dict[str, str], outcomes: Counter[str]) -> None:
    """Two columns of outcome colours with their counts, from ``y`` down."""
    for i, (key, c) in enumerate(colour.items()):
        x, line = 10 + (i % 2) * 360, y + (i // 2) * 16
        d.append(svg.cell(x, line - 9, 10, 10, c, key))
        d.append(svg.label(x + 14, line, f"{key} ({outcomes[key]})", 10))


def legend_height(colour: dict[str, str]) -> int:
    return (len(colour) + 1) // 2 * 16


def _row(iv: Interleaving) -> tuple[int, int]:
    """(writes done before thread 1 enters, writes done by the time it continues)."""
    return iv.writes_before, iv.writes_before if iv.writes_after is None else iv.writes_after


def _row_label(row: tuple[int, int], total: int) -> str:
    before, after = row
    if before == after:
        return f"{before}/{total} done, runs through"
    landed = f"{after}" if after == before + 1 else f"{before + 1}-{after}"
    return f"{before}/{total} done, {landed} while stopped"


def grid(report: RaceReport) -> dw.Drawing:
    total = len(report.writes)
    rows = sorted({_row(iv) for iv, _ in report.cells})
    columns = max((iv.insns or 0 for iv, _ in report.cells), default=0) + 1
    colour = colours(report.outcomes)
    width = LABEL_W + columns * CELL + 20
    d = svg.drawing(max(width, 520), TOP + len(rows) * CELL + 20 + legend_height(colour))
    d.append(svg.label(LABEL_W, 14, "thread 1 stopped after k instructions (0: not stopped)", 10, fill=svg.MUTED))
    for k in range(columns):
        if k % 5 == 0 or k == columns - 1:
            d.append(svg.label(LABEL_W + k * CELL + CELL / 2, TOP - 6, str(k), 9, "middle", fill=svg.MUTED))
    for r, row in enumerate(rows):
        d.append(svg.label(LABEL_W - 6, TOP + r * CELL + 10, _row_label(row, total), 9.5, "end"))
        d.append(svg.cell(LABEL_W, TOP + r * CELL, columns * CELL, CELL - 1, "#f7f7f7"))
    index = {row: r for r, row in enumerate(rows)}
    for iv, key in report.cells:
        r, k = index[_row(iv)], iv.insns or 0
        example = report.examples[key].interleaving == iv  # outlined: the one the table spells out
        outline = {"stroke": svg.INK, "stroke_width": 1.5, "data_example": "1"} if example else {}
        d.append(svg.cell(LABEL_W + k * CELL, TOP + r * CELL, CELL - 1, CELL - 1, colour[key],
                          f"{iv.text(total)}: {key}" + (" (the example)" if example else ""),
                          data_outcome=key, data_insns=k, data_row=r, **outline))
    outcome_legend(d, TOP + len(rows) * CELL + 22, colour, report.outcomes)
    return d


def page(reports: Sequence[RaceReport], command: str) -> Page:
    p = Page("uprobe-emu race", command)
    p.table(("design", "event", "interleavings", "outcomes", "race only"),
            [(r.design, r.event, r.interleavings if r.refused is None else "-",
              ", ".join(f"{k} {n}" for k, n in r.outcomes.most_common()) or (r.refused or ""),
              ", ".join(r.race_outcomes) or "-") for r in reports], numeric=(2,))
    for r in reports:
        _section(p, r)
    return p


def _section(p: Page, r: RaceReport) -> None:
    p.heading(f"{r.design}: {r.event} of {' then '.join(r.sites)}", anchor=f"design-{r.design}")
    if r.refused is not None:
        p.para(f"not explored: {r.refused}")
        return
    total = len(r.writes)
    if r.writes:
        p.table(("write", "address: old -> new bytes"), [(str(i), w.text()) for i, w in enumerate(r.writes, 1)])
    p.figure(grid(r), f"{r.design}: {r.interleavings} interleavings of {total} kernel write(s) with thread 1; "
             "outlined: the example of each outcome; hover a cell for its interleaving", "race-grid",
             design=r.design, event=r.event)
    race_only = set(r.race_outcomes)
    p.table(("outcome", "count", "race only", "example interleaving", "what it showed"),
            [(key, n, "yes" if key in race_only else "no", r.examples[key].interleaving.text(total),
              r.examples[key].outcome.detail) for key, n in r.outcomes.most_common()], numeric=(1,))
