"""The whole user state of one CPU as raw bytes, and small memory reads, each in one C call; and the
snapshot decoded: registers in read_user_state order, and the extended state (fs base, gs base,
xmm0-15 raw, mxcsr, the x87 state raw).

A probe transaction reads the state at its start and end (emu/verify): raw bytes out, compared as
bytes; decoding into registers happens only when something differs.
"""

from __future__ import annotations

import ctypes
import struct
from typing import TYPE_CHECKING

from emu.cpu import binding
from emu.cpu.regs import (
    STATE_BYTES,
    STATE_FLAGS_OFFSET,
    STATE_OFFSETS,
    STATE_REGS,
    STATE_X87_OFFSET,
    STATE_XMM_OFFSET,
    Reg,
)

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

ExtendedState = tuple[int, int, bytes, int, bytes]  # fs base, gs base, xmm0-15 raw, mxcsr, x87 raw (X87_NAMES)
X87_NAMES = ("fpcw", "fpsw", "fptag", *(f"st{i}" for i in range(8)))

RAW_RIP = 0  # offsets in a snapshot
RAW_RSP = 8
RAW_KEPT = 16  # from here on, a snapshot holds what a probe hit must leave as it was (rflags exactly)
# Each register's bytes in a snapshot, by name (the order of emu.cpu.STATE_REGS).
_SLOT_NAMES = ("rip", "rsp", "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", *(f"r{i}" for i in range(8, 16)),
               "rflags", "fs_base", "gs_base", "mxcsr")
SLOTS: dict[str, tuple[int, int]] = {name: (8 * i, 8 * i + 8) for i, name in enumerate(_SLOT_NAMES)}
SLOTS |= {f"xmm{i}": (STATE_XMM_OFFSET + 16 * i, STATE_XMM_OFFSET + 16 * i + 16) for i in range(16)}
SLOTS |= {name: (STATE_X87_OFFSET + 8 * i, STATE_X87_OFFSET + 8 * i + 8) for i, name in enumerate(X87_NAMES[:3])}
SLOTS |= {f"st{i}": (STATE_X87_OFFSET + 24 + 16 * i, STATE_X87_OFFSET + 40 + 16 * i) for i in range(8)}
assert len(SLOTS) == len(STATE_REGS) and SLOTS["st7"][1] == STATE_BYTES
_GPRS = struct.Struct("<18Q")  # rip, rsp, rax rbx rcx rdx rsi rdi rbp, r8-r15, rflags
_EXT = struct.Struct("<3Q")  # fs base, gs base, mxcsr


def decode_state(raw: bytes) -> list[int]:
    """The 16 GPRs, rip and rflags of a snapshot, in read_user_state order."""
    v = _GPRS.unpack_from(raw)
    return [*v[2:9], v[1], *v[9:17], v[0], v[17]]


def decode_extended(raw: bytes) -> ExtendedState:
    fs, gs, mxcsr = _EXT.unpack_from(raw, STATE_FLAGS_OFFSET + 8)
    return fs, gs, raw[STATE_XMM_OFFSET:STATE_X87_OFFSET], mxcsr, raw[STATE_X87_OFFSET:]


def x87_registers(x87: bytes) -> dict[str, int]:
    """The x87 part of a snapshot by register name (the st registers' 80 bits each)."""
    out = {name: int.from_bytes(x87[8 * i : 8 * i + 2], "little") for i, name in enumerate(X87_NAMES[:3])}
    out |= {f"st{i}": int.from_bytes(x87[24 + 16 * i : 34 + 16 * i], "little") for i in range(8)}
    return out


def encode_state(state: list[int], extended: ExtendedState) -> bytes:
    """Inverse of decode_state and decode_extended."""
    fs, gs, xmm, mxcsr, x87 = extended
    gprs = _GPRS.pack(state[16], state[7], *state[0:7], *state[8:16], state[17])
    raw = gprs + _EXT.pack(fs, gs, mxcsr) + xmm + x87
    assert len(raw) == STATE_BYTES
    return raw
