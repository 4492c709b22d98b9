"""The pieces of an address space: a VMA, the bytes shared between processes behind one, and the
mappings the kernel installs itself (emu/process/memory.py keeps the list)."""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from emu.abi import Prot, page_up


class MemoryBackend(Protocol):
    def mem_map(self, addr: int, size: int, prot: Prot) -> None: ...
    def mem_unmap(self, addr: int, size: int) -> None: ...
    def mem_protect(self, addr: int, size: int, prot: Prot) -> None: ...
    def mem_read(self, addr: int, size: int) -> bytes: ...
    def mem_write(self, addr: int, data: bytes) -> None: ...
    def flush_code(self, begin: int, end: int) -> None: ...
    def mem_map_shared(self, addr: int, size: int, prot: Prot, pages: SharedPages, offset: int) -> None: ...


class WatchedBackend:
    """A backend that reports each write before passing it on (a verifier seeing the fake kernel's
    copy_to_user before it lands); every other operation is the wrapped backend's own bound method."""

    def __init__(self, backend: MemoryBackend, on_write: Callable[[int, bytes], None]) -> None:  # (address, bytes)
        self.backend, self.on_write = backend, on_write
        self.mem_read: Callable[[int, int], bytes] = backend.mem_read
        self.mem_map: Callable[[int, int, Prot], None] = backend.mem_map
        self.mem_unmap: Callable[[int, int], None] = backend.mem_unmap
        self.mem_protect: Callable[[int, int, Prot], None] = backend.mem_protect
        self.flush_code: Callable[[int, int], None] = backend.flush_code
        self.mem_map_shared: Callable[[int, int, Prot, SharedPages, int], None] = backend.mem_map_shared

    def mem_write(self, addr: int, data: bytes) -> None:
        self.on_write(addr, data)
        self.backend.mem_write(addr, data)


class SharedPages:
    """Host memory behind MAP_SHARED mappings: every address space that maps it (fork children, other
    processes mapping the same file) maps these very bytes, so a store by one is seen by all at once."""

    def __init__(self, size: int) -> None:
        self.size = page_up(size)
        self.buf = mmap.mmap(-1, self.size)
        self._view = ctypes.c_char.from_buffer(self.buf)  # an export: the buffer can never be closed under an engine
        self.address = ctypes.addressof(self._view)
        self.wakes: dict[int, int] = {}  # FUTEX_WAKEs so far of a shared futex word, by its offset here


@dataclass(frozen=True, slots=True)
class Backing:
    """[start, end) of an address space is ``pages`` from byte ``offset`` on."""

    start: int
    end: int
    pages: SharedPages
    offset: int

    def cut(self, lo: int, hi: int) -> list[Backing]:
        """What remains outside [lo, hi)."""
        out = []
        if self.start < lo:
            out.append(Backing(self.start, min(self.end, lo), self.pages, self.offset))
        if hi < self.end:
            start = max(self.start, hi)
            out.append(Backing(start, self.end, self.pages, self.offset + start - self.start))
        return out


@dataclass(frozen=True, slots=True)
class Vma:
    """One line of /proc/self/maps."""

    start: int
    end: int
    prot: Prot
    name: str = ""
    offset: int = 0
    dev: tuple[int, int] = (0, 0)
    inode: int = 0
    shared: bool = False
    # VM_ACCOUNT: set once a private mapping has been writable (at mmap or by mprotect) and never
    # cleared. Linux does not merge accounted with unaccounted VMAs: that is why a RELRO region made
    # read-only stays a separate line next to the read-only segment before it.
    accounted: bool = False
    sealed: bool = False  # VM_SEALED (mseal): munmap, mprotect, mremap and MAP_FIXED over it are EPERM

    def __contains__(self, addr: int) -> bool:
        return self.start <= addr < self.end

    @property
    def size(self) -> int:
        return self.end - self.start

    def perms(self) -> str:
        return (
            ("r" if self.prot & Prot.READ else "-")
            + ("w" if self.prot & Prot.WRITE else "-")
            + ("x" if self.prot & Prot.EXEC else "-")
            + ("s" if self.shared else "p")
        )

    def maps_line(self) -> str:
        """This VMA as Linux's show_map_vma() prints it: the header ends in a space; a name is padded
        to start at column 73 (seq_setwidth(25 + 6 * sizeof(void *) - 1), then seq_pad(' '))."""
        head = (
            f"{self.start:08x}-{self.end:08x} {self.perms()} {self.offset:08x} "
            f"{self.dev[0]:02x}:{self.dev[1]:02x} {self.inode} "
        )
        if not self.name:
            return head
        return head.ljust(72) + " " + self.name

    @property
    def is_file(self) -> bool:
        """Backed by a file (anonymous mappings show offset 0, device 00:00, inode 0)."""
        return bool(self.inode or self.dev != (0, 0) or self.offset)

    def slice(self, start: int, end: int) -> Vma:
        """The part [start, end) of this VMA, with the file offset moved along (anonymous: stays 0)."""
        offset = self.offset + (start - self.start) if self.is_file else self.offset
        return dataclasses.replace(self, start=start, end=end, offset=offset)

    def continues(self, other: Vma) -> bool:
        """True if ``other`` starts where this one ends and could be one VMA with it."""
        if other.start != self.end:
            return False
        if (self.prot, self.name, self.dev, self.inode, self.shared, self.accounted, self.sealed) != (
            other.prot, other.name, other.dev, other.inode, other.shared, other.accounted, other.sealed,
        ) or self.name in SPECIAL:
            return False
        return not self.is_file or other.offset == self.offset + self.size


@dataclass(frozen=True, slots=True)
class Special:
    """A mapping the kernel installs itself (_install_special_mapping): what the mm syscalls and
    /proc/pid/mem may do to it (docs/linux-6.18-observed.md section 8, "Trampoline VMA operations")."""

    may: Prot  # VM_MAYREAD/WRITE/EXEC: mprotect asking for more is EACCES
    movable: bool  # mremap may move it (the trampoline's vm_special_mapping.mremap refuses: EPERM)
    io: bool  # no pages behind it for get_user_pages (VM_IO / VM_PFNMAP): /proc/pid/mem gives EIO


# Every special mapping is VM_DONTEXPAND (mremap growing it: EFAULT) and is never merged.
SPECIAL: dict[str, Special] = {
    "[uprobes-trampoline]": Special(Prot.READ | Prot.EXEC, movable=False, io=True),
    "[uprobes]": Special(Prot.EXEC, movable=True, io=True),
    "[vvar]": Special(Prot.READ, movable=False, io=True),
    "[vvar_vclock]": Special(Prot.READ, movable=False, io=True),
    "[vdso]": Special(Prot.READ | Prot.WRITE | Prot.EXEC, movable=True, io=False),
}
KERNEL_SIDE = frozenset({"[uprobes-trampoline]", "[uprobes]"})  # the special mappings uprobes run code in
