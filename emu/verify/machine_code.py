"""Hooks written in machine code: assembled with keystone on first use and mapped executable, so
that Unicorn calls them without entering Python (a ctypes callback costs ~1 us before the first
line of Python runs, and the verifiers' hooks fire on every probe hit).

A hook's source is AT&T text, one statement per line; it is called with Unicorn's arguments and
the hook's user data (System V: rdi, rsi, rdx, rcx, r8, r9) and must keep the callee-saved
registers and rsp's 16-byte alignment at its own calls.
"""

from __future__ import annotations

import ctypes
import functools
import mmap

_KEEP: list[mmap.mmap] = []  # mapped code lives as long as the process


@functools.cache
def mapped(source: str) -> int | None:
    """The address of ``source`` assembled and mapped executable (once per process); None where
    executable memory is refused or keystone is missing."""
    from emu.asm import AsmError, assemble

    try:
        code = assemble(";".join(line.strip() for line in source.strip().splitlines()))
        page = mmap.mmap(-1, max(mmap.PAGESIZE, len(code)), prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (AsmError, OSError):
        return None
    page.write(code)
    _KEEP.append(page)
    return ctypes.addressof(ctypes.c_char.from_buffer(page))
