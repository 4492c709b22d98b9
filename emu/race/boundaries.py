"""Every instruction boundary of one probe hit, found by running the program once under a design.

The entry path: the site, the trampoline or slot (or the out-of-line step of an INT3 design), and the
instruction the hit resumes at; for a uretprobe also the return path: the return trampoline and the
caller's instruction it returns to. As in the race explorer (thread.py), a trap or a syscall with all
the kernel does for it is one instruction, so "on the return from the uprobe syscall" is the boundary
after the trampoline's ``syscall``. A boundary is named by its address and by how often that address
has run by then: the runs are deterministic up to the boundary, so another run stops at the same one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from emu.designs import Layout
from emu.errors import UsageError
from emu.kernel.uprobes.records import XOL_NAME
from emu.machine import Machine
from emu.race.outcome import Describe
from emu.race.scenario import Site
from emu.race.thread import KERNEL_REGIONS

SYSCALL, INT3 = b"\x0f\x05", b"\xcc"


class Role(enum.Enum):
    SITE = "site"
    TRAMPOLINE = "trampoline"  # the trampoline the site calls
    SLOT = "slot"  # the slot the site jumps to (a design with slots, jmp-slots)
    XOL_STEP = "XOL step"  # the probed instruction, stepped out of line by the kernel (spec 4.4)
    RESUMED = "resumed"  # the first instruction after the entry path
    RETURN_TRAMPOLINE = "return trampoline"  # [uprobes] slot 0 (spec 1.4)
    RETURNED = "returned"  # the caller's instruction the return path ends at


@dataclass(frozen=True)
class Boundary:
    """The point before one instruction of the hit: a signal arriving there finds the thread at ``address``."""

    index: int
    address: int
    occurrence: int  # how many times ``address`` has started an instruction, this one included
    role: Role
    at: str  # ``address`` as people read it (explore.Describer)
    after: str | None = None  # "syscall" or "int3": the instruction before entered the kernel

    @property
    def stepping(self) -> bool:
        return self.role is Role.XOL_STEP

    def text(self) -> str:
        after = f", on the return from its {self.after}" if self.after else ""
        return f"{self.role.value} {self.at}{after}"

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "role": self.role.value, "at": self.at, "address": self.address,
                "occurrence": self.occurrence, "after": self.after, "text": self.text()}


class _Phase(enum.Enum):
    BEFORE = 0
    ENTRY = 1
    BETWEEN = 2  # the function body, before its return reaches the return trampoline
    RETURN = 3


class _Traced(Exception):
    """Raised from the code hook: every boundary of the hit is recorded."""


class _Tracer:
    """A code hook on every instruction: counts each address, records the hit's instructions."""

    def __init__(self, machine: Machine, site: Site, hit: int, returns: bool) -> None:
        self.machine, self.site, self.hit, self.returns = machine, site, hit, returns
        slots = machine.design.trampoline is not None and machine.design.trampoline.layout is Layout.SLOTS
        self.branched = Role.SLOT if slots else Role.TRAMPOLINE
        self.counts: dict[int, int] = {}
        self.phase = _Phase.BEFORE
        self.found: list[tuple[int, int, Role, str | None]] = []  # address, occurrence, role, after
        self.previous = 0

    def __call__(self, addr: int, size: int) -> None:
        seen = self.counts[addr] = self.counts.get(addr, 0) + 1
        if self.phase is _Phase.BEFORE:
            if addr == self.site.vaddr and seen == self.hit:
                self.phase = _Phase.ENTRY
                self._record(addr, seen, Role.SITE)
        elif self.phase is _Phase.ENTRY:
            self._entry(addr, seen)
        elif self.phase is _Phase.BETWEEN:
            if self._region(addr) == XOL_NAME and not self.machine.uprobes.stepping:
                self.phase = _Phase.RETURN
                self._record(addr, seen, Role.RETURN_TRAMPOLINE)
        elif self.phase is _Phase.RETURN:
            self._return(addr, seen)
        self.previous = addr if size in (len(SYSCALL), len(INT3)) else 0  # _kernel_entry reads it back

    def _entry(self, addr: int, seen: int) -> None:
        if self.machine.uprobes.stepping:
            self._record(addr, seen, Role.XOL_STEP)
        elif addr in self.site or self._region(addr) in KERNEL_REGIONS:
            self._record(addr, seen, self.branched if addr not in self.site else Role.SITE)
        else:
            self._record(addr, seen, Role.RESUMED)
            self.phase = _Phase.BETWEEN
            if not self.returns:
                raise _Traced

    def _return(self, addr: int, seen: int) -> None:
        if self._region(addr) in KERNEL_REGIONS:
            self._record(addr, seen, Role.RETURN_TRAMPOLINE)
        else:
            self._record(addr, seen, Role.RETURNED)
            raise _Traced

    def _region(self, addr: int) -> str | None:
        vma = self.machine.mem.find(addr)
        return None if vma is None else vma.name

    def _record(self, addr: int, seen: int, role: Role) -> None:
        self.found.append((addr, seen, role, self._kernel_entry()))

    def _kernel_entry(self) -> str | None:
        """"syscall" or "int3" if the instruction just run was one (the kernel ran in between)."""
        if not self.found or not self.previous:
            return None
        code = self.machine.mem.read(self.previous, 2)
        return "syscall" if code == SYSCALL else "int3" if code[:1] == INT3 else None


def trace_hit(machine: Machine, site: Site, hit: int, returns: bool, describe: Describe) -> tuple[Boundary, ...]:
    """Run ``machine`` (probes attached) through the ``hit``-th hit of ``site``; its boundaries in order.
    ``returns``: the probe is a uretprobe, whose return path belongs to the hit too."""
    tracer = _Tracer(machine, site, hit, returns)
    hook = machine.cpu.hooks.add_code(tracer, 1, 0)
    try:
        result = machine.run()
    except _Traced:
        return tuple(Boundary(i, addr, seen, role, describe(addr), after)
                     for i, (addr, seen, role, after) in enumerate(tracer.found))
    finally:
        machine.cpu.hooks.remove(hook)
    runs = tracer.counts.get(site.vaddr, 0)
    raise UsageError(f"{site.spec}: the program ran the site at {site.vaddr:#x} {runs} time(s), never reaching "
                     f"hit {hit}" + ("" if tracer.phase is _Phase.BEFORE else " through")
                     + f" ({result.message or result.ending.value})")
