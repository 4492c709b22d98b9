"""The check page: per design, the red-zone map (128 bytes below rsp x hits, one row per distinct
site and write pattern with its hit count, each changed byte coloured by its writer), the
register and memory differences, the path of one hit as a sequence diagram, and the output
difference."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import drawsvg as dw

from emu.abi import RED_ZONE
from emu.report import svg
from emu.report.hitpath import HitPath
from emu.report.html import Page
from emu.violations import Check, Violation

if TYPE_CHECKING:
    from emu.check import DesignReport

WRITERS = {"trampoline": "#d62728", "kernel": "#9467bd", "guest": "#1f77b4"}
# Each distinct writer instruction gets a shade of its kind's hue, so four pushes read as four writers.
SHADES = {"trampoline": ("#d62728", "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#f4a582"),
          "kernel": ("#9467bd", "#c5b0d5"), "guest": ("#1f77b4", "#17becf", "#aec7e8", "#2ca02c")}
WRITER_NAMES = {"trampoline": "probe path (patched site, trampoline or slot)", "kernel": "kernel copy (copy_to_user)",
                "guest": "guest code"}
UNTOUCHED = "#f3f3f3"
MAX_ROWS = 40  # write patterns drawn per design; the rest are counted in the caption
CELL_W, ROW_H, LABEL_W = 5.5, 16, 250
_GUEST_WRITER = re.compile(r"guest code at (0x[0-9a-f]+): (.*)")


class Tracer(Protocol):
    """What the page needs of a run's emu.report.hitpath.HitTracer."""

    paths: list[HitPath]

    def where(self, address: int) -> str: ...


@dataclass(frozen=True, slots=True, order=True)
class Write:
    """A run of red-zone bytes a hit changed, and who changed them."""

    offset: int  # from rsp, negative
    size: int
    kind: str  # a WRITERS key
    writer: str

    @property
    def name(self) -> str:
        """The writer without its address: the same instruction at two sites is one writer."""
        return re.sub(r" at 0x[0-9a-f]+", "", self.writer)


@dataclass
class Pattern:
    """Hits of one site that changed the same bytes through the same writers."""

    probe: str
    site: int
    writes: tuple[Write, ...]
    hits: list[int] = field(default_factory=list)
    values: dict[int, tuple[str, str]] = field(default_factory=dict)  # offset -> (old, new) hex, of the first hit
    distinct: set[tuple[str, ...]] = field(default_factory=set)  # the new values seen, per hit


def writer_kind(writer: str, tracer: Tracer | None) -> tuple[str, str]:
    """(WRITERS key, readable writer) of a red-zone violation's ``writer`` evidence."""
    m = _GUEST_WRITER.fullmatch(writer)
    if m is None:
        return "kernel", writer
    pc, text = int(m.group(1), 16), m.group(2)
    where = tracer.where(pc) if tracer is not None else "guest"
    if where == "guest":
        return "guest", f"{text} at {pc:#x}"
    return "trampoline", f"{text} at {pc:#x} ({where})"


def redzone_patterns(violations: Sequence[Violation], tracer: Tracer | None) -> list[Pattern]:
    """The red-zone violations grouped by hit, then the hits grouped by (site, writes): most hits first."""
    by_hit: dict[tuple[str, int, int], list[Violation]] = {}
    for v in violations:
        if v.kind is Check.REDZONE:
            by_hit.setdefault((v.probe, v.address, v.hit), []).append(v)
    patterns: dict[tuple[str, int, tuple[Write, ...]], Pattern] = {}
    for (probe, site, hit), found in by_hit.items():
        writes = tuple(sorted(Write(int(v.detail["offset"]), int(v.detail["size"]),
                                    *writer_kind(str(v.detail["writer"]), tracer)) for v in found))
        pattern = patterns.get((probe, site, writes))
        if pattern is None:
            pattern = patterns[(probe, site, writes)] = Pattern(probe, site, writes)
            pattern.values = {int(v.detail["offset"]): (str(v.detail["old"]), str(v.detail["new"])) for v in found}
        pattern.hits.append(hit)
        pattern.distinct.add(tuple(str(v.detail["new"]) for v in sorted(found, key=lambda v: int(v.detail["offset"]))))
    return sorted(patterns.values(), key=lambda p: (-len(p.hits), p.probe, p.site))


def writer_colours(patterns: Sequence[Pattern]) -> dict[str, str]:
    """Writer name -> colour, by kind then first appearance (nearest rsp first)."""
    names: dict[str, str] = {}
    for write in sorted({w for p in patterns for w in p.writes}, key=lambda w: (w.kind, -w.offset)):
        names.setdefault(write.name, write.kind)
    out: dict[str, str] = {}
    for name, kind in names.items():
        used = sum(1 for k in out if names[k] == kind)
        out[name] = SHADES[kind][used % len(SHADES[kind])]
    return out


def redzone_map(patterns: Sequence[Pattern], hits: int) -> dw.Drawing:
    shown = patterns[:MAX_ROWS]
    colours = writer_colours(shown)
    rows = max(len(shown), 1)
    top = 30
    width = LABEL_W + RED_ZONE * CELL_W + 10
    lines = max((line for _, line in svg.legend_layout(list(colours.items()), width - 20)), default=0) + 1
    d = svg.drawing(width, top + rows * ROW_H + 16 + lines * svg.LEGEND_LINE)
    for off in (-128, -96, -64, -32, -24, -16, -8):
        x = LABEL_W + (RED_ZONE + off) * CELL_W
        d.append(dw.Line(x, top - 4, x, top + rows * ROW_H, stroke="#bbbbbb", stroke_width=0.6))
        d.append(svg.label(x, top - 8, f"rsp{off}", 9, "middle", fill=svg.MUTED))
    d.append(svg.label(LABEL_W + RED_ZONE * CELL_W, top - 8, "rsp", 9, "end", fill=svg.MUTED))
    if not shown:
        d.append(svg.cell(LABEL_W, top, RED_ZONE * CELL_W, ROW_H - 2, UNTOUCHED,
                          f"no red-zone byte changed in {hits} hits", data_clean="1"))
        d.append(svg.label(LABEL_W - 6, top + 11, f"all {hits} hits: clean", 10, "end"))
    for row, pattern in enumerate(shown):
        _pattern_row(d, pattern, top + row * ROW_H, colours)
    items = [(name, c) for name, c in colours.items()] or [(WRITER_NAMES[k], c) for k, c in WRITERS.items()]
    svg.legend(d, 10, top + rows * ROW_H + 20, items, width - 20)
    return d


def _pattern_row(d: dw.Drawing, pattern: Pattern, y: float, colours: dict[str, str]) -> None:
    count = len(pattern.hits)
    d.append(svg.label(LABEL_W - 6, y + 11, f"{pattern.probe} {pattern.site:#x} x{count}", 10, "end"))
    d.append(svg.cell(LABEL_W, y, RED_ZONE * CELL_W, ROW_H - 2, UNTOUCHED,
                      f"{pattern.probe} at {pattern.site:#x}: {count} hits (first {pattern.hits[0]}), "
                      f"{len(pattern.distinct)} distinct sets of values"))
    for write in pattern.writes:
        group = dw.Group(data_offset=write.offset, data_size=write.size, data_writer_kind=write.kind,
                         data_writer=write.writer, data_probe=pattern.probe)
        old, new = pattern.values.get(write.offset, ("", ""))
        for b in range(write.size):
            x = LABEL_W + (RED_ZONE + write.offset + b) * CELL_W
            tip = (f"rsp{write.offset + b:+d}: {old[2 * b:2 * b + 2]} -> {new[2 * b:2 * b + 2]} "
                   f"by {write.writer} (hit {pattern.hits[0]}; {count} hits like it)")
            group.append(svg.cell(x, y, CELL_W - 0.5, ROW_H - 2, colours[write.name], tip))
        d.append(group)


def differences(violations: Sequence[Violation]) -> list[tuple[str, ...]]:
    """Every violation, aggregated: kind, probe, site, what changed, hit count, first hits, an example."""
    groups: dict[tuple[str, str, int, str], list[Violation]] = {}
    for v in violations:
        groups.setdefault((v.kind.value, v.probe, v.address, _what(v)), []).append(v)
    rows: list[tuple[str, ...]] = []
    for (kind, probe, site, what), found in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        hits = sorted({v.hit for v in found})
        first = ", ".join(map(str, hits[:5])) + (", ..." if len(hits) > 5 else "")
        rows.append((kind, probe, f"{site:#x}", what, str(len(hits)), first, _example(found[0])))
    return rows


def _example(v: Violation) -> str:
    if v.kind is Check.REDZONE:
        return f"hit {v.hit}: {v.detail.get('old')} -> {v.detail.get('new')}"
    return f"hit {v.hit}: {v.summary}"


def _what(v: Violation) -> str:
    if v.kind is Check.REDZONE:
        return f"memory rsp{v.detail.get('offset', 0):+d} ({v.detail.get('size', '?')} bytes) by {v.detail.get('writer')}"
    if v.kind is Check.REGS:
        return "registers " + ", ".join(sorted(v.detail.get("registers", {})))
    return v.summary.split(",")[0]


LANES = ("guest", "probe pages", "kernel")
LANE_X = (10, 330, 650)
STEP_H = 17


def sequence(path: HitPath, tracer: Tracer) -> dw.Drawing:
    """One hit: each instruction in its lane (guest code, the kernel's user pages, the kernel), arrows
    where control moves between lanes."""
    rows: list[tuple[int, str, str]] = []  # lane, text, tooltip
    for i, step in enumerate(path.steps):
        if i == path.kernel_at:
            rows.append(_kernel_row(path))
        lane = 0 if step.where in ("site", "guest") else 1
        where = "site" if step.where == "site" else step.where
        rows.append((lane, f"{step.address:#x}  {step.code.hex(' ')}  {step.text}", f"{where}: {step.text}"))
    if path.kernel_at >= len(path.steps):
        rows.append(_kernel_row(path))
    resume_where = "the site's next instruction" if tracer.where(path.resume) == "guest" else tracer.where(path.resume)
    rows.append((0, f"{path.resume:#x}  resume", f"the guest resumes at {path.resume:#x} ({resume_where})"))
    top = 34
    d = svg.drawing(980, top + STEP_H * len(rows) + 8)
    for lane, x in zip(range(3), LANE_X, strict=True):
        d.append(svg.label(x, 14, LANES[lane], 11, font_weight="bold"))
        d.append(dw.Line(x, 20, x, top + STEP_H * len(rows), stroke=svg.GRID, stroke_width=1))
    previous = 0
    for i, (lane, text, tip) in enumerate(rows):
        y = top + i * STEP_H
        if lane != previous:
            exit_text = path.exit.upper() if previous == 2 and path.exit != "none" else ""
            svg.arrow(d, LANE_X[previous] + 4, y - 4, LANE_X[lane] - 4, y - 4, exit_text)
        group = dw.Group(data_lane=LANES[lane])
        group.append(svg.cell(LANE_X[lane], y - 1, 310, STEP_H - 3, "#fafafa", tip))
        group.append(svg.label(LANE_X[lane] + 4, y + 10, text, 10, mono=True))
        d.append(group)
        previous = lane
    return d


def _kernel_row(path: HitPath) -> tuple[int, str, str]:
    how = {"int3": "INT3 trap", "call": "uprobe syscall", "jmp": "uprobe syscall", "return": "return probe"}
    text = f"{how.get(path.path, path.path)}: handler chain ({path.path} path)"
    leave = {"sysret": "returns by SYSRET", "iret": "returns by IRET", "none": "returns from the trap"}[path.exit]
    return 2, text, f"the kernel runs the consumers, then {leave}"


def page(reports: Sequence[DesignReport], command: str) -> Page:
    p = Page("uprobe-emu check", command)
    p.table(("design", "hits", "redzone", "regs", "resume", "same output", "sysret", "iret"),
            [(r.design, r.hits, r.count(Check.REDZONE), r.count(Check.REGS), r.count(Check.RESUME),
              r.same_output_cell, r.exits.get("sysret", 0), r.exits.get("iret", 0)) for r in reports],
            numeric=(1, 2, 3, 4, 6, 7))
    for r in reports:
        _design_section(p, r)
    return p


def _design_section(p: Page, r: DesignReport) -> None:
    tracer: Tracer | None = r.trace
    clean = not r.violations and r.same_output
    p.heading(f"{r.design}: {'failed' if r.error else 'clean' if clean else 'broken'}", anchor=f"design-{r.design}")
    if r.error is not None:
        p.para(f"failed: {r.error}", "meta")
    for why in r.refused:
        p.para(f"refused: {why}", "meta")
    patterns = redzone_patterns(r.violations, tracer)
    dropped = len(patterns) - min(len(patterns), MAX_ROWS)
    clobbered = sum(len(pt.hits) for pt in patterns)
    p.figure(redzone_map(patterns, r.hits),
             f"{r.design}: the 128 bytes below rsp at each probed site; {clobbered} of {r.hits} hits changed some, "
             f"in {len(patterns)} pattern(s)" + (f" ({dropped} rare ones not drawn)" if dropped else "")
             + "; hover a byte for its values and writer", "redzone-map", design=r.design)
    if r.violations:
        p.heading("Register and memory differences", 3)
        p.table(("check", "probe", "site", "what", "hits", "first hits", "example"), differences(r.violations),
                numeric=(4,))
    p.heading("Output", 3)
    p.para("same output, exit status and syscalls as the unprobed run" if r.same_output else
           f"differs from the unprobed run: {r.divergence}", "good" if r.same_output else "bad")
    if tracer is not None:
        for path in tracer.paths:
            p.heading(f"One hit of {path.probe} ({path.path} path)", 3)
            p.figure(sequence(path, tracer), f"{r.design}: {path.probe} at {path.site:#x}, instruction bytes as run; "
                     f"the kernel {'leaves by ' + path.exit.upper() if path.exit != 'none' else 'returns from the trap'}",
                     "hit-path", design=r.design, path=path.path)

