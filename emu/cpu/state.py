"""The whole user state of one CPU as raw bytes, and small memory reads, each in one C call.

A probe transaction reads the state at its start and end (emu/verify): raw bytes out, compared as
bytes; decoding into registers happens only when something differs.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from emu.cpu import binding
from emu.cpu.regs import STATE_BYTES, STATE_OFFSETS, STATE_REGS, Reg

if TYPE_CHECKING:
    from emu.cpu.engine import Cpu


class RawState:
    """Reads and writes :data:`STATE_REGS` of one CPU as :data:`STATE_BYTES` raw little-endian bytes
    (xmm registers 16 bytes each), and small memory ranges, each in one C call without argument
    conversion (the binding's reads cost 2-4 times more)."""

    def __init__(self, cpu: Cpu) -> None:
        self._uch = cpu.handle
        self._buf = ctypes.create_string_buffer(STATE_BYTES)
        base = ctypes.addressof(self._buf)
        offsets = STATE_OFFSETS
        n = len(STATE_REGS)
        self._all = ((ctypes.c_int * n)(*STATE_REGS), (ctypes.c_void_p * n)(*[base + o for o in offsets]), n)
        keep = [i for i in range(n) if STATE_REGS[i] != Reg.RIP]
        self._no_rip = (
            (ctypes.c_int * (n - 1))(*[STATE_REGS[i] for i in keep]),
            (ctypes.c_void_p * (n - 1))(*[base + offsets[i] for i in keep]),
            n - 1,
        )
        self._mem_bufs: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self._addr_arg = ctypes.c_uint64()
        self._word = ctypes.c_uint64()
        self._word_ref = ctypes.byref(self._word)

    def read(self) -> bytes:
        ids, ptrs, n = self._all
        binding.state_read_batch(self._uch, ids, ptrs, n)
        return self._buf.raw

    def write(self, raw: bytes, write_rip: bool) -> None:
        """Inverse of :meth:`read`. As for :meth:`Cpu.write_user_state`, rip only when asked."""
        ctypes.memmove(self._buf, raw, STATE_BYTES)
        ids, ptrs, n = self._all if write_rip else self._no_rip
        binding.reg_write_batch(self._uch, ids, ptrs, n)

    def u64(self, addr: int) -> int | None:
        """The 8-byte little-endian word at ``addr``; None if unmapped."""
        self._addr_arg.value = addr
        if binding.mem_read(self._uch, self._addr_arg, self._word_ref, 8) != binding.OK:
            return None
        return self._word.value

    def mem(self, addr: int, size: int) -> bytes | None:
        """``size`` bytes at ``addr`` (one reused buffer per size: for the few fixed sizes the verifiers
        read); None if any byte is unmapped."""
        buf = self._mem_bufs.get(size)
        if buf is None:
            buf = self._mem_bufs[size] = ctypes.create_string_buffer(size)
        self._addr_arg.value = addr
        if binding.mem_read(self._uch, self._addr_arg, buf, size) != binding.OK:
            return None
        return buf.raw
