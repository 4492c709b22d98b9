"""The page of `race --signals`: per design, the grid of the hit's instruction boundaries (rows) and
the handlers (columns), each cell a run with the signal at that boundary coloured by outcome (the
race page's colours), and the example of each outcome with what the verifiers said."""

from __future__ import annotations

from collections.abc import Sequence

import drawsvg as dw

from emu.race.signal_report import SignalReport
from emu.report import svg
from emu.report.html import Page
from emu.report.race_page import colours, legend_height, outcome_legend

CELL_W, CELL_H, LABEL_W, TOP = 76, 16, 430, 34


def grid(report: SignalReport) -> dw.Drawing:
    colour = colours(report.outcomes)
    rows, columns = report.boundaries, report.handlers
    height = TOP + len(rows) * CELL_H + 22 + legend_height(colour)
    d = svg.drawing(max(LABEL_W + len(columns) * CELL_W + 20, 740), height)
    for c, handler in enumerate(columns):
        d.append(svg.label(LABEL_W + c * CELL_W + CELL_W / 2, TOP - 8, handler, 10, "middle", fill=svg.MUTED))
    examples = {(b.index, h) for b, h, _ in report.examples().values()}
    for r, b in enumerate(rows):
        y = TOP + r * CELL_H
        d.append(svg.label(LABEL_W - 6, y + 11, f"#{b.index} {report.row_label(b)}", 9.5, "end"))
        for c, handler in enumerate(columns):
            outcome = report.cells[b.index, handler]
            example = (b.index, handler) in examples  # outlined: the one the table spells out
            outline = {"stroke": svg.INK, "stroke_width": 1.5, "data_example": "1"} if example else {}
            d.append(svg.cell(LABEL_W + c * CELL_W, y, CELL_W - 1, CELL_H - 1, colour[outcome.key],
                              f"#{b.index} {b.text()}, {handler}: {outcome.key}: {outcome.explain()}",
                              data_outcome=outcome.key, data_boundary=b.index, data_role=b.role.value,
                              data_handler=handler, **outline))
    outcome_legend(d, TOP + len(rows) * CELL_H + 22, colour, report.outcomes)
    return d


def page(reports: Sequence[SignalReport], command: str) -> Page:
    p = Page("uprobe-emu race --signals", command)
    p.table(("design", "probe", "boundaries", "runs", "without a signal", "outcomes"),
            [(r.design, r.site, len(r.boundaries) if r.refused is None else "-", r.runs if r.refused is None else "-",
              r.baseline.key if r.baseline is not None else "-",
              ", ".join(f"{k} {n}" for k, n in r.outcomes.most_common()) or (r.refused or ""))
             for r in reports], numeric=(2, 3))
    for r in reports:
        _section(p, r)
    return p


def _section(p: Page, r: SignalReport) -> None:
    p.heading(f"{r.design}: {r.signal} in hit {r.hit} of {r.site}", anchor=f"design-{r.design}")
    if r.refused is not None:
        p.para(f"not explored: {r.refused}")
        return
    if r.baseline is not None:
        p.para(f"Without a signal the probed run is {r.baseline.key}: {r.baseline.explain()}")
    p.figure(grid(r), f"{r.design}: {r.runs} runs, one per boundary of the hit and handler; outlined: the example "
             "of each outcome; hover a cell for what the run showed", "race-signals-grid", design=r.design)
    p.table(("outcome", "runs", "example", "what it showed"),
            [(key, r.outcomes[key], f"#{b.index} {b.text()}, {h}", outcome.explain())
             for key, (b, h, outcome) in r.examples().items()], numeric=(1,))
