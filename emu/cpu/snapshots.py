"""Whole-CPU snapshots (Unicorn's uc_context) for the verifiers' C hooks, checked before use.

A snapshot copies the CPU's state in one memcpy; reading the 48 registers of a state buffer
(emu/cpu/regs.py, STATE_REGS) costs a call each. :func:`context_snapshots` checks, on the CPU at
hand, that a snapshot holds every register of STATE_REGS exactly as the CPU reads it, and finds
where: the bytes that writing each register changes, and the one offset of rip and of rsp (the
hooks compare those two on their own). Two snapshots equal on those bytes, with the same rflags
(read from each: the emulator keeps flags lazily, in more than one form), read the same
registers. It returns None if the check fails, and the hooks read registers instead.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu.cpu.binding import _raw
from emu.cpu.regs import STATE_OFFSETS, STATE_REGS, Reg

if TYPE_CHECKING:
    from emu.cpu.engine import Cpu

_context_alloc, _context_free, _context_size = _raw.uc_context_alloc, _raw.uc_context_free, _raw.uc_context_size
_context_save, _context_restore = _raw.uc_context_save, _raw.uc_context_restore
_context_reg_read = _raw.uc_context_reg_read
_context_size.restype = ctypes.c_size_t
MARKERS = (b"\x5a" * 16, b"\xa5" * 16, b"\xff" * 16)  # each bit set and clear in some marker


@dataclass(frozen=True)
class Snapshots:
    """Two snapshots of one engine (a hit's start and end), ``size`` bytes each, and where their
    registers lie: ``pairs`` holds (word index, mask) for each 8-byte word of a snapshot that holds
    a register other than rip, rsp and rflags, the mask's bytes 0xff on that register's bytes; rip
    and rsp are the 8 bytes at their offsets. Freed with this object."""

    start: ctypes.c_void_p
    end: ctypes.c_void_p
    size: int
    pairs: ctypes.Array[ctypes.c_uint64]
    rip_offset: int
    rsp_offset: int

    @property
    def addresses(self) -> tuple[int, int]:
        return _address(self.start), _address(self.end)

    @property
    def word_count(self) -> int:
        """How many words are compared (the pairs)."""
        return len(self.pairs) // 2

    @property
    def register_bytes(self) -> int:
        """How many bytes of a snapshot hold registers (the ones compared)."""
        return sum(bin(mask).count("1") // 8 for mask in self.pairs[1::2])

    def __post_init__(self) -> None:
        weakref.finalize(self, _free, self.start, self.end)


def _free(*contexts: ctypes.c_void_p) -> None:
    for context in contexts:
        _context_free(context)


def _address(context: ctypes.c_void_p) -> int:
    assert context.value is not None
    return context.value


def _alloc(cpu: Cpu) -> ctypes.c_void_p:
    context = ctypes.c_void_p()
    if _context_alloc(cpu.handle, ctypes.byref(context)) != 0:
        raise MemoryError("uc_context_alloc")
    return context


def _widths() -> list[int]:
    """Each STATE_REGS register's width in a state buffer (x87 registers: 10 bytes of their 16)."""
    ends = [*STATE_OFFSETS[1:], STATE_OFFSETS[-1] + 16]
    widths = [end - start for start, end in zip(STATE_OFFSETS, ends, strict=True)]
    return widths[:-8] + [10] * 8


@dataclass(frozen=True)
class Layout:
    """Where a snapshot holds the registers: a mask for each of its words from the first (0 where no
    register lies; Snapshots keeps the others as pairs), and the offsets of rip and rsp."""

    words: list[int]
    rip_offset: int
    rsp_offset: int


_checked: list[Layout | None] = []  # the check's answer: one Unicorn library a process, one layout


def context_snapshots(cpu: Cpu) -> Snapshots | None:
    """Snapshots for ``cpu``'s hooks, if a snapshot holds its registers faithfully (checked on the first
    CPU of the process, which is left as it was)."""
    if not _checked:
        original, probe = _alloc(cpu), _alloc(cpu)
        try:
            _context_save(cpu.handle, original)
            _checked.append(_layout(cpu, probe))
        finally:
            _context_restore(cpu.handle, original)
            _free(original, probe)
    layout = _checked[0]
    if layout is None:
        return None
    size = int(_context_size(cpu.handle))
    flat = [n for index, mask in enumerate(layout.words) if mask for n in (index, mask)]
    pairs = (ctypes.c_uint64 * len(flat))(*flat)
    return Snapshots(_alloc(cpu), _alloc(cpu), size, pairs, layout.rip_offset, layout.rsp_offset)


def _layout(cpu: Cpu, probe: ctypes.c_void_p) -> Layout | None:
    """Where a snapshot holds each register of STATE_REGS, if every one reads back from a snapshot as
    from the CPU for each marker value (else None)."""
    changed = _changed_bytes(cpu, probe)
    if changed is None:
        return None
    others = 0
    for reg, bits in changed.items():
        if reg not in (Reg.RIP, Reg.RSP, Reg.RFLAGS):  # rflags: read from each snapshot, in any lazy form
            others |= bits
    size = int(_context_size(cpu.handle))
    words, rip, rsp = _word_masks(others, size), _offset_of(cpu, probe, Reg.RIP), _offset_of(cpu, probe, Reg.RSP)
    return None if words is None or rip is None or rsp is None else Layout(words, rip, rsp)


def _changed_bytes(cpu: Cpu, probe: ctypes.c_void_p) -> dict[int, int] | None:
    """For each register of STATE_REGS, the snapshot bits that writing the markers into it changed (as
    one int, snapshot byte 0 lowest); None if a register does not read back from a snapshot as from
    the CPU."""
    size = int(_context_size(cpu.handle))
    live, saved = ctypes.create_string_buffer(16), ctypes.create_string_buffer(16)
    changed: dict[int, int] = {}
    for reg, width in zip(STATE_REGS, _widths(), strict=True):
        for marker in MARKERS:
            _context_save(cpu.handle, probe)
            before = int.from_bytes(ctypes.string_at(_address(probe), size), "little")
            ctypes.memmove(live, marker, 16)
            cpu.write_raw(reg, live)
            ctypes.memset(live, 0, 16)
            cpu.read_raw(reg, live)
            _context_save(cpu.handle, probe)
            ctypes.memset(saved, 0, 16)
            if _context_reg_read(probe, reg, saved) != 0 or live.raw[:width] != saved.raw[:width]:
                return None
            after = int.from_bytes(ctypes.string_at(_address(probe), size), "little")
            changed[reg] = changed.get(reg, 0) | before ^ after
    return changed


def _offset_of(cpu: Cpu, probe: ctypes.c_void_p, reg: Reg) -> int | None:
    """The one offset where a snapshot holds ``reg``'s 8 bytes, for two values (None: not one)."""
    size = int(_context_size(cpu.handle))
    offsets: set[int] = set()
    for value in (0x1122334455667700 | reg, 0x8877665544332200 | reg):  # the register's own values
        cpu.write(reg, value)
        _context_save(cpu.handle, probe)
        data = ctypes.string_at(_address(probe), size)
        packed = value.to_bytes(8, "little")
        at = data.find(packed)
        if at < 0 or data.find(packed, at + 1) >= 0:
            return None
        offsets.add(at)
    return offsets.pop() if len(offsets) == 1 else None


def _word_masks(changed: int, size: int) -> list[int] | None:
    """A mask for each 8-byte word of a snapshot from the first up to the last with a changed bit:
    0xff on each changed byte (masked whole). None if nothing changed (the check found no register
    in a snapshot)."""
    masks: list[int] = []
    for offset in range(0, size - size % 8, 8):
        word = changed >> 8 * offset & (1 << 64) - 1
        masks.append(sum(0xFF << 8 * i for i in range(8) if word >> 8 * i & 0xFF))
    while masks and not masks[-1]:
        masks.pop()
    return masks or None
