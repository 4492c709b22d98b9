"""Whole-CPU snapshots (Unicorn's uc_context) for the verifiers' C hooks, checked before use.

A snapshot copies the CPU's state in one memcpy; reading the 48 registers of a state buffer
(emu/cpu/regs.py, STATE_REGS) costs a call each. :func:`context_snapshots` checks, on the CPU at
hand, that a snapshot holds every register of STATE_REGS exactly as the CPU reads it, and finds
which bytes of a snapshot hold them: the bytes that writing the registers changes, rip and rsp
apart (the hooks compare those two on their own). Two snapshots equal on those bytes, with rflags
in the form a register write leaves, read the same registers. It returns None if the check fails,
and the hooks read registers instead.
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
    registers lie: ``words`` holds (offset, mask) pairs, one for each 8-byte word of a snapshot
    with register bytes in it, the mask's bytes 0xff where they are. Freed with this object."""

    start: ctypes.c_void_p
    end: ctypes.c_void_p
    size: int
    words: ctypes.Array[ctypes.c_uint64]

    @property
    def addresses(self) -> tuple[int, int]:
        return _address(self.start), _address(self.end)

    @property
    def word_count(self) -> int:
        return len(self.words) // 2

    @property
    def register_bytes(self) -> int:
        """How many bytes of a snapshot hold registers (the ones compared)."""
        return sum(bin(mask).count("1") // 8 for mask in self.words[1::2])

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


_checked: list[list[int] | None] = []  # the check's answer, (offset, mask) pairs: one Unicorn library a process


def context_snapshots(cpu: Cpu) -> Snapshots | None:
    """Snapshots for ``cpu``'s hooks, if a snapshot holds its registers faithfully (checked on the first
    CPU of the process, which is left as it was)."""
    if not _checked:
        original, probe = _alloc(cpu), _alloc(cpu)
        try:
            _context_save(cpu.handle, original)
            _checked.append(_register_words(cpu, probe))
        finally:
            _context_restore(cpu.handle, original)
            _free(original, probe)
    words = _checked[0]
    if words is None:
        return None
    size = int(_context_size(cpu.handle))
    return Snapshots(_alloc(cpu), _alloc(cpu), size, (ctypes.c_uint64 * len(words))(*words))


def _register_words(cpu: Cpu, probe: ctypes.c_void_p) -> list[int] | None:
    """(offset, mask) of each 8-byte snapshot word that writing a register of STATE_REGS other than
    rip and rsp changes, flattened, if every one reads back from a snapshot as from the CPU for each
    marker value (else None)."""
    size = int(_context_size(cpu.handle))
    live, saved = ctypes.create_string_buffer(16), ctypes.create_string_buffer(16)
    changed = 0
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
            if reg not in (Reg.RIP, Reg.RSP):
                changed |= before ^ int.from_bytes(ctypes.string_at(_address(probe), size), "little")
    return _word_masks(changed, size)


def _word_masks(changed: int, size: int) -> list[int] | None:
    """The (offset, mask) pairs, flattened, of the 8-byte words with a changed bit; each changed
    byte masked whole. None if nothing changed (the check found no register in a snapshot)."""
    pairs: list[int] = []
    for offset in range(0, size - size % 8, 8):
        word = changed >> 8 * offset & (1 << 64) - 1
        if word:
            pairs += [offset, sum(0xFF << 8 * i for i in range(8) if word >> 8 * i & 0xFF)]
    return pairs or None
