"""The page of `survey --html`: the static survey per design and per Debian package, and with a
corpus, what the runs proved: per design the confusion table of static verdict against dynamic
proof (a figure), the confirmed hazards with the command that replays each, and the entries' runs
against their native record."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import drawsvg as dw

from emu.designs import Design
from emu.report import svg
from emu.report.html import Page
from emu.survey.confusion import COLUMNS, ROWS, Confusion, confusion, seen_sites
from emu.survey.engine import Outcome
from emu.survey.redzone import LIVE, UNKNOWN
from emu.survey.report import package_sites, totals

CELL_W, CELL_H, LABEL_W, TOP = 110, 30, 90, 26
# a cell's colour: what its count means for the static verdict (a proof for it, against it, or no proof)
PROOF_COLOURS = {("hazard", "clobbered"): "#b7e1b7", ("no_hazard", "clobbered"): "#f4b6b6",
                 ("unknown", "clobbered"): "#f9dca4", ("hazard", "exercised"): "#f4b6b6"}


def confusion_figure(c: Confusion) -> dw.Drawing:
    d = svg.drawing(LABEL_W + len(COLUMNS) * CELL_W + 10, TOP + len(ROWS) * CELL_H + 8)
    for j, column in enumerate(COLUMNS):
        d.append(svg.label(LABEL_W + j * CELL_W + CELL_W / 2, TOP - 8, column.replace("_", " "), 10, "middle",
                           fill=svg.MUTED))
    for i, row in enumerate(ROWS.values()):
        y = TOP + i * CELL_H
        d.append(svg.label(LABEL_W - 6, y + CELL_H / 2 + 4, row.replace("_", " "), 10, "end"))
        for j, column in enumerate(COLUMNS):
            count = c.cells[row][column]
            fill = PROOF_COLOURS.get((row, column), "#f2f2f2") if count else "#ffffff"
            x = LABEL_W + j * CELL_W
            d.append(svg.cell(x, y, CELL_W - 2, CELL_H - 2, fill, f"static {row}, {column}: {count} sites",
                              stroke=svg.GRID, data_row=row, data_column=column, data_count=count))
            d.append(svg.label(x + CELL_W / 2, y + CELL_H / 2 + 4, f"{count:,}", 11, "middle"))
    return d


def page(outcome: Outcome, designs: Sequence[Design], owners: dict[str, str], command: str) -> Page:
    t = totals(outcome, designs)
    rz = t["red_zone"]
    p = Page("uprobe-emu survey", command)
    p.table(("files", "ELF files", "distinct", "sites", "USDT notes", "red zone live", "dead", "unknown"),
            [(t["files"], t["elf_files"], t["distinct_elf_files"], t["site_count"], t["usdt_notes"], rz.get(LIVE, 0),
              rz.get("dead", 0), rz.get(UNKNOWN, 0))], numeric=range(8))
    tables = {d.name: confusion(outcome, d) for d in designs} if outcome.runs else {}
    _designs(p, t, tables)
    if tables:
        _proof(p, outcome, designs, tables)
    _packages(p, outcome, designs, owners, tables)
    return p


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _designs(p: Page, t: dict[str, object], tables: dict[str, Confusion]) -> None:
    p.heading("Per design", anchor="designs")
    per = t["designs"]
    assert isinstance(per, dict)
    header: tuple[str, ...] = ("design", "optimized", "hazards", "hazard unknown")
    if tables:
        header += ("reached by the corpus", "confirmed", "refuted (exercised)", "unknowns decided", "precision",
                   "recall")
    rows = []
    for name, v in per.items():
        row: list[object] = [name, v["optimized"], v["hazards"], v["unknown"]]
        c = tables.get(name)
        if c is not None:
            reached = sum(n for cells in c.cells.values() for col, n in cells.items() if col != "not_reached")
            row += [reached, c.cells["hazard"]["clobbered"], c.cells["hazard"]["exercised"], c.unknowns_decided,
                    _ratio(c.precision), _ratio(c.recall)]
        rows.append(row)
    p.table(header, rows, numeric=range(1, len(header)))


def _proof(p: Page, outcome: Outcome, designs: Sequence[Design], tables: dict[str, Confusion]) -> None:
    p.heading("Static verdicts against the corpus runs", anchor="proof")
    p.para(f"{len(outcome.runs)} runs of {len(outcome.entries)} entries. Clobbered: a red-zone byte the design changed "
           "was read back by the program; exercised: hit at least twice, not clobbered; reached once: hit once (an "
           "optimizing design never ran its patch); not reached: no hit (or outside the code the unprobed run ran).")
    with p.row():
        for d in designs:
            c = tables[d.name]
            p.figure(confusion_figure(c), f"{d.name}: precision {_ratio(c.precision)}, recall {_ratio(c.recall)}",
                     "confusion", design=d.name)
    confirmed = [(name, h) for name, c in tables.items() for h in c.confirmed]
    p.heading(f"Confirmed hazards ({len(confirmed)})", 3, anchor="confirmed")
    if confirmed:
        p.table(("design", "file", "address", "symbol", "hits", "read back", "replay"),
                [(name, h["file"], f"{h['address']:#x}", h["symbol"] or "-", h["hits"], h["read_back"], h["replay"])
                 for name, h in confirmed], numeric=(4, 5))
    else:
        p.para("No static hazard was clobbered by a run.")
    missed = [(name, fn) for name, c in tables.items() for fn in c.false_negatives]
    if missed:
        p.heading(f"Clobbered without a static hazard ({len(missed)})", 3, anchor="false-negatives")
        p.table(("design", "file", "address", "symbol", "red zone", "replay"),
                [(name, fn["file"], f"{fn['address']:#x}", fn["symbol"] or "-", fn["red_zone"], fn["replay"])
                 for name, fn in missed])
    _runs(p, outcome, designs)


def _runs(p: Page, outcome: Outcome, designs: Sequence[Design]) -> None:
    p.heading("Corpus entries", 3, anchor="entries")
    by_entry: dict[str, dict[str, str]] = {}
    for cr in outcome.runs:
        run = cr.run
        cell = run.status if run.status != "ok" else "same output" if run.same_output else "output differs"
        by_entry.setdefault(cr.name, {})[run.design] = f"{cell}, {sum(s.hits for s in run.sites)} hits"
    rows = [(name, " ".join(x for x in outcome.fidelity.get(name, ("-", None)) if x),
             *(cells.get(d.name, "-") for d in designs)) for name, cells in sorted(by_entry.items())]
    p.table(("entry", "unprobed against Linux", *(d.name for d in designs)), rows)


def _packages(p: Page, outcome: Outcome, designs: Sequence[Design], owners: dict[str, str],
              tables: dict[str, Confusion]) -> None:
    """Per package: sites, live red zones, and per design the hazards (and with a corpus, the confirmed ones)."""
    p.heading("Per package", anchor="packages")
    proven: dict[str, Counter[str]] = {}
    first = {sha: path for path, sha in sorted(outcome.walk.elf.items(), reverse=True)}  # the first path wins
    for d in designs if tables else ():
        for (sha, _address), got in seen_sites(outcome, d.name).items():
            owner = owners.get(first.get(sha, sha), "(no package)")
            proven.setdefault(owner, Counter())[d.name] += got.column == "clobbered"
    per = package_sites(outcome, designs, owners)
    p.para("Per design: static hazards / hazard unknown" + (" / sites a corpus run clobbered." if tables else "."))
    rows = [(package, c["sites"], c["live"],
             *(" / ".join(str(n) for n in (c[d.name], c["unknown " + d.name], *(
                 [proven.get(package, Counter())[d.name]] if tables else []))) for d in designs))
            for package, c in per]
    p.table(("package", "sites", "live", *(d.name for d in designs)), rows, numeric=range(1, 3 + len(designs)))
