"""Scratch-CPU references kept per probe site, keyed by everything the instruction reads.

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

from emu.verify.scratch import Reference, ScratchCpu
from emu.verify.state import SLOTS

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


class _Effect:
    """What one run changed: register slots, stores, and the loads it depended on. ``apply`` gives
    another start snapshot the same changes, in a few C calls (it runs on every cached hit)."""

    def __init__(self, before: bytes, ref: Reference) -> None:
        after = ref.raw
        changed = _merged([(lo, hi) for lo, hi in SLOTS.values() if after[lo:hi] != before[lo:hi]])
        kept = [0] + [edge for lo, hi in changed for edge in (lo, hi)] + [len(after)]
        self._kept = operator.itemgetter(*(slice(kept[i], kept[i + 1]) for i in range(0, len(kept), 2)), slice(0, 0))
        self._values = tuple(after[lo:hi] for lo, hi in changed) + (b"",)
        self.stores = ref.stores
        self.reads = ref.reads or ()

    def apply(self, raw: bytes) -> bytes:
        return b"".join(chain.from_iterable(zip(self._kept(raw), self._values, strict=False)))


@dataclass(slots=True)
class _Site:
    key: InputKey | None  # None: run every time
    effects: dict[tuple[bytes, ...], _Effect] = field(default_factory=dict)


class ReferenceCache:
    def __init__(self, scratch: ScratchCpu, read_guest: Callable[[int, int], bytes | None]) -> None:
        """``read_guest(addr, size)``: the guest's bytes, or None if unmapped."""
        self.scratch = scratch
        self.read_guest = read_guest
        self._sites: dict[tuple[int, bytes], _Site] = {}
        self.runs = 0  # scratch runs (the rest were answered from the cache)

    def reference(self, site: int, original: bytes, raw: bytes) -> Reference:
        """What ``original`` at ``site`` does from the snapshot ``raw``, as ScratchCpu.execute says."""
        at = self._sites.get((site, original))
        if at is None:
            at = self._sites[(site, original)] = _Site(input_key(original, site))
        if at.key is None:
            return self._run(site, original, raw)
        key = at.key(raw)
        effect = at.effects.get(key)
        if effect is not None and (not effect.reads or self._still_read(effect.reads)):
            return Reference(effect.apply(raw), effect.stores, False, effect.reads)
        ref = self._run(site, original, raw)
        if not ref.faulted and ref.reads is not None:
            if len(at.effects) >= MAX_KEYS:
                at.effects.clear()
            at.effects[key] = _Effect(raw, ref)
        return ref

    def _still_read(self, reads: tuple[tuple[int, bytes], ...]) -> bool:
        """The guest's memory still holds what the cached run loaded."""
        return all(self.read_guest(addr, len(data)) == data for addr, data in reads)

    def _run(self, site: int, original: bytes, raw: bytes) -> Reference:
        self.runs += 1
        return self.scratch.execute(site, original, raw)
