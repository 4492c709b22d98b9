"""Plain-text rendering shared by the library's reports and the CLI."""

from __future__ import annotations

from collections.abc import Sequence


def table(rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, two spaces apart, no trailing blanks."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
