"""The fuzz page: findings over the campaign's cases per design, then each saved finding's shrunk
function as machine code, the instruction whose store broke the red zone highlighted (the probed
site the kernel patched, or wherever the evidence names) and the case's own stores whose values
were lost marked beside it."""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import drawsvg as dw

from emu.disasm import cs64
from emu.fuzz import layout as L
from emu.fuzz.case import Case
from emu.fuzz.codegen import program
from emu.report import svg
from emu.report.html import Page

if TYPE_CHECKING:
    from emu.fuzz.campaign import Stats

HIGHLIGHTS = {"violator": "#d62728", "lost": "#ff7f0e"}
_CLOBBERED = re.compile(r"rsp-(\d+) \((\d+) bytes\)")
_READ_BACK = re.compile(r"read rsp-(\d+)/(\d+)")
_WRITER_PC = re.compile(r"by guest code at (0x[0-9a-f]+)")
_STORE_DEST = re.compile(r"\[rsp - (0x[0-9a-f]+|\d+)\]")


def findings_figure(stats: Stats) -> dw.Drawing:
    """Cumulative findings against the case index, one line per design."""
    width, height, left, top, bottom = 640, 260, 52, 24, 50
    first = stats.config.start
    last = max([first + stats.cases] + [max(s.cases) + 1 for s in stats.designs.values() if s.cases])
    peak = max((s.findings for s in stats.designs.values()), default=0) or 1
    plot_w, plot_h = width - left - 16, height - top - bottom
    d = svg.drawing(width, height)
    d.append(svg.label(left, 14, "findings so far, by case index", 12, font_weight="bold"))
    for i in range(5):
        y = top + plot_h * (1 - i / 4)
        d.append(dw.Line(left, y, left + plot_w, y, stroke=svg.GRID))
        d.append(svg.label(left - 4, y + 3, f"{peak * i / 4:.3g}", 9, "end", fill=svg.MUTED))
    for i in range(5):
        x = left + plot_w * i / 4
        d.append(svg.label(x, top + plot_h + 13, f"{first + (last - first) * i / 4:.0f}", 9, "middle", fill=svg.MUTED))

    def at(index: float, count: int) -> tuple[float, float]:
        return left + plot_w * (index - first) / max(last - first, 1), top + plot_h * (1 - count / peak)

    items = []
    for n, (design, st) in enumerate(stats.designs.items()):
        colour = svg.PALETTE[n % len(svg.PALETTE)]
        items.append((f"{design}: {st.findings}", colour))
        points = _steps(sorted(st.cases), first, last, at)
        line = dw.Lines(*[c for p in points for c in p], close=False, fill="none", stroke=colour, stroke_width=1.8,
                        data_design=design, data_findings=st.findings)
        line.append_title(f"{design}: {st.findings} findings in {stats.cases} cases"
                          + (f", first at case {st.first_case}" if st.first_case is not None else ""))
        d.append(line)
    svg.legend(d, left, height - 12, items, plot_w)
    return d


MAX_STEPS = 400  # a long campaign's curve is drawn through this many points at most


def _steps(found: list[int], first: int, last: int, at: Callable[[float, int], tuple[float, float]]) \
        -> list[tuple[float, float]]:
    """The cumulative curve: a step up at each finding, or, past MAX_STEPS findings, the count at
    MAX_STEPS evenly spaced case indices."""
    if len(found) <= MAX_STEPS:
        points = [at(first, 0)]
        for count, index in enumerate(found, start=1):
            points += [at(index, count - 1), at(index, count)]
        return points + [at(last, len(found))]
    marks = [first + (last - first) * i / MAX_STEPS for i in range(MAX_STEPS + 1)]
    return [at(x, bisect.bisect_right(found, x)) for x in marks]


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a finding's record says was broken: red-zone byte ranges (offset, size) and writer pcs."""

    ranges: tuple[tuple[int, int], ...]
    pcs: frozenset[int]

    @staticmethod
    def of(record: dict[str, Any]) -> Evidence:
        text = " ".join(list(record.get("violations", [])) + list(record.get("differences", [])))
        ranges = [(int(o), int(s)) for o, s in _CLOBBERED.findall(text)]
        ranges += [(int(o), int(s)) for o, s in _READ_BACK.findall(text)]
        return Evidence(tuple(sorted(set(ranges))), frozenset(int(pc, 16) for pc in _WRITER_PC.findall(text)))

    def overlaps(self, offset: int, size: int) -> bool:
        """Does [rsp-offset, rsp-offset+size) meet a broken range?"""
        return any(offset - size < o and o - s < offset for o, s in self.ranges)


def listing(record: dict[str, Any]) -> dw.Drawing:
    case = Case.from_json(record["case"])
    prog = program(case)
    evidence = Evidence.of(record)
    code = prog.code[L.FUNC - L.CODE_BASE:]
    in_function = {pc for pc in evidence.pcs if L.FUNC <= pc < L.FUNC + len(code)}
    violators = in_function or {prog.site}  # a store in the kernel's page: the site that led there
    stores = {s.offset: s for s in case.stores}
    lines: list[tuple[str, str | None, str]] = []
    for addr, size, mnemonic, op_str in cs64().disasm_lite(code, L.FUNC):
        raw = prog.code[addr - L.CODE_BASE: addr - L.CODE_BASE + size]
        text = f"{addr:#x}  {raw.hex(' '):<30} {mnemonic} {op_str}".rstrip()
        colour, tip = None, ""
        if addr in violators:
            colour, tip = "violator", (f"the violating store: the probed {case.site} site"
                                     + (" (the kernel's patch pushes into the red zone)" if addr == prog.site else ""))
        elif (dest := _STORE_DEST.search(op_str)) is not None and mnemonic != "lea":
            offset = int(dest.group(1), 0)
            store = stores.get(offset)
            if store is not None and evidence.overlaps(offset, store.size):
                colour, tip = "lost", f"the case's store to rsp-{offset} ({store.size} bytes): overwritten under the probe"
        lines.append((text + ("   <- probe site" if addr == prog.site else ""), colour, tip))
        if mnemonic == "ret":
            break
    return svg.listing(lines, HIGHLIGHTS, 760, f"{record['design']} case {record['index']}: {case.site} site, "
                                   f"{len(case.stores)} store(s) after shrinking")


def page(stats: Stats, command: str) -> Page:
    p = Page("uprobe-emu fuzz", command)
    p.table(("design", "cases", "findings", "first finding", "saved"),
            [(d, stats.cases, s.findings, "-" if s.first_case is None else s.first_case, len(s.saved))
             for d, s in stats.designs.items()], numeric=(1, 2, 3, 4))
    p.figure(findings_figure(stats), f"{stats.cases} cases, seed {stats.config.seed}"
             + (" (interrupted)" if stats.interrupted else ""), "fuzz-findings")
    for design, st in stats.designs.items():
        for saved in st.saved:
            record = _record(saved["json"])
            p.heading(f"{design}: case {saved['index']}", 3)
            if record is None:
                p.para(f"{saved['json']}: not readable any more")
                continue
            p.figure(listing(record), "the shrunk function; red: the violating store, orange: the case's stores "
                     "whose bytes it broke", "fuzz-finding", design=design, case=saved["index"])
            p.table(("evidence",), [(v,) for v in list(record["differences"]) + list(record["violations"])])
            p.para(f"replay: {record['replay']}")
    return p


def _record(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            record: dict[str, Any] = json.load(fh)
    except (OSError, json.JSONDecodeError):
        return None
    return record
