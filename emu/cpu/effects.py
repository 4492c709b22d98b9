"""Scratch-CPU references (emu/cpu/scratch.py) kept per probe site, keyed by everything the
instruction reads.

An instruction's effect is a function of what it reads: the registers it reads and the memory it
loads. So two hits of one site whose inputs are equal have the same effect, and the second needs
no scratch run: its reference is its own start state with the register changes the first run
made, and the same stores. The inputs are

* the registers capstone says the instruction reads, plus rflags, fs base, gs base and mxcsr
  always (cheap, and they cover segment-relative and flag-reading forms capstone might not name);
  rip needs no slot: the key is per site, and a probed instruction always starts at its site;
* the memory the scratch CPU saw it load, each (address, bytes) checked against the guest at every
  use (the addresses follow from the registers in the key).

An instruction whose inputs cannot all be named this way runs on the scratch CPU every time: one
capstone cannot decode, one that reads a register outside the snapshot (x87, the upper halves of
ymm, mask registers), the x87 and xsave families, and those whose result is not a function of
their inputs (rdtsc, rdrand and kin). So does a run that faulted or loaded more than Unicorn
reports in one read. This keeps the common case (a loop hitting ``push %rbp``) at the cost of a
dictionary lookup, where a scratch run costs ~30 us (benchmarks/probe_hits.py).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from typing import NamedTuple, Protocol

from emu.cpu.scratch import Reference, ScratchCpu
from emu.cpu.state import RAW_KEPT, RAW_RIP, RAW_RSP, SLOTS


class FinishedHit(Protocol):
    """What Effect.settles reads of a finished transaction (emu/verify/records.py: Transaction)."""

    start_raw: bytes
    start_rsp: int
    end_raw: bytes
    end_addr: int
    end_rsp: int
    redzone_base: int
    redzone_before: bytes | None
    redzone_after: bytes

MAX_KEYS = 256  # per site; a site whose inputs keep changing starts afresh past this
ALWAYS_READ = ("rflags", "fs_base", "gs_base", "mxcsr")
CONSTANT = frozenset({"rip", "eip", "ip", "cs", "ds", "es", "ss"})  # the site, or fixed in 64-bit user mode
NOT_A_FUNCTION_OF_INPUTS = frozenset({
    "rdtsc", "rdtscp", "rdrand", "rdseed", "rdpid", "rdpmc", "xgetbv", "rdpkru", "xbegin", "xend", "xabort",
    "xtest", "emms", "syscall", "sysenter", "int", "int1", "int3", "into", "hlt", "ud0", "ud1", "ud2",
})
_LEGACY = {"rax": "a", "rbx": "b", "rcx": "c", "rdx": "d"}
_INDEX = {"rsi": "si", "rdi": "di", "rbp": "bp", "rsp": "sp"}


def _register_names() -> dict[str, str]:
    """Every capstone name of a register in the snapshot (or part of one) -> its slot."""
    names = {"rflags": "rflags", "eflags": "rflags", "flags": "rflags", "fs": "fs_base", "gs": "gs_base",
             "mxcsr": "mxcsr"}
    for full, x in _LEGACY.items():
        names |= dict.fromkeys((full, f"e{x}x", f"{x}x", f"{x}l", f"{x}h"), full)
    for full, x in _INDEX.items():
        names |= dict.fromkeys((full, f"e{x}", x, f"{x}l"), full)
    for i in range(8, 16):
        names |= dict.fromkeys((f"r{i}", f"r{i}d", f"r{i}w", f"r{i}b"), f"r{i}")
    names |= {f"xmm{i}": f"xmm{i}" for i in range(16)}
    return names


REGISTER_SLOT = _register_names()

InputKey = Callable[[bytes], tuple[bytes, ...]]
Spans = list[tuple[int, int]]  # [lo, hi) byte ranges
WindowSlices = Callable[[bytes], tuple[bytes, ...]]
WindowPlan = tuple[WindowSlices, WindowSlices, tuple[bytes, ...]]  # see _window_plan
MAX_PLANS = 16  # red-zone bases an effect keeps a plan for


def stored_into(window: bytes, base: int, stores: tuple[tuple[int, bytes], ...]) -> bytes:
    """``window`` (the bytes at ``base``) with the parts of ``stores`` that fall inside it."""
    out = bytearray(window)
    for addr, data in stores:
        lo, hi = max(addr - base, 0), min(addr + len(data) - base, len(window))
        if lo < hi:
            out[lo:hi] = data[lo + base - addr : hi + base - addr]
    return bytes(out)


def _window_spans(base: int, size: int, stores: tuple[tuple[int, bytes], ...]) -> tuple[Spans, list[tuple[int, bytes]]]:
    """How ``stores`` change the ``size`` bytes at ``base``: the spans they leave alone, and the
    spans they write with what those hold afterwards."""
    final = stored_into(bytes(size), base, stores)
    written = stored_into(b"\0" * size, base, tuple((addr, b"\1" * len(data)) for addr, data in stores))
    spans: list[list[int]] = []  # [lo, hi, written]
    for i, w in enumerate(written):
        if spans and spans[-1][2] == w:
            spans[-1][1] = i + 1
        else:
            spans.append([i, i + 1, w])
    return [(lo, hi) for lo, hi, w in spans if not w], [(lo, final[lo:hi]) for lo, hi, w in spans if w]


def _window_plan(base: int, size: int, stores: tuple[tuple[int, bytes], ...]) -> WindowPlan:
    untouched, stored = _window_spans(base, size, stores)
    values = tuple(data for _, data in stored) + (b"",)
    return _slices(untouched), _slices([(lo, lo + len(data)) for lo, data in stored]), values


class EffectSpans(NamedTuple):
    """A cached effect as byte comparisons, for a hit whose red zone is at a given base: the end
    snapshot's rip and rsp, its spans (offsets in a snapshot) equal to the start snapshot's and
    those holding fixed bytes; the red zone's spans equal to the start's and those the instruction
    stored (offsets in the red zone)."""

    rip: int
    rsp: int
    same: Spans
    changed: list[tuple[int, bytes]]
    redzone_same: Spans
    redzone_stored: list[tuple[int, bytes]]


def _slices(spans: list[tuple[int, int]]) -> Callable[[bytes], tuple[bytes, ...]]:
    return operator.itemgetter(*(slice(lo, hi) for lo, hi in spans), slice(0, 0))


def _merged(slices: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(slices):
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def input_key(original: bytes, site: int) -> InputKey | None:
    """The snapshot bytes an instruction's result depends on, besides memory, as a function of the
    snapshot (one C call: an itemgetter of slices); None: not all nameable."""
    from emu.disasm import cs64

    insn = next(cs64(detail=True).disasm(original, site), None)
    if insn is None or insn.size != len(original):
        return None
    mnemonic = insn.mnemonic.split()[-1]
    if mnemonic in NOT_A_FUNCTION_OF_INPUTS or mnemonic.startswith(("f", "xsave", "xrstor")):
        return None
    slots = set(ALWAYS_READ)
    for reg in insn.regs_access()[0]:
        name = insn.reg_name(reg)
        if name in CONSTANT:
            continue
        slot = REGISTER_SLOT.get(name)
        if slot is None:
            return None
        slots.add(slot)
    return operator.itemgetter(*(slice(lo, hi) for lo, hi in _merged([SLOTS[s] for s in slots])), slice(0, 0))


class Effect:
    """What one run changed: register slots, stores, and the loads it depended on. ``apply`` gives
    another start snapshot the same changes, and ``settles`` compares a hit with them, each in a
    few C calls (they run on every cached hit)."""

    def __init__(self, before: bytes, ref: Reference) -> None:
        after = ref.raw
        changed = _merged([(lo, hi) for lo, hi in SLOTS.values() if after[lo:hi] != before[lo:hi]])
        kept = [0] + [edge for lo, hi in changed for edge in (lo, hi)] + [len(after)]
        self._kept = _slices([(kept[i], kept[i + 1]) for i in range(0, len(kept), 2)])
        self._values = tuple(after[lo:hi] for lo, hi in changed) + (b"",)
        self.stores = ref.stores
        self.reads = ref.reads or ()
        # For settles(): rip and rsp apart (a hit's end snapshot may hold them as they were before
        # a ret), then the rest, changed and unchanged.
        self.rip = int.from_bytes(after[RAW_RIP : RAW_RIP + 8], "little")
        rsp = after[RAW_RSP : RAW_RSP + 8]
        self.rsp = None if rsp == before[RAW_RSP : RAW_RSP + 8] else int.from_bytes(rsp, "little")
        rest = [(lo, hi) for lo, hi in SLOTS.values() if lo >= RAW_KEPT]
        self._changed_spans = _merged([(lo, hi) for lo, hi in rest if after[lo:hi] != before[lo:hi]])
        self._same_spans = _merged([(lo, hi) for lo, hi in rest if after[lo:hi] == before[lo:hi]])
        self._changed_rest, self._same_rest = _slices(self._changed_spans), _slices(self._same_spans)
        self._changed_values = self._changed_rest(after)
        self._redzone_plans: dict[int, WindowPlan] = {}
        self.compiled: dict[object, object] = {}  # for a caller's own form of spans() (see MAX_PLANS)

    def spans(self, base: int, size: int) -> EffectSpans:
        """This effect as comparisons, for a hit whose ``size``-byte red zone starts at ``base``
        (its rsp at the start: base + size)."""
        redzone_same, redzone_stored = _window_spans(base, size, self.stores)
        return EffectSpans(self.rip, base + size if self.rsp is None else self.rsp, self._same_spans,
                           list(zip((lo for lo, _ in self._changed_spans), self._changed_values, strict=False)),
                           redzone_same, redzone_stored)

    def apply(self, raw: bytes) -> bytes:
        return b"".join(chain.from_iterable(zip(self._kept(raw), self._values, strict=False)))

    def settles(self, tx: FinishedHit) -> bool:
        """``tx`` resumed where this run did, with the registers (rflags exactly), the extended
        state and the red zone as it leaves them: what matches_exactly() says of the reference
        apply() gives, without building it."""
        end, before = tx.end_raw, tx.redzone_before
        return (before is not None and tx.end_addr == self.rip
                and tx.end_rsp == (tx.start_rsp if self.rsp is None else self.rsp)
                and self._changed_rest(end) == self._changed_values
                and self._same_rest(end) == self._same_rest(tx.start_raw)
                and self._same_redzone(tx.redzone_base, before, tx.redzone_after))

    def _same_redzone(self, base: int, before: bytes, after: bytes) -> bool:
        """``after`` is ``before`` with this run's stores."""
        if not self.stores:
            return after == before
        plan = self._redzone_plans.get(base)
        if plan is None:
            if len(self._redzone_plans) >= MAX_PLANS:
                self._redzone_plans.clear()
            plan = self._redzone_plans[base] = _window_plan(base, len(before), self.stores)
        untouched, stored, values = plan
        return stored(after) == values and untouched(after) == untouched(before)


class Prepared(NamedTuple):
    """A reference taken before the instruction ran: the input snapshot, and the cached effect
    that applies to it, or the scratch run made for it, or both."""

    raw: bytes
    effect: Effect | None
    ran: Reference | None

    @property
    def reference(self) -> Reference:
        if self.ran is not None:
            return self.ran
        assert self.effect is not None
        return Reference(self.effect.apply(self.raw), self.effect.stores, False, self.effect.reads)


@dataclass(slots=True)
class _Site:
    key: InputKey | None  # None: run every time
    effects: dict[tuple[bytes, ...], Effect] = field(default_factory=dict)


class ReferenceCache:
    def __init__(self, scratch: ScratchCpu, read_guest: Callable[[int, int], bytes | None]) -> None:
        """``read_guest(addr, size)``: the guest's bytes, or None if unmapped."""
        self.scratch = scratch
        self.read_guest = read_guest
        self._sites: dict[tuple[int, bytes], _Site] = {}
        self.runs = 0  # scratch runs (the rest were answered from the cache)

    def reference(self, site: int, original: bytes, raw: bytes) -> Reference:
        """What ``original`` at ``site`` does from the snapshot ``raw``, as ScratchCpu.execute says
        (guest memory as it is now)."""
        return self.prepare(site, original, raw).reference

    def _site(self, site: int, original: bytes) -> _Site:
        at = self._sites.get((site, original))
        if at is None:
            at = self._sites[(site, original)] = _Site(input_key(original, site))
        return at

    def _cache(self, at: _Site, key: tuple[bytes, ...], raw: bytes, ref: Reference) -> Reference:
        if not ref.faulted and ref.reads is not None:
            if len(at.effects) >= MAX_KEYS:
                at.effects.clear()
            at.effects[key] = Effect(raw, ref)
        return ref

    def prepare(self, site: int, original: bytes, raw: bytes) -> Prepared:
        """What ``original`` at ``site`` will do from the snapshot ``raw``, with guest memory as it
        is now: taken before the instruction runs, for one that loads what it stores. A cached
        effect is not applied until a caller needs the whole reference (Prepared.reference)."""
        at = self._site(site, original)
        if at.key is None:
            return Prepared(raw, None, self._run(site, original, raw))
        key = at.key(raw)
        effect = at.effects.get(key)
        if effect is not None and (not effect.reads or self._still_read(effect.reads)):
            return Prepared(raw, effect, None)
        ref = self._cache(at, key, raw, self._run(site, original, raw))
        return Prepared(raw, at.effects.get(key), ref)

    def _still_read(self, reads: tuple[tuple[int, bytes], ...]) -> bool:
        """The guest's memory still holds what the cached run loaded."""
        return all(self.read_guest(addr, len(data)) == data for addr, data in reads)

    def _run(self, site: int, original: bytes, raw: bytes) -> Reference:
        self.runs += 1
        return self.scratch.execute(site, original, raw)
