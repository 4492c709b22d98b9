"""The vDSO and its data pages, mapped into every new process (arch_setup_additional_pages).

The image (emu/data/vdso.so, from fixtures/vdso/) exports clock_gettime, gettimeofday, time,
getcpu and clock_getres; they read the virtual clock from the first [vvar] page (clock.py has
the protocol). Each reading bumps a counter there, so the page is writable to the CPU although
/proc/pid/maps shows it r--p as Linux's: the one liberty taken (a guest store to [vvar] would
fault natively).
"""

from __future__ import annotations

import struct
from functools import cache
from pathlib import Path

from emu.abi import PAGE_SIZE, Prot
from emu.kernel.clock import VirtualClock
from emu.layout import (
    VDSO_BLOCK,
    VDSO_NAME,
    VVAR_NAME,
    VVAR_PAGES,
    VVAR_VCLOCK_NAME,
    VVAR_VCLOCK_PAGES,
)
from emu.memory import Memory

IMAGE = Path(__file__).resolve().parent.parent / "data" / "vdso.so"


@cache
def image() -> bytes:
    return IMAGE.read_bytes()


class VvarPage:
    """One process's clock page, as the clock reads and writes it."""

    def __init__(self, mem: Memory, start: int) -> None:
        self.mem = mem
        self.start = start

    def load(self, offset: int) -> int | None:
        vma = self.mem.find(self.start)
        if vma is None or vma.name != VVAR_NAME:
            return None  # unmapped (exec replaced the image, or the process unmapped it)
        return int(struct.unpack("<Q", self.mem.read(self.start + offset, 8))[0])

    def store(self, offset: int, value: int) -> None:
        vma = self.mem.find(self.start)
        if vma is not None and vma.name == VVAR_NAME:
            self.mem.write(self.start + offset, struct.pack("<Q", value & 0xFFFFFFFFFFFFFFFF))


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
    """Hook the [vvar] page of ``mem`` (new, or copied by fork) to the clock."""
    page = next((v.start for v in mem if v.name == VVAR_NAME), None)
    if page is None:
        return
    mem.backend.mem_protect(page, PAGE_SIZE, Prot.READ | Prot.WRITE)
    # an exec maps a new page, maybe where the old one was: the old one must not count twice
    clock.pages = [p for p in clock.pages if not (isinstance(p, VvarPage) and p.mem is mem)]
    clock.attach(VvarPage(mem, page))
