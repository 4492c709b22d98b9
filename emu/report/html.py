"""The page shell every --html page shares: one HTML file with inline CSS and inline SVG
figures, no script, no external font or URL, laid out to print (figures do not split across
pages). Text goes through ``html.escape``; figures come from svg.py as drawsvg drawings."""

from __future__ import annotations

import contextlib
import html
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import drawsvg as dw

from emu.errors import EmuError

CSS = """
:root { color-scheme: light; }
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 72em; color: #222; background: #fff;
       padding: 0 1em; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.25em; border-bottom: 1px solid #ccc; margin-top: 1.6em; }
h3 { font-size: 1.05em; margin-bottom: 0.3em; }
.meta { color: #555; font-size: 0.9em; }
figure { margin: 0.8em 0; break-inside: avoid; page-break-inside: avoid; display: table; }
figure svg { max-width: 100%; height: auto; }
figcaption { font-size: 0.85em; color: #444; margin-top: 0.2em; display: table-caption; caption-side: bottom; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; break-inside: avoid; }
th, td { border: 1px solid #ccc; padding: 0.15em 0.5em; text-align: left; vertical-align: top; overflow-wrap: anywhere; }
th { background: #f2f2f2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, pre, td.code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 0.85em; }
.bad { color: #b00020; font-weight: 600; }
.good { color: #1b7a1b; font-weight: 600; }
.row { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
@media print { body { max-width: none; margin: 0; } h2 { break-after: avoid; } }
"""


@dataclass
class Page:
    """A page under construction: add sections of text, tables and figures, then ``write``."""

    title: str
    subtitle: str = ""
    parts: list[str] = field(default_factory=list)
    figures: int = 0

    def heading(self, text: str, level: int = 2, anchor: str | None = None) -> None:
        ident = f' id="{html.escape(anchor)}"' if anchor else ""
        self.parts.append(f"<h{level}{ident}>{html.escape(text)}</h{level}>")

    def para(self, text: str, css: str | None = None) -> None:
        cls = f' class="{css}"' if css else ""
        self.parts.append(f"<p{cls}>{html.escape(text)}</p>")

    def pre(self, text: str) -> None:
        self.parts.append(f"<pre>{html.escape(text)}</pre>")

    def table(self, header: Sequence[str], rows: Iterable[Sequence[object]], numeric: Sequence[int] = ()) -> None:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(_cell(c, i in numeric) for i, c in enumerate(r)) + "</tr>" for r in rows)
        self.parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def figure(self, drawing: dw.Drawing, caption: str, kind: str, **data: object) -> None:
        """An inline SVG figure; ``kind`` and ``data`` label it for readers and tests (data-figure, data-KEY)."""
        self.figures += 1
        svg = drawing.as_svg(header="")
        labels = "".join(f' data-{k}="{html.escape(str(v))}"' for k, v in {"figure": kind, **data}.items())
        self.parts.append(f"<figure{labels}>{svg}"
                          f"<figcaption>{html.escape(caption)}</figcaption></figure>")

    @contextlib.contextmanager
    def row(self) -> Iterator[None]:
        """Side by side: the parts added inside the ``with`` go into one flex row."""
        start = len(self.parts)
        yield
        inner = "".join(f"<div>{p}</div>" for p in self.parts[start:])
        del self.parts[start:]
        self.parts.append(f'<div class="row">{inner}</div>')

    def render(self) -> str:
        stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        sub = f'<p class="meta">{html.escape(self.subtitle)} · made {stamp} by uprobe-emu</p>'
        return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
                f"<title>{html.escape(self.title)}</title><style>{CSS}</style></head>"
                f"<body><h1>{html.escape(self.title)}</h1>{sub}" + "\n".join(self.parts) + "</body></html>\n")

    def write(self, path: str) -> int:
        """Write the page; its size in bytes."""
        text = self.render()
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise EmuError(f"cannot write {path}: {exc.strerror}") from None
        return len(text.encode())


def _cell(value: object, numeric: bool) -> str:
    cls = ' class="num"' if numeric else ""
    return f"<td{cls}>{html.escape(str(value))}</td>"
