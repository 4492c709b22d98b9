"""The explorer's result for one design: every distinct outcome, how often, and one example
interleaving of each; rendered as a plain table or as JSON."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emu.race.outcome import CLEAN, Outcome
from emu.race.scenario import CodeWrite
from emu.render import table


@dataclass(frozen=True)
class Interleaving:
    """Writes 0..writes_before-1 land; thread 1 runs ``insns`` instructions (to ``preempted_at``); writes up
    to ``writes_after`` land; thread 1 runs to the end. ``insns`` None: thread 1 is never preempted."""

    writes_before: int
    insns: int | None = None
    writes_after: int | None = None
    preempted_at: str | None = None

    @property
    def raced(self) -> bool:
        return self.insns is not None

    def text(self, total: int) -> str:
        if self.insns is None:
            return f"{self.writes_before}/{total} writes done, then thread 1 runs through"
        assert self.writes_after is not None
        landed = f"write {self.writes_after}" if self.writes_after == self.writes_before + 1 else \
            f"writes {self.writes_before + 1}-{self.writes_after}"
        return (f"{self.writes_before}/{total} writes done, thread 1 runs {self.insns} insn"
                f"{'s' if self.insns > 1 else ''} (to {self.preempted_at}), {landed} land, thread 1 continues")

    def to_json(self, total: int) -> dict[str, Any]:
        return {"writes_before": self.writes_before, "insns": self.insns, "writes_after": self.writes_after,
                "preempted_at": self.preempted_at, "text": self.text(total)}


@dataclass(frozen=True)
class Example:
    interleaving: Interleaving
    outcome: Outcome


@dataclass
class RaceReport:
    """Every interleaving of one design's event, summarized by outcome."""

    design: str
    event: str
    sites: tuple[str, ...]  # "SPEC at ADDR", the site thread 1 enters first
    writes: tuple[CodeWrite, ...]
    interleavings: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    examples: dict[str, Example] = field(default_factory=dict)
    without_race: set[str] = field(default_factory=set)  # outcomes of the event's start and end states, run through
    refused: str | None = None  # why this design could not run the scenario (the kernel refused the probe)
    cells: list[tuple[Interleaving, str]] = field(default_factory=list)  # every interleaving and its outcome key

    def add(self, interleaving: Interleaving, outcome: Outcome) -> None:
        self.interleavings += 1
        self.outcomes[outcome.key] += 1
        self.cells.append((interleaving, outcome.key))
        known = self.examples.get(outcome.key)
        if known is None or (known.interleaving.raced and not interleaving.raced):
            self.examples[outcome.key] = Example(interleaving, outcome)  # the simplest example wins

    def no_race(self, outcome: Outcome) -> None:
        self.without_race.add(outcome.key)

    @property
    def race_outcomes(self) -> list[str]:
        """Outcomes only a race produces (not seen when the event is not interleaved with thread 1)."""
        return [key for key in self.outcomes if key not in self.without_race]

    @property
    def clean(self) -> bool:
        return set(self.outcomes) == {CLEAN}

    def to_json(self) -> dict[str, Any]:
        total = len(self.writes)
        return {
            "refused": self.refused,
            "event": self.event,
            "sites": list(self.sites),
            "writes": [w.text() for w in self.writes],
            "interleavings": self.interleavings,
            "outcomes": dict(self.outcomes),
            "race_only": self.race_outcomes,
            "examples": {key: {**ex.interleaving.to_json(total), "detail": ex.outcome.detail}
                         for key, ex in self.examples.items()},
        }

    def render(self) -> str:
        if self.refused is not None:
            return f"{self.design}: {self.event}: not explored: {self.refused}"
        total = len(self.writes)
        head = [f"{self.design}: {self.event} of {' then '.join(self.sites)}: {_count(total, 'write')}, "
                f"{_count(self.interleavings, 'interleaving')}"]
        head += [f"  write {i}: {w.text()}" for i, w in enumerate(self.writes, 1)]
        rows = [("outcome", "count", "race only", "example interleaving")]
        race_only = set(self.race_outcomes)
        for key, count in self.outcomes.most_common():
            ex = self.examples[key]
            rows.append((key, str(count), "yes" if key in race_only else "no", ex.interleaving.text(total)))
        details = [f"  {key}: {self.examples[key].outcome.detail}" for key, _ in self.outcomes.most_common()]
        return "\n".join(head + ["  " + line for line in table(rows).splitlines()] + details)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def reports_json(reports: Sequence[RaceReport]) -> dict[str, Any]:
    return {"designs": {r.design: r.to_json() for r in reports}}
