"""The signal explorer's result for one design: per boundary of the hit and per handler, how the run
ended compared with the unprobed run and what the verifiers flagged; rendered as a text grid or JSON."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from emu.race.boundaries import Boundary
from emu.race.outcome import CLEAN
from emu.render import table

SAME = "same output"
SHORT = {SAME: "same", "differs": "differs", "harness error": "error"}


@dataclass(frozen=True)
class RunOutcome:
    """One run: its output against the unprobed run's, and the verifiers' verdicts."""

    output: str  # "same output", "differs", "killed by SIGSEGV", "harness error"
    verdicts: dict[str, list[str]]  # verifier -> the distinct summaries of what it flagged
    detail: str = ""  # where the output first differs, the error, or how it was killed
    delivered_at: str | None = None  # where the kernel built the handler's frame
    baseline: RunOutcome | None = field(default=None, repr=False)  # the probed run without a signal

    @property
    def key(self) -> str:
        """What is counted and coloured: "clean", "differs, flagged by redzone", "killed by SIGSEGV" ..."""
        if self.output == SAME and not self.verdicts:
            return CLEAN
        return self.output + (f", flagged by {', '.join(sorted(self.verdicts))}" if self.verdicts else "")

    @property
    def cell(self) -> str:
        """The key in a few letters, for the text grid: "clean", "same+regs", "differs+redzone", "SIGSEGV"."""
        if self.key == CLEAN:
            return CLEAN
        word = SHORT.get(self.output, self.output.removeprefix("killed by "))
        return word + "".join(f"+{v}" for v in sorted(self.verdicts))

    @property
    def signal_only(self) -> dict[str, list[str]]:
        """The verdicts of verifiers that flag nothing in the probed run without the signal. (By verifier, not
        by summary: a summary quotes the bytes it found, which an earlier run of the function may change.)"""
        known = self.baseline.verdicts if self.baseline is not None else {}
        return {kind: summaries for kind, summaries in self.verdicts.items() if kind not in known}

    def explain(self) -> str:
        parts = [self.detail] if self.detail else []
        parts += [f"{kind}: {_short(summaries[0])}" + (f" (+{len(summaries) - 1} more)" if len(summaries) > 1 else "")
                  for kind, summaries in sorted(self.verdicts.items())]
        return "; ".join(parts) or "the output of the unprobed run, nothing flagged"

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.key, "output": self.output, "verdicts": self.verdicts,
                "signal_only": self.signal_only, "detail": self.detail, "delivered_at": self.delivered_at}


@dataclass
class SignalReport:
    """Every boundary of one hit under one design, a run per handler."""

    design: str
    spec: str
    site: str  # "SPEC at ADDR"
    hit: int
    signal: str
    boundaries: tuple[Boundary, ...] = ()
    handlers: tuple[str, ...] = ()
    baseline: RunOutcome | None = None
    cells: dict[tuple[int, str], RunOutcome] = field(default_factory=dict)  # (boundary index, handler) -> outcome
    outcomes: Counter[str] = field(default_factory=Counter)
    refused: str | None = None

    @classmethod
    def refusal(cls, design: str, spec: str, hit: int, signal: str, why: str) -> SignalReport:
        return cls(design, spec, spec, hit, signal, refused=why)

    def add(self, boundary: Boundary, handler: str, outcome: RunOutcome) -> None:
        self.cells[boundary.index, handler] = outcome
        self.outcomes[outcome.key] += 1

    @property
    def runs(self) -> int:
        return len(self.cells)

    @property
    def clean(self) -> bool:
        return set(self.outcomes) == {CLEAN}

    def examples(self) -> dict[str, tuple[Boundary, str, RunOutcome]]:
        """The first boundary and handler of each outcome, in grid order."""
        found: dict[str, tuple[Boundary, str, RunOutcome]] = {}
        for b in self.boundaries:
            for h in self.handlers:
                outcome = self.cells[b.index, h]
                found.setdefault(outcome.key, (b, h, outcome))
        return found

    def row_label(self, b: Boundary) -> str:
        """The boundary, and where the signal was delivered when that is elsewhere (after an XOL step)."""
        delivered = {o.delivered_at for h in self.handlers if (o := self.cells.get((b.index, h))) is not None}
        elsewhere = sorted(d for d in delivered if d is not None and d != b.at)
        return b.text() + (f" (delivered at {', '.join(elsewhere)})" if elsewhere else "")

    def headline(self) -> str:
        return (f"{self.design}: {self.signal} at each of the {len(self.boundaries)} boundaries of hit {self.hit} of "
                f"{self.site}, {len(self.handlers)} handler(s): {self.runs} runs")

    def render(self) -> str:
        if self.refused is not None:
            return f"{self.design}: {self.spec}: not explored: {self.refused}"
        head = [self.headline()]
        if self.baseline is not None:
            head.append(f"  without a signal: {self.baseline.key}")
        rows = [("#", "boundary", *self.handlers)]
        rows += [(str(b.index), self.row_label(b), *(self.cells[b.index, h].cell for h in self.handlers))
                 for b in self.boundaries]
        lines = head + ["  " + line for line in table(rows).splitlines()]
        lines.append("  outcomes: " + ", ".join(f"{key} {n}" for key, n in self.outcomes.most_common()))
        for key, (b, h, outcome) in self.examples().items():
            if key != CLEAN:
                lines.append(f"  {key}: e.g. #{b.index} with {h}: {outcome.explain()}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "refused": self.refused,
            "spec": self.spec,
            "site": self.site,
            "hit": self.hit,
            "signal": self.signal,
            "handlers": list(self.handlers),
            "boundaries": [{**b.to_json(), "label": self.row_label(b)} for b in self.boundaries],
            "baseline": None if self.baseline is None else self.baseline.to_json(),
            "outcomes": dict(self.outcomes),
            "cells": [{"boundary": i, "handler": h, **o.to_json()} for (i, h), o in self.cells.items()],
        }


def _short(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def signal_reports_json(reports: list[SignalReport]) -> dict[str, Any]:
    return {"designs": {r.design: r.to_json() for r in reports}}
