"""The vDSO and its data pages, mapped into every new process (arch_setup_additional_pages).

The image (emu/data/vdso.so, from fixtures/vdso/) exports clock_gettime, gettimeofday, time,
getcpu and clock_getres; they read the virtual clock from the first [vvar] page. Every reading goes
through one routine of the image, ``reading``; a code hook there (emu/process/timekeeping.py) writes the
clock's time, with the reading's tick, into the page just before the routine reads it, so the vDSO
sees the instructions run so far as a clock_gettime syscall does (to a translated block: the counter
counts a block as it starts). The page's tick is 0: the routine's own count of readings adds nothing.
The routine bumps that count, so the page is writable to the CPU although /proc/pid/maps shows it
r--p as Linux's: the one liberty taken (a guest store to [vvar] would fault natively).
"""

from __future__ import annotations

import struct
from functools import cache
from pathlib import Path

from emu.abi import PAGE_SIZE, Prot
from emu.kernel.clock import VirtualClock
from emu.process.layout import (
    VDSO_BLOCK,
    VDSO_NAME,
    VVAR_NAME,
    VVAR_PAGES,
    VVAR_VCLOCK_NAME,
    VVAR_VCLOCK_PAGES,
)
from emu.process.memory import Memory

IMAGE = Path(__file__).resolve().parent.parent / "data" / "vdso.so"
# [vvar] (fixtures/vdso/vdso.S): the start times, the elapsed ns, the routine's count of readings, the
# ns each reading adds to it, the cpu getcpu reports
VV_REALTIME, VV_MONOTONIC, VV_ELAPSED, VV_READINGS, VV_TICK, VV_CPU = 0, 8, 16, 24, 32, 40
SHT_SYMTAB = 2
VVAR_BEFORE_VDSO = (VVAR_PAGES + VVAR_VCLOCK_PAGES) * PAGE_SIZE  # where [vvar] is, below the image


@cache
def image() -> bytes:
    return IMAGE.read_bytes()


@cache
def reading_offset() -> int:
    """Where the image's ``reading`` routine starts, from the image's start (its .symtab; read with
    struct here: a plain run imports no ELF library)."""
    data = image()
    shoff, shentsize, shnum = struct.unpack_from("<Q", data, 0x28)[0], *struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != SHT_SYMTAB:
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, entsize):
            name, _st_info, _other, _shndx, value, _size = struct.unpack_from("<IBBHQQ", data, at)
            if data[strings + name : data.index(b"\0", strings + name)] == b"reading":
                return int(value)
    raise RuntimeError(f"{IMAGE} has no 'reading' symbol: rebuild it (make -C fixtures vdso)")


def write_elapsed(mem: Memory, vdso: int, elapsed: int) -> None:
    """A reading's elapsed time into the [vvar] page of the image at ``vdso`` (nothing if the process
    unmapped the page: the routine's load then faults, as Linux's would)."""
    page = vdso - VVAR_BEFORE_VDSO
    vma = mem.find(page)
    if vma is not None and vma.name == VVAR_NAME:
        mem.write(page + VV_ELAPSED, struct.pack("<Q", elapsed & 0xFFFFFFFFFFFFFFFF))


def map_vdso(mem: Memory, clock: VirtualClock) -> int:
    """Map [vvar], [vvar_vclock] and [vdso] in one block top-down (below the interpreter, if any)
    and return the vDSO's address (AT_SYSINFO_EHDR)."""
    start = mem.find_free(VDSO_BLOCK)
    if start is None:
        raise MemoryError("no room for the vDSO")
    vclock = start + VVAR_PAGES * PAGE_SIZE
    vdso = vclock + VVAR_VCLOCK_PAGES * PAGE_SIZE
    mem.map(start, VVAR_PAGES * PAGE_SIZE, Prot.READ, name=VVAR_NAME)
    mem.map(vclock, VVAR_VCLOCK_PAGES * PAGE_SIZE, Prot.READ, name=VVAR_VCLOCK_NAME)
    mem.map(vdso, start + VDSO_BLOCK - vdso, Prot.READ | Prot.EXEC, name=VDSO_NAME, data=image())
    adopt(mem, clock)
    return vdso


def adopt(mem: Memory, clock: VirtualClock) -> None:
    """Fill the [vvar] page of ``mem`` (new, or copied by fork): the start times, and a tick of 0."""
    page = next((v.start for v in mem if v.name == VVAR_NAME), None)
    if page is None:
        return
    mem.backend.mem_protect(page, PAGE_SIZE, Prot.READ | Prot.WRITE)
    for offset, value in ((VV_REALTIME, clock.realtime_start), (VV_MONOTONIC, clock.monotonic_start),
                          (VV_ELAPSED, clock.elapsed), (VV_TICK, 0)):
        mem.write(page + offset, struct.pack("<Q", value))
