"""A minimal static x86-64 ELF executable: two PT_LOAD segments (code r-x, data rw-) and
PT_GNU_STACK, no sections. It runs on a real Linux kernel and loads in the harness."""

from __future__ import annotations

import os
import struct

from emu.fuzz import layout as L

EHDR_SIZE, PHDR_SIZE = 64, 56
PF_X, PF_W, PF_R = 1, 2, 4
PT_LOAD, PT_GNU_STACK = 1, 0x6474E551
PAGE = 0x1000


def _ehdr(entry: int, phnum: int) -> bytes:
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # 64-bit, little endian, version 1, SysV
    return ident + struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, entry, EHDR_SIZE, 0, 0, EHDR_SIZE, PHDR_SIZE, phnum,
                               64, 0, 0)


def _phdr(kind: int, flags: int, offset: int, vaddr: int, size: int) -> bytes:
    return struct.pack("<IIQQQQQQ", kind, flags, offset, vaddr, vaddr, size, size, PAGE if kind == PT_LOAD else 16)


CODE_FILE_OFFSET = PAGE


def file_offset(address: int) -> int:
    """The file offset of a code address (what perf_event_open's uprobe PMU and bpftrace want)."""
    return CODE_FILE_OFFSET + address - L.CODE_BASE


def elf_image(code: bytes, data: bytes) -> bytes:
    """Code at layout.CODE_BASE (padded to CODE_SIZE), data at layout.DATA_BASE (DATA_SIZE)."""
    if len(code) > L.CODE_SIZE or len(data) > L.DATA_SIZE:
        raise ValueError("program larger than the layout's segments")
    code_off, data_off = CODE_FILE_OFFSET, CODE_FILE_OFFSET + L.CODE_SIZE
    headers = _ehdr(L.CODE_BASE, 3) + b"".join((
        _phdr(PT_LOAD, PF_R | PF_X, code_off, L.CODE_BASE, L.CODE_SIZE),
        _phdr(PT_LOAD, PF_R | PF_W, data_off, L.DATA_BASE, L.DATA_SIZE),
        _phdr(PT_GNU_STACK, PF_R | PF_W, 0, 0, 0),
    ))
    return headers.ljust(PAGE, b"\0") + code.ljust(L.CODE_SIZE, b"\xcc") + data.ljust(L.DATA_SIZE, b"\0")


def write_elf(path: str, code: bytes, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(elf_image(code, data))
    os.chmod(path, 0o755)
