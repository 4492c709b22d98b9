"""A violation: what a verifier proved wrong, structured (JSON) and readable (one line plus detail);
and a run's log of them, bounded however many hits break."""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, overload


class Check(enum.Enum):
    REDZONE = "redzone"
    REGS = "regs"
    RESUME = "resume"
    MEMORY = "memory"  # a write during a hit outside the red zone, the scratch below it and the kernel's pages
    LOCKSTEP = "lockstep"
    SHSTK = "shstk"  # a ret the shadow stack disagrees with (#CP), or the kernel refusing it


@dataclass(slots=True)  # not frozen, as one is built for each hit that breaks something (a frozen one is slower):
class Violation:  # treat it as immutable all the same
    kind: Check
    probe: str
    address: int
    summary: str
    detail: dict[str, Any] = field(default_factory=dict)
    hit: int = 0  # which hit of the probe (1-based), in its process
    pid: int = 0  # the forked process it happened in; 0: the process the run started with

    def at_hit(self, hit: int) -> Violation:
        """The same violation, found at another hit of its probe."""
        return Violation(self.kind, self.probe, self.address, self.summary, self.detail, hit, self.pid)

    def in_process(self, pid: int) -> Violation:
        """The same violation, found in the forked process ``pid``."""
        return Violation(self.kind, self.probe, self.address, self.summary, self.detail, self.hit, pid)

    def line(self) -> str:
        where = f"hit {self.hit}, pid {self.pid}" if self.pid else f"hit {self.hit}"
        return f"{self.kind.value}: {self.probe} at {self.address:#x} ({where}): {self.summary}"

    def to_json(self) -> dict[str, Any]:
        found = {"kind": self.kind.value, "probe": self.probe, "address": self.address, "hit": self.hit,
                 "summary": self.summary, "detail": self.detail}
        return found | {"pid": self.pid} if self.pid else found

    def details_text(self) -> str:
        lines = [self.line()]
        for key, value in self.detail.items():
            lines.append(f"    {key}: {value}")
        return "\n".join(lines)


KEPT = 100_000  # violations a run keeps whole; past them each one is only counted
Repeats = list[tuple[Sequence[Violation], list[int]]]  # runs of a hit's violations and the later hits that had them too


@dataclass(frozen=True, slots=True)
class _Repeated:
    """``template`` at each of ``hits``, of which the first ``kept`` violations are kept whole (made on reading)."""

    template: Sequence[Violation]
    hits: list[int]
    kept: int

    def made(self) -> Iterator[Violation]:
        made = (v.at_hit(hit) for hit in self.hits for v in self.template)
        return made if self.kept == len(self.hits) * len(self.template) else islice(made, self.kept)


class ViolationLog(Sequence[Violation]):
    """A run's violations in the order found, bounded: the first ``kept`` are kept whole, later ones
    are only counted (by kind, and the hits they flag at each site). A design that breaks something on
    every hit would otherwise grow memory with every hit of a long run. ``listeners`` see every one.
    Sources (pull_from) may hold violations back; they join before anything reads or adds to the log,
    as runs of repeats made whole only when read (nothing is made for a run that only counts them).
    A run of several processes keeps them all here, each violation saying its process (Violation.pid)."""

    def __init__(self, kept: int | None = None) -> None:
        self.kept = KEPT if kept is None else kept
        self._dropped = 0
        self._sources: list[Callable[[], Repeats]] = []
        self.listeners: list[Callable[[Violation], None]] = []
        self._parts: list[Violation | _Repeated] = []  # what is kept, in order: violations and runs of repeats
        self._count = 0  # the whole violations in _parts
        self._kinds: Counter[Check] = Counter()
        self._flagged: dict[tuple[Check, int, int], list[int]] = {}  # (kind, site, pid) -> [hits flagged, last hit]

    @classmethod
    def of(cls, violations: Iterable[Violation]) -> ViolationLog:
        log = cls()
        log.extend(violations)
        return log

    def pull_from(self, source: Callable[[], Repeats]) -> None:
        """``source`` returns the violations it holds back (found in C: emu/hotpath/repeats.py): runs
        of a hit's violations and the numbers of the later hits that had them too, in order."""
        self._sources.append(source)

    def _pull(self) -> None:
        for source in self._sources:
            for template, hits in source():
                self._add_repeats(template, hits)

    def _add_repeats(self, template: Sequence[Violation], hits: list[int]) -> None:
        """``template`` again for each of ``hits``: one by one while listened to, else kept (as far as
        there is room) as one run, counted as the whole violations would be."""
        if not hits or not template:
            return
        if self.listeners:
            for hit in hits:
                for v in template:
                    self._add(v.at_hit(hit))
            return
        whole = len(template) * len(hits)
        kept = min(whole, max(0, self.kept - self._count))
        if kept:
            self._parts.append(_Repeated(template, hits, kept))
            self._count += kept
        self._dropped += whole - kept
        for v in template:
            self._kinds[v.kind] += len(hits)
        for key in dict.fromkeys((v.kind, v.address, v.pid) for v in template):
            flagged = self._flagged.setdefault(key, [0, 0])
            flagged[0] += len(hits) - (flagged[1] == hits[0])
            flagged[1] = hits[-1]

    def append(self, violation: Violation) -> None:
        self._pull()
        self._add(violation)

    def _add(self, violation: Violation) -> None:
        self._kinds[violation.kind] += 1
        key = (violation.kind, violation.address, violation.pid)
        flagged = self._flagged.get(key)
        if flagged is None:
            self._flagged[key] = [1, violation.hit]
        elif flagged[1] != violation.hit:
            flagged[0] += 1
            flagged[1] = violation.hit
        for listener in self.listeners:
            listener(violation)
        if self._count < self.kept:
            self._parts.append(violation)
            self._count += 1
        else:
            self._dropped += 1

    def extend(self, violations: Iterable[Violation]) -> None:
        for violation in violations:
            self.append(violation)

    def __iadd__(self, violations: Iterable[Violation]) -> ViolationLog:
        if violations:  # most checks of most hits find nothing
            self.extend(violations)
        return self

    def clear(self) -> None:
        """Forget every violation, those a source holds back included."""
        for source in self._sources:
            source()
        self._dropped = self._count = 0
        self._parts.clear()
        self._kinds.clear()
        self._flagged.clear()

    @property
    def dropped(self) -> int:
        """Violations counted but not kept."""
        self._pull()
        return self._dropped

    @property
    def total(self) -> int:
        """Every violation found, kept or not."""
        return len(self) + self.dropped

    def of_kind(self, kind: Check) -> int:
        """Violations of ``kind``, kept or not."""
        self._pull()
        return self._kinds[kind]

    def hits_flagged(self, kind: Check) -> Counter[int]:
        """site -> the hits there that ``kind`` flagged (a hit's violations come together)."""
        self._pull()
        found: Counter[int] = Counter()
        for (k, site, _pid), flagged in self._flagged.items():
            if k is kind:
                found[site] += flagged[0]
        return found

    def _whole(self) -> list[Violation]:
        """Every kept violation made whole (the runs of repeats made once, here)."""
        self._pull()
        if any(isinstance(part, _Repeated) for part in self._parts):
            self._parts = list(self._made())
        return self._parts  # type: ignore[return-value]  # (no runs left)

    def _made(self) -> Iterator[Violation]:
        for part in self._parts:
            if isinstance(part, _Repeated):
                yield from part.made()
            else:
                yield part

    def __len__(self) -> int:
        self._pull()
        return self._count

    @overload
    def __getitem__(self, index: int) -> Violation: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Violation]: ...

    def __getitem__(self, index: int | slice) -> Violation | Sequence[Violation]:
        if isinstance(index, slice) and index.start is None and index.step is None and index.stop is not None \
                and index.stop >= 0:
            self._pull()
            return list(islice(self._made(), index.stop))  # the first few, as a report shows: no run made whole
        return self._whole()[index]

    def __iter__(self) -> Iterator[Violation]:
        return iter(self._whole())

    def __bool__(self) -> bool:
        return self.total > 0

    def __eq__(self, other: object) -> bool:
        """Equal to a list of the same violations, or a log that kept and dropped the same."""
        if isinstance(other, ViolationLog):
            return self._whole() == other._whole() and self._dropped == other._dropped
        return isinstance(other, list) and self.dropped == 0 and self._whole() == other

    __hash__ = None  # type: ignore[assignment]  # mutable
