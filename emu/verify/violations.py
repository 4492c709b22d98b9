"""A violation: what a verifier proved wrong, structured (JSON) and readable (one line plus detail)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Check(enum.Enum):
    REDZONE = "redzone"
    REGS = "regs"
    RESUME = "resume"
    MEMORY = "memory"  # a write during a hit outside the red zone, the scratch below it and the kernel's pages
    LOCKSTEP = "lockstep"
    SHSTK = "shstk"  # a ret the shadow stack disagrees with (#CP), or the kernel refusing it


@dataclass(slots=True)  # not frozen: a frozen dataclass costs ~1 us more to build, and a design that
class Violation:  # breaks something usually does it on every hit. Treat it as immutable all the same.
    kind: Check
    probe: str
    address: int
    summary: str
    detail: dict[str, Any] = field(default_factory=dict)
    hit: int = 0  # which hit of the probe (1-based)

    def line(self) -> str:
        return f"{self.kind.value}: {self.probe} at {self.address:#x} (hit {self.hit}): {self.summary}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "probe": self.probe, "address": self.address, "hit": self.hit,
                "summary": self.summary, "detail": self.detail}

    def details_text(self) -> str:
        lines = [self.line()]
        for key, value in self.detail.items():
            lines.append(f"    {key}: {value}")
        return "\n".join(lines)
