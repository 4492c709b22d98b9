"""Unicorn's C functions, bound without the Python binding's argument conversion.

The binding's ``reg_read`` converts its arguments on every call, which costs several times the
call itself: register and memory I/O and hook registration go through these instead. Only public
functions of unicorn.h are bound; nothing here depends on a private structure. Importing this
module checks that the Unicorn library is one the harness is tested with (TESTED_UNICORN).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from typing import Any

import unicorn
from unicorn.unicorn_py3.unicorn import Uc, uc_version, uclib
from unicorn.unicorn_py3.unicorn import UcError as _UcError

from emu.errors import EmuError

# The Unicorn releases the harness is tested with: from the first up to, not including, the second.
# It relies on their behaviour (docs/ARCHITECTURE.md, "Unicorn"), so an engine outside is refused.
TESTED_UNICORN = ((2, 1, 4), (2, 2, 0))
ANY_UNICORN_VARIABLE = "UPROBE_EMU_ANY_UNICORN"  # set to 1: run on an untested release anyway


class UnsupportedUnicorn(EmuError):
    """The Unicorn library installed is outside the tested range."""


def unicorn_version() -> tuple[int, int, int]:
    """(major, minor, patch) of the Unicorn library loaded (not of its Python binding)."""
    combined = int(uc_version()[2])
    return combined >> 24 & 0xFF, combined >> 16 & 0xFF, combined >> 8 & 0xFF


def check_unicorn(version: tuple[int, int, int], environ: Mapping[str, str] = os.environ) -> None:
    """Refuse a Unicorn outside TESTED_UNICORN, in one line that says what to install."""
    low, high = TESTED_UNICORN
    if low <= version < high or environ.get(ANY_UNICORN_VARIABLE) == "1":
        return
    raise UnsupportedUnicorn(f"Unicorn {_dotted(version)} is not supported: uprobe-emu is tested with Unicorn "
                             f"{_dotted(low)} up to, not including, {_dotted(high)} (pip install "
                             f"'unicorn>={_dotted(low)},<{_dotted(high)}'; {ANY_UNICORN_VARIABLE}=1 runs on it anyway)")


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


check_unicorn(unicorn_version())

# uc_reg_* bound again without argtypes: the binding's POINTER argtypes convert every argument on
# the syscall hot path; these take the arrays as plain pointers.
_raw = ctypes.CDLL(uclib._name, handle=uclib._handle)
reg_read, reg_write = _raw.uc_reg_read, _raw.uc_reg_write
reg_read_batch, reg_write_batch = _raw.uc_reg_read_batch, _raw.uc_reg_write_batch
ctl = _raw.uc_ctl
for _f in (reg_read, reg_write, reg_read_batch, reg_write_batch, ctl):
    _f.restype = ctypes.c_int
# UC_CTL_WRITE(UC_CTL_TB_REMOVE_CACHE, 2 arguments), as the binding encodes it
CTL_REMOVE_CACHE = (unicorn.UC_CTL_IO_WRITE << 30) | (2 << 26) | unicorn.UC_CTL_TB_REMOVE_CACHE
CTL_FLUSH_TB = (unicorn.UC_CTL_IO_WRITE << 30) | unicorn.UC_CTL_TB_FLUSH
CTL_FLUSH_TLB = (unicorn.UC_CTL_IO_WRITE << 30) | unicorn.UC_CTL_TLB_FLUSH

# Bound through PyDLL: these calls keep the GIL (releasing and taking it back costs more than they
# do; they never call back into Python). No argtypes: their conversion costs more than the call;
# a size goes as a C int, sign-extended to size_t (no single copy comes near 2 GiB).
_gil_held = ctypes.PyDLL(uclib._name, handle=uclib._handle)
state_read_batch, mem_read, mem_write = _gil_held.uc_reg_read_batch, _gil_held.uc_mem_read, _gil_held.uc_mem_write
state_read_batch.restype = mem_read.restype = mem_write.restype = ctypes.c_int

hook_add, hook_del, emu_stop, close = uclib.uc_hook_add, uclib.uc_hook_del, uclib.uc_emu_stop, uclib.uc_close
OK = unicorn.UC_ERR_OK
UcError: type[Exception] = _UcError  # (the binding is untyped: its errors and engines are typed here)


def new_engine() -> Any:
    """A Unicorn x86-64 engine (the binding's Uc, whose methods the engine calls for what is not hot)."""
    return Uc(unicorn.UC_ARCH_X86, unicorn.UC_MODE_64)

# Hook callback shapes (unicorn.h)
SYSCALL_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
CPUID_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
INTR_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p)
CODE_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p)
MEM_CB = ctypes.CFUNCTYPE(
    ctypes.c_bool, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p
)


class TranslatedBlock(ctypes.Structure):
    """uc_tb, as UC_HOOK_EDGE_GENERATED reports a block Unicorn has just translated."""

    _fields_ = [("pc", ctypes.c_uint64), ("icount", ctypes.c_uint16), ("size", ctypes.c_uint16)]


EDGE_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(TranslatedBlock),
                           ctypes.POINTER(TranslatedBlock), ctypes.c_void_p)


def native_function(name: str) -> int:
    """The address of one of libunicorn's public functions (for C that calls it)."""
    address = ctypes.cast(getattr(_raw, name), ctypes.c_void_p).value
    assert address is not None
    return address


def callback_address(cfunc: Any) -> int:
    """The C address of a ctypes callback (the caller keeps it alive)."""
    address = ctypes.cast(cfunc, ctypes.c_void_p).value
    assert address is not None
    return address
