"""A race scenario: one process stopped where "thread 1" enters a probed site, and the write
sequence of one patching event recorded with the kernel state it leaves at each write.

The machine runs the binary until the site's first instruction is about to execute (a code hook
stops it there; no probe is attached yet), which gives thread 1 the registers and stack of a
real call. The probes are then put in the event's starting state (attached, optimized) and the
event is performed once for real with the design's own SitePatcher, every write observed through
``Memory.patch_observers``; then the code bytes are put back. The kernel's bookkeeping (which
probes exist, who owns which slot) is captured at each write, so an interleaving can put the
site bytes *and* the bookkeeping in the state the kernel had between two writes.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from emu.designs import Design
from emu.errors import UsageError
from emu.guestio import GuestIO
from emu.kernel.uprobes.consumers import Consumer
from emu.kernel.uprobes.core import Uprobes
from emu.kernel.uprobes.generation import TABLES
from emu.kernel.uprobes.records import Uprobe
from emu.kernel.uprobes.sites import SlotPage
from emu.machine import Attachment, Machine, RunOptions
from emu.probes import parse_spec


class Event(enum.Enum):
    ATTACH = "attach"  # set_swbp over an unprobed site (spec 1.1, 3.2)
    OPTIMIZE = "optimize"  # the first hit's optimization of an INT3'd site (spec 3.3, 3.5)
    DETACH = "detach"  # unoptimize, or set_orig, of an optimized site (spec 3.5, 3.8)
    REATTACH = "reattach"  # detach probe A, then attach and optimize probe B


def parse_event(text: str) -> Event:
    try:
        return Event(text)
    except ValueError:
        raise UsageError(f"unknown event {text!r} (known: {', '.join(e.value for e in Event)})") from None


@dataclass(frozen=True)
class CodeWrite:
    """One ``Memory.patch`` of the event, in order."""

    addr: int
    old: bytes
    new: bytes

    def text(self) -> str:
        return f"{self.addr:#x}: {self.old.hex(' ')} -> {self.new.hex(' ')}"


@dataclass(frozen=True)
class Bookkeeping:
    """The kernel state an interleaving restores with the bytes: probes, slot owners, trampolines."""

    probes: dict[int, Uprobe]
    slot_of: dict[int, int]
    slot_pages: tuple[tuple[SlotPage, tuple[int | None, ...]], ...]
    trampolines: tuple[int, ...]

    @classmethod
    def capture(cls, up: Uprobes) -> Bookkeeping:
        sites = up.sites
        return cls(dict(up.probes), dict(sites.slot_of),
                   tuple((page, tuple(page.owners)) for page in sites.slot_pages), tuple(sites.trampolines))

    def restore(self, up: Uprobes) -> None:
        up.probes.clear()
        up.probes.update(self.probes)
        sites = up.sites
        sites.slot_of = dict(self.slot_of)
        sites.slot_pages = [page for page, _ in self.slot_pages]
        for page, owners in self.slot_pages:
            page.owners = list(owners)
        sites.trampolines = list(self.trampolines)
        TABLES.bump()  # the C hot path's tables (emu/kernel/uprobes/fastpath.py) follow the registry


@dataclass(frozen=True)
class Site:
    """A probed instruction: where, how long, and its original bytes."""

    spec: str
    vaddr: int
    length: int
    original: bytes

    def __contains__(self, addr: int) -> bool:
        return self.vaddr <= addr < self.vaddr + self.length


@dataclass
class Scenario:
    """Everything the explorer needs: the machine at thread 1's entry, the sites, the writes and the
    bookkeeping before the event and at each write."""

    machine: Machine
    design: Design
    event: Event
    sites: tuple[Site, ...]  # the site thread 1 enters first, then the reattach target
    entry: list[int]  # thread 1's registers (Cpu.read_user_state order) as it enters the site
    writes: tuple[CodeWrite, ...]
    books: tuple[Bookkeeping, ...]  # books[j]: the kernel's state with the first j writes done

    @property
    def site(self) -> Site:
        return self.sites[0]


class _AtSite(Exception):
    """Raised from the code hook: thread 1 is about to execute the site."""


def build(binary: str, argv: list[str], specs: tuple[str, ...], design: Design, event: Event,
          options: RunOptions | None = None, env: dict[str, str] | None = None) -> Scenario:
    """Run ``binary`` to the first probe's site, set the event's starting state and record the event."""
    if event is Event.REATTACH and len(specs) < 2:
        raise UsageError("reattach needs a second probe spec (-p A -p B: A is detached, then B attached and optimized)")
    specs = specs[:2] if event is Event.REATTACH else specs[:1]
    opts = dataclasses.replace(options or RunOptions(), design=design)
    machine = Machine(binary, argv, env or {}, opts, GuestIO.captured())
    _run_to(machine, machine.resolver.resolve(parse_spec(specs[0])).address, specs[0])
    entry = machine.cpu.read_user_state()
    first_attachment = _start_state(machine, specs[0], event)
    first = Bookkeeping.capture(machine.uprobes)
    writes, later = _record(machine, event, first_attachment, specs)
    for write in reversed(writes):  # back to the starting bytes; the bookkeeping is restored per interleaving
        machine.mem.write(write.addr, write.old)
        machine.mem.backend.flush_code(write.addr, write.addr + len(write.old))
    books = (first, *later)
    for probe in {id(p): p for b in books for p in b.probes.values()}.values():
        probe.optimize_failed = True  # the patching thread owns the optimization; thread 1 only takes traps
    sites = tuple(site_of(design, spec, a.uprobe) for spec, a in zip(specs, machine.attachments, strict=True))
    return Scenario(machine, design, event, sites, entry, tuple(writes), books)


def _run_to(machine: Machine, address: int, spec: str) -> None:
    def stop(_addr: int, _size: int) -> None:
        raise _AtSite

    hook = machine.cpu.hooks.add_code(stop, address, address)
    try:
        result = machine.run()
    except _AtSite:
        if machine.counter is not None:
            machine.counter.limit = None  # --max-insns bounds the way to the site, not the exploration
        return
    finally:
        machine.cpu.hooks.remove(hook)
    raise UsageError(f"{spec}: the program never reached {address:#x} ({result.message or result.ending.value})")


def _start_state(machine: Machine, spec: str, event: Event) -> Attachment | None:
    """Probe A as the event finds it: absent (attach), INT3 (optimize), optimized (detach, reattach)."""
    if event is Event.ATTACH:
        return None
    attachment = _attach(machine, spec)
    if event in (Event.DETACH, Event.REATTACH):
        machine.uprobes.optimize_now(attachment.uprobe)
    return attachment


def _attach(machine: Machine, spec: str) -> Attachment:
    attachment = machine.attach(spec, Consumer())
    if not isinstance(attachment, Attachment):
        raise UsageError(f"{spec}: probes in shared libraries are not supported by the race explorer")
    return attachment


def site_of(design: Design, spec: str, probe: Uprobe) -> Site:
    """The bytes a hit of ``probe`` starts in: its instruction, or the design's patched site if it optimizes."""
    length = max(probe.insn.length, design.site_length if probe.can_optimize else 0)
    return Site(spec, probe.vaddr, length, probe.insn.raw[:length])


def _record(machine: Machine, event: Event, first: Attachment | None,
            specs: tuple[str, ...]) -> tuple[list[CodeWrite], list[Bookkeeping]]:
    up = machine.uprobes
    writes: list[CodeWrite] = []
    books: list[Bookkeeping] = []

    def observe(addr: int, old: bytes, new: bytes) -> None:
        writes.append(CodeWrite(addr, old, new))
        books.append(Bookkeeping.capture(up))

    machine.mem.patch_observers.append(observe)
    try:
        _perform(machine, event, first, specs)
    finally:
        machine.mem.patch_observers.remove(observe)
    if books:
        books[-1] = Bookkeeping.capture(up)  # what the event leaves after its last write (a released slot)
    return writes, books


def _perform(machine: Machine, event: Event, first: Attachment | None, specs: tuple[str, ...]) -> None:
    if event is Event.ATTACH:
        _attach(machine, specs[0])
    elif event is Event.OPTIMIZE:
        assert first is not None
        machine.uprobes.optimize_now(first.uprobe)
    else:
        assert first is not None
        first.detach()
        if event is Event.REATTACH:
            machine.uprobes.optimize_now(_attach(machine, specs[1]).uprobe)
