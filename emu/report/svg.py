"""Figure primitives on drawsvg: a drawing with the page's fonts, cells with tooltips (SVG
<title>), labels, a legend, grouped bars and a code listing. Every page module draws with these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import drawsvg as dw

FONT = "system-ui, sans-serif"
MONO = "ui-monospace, 'DejaVu Sans Mono', monospace"
GRID = "#e6e6e6"
INK = "#222222"
MUTED = "#777777"
# A categorical palette that stays distinct in greyscale print (dark, light, mid alternate).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


def drawing(width: float, height: float) -> dw.Drawing:
    d = dw.Drawing(width, height, font_family=FONT, font_size=11)
    d.append(dw.Rectangle(0, 0, width, height, fill="#ffffff"))
    return d


def cell(x: float, y: float, w: float, h: float, fill: str, tooltip: str | None = None, **attrs: object) -> dw.Rectangle:
    rect = dw.Rectangle(x, y, w, h, fill=fill, **attrs)
    if tooltip:
        rect.append_title(tooltip)
    return rect


def label(x: float, y: float, text: str, size: float = 11, anchor: str = "start", mono: bool = False,
          fill: str = INK, **attrs: object) -> dw.Text:
    extra = {"font_family": MONO} if mono else {}
    return dw.Text(text, size, x, y, text_anchor=anchor, fill=fill, **extra, **attrs)


def arrow(d: dw.Drawing, x1: float, y1: float, x2: float, y2: float, text: str = "", color: str = INK) -> None:
    """A line with an arrowhead at (x2, y2) and an optional label above its middle."""
    d.append(dw.Line(x1, y1, x2, y2, stroke=color, stroke_width=1.2))
    head = 5 if x2 >= x1 else -5
    d.append(dw.Lines(x2, y2, x2 - head, y2 - 3, x2 - head, y2 + 3, close=True, fill=color))
    if text:
        d.append(label((x1 + x2) / 2, y1 - 3, text, 9, "middle", mono=True, fill=color))


LEGEND_LINE = 15


def legend_layout(items: Sequence[tuple[str, str]], width: float) -> list[tuple[float, int]]:
    """(x offset, line) of each legend item, wrapping at ``width`` (text width estimated, no font metrics)."""
    out, x, line = [], 0.0, 0
    for name, _ in items:
        w = 24 + 6.2 * len(name)
        if x and x + w > width:
            x, line = 0.0, line + 1
        out.append((x, line))
        x += w
    return out


def legend(d: dw.Drawing, x: float, y: float, items: Sequence[tuple[str, str]], width: float = 900) -> None:
    """Coloured squares with names from (x, y), wrapped into lines ``width`` wide."""
    for (name, color), (dx, line) in zip(items, legend_layout(items, width), strict=True):
        d.append(cell(x + dx, y - 9 + line * LEGEND_LINE, 10, 10, color, name))
        d.append(label(x + dx + 14, y + line * LEGEND_LINE, name, 10))


@dataclass(frozen=True, slots=True)
class Bars:
    """Grouped bars: one group per category, one bar per series."""

    categories: Sequence[str]
    series: Sequence[str]
    values: Mapping[tuple[str, str], float]  # (category, series) -> value; missing: no bar
    unit: str = ""


def grouped_bars(bars: Bars, width: float = 640, height: float = 240, title: str = "") -> dw.Drawing:
    items = [(s, PALETTE[i % len(PALETTE)]) for i, s in enumerate(bars.series)]
    lines = max(line for _, line in legend_layout(items, width - 56)) + 1 if items else 1
    height += (lines - 1) * LEGEND_LINE
    left, top, bottom = 46, 28 if title else 10, 37 + lines * LEGEND_LINE
    d = drawing(width, height)
    if title:
        d.append(label(left, 16, title, 12, font_weight="bold"))
    plot_w, plot_h = width - left - 10, height - top - bottom
    peak = max((v for v in bars.values.values()), default=0.0) or 1.0
    for i in range(5):  # horizontal grid and scale
        y = top + plot_h * (1 - i / 4)
        d.append(dw.Line(left, y, left + plot_w, y, stroke=GRID))
        d.append(label(left - 4, y + 3, _short(peak * i / 4), 9, "end", fill=MUTED))
    group_w = plot_w / max(len(bars.categories), 1)
    bar_w = group_w * 0.8 / max(len(bars.series), 1)
    for g, category in enumerate(bars.categories):
        x0 = left + g * group_w + group_w * 0.1
        for s, series in enumerate(bars.series):
            value = bars.values.get((category, series))
            if value is None:
                continue
            h = plot_h * value / peak
            d.append(cell(x0 + s * bar_w, top + plot_h - h, bar_w - 1, h, PALETTE[s % len(PALETTE)],
                          f"{category} · {series}: {value:g}{bars.unit}", data_series=series, data_category=category))
        d.append(label(x0 + group_w * 0.4, top + plot_h + 13, category, 10, "middle"))
    legend(d, left, top + plot_h + 34, items, width - 56)
    return d


def _short(value: float) -> str:
    return f"{value:.2g}" if value < 10 else f"{value:.0f}"


def listing(lines: Sequence[tuple[str, str | None, str]], colours: Mapping[str, str], width: float = 720,
            title: str = "") -> dw.Drawing:
    """Code lines (text, highlight role or None, tooltip), monospace; a highlighted line sits on a band of
    its role's colour (data-highlight names the role)."""
    line_h, top = 15, 24 if title else 6
    d = drawing(width, top + line_h * len(lines) + 6)
    if title:
        d.append(label(6, 15, title, 11, font_weight="bold"))
    for i, (text, role, tooltip) in enumerate(lines):
        y = top + i * line_h
        if role:
            d.append(cell(0, y, width, line_h, colours[role], tooltip or None, fill_opacity=0.3, data_highlight=role))
        d.append(label(6, y + 11, text, 10.5, mono=True))
    return d
