"""The guest address space: VMAs that the CPU's page permissions enforce.

Pure bookkeeping over a :class:`MemoryBackend` (the CPU in a run, a bytearray in
unit tests). Every code write goes through :meth:`Memory.patch`, which checks the
old bytes first, as the kernel's ``verify_insn`` step does (spec 3.5).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from emu.abi import MMAP_BASE, PAGE_SIZE, TASK_SIZE, Prot, page_down, page_up
from emu.errors import MemoryFault, PatchMismatch


class MemoryBackend(Protocol):
    def mem_map(self, addr: int, size: int, prot: Prot) -> None: ...
    def mem_unmap(self, addr: int, size: int) -> None: ...
    def mem_protect(self, addr: int, size: int, prot: Prot) -> None: ...
    def mem_read(self, addr: int, size: int) -> bytes: ...
    def mem_write(self, addr: int, data: bytes) -> None: ...
    def flush_code(self, begin: int, end: int) -> None: ...


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
        head = (
            f"{self.start:08x}-{self.end:08x} {self.perms()} {self.offset:08x} "
            f"{self.dev[0]:02x}:{self.dev[1]:02x} {self.inode}"
        )
        if not self.name:
            return head
        return head.ljust(73) + self.name

    def slice(self, start: int, end: int) -> Vma:
        """The part [start, end) of this VMA, with the file offset moved along."""
        offset = self.offset + (start - self.start) if self.inode else self.offset
        return dataclasses.replace(self, start=start, end=end, offset=offset)

    def continues(self, other: Vma) -> bool:
        """True if ``other`` starts where this one ends and could be one VMA with it."""
        if other.start != self.end or (self.prot, self.name, self.dev, self.inode, self.shared) != (
            other.prot, other.name, other.dev, other.inode, other.shared,
        ):
            return False
        return not self.inode or other.offset == self.offset + self.size


class UserFault(Exception):
    """A kernel copy to or from user memory hit an address the guest may not use (EFAULT)."""

    def __init__(self, addr: int) -> None:
        super().__init__(f"bad user address {addr:#x}")
        self.addr = addr


class Memory:
    """VMA list plus the backend that holds the bytes."""

    def __init__(self, backend: MemoryBackend, mmap_base: int = MMAP_BASE) -> None:
        self.backend = backend
        self.mmap_base = mmap_base
        self._vmas: list[Vma] = []
        self._starts: list[int] = []

    # --------------------------------------------------------------- queries
    def __iter__(self) -> Iterator[Vma]:
        return iter(self._vmas)

    def find(self, addr: int) -> Vma | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self._vmas[i].end:
            return self._vmas[i]
        return None

    def overlapping(self, start: int, end: int) -> list[Vma]:
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        out = []
        for vma in self._vmas[i:]:
            if vma.start >= end:
                break
            if vma.end > start:
                out.append(vma)
        return out

    def is_free(self, start: int, end: int) -> bool:
        return not self.overlapping(start, end)

    def find_free(self, length: int, *, below: int | None = None, above: int = PAGE_SIZE) -> int | None:
        """Highest page-aligned hole of ``length`` bytes in [above, below), top-down like Linux's mmap."""
        length = page_up(length)
        top = self.mmap_base if below is None else below
        for vma in reversed(self._vmas):
            if vma.start >= top:
                continue
            if vma.end <= top - length:
                break
            top = vma.start
        return top - length if top - length >= above else None

    def find_free_above(self, length: int, start: int, limit: int) -> int | None:
        """Lowest page-aligned hole of ``length`` bytes in [start, limit), bottom-up."""
        addr = page_up(start)
        for vma in self.overlapping(addr, limit):
            if vma.start - addr >= length:
                break
            addr = max(addr, vma.end)
        return addr if addr + length <= limit else None

    # --------------------------------------------------------------- changes
    def map(
        self,
        start: int,
        length: int,
        prot: Prot,
        *,
        name: str = "",
        offset: int = 0,
        dev: tuple[int, int] = (0, 0),
        inode: int = 0,
        shared: bool = False,
        data: bytes = b"",
    ) -> Vma:
        """Map [start, start+length) (page-rounded), replacing whatever was there (MAP_FIXED)."""
        start, end = page_down(start), page_up(start + length)
        if not (0 < start < end <= TASK_SIZE):
            raise MemoryFault(f"cannot map {start:#x}-{end:#x}")
        self.unmap(start, end - start)
        vma = Vma(start, end, prot, name, offset, dev, inode, shared)
        self.backend.mem_map(start, end - start, prot)
        if data:
            self.backend.mem_write(start, data[: end - start])
        self._insert(vma)
        return vma

    def unmap(self, start: int, length: int) -> None:
        start, end = page_down(start), page_up(start + length)
        for vma in self.overlapping(start, end):
            self._remove(vma)
            lo, hi = max(vma.start, start), min(vma.end, end)
            self.backend.mem_unmap(lo, hi - lo)
            if vma.start < lo:
                self._insert(vma.slice(vma.start, lo), merge=False)
            if hi < vma.end:
                self._insert(vma.slice(hi, vma.end), merge=False)

    def protect(self, start: int, length: int, prot: Prot) -> bool:
        """mprotect: False (ENOMEM) if part of the range is unmapped."""
        start, end = page_down(start), page_up(start + length)
        covered = sum(min(v.end, end) - max(v.start, start) for v in self.overlapping(start, end))
        if covered != end - start:
            return False
        for vma in self.overlapping(start, end):
            lo, hi = max(vma.start, start), min(vma.end, end)
            self._remove(vma)
            if vma.start < lo:
                self._insert(vma.slice(vma.start, lo), merge=False)
            if hi < vma.end:
                self._insert(vma.slice(hi, vma.end), merge=False)
            self._insert(dataclasses.replace(vma.slice(lo, hi), prot=prot))
            self.backend.mem_protect(lo, hi - lo, prot)
        return True

    def rename(self, start: int, end: int, name: str) -> None:
        for vma in self.overlapping(start, end):
            self._remove(vma)
            self._insert(dataclasses.replace(vma, name=name))

    def _insert(self, vma: Vma, merge: bool = True) -> None:
        i = bisect.bisect_left(self._starts, vma.start)
        self._vmas.insert(i, vma)
        self._starts.insert(i, vma.start)
        if merge:
            self._merge_around(i)

    def _remove(self, vma: Vma) -> None:
        i = self._vmas.index(vma)
        del self._vmas[i]
        del self._starts[i]

    def _merge_around(self, i: int) -> None:
        # Linux merges compatible neighbours; /proc/self/maps shows one line for them.
        if i + 1 < len(self._vmas) and self._vmas[i].continues(self._vmas[i + 1]):
            merged = dataclasses.replace(self._vmas[i], end=self._vmas[i + 1].end)
            del self._vmas[i + 1], self._starts[i + 1]
            self._vmas[i] = merged
        if i > 0 and self._vmas[i - 1].continues(self._vmas[i]):
            merged = dataclasses.replace(self._vmas[i - 1], end=self._vmas[i].end)
            del self._vmas[i], self._starts[i]
            self._vmas[i - 1] = merged

    # ---------------------------------------------------------------- access
    def read(self, addr: int, size: int) -> bytes:
        """Raw read (the harness's own view; no permission check)."""
        try:
            return self.backend.mem_read(addr, size)
        except Exception as exc:
            raise MemoryFault(f"harness read of unmapped {addr:#x}+{size}") from exc

    def write(self, addr: int, data: bytes) -> None:
        """Raw write (loader, kernel-internal); no permission check."""
        try:
            self.backend.mem_write(addr, data)
        except Exception as exc:
            raise MemoryFault(f"harness write to unmapped {addr:#x}+{len(data)}") from exc

    def check_user(self, addr: int, size: int, need: Prot) -> None:
        end = addr + size
        pos = addr
        while pos < end:
            vma = self.find(pos)
            if vma is None or not (vma.prot & need):
                raise UserFault(pos)
            pos = vma.end

    def read_user(self, addr: int, size: int) -> bytes:
        """copy_from_user: EFAULT (:class:`UserFault`) unless every byte is readable."""
        if size == 0:
            return b""
        self.check_user(addr, size, Prot.READ)
        return self.backend.mem_read(addr, size)

    def write_user(self, addr: int, data: bytes) -> None:
        """copy_to_user: EFAULT (:class:`UserFault`) unless every byte is writable."""
        if not data:
            return
        self.check_user(addr, len(data), Prot.WRITE)
        self.backend.mem_write(addr, data)

    def read_cstring(self, addr: int, limit: int = 4096) -> bytes:
        """strncpy_from_user: a NUL-terminated string of at most ``limit`` bytes."""
        out = bytearray()
        while len(out) < limit:
            vma = self.find(addr)
            if vma is None or not (vma.prot & Prot.READ):
                raise UserFault(addr)
            chunk = self.backend.mem_read(addr, min(vma.end - addr, 256, limit - len(out)))
            nul = chunk.find(0)
            if nul >= 0:
                return bytes(out + chunk[:nul])
            out += chunk
            addr += len(chunk)
        raise UserFault(addr)

    def patch(self, addr: int, expect: bytes, new: bytes) -> None:
        """Write code bytes after checking the current ones; drop translated code for the range."""
        current = self.read(addr, len(expect))
        if current != expect:
            raise PatchMismatch(f"at {addr:#x}: expected {expect.hex()} found {current.hex()}")
        self.write(addr, new)
        self.backend.flush_code(addr, addr + len(new))

    # ---------------------------------------------------------------- procfs
    def maps_text(self) -> str:
        return "".join(vma.maps_line() + "\n" for vma in self._vmas)
