"""What the emulated kernel really writes at each probe site, step by step, under one design.

A real Machine is built and its ``Memory.patch`` is wrapped on the instance (no core change) to
record every code write in order: address, expected bytes, new bytes, the site before and after.
The trampoline or slot an optimized site jumps to is read back from memory.
Then: attach the probes (INT3, spec 1.1); run the program so each site's first hit optimizes it
(spec 3.3; a site the run never hits is optimized by calling the design's SitePatcher directly,
as arch_uprobe_optimize would); detach (spec 3.5, 3.8).
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emu.designs import BRANCH_OPCODE, Detach, Layout, Patch, WriteOrder
from emu.errors import ProbeRefused, UsageError
from emu.guestio import GuestIO
from emu.kernel.uprobes.sites import crosses_page
from emu.machine import Attachment, Machine, RunOptions
from emu.process.memory import Memory
from emu.scan import CS_ATT, disasm_text

ATTACH = "attach"
OPTIMIZE = "optimize"
DETACH = "detach"
CONTEXT = 16  # bytes recorded either side of each write: covers any site window (<= 10 bytes)

PHASE_TITLES = {ATTACH: "attach: set_swbp, INT3 over byte 0 (spec 1.1, 3.2)"}
SET_ORIG = "detach: set_orig, the original byte 0 back (spec 1.1, 3.5)"


def optimize_title(patch: Patch) -> str:
    size = patch.branch_end
    if patch.write_order is WriteOrder.FRONT_TO_BACK:
        return f"first hit: optimize: bytes 0..{size - 1} one at a time, front to back (torn instructions visible)"
    what = ("prefix tail + " if patch.prefix_bytes else "") + f"{patch.branch} rel32"
    first = (patch.prefix_bytes or bytes([BRANCH_OPCODE[patch.branch]]))[0]
    return f"first hit: optimize (spec 3.5, 3.8): bytes 1..{size - 1} ({what}) expecting CC, then {first:02X} at byte 0"


def detach_title(patch: Patch) -> str:
    if patch.detach is Detach.JUMP_OVER:
        rel8 = patch.length - 2
        return (f"detach: unoptimize (spec 3.8, WIP10 form): CC at byte 0, {rel8:02X} at byte 1, EB at byte 0 "
                f"-> `eb {rel8:02x}` jumps over the stale tail")
    return f"detach: unoptimize (spec 3.5): CC at byte 0, original bytes 1..{patch.length - 1}, original byte 0"


@dataclass(frozen=True, slots=True)
class RawWrite:
    phase: str
    addr: int
    expect: bytes
    new: bytes
    lo: int  # start of the recorded context
    before: bytes
    after: bytes


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    phase: str
    offset: int  # from the site
    expect: bytes
    new: bytes
    before: bytes  # the site window
    after: bytes

    def to_json(self) -> dict[str, Any]:
        return {"step": self.index, "phase": self.phase, "offset": self.offset, "expect": self.expect.hex(),
                "new": self.new.hex(), "before": self.before.hex(), "after": self.after.hex()}


@dataclass(frozen=True, slots=True)
class Mapped:
    """Trampoline or slot code the optimized site jumps into."""

    target: int
    vma: str  # /proc/self/maps line of its page
    code: bytes
    what: str


@dataclass
class SiteHistory:
    spec: str
    address: int
    length: int  # the window shown
    original: bytes
    optimizable: bool
    steps: list[Step] = field(default_factory=list)
    hits: int = 0
    triggered: bool = False  # optimized by a direct call, not by a hit during the run
    mapped: Mapped | None = None
    notes: list[str] = field(default_factory=list)
    refused: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec, "address": self.address, "original": self.original.hex(),
            "optimizable": self.optimizable, "hits": self.hits, "triggered": self.triggered,
            "refused": self.refused, "notes": self.notes, "steps": [s.to_json() for s in self.steps],
            "mapped": None if self.mapped is None else {
                "target": self.mapped.target, "vma": self.mapped.vma, "code": self.mapped.code.hex(),
                "what": self.mapped.what},
        }


@dataclass
class PatchReport:
    binary: str
    design: str
    patch: Patch | None  # the design's patch (None: INT3 only)
    sites: list[SiteHistory]
    ran: bool
    run_message: str | None = None


class PatchRecorder:
    """Wraps ``mem.patch`` on one Memory instance; records each write in order, tagged with a phase."""

    def __init__(self, mem: Memory) -> None:
        self.mem = mem
        self.phase = ATTACH
        self.writes: list[RawWrite] = []
        mem.patch_observers.append(self._record)

    def _record(self, addr: int, old: bytes, new: bytes) -> None:
        lo, hi = self._context(addr, len(new))
        after = self.mem.read(lo, hi - lo)
        before = after[: addr - lo] + old + after[addr - lo + len(old) :]
        expect = old[: len(new)]
        self.writes.append(RawWrite(self.phase, addr, bytes(expect), bytes(new), lo, before, after))

    def _context(self, addr: int, size: int) -> tuple[int, int]:
        vma = self.mem.find(addr)
        if vma is None:
            return addr, addr + size
        return max(vma.start, addr - CONTEXT), min(vma.end, addr + size + CONTEXT)


def _window(raw: RawWrite, start: int, length: int, after: bool) -> bytes:
    data = raw.after if after else raw.before
    off = start - raw.lo
    return data[max(off, 0) : off + length] if off >= 0 else b""


def record_patches(binary: str, specs: Sequence[str], design: str, argv: Sequence[str] | None = None,
                   env: dict[str, str] | None = None, options: RunOptions | None = None, run: bool = True) -> PatchReport:
    """Attach ``specs`` under ``design``, run (or trigger directly), detach; every code write recorded."""
    if not specs:
        raise UsageError("no probe given (use -p SPEC)")
    opts = dataclasses.replace(options or RunOptions(), design=design)
    machine = Machine(binary, list(argv or [binary]), env or {}, opts, GuestIO.captured())
    recorder = PatchRecorder(machine.mem)
    histories: list[SiteHistory] = []
    attached: list[tuple[SiteHistory, Attachment]] = []
    for spec in specs:
        try:
            att = machine.attach(spec)
        except ProbeRefused as err:  # the design's verdict, shown; a spec that resolves to nothing is an error
            histories.append(SiteHistory(spec, 0, 0, b"", False, refused=str(err)))
            continue
        if not isinstance(att, Attachment):
            raise UsageError(f"{spec}: probes in shared libraries are not shown by patch")
        probe = att.uprobe
        length = max(probe.insn.length, machine.design.site_length if probe.can_optimize else 0)
        hist = SiteHistory(spec, probe.vaddr, length, probe.insn.raw[:length].ljust(length, b"?"), probe.can_optimize)
        if length > probe.insn.length:  # nop10 window: the file's 10 bytes
            hist.original = machine.resolver.bytes_at(machine.exe, probe.vaddr - machine.exe.bias, length) or hist.original
        histories.append(hist)
        attached.append((hist, att))
    run_message = None
    recorder.phase = OPTIMIZE
    if run and attached:
        result = machine.run()
        run_message = f"guest {result.ending.value}, status {result.exit_status}" + (
            f": {result.message}" if result.message else "")
    for hist, att in attached:
        hist.hits = att.consumer.hits
        probe = att.uprobe
        sites = machine.uprobes.sites
        if probe.can_optimize and machine.mem.read(probe.vaddr, 1) == b"\xcc":
            hist.triggered = True  # never hit (or --no-run): do what the first hit would (spec 3.3)
            machine.uprobes.optimize_now(probe)
        if probe.can_optimize and sites.is_optimized(probe.vaddr):
            hist.mapped = _mapped(machine, probe.vaddr)
    recorder.phase = DETACH
    for _hist, att in attached:
        att.detach()
    for hist, att in attached:
        _collect(hist, recorder.writes)
        _explain(hist, att, machine)
    return PatchReport(binary, design, machine.design.patch, histories, run and bool(attached), run_message)


def _collect(hist: SiteHistory, writes: list[RawWrite]) -> None:
    for raw in writes:
        if hist.address <= raw.addr < hist.address + hist.length:
            hist.steps.append(Step(len(hist.steps) + 1, raw.phase, raw.addr - hist.address, raw.expect, raw.new,
                                   _window(raw, hist.address, hist.length, False),
                                   _window(raw, hist.address, hist.length, True)))


def _mapped(machine: Machine, vaddr: int) -> Mapped | None:
    patch, tramp = machine.design.patch, machine.design.trampoline
    assert patch is not None and tramp is not None
    end = patch.branch_end
    target = vaddr + end + struct.unpack("<i", machine.mem.read(vaddr + end - 4, 4))[0]
    what = (f"the {patch.branch} targets this probe's {tramp.slot_size}-byte slot" if tramp.layout is Layout.SLOTS else
            f"the {patch.branch} targets the first byte of the trampoline page (spec 1.3, 1.5)")
    vma = machine.mem.find(target)
    if vma is None:
        return None
    return Mapped(target, vma.maps_line(), machine.mem.read(target, len(tramp.code_bytes)), what)


def _explain(hist: SiteHistory, att: Attachment, machine: Machine) -> None:
    design = machine.design
    probe = att.uprobe
    if not design.optimizes:
        hist.notes.append(f"{design.name} never optimizes: the site stays INT3 (every hit traps; spec 4)")
    elif not probe.can_optimize:
        why = "crosses a page boundary" if crosses_page(probe.vaddr, design.site_length) else \
            f"is not a site {design.name} optimizes (spec 1.2, 1.5)"
        hist.notes.append(f"`{disasm_text(probe.insn.raw)}` {why}: INT3 only")
    elif probe.optimize_failed:
        hist.notes.append("optimization failed (no page within rel32 reach / no free slot): stays INT3")
    elif hist.triggered:
        hist.notes.append("not hit during the run: the optimization was triggered directly (as the first hit would)")


def _hex(data: bytes) -> str:
    return data.hex(" ")


def render(report: PatchReport) -> str:
    lines = [f"{report.binary}: design {report.design} (sites: {_sites(report.patch)})" +
             (f"; {report.run_message}" if report.run_message else "; not run")]
    for hist in report.sites:
        lines.append("")
        if hist.refused is not None:
            lines.append(f"{hist.spec}: refused: {hist.refused}")
            continue
        lines.append(f"{hist.spec} at {hist.address:#x}, {hist.length}-byte window, {hist.hits} hit(s)")
        col = 3 * hist.length + 1
        whats = [_step_text(step) for step in hist.steps]
        wcol = max([len(w) for w in whats] + [len("original")]) + 2
        lines.append(f"  {'':<4}{'original':<{wcol}}{_hex(hist.original):<{col}}{disasm_text(hist.original, hist.address)}")
        phase = ""
        for step, what in zip(hist.steps, whats, strict=True):
            if step.phase != phase:
                phase = step.phase
                lines.append("  " + _title(phase, report.patch, hist.mapped is not None))
            lines.append(f"  {step.index:>2}. {what:<{wcol}}{_hex(step.after):<{col}}{disasm_text(step.after, hist.address)}")
        if hist.mapped is not None:
            m = hist.mapped
            lines.append("  maps " + " ".join(m.vma.split()))
            lines.append(f"  {m.what}: {m.target:#x}")
            lines.extend(_listing(m.code, m.target))
        for note in hist.notes:
            lines.append(f"  note: {note}")
    return "\n".join(lines)


def _step_text(step: Step) -> str:
    span = f"[{step.offset}]" if len(step.new) == 1 else f"[{step.offset}..{step.offset + len(step.new) - 1}]"
    return f"{span} {step.expect.hex()} -> {step.new.hex()}"


def _sites(patch: Patch | None) -> str:
    return "int3" if patch is None else f"{patch.site} -> {patch.branch}"


def _title(phase: str, patch: Patch | None, optimized: bool) -> str:
    if phase == OPTIMIZE:
        return optimize_title(patch) if patch is not None else "optimize"
    if phase == DETACH:
        return detach_title(patch) if optimized and patch is not None else SET_ORIG
    return PHASE_TITLES[phase]


def _listing(code: bytes, address: int) -> list[str]:
    out = []
    for addr, size, mnemonic, op_str in CS_ATT.disasm_lite(code, address):
        raw = code[addr - address : addr - address + size]
        out.append(f"    +{addr - address:#04x}  {_hex(raw):<24}{mnemonic} {op_str}".rstrip())
    return out
