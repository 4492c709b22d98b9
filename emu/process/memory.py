"""The guest address space: VMAs that the CPU's page permissions enforce.

Pure bookkeeping over a :class:`MemoryBackend` (the CPU in a run, a bytearray in
unit tests). Every code write goes through :meth:`Memory.patch`, which checks the
old bytes first, as the kernel's ``verify_insn`` step does (spec 3.5).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable, Iterator

from emu.abi import MMAP_BASE, PAGE_SIZE, TASK_SIZE, Prot, page_down, page_up
from emu.errors import MapFailed, MemoryFault, PatchMismatch
from emu.process.layout import RLIMIT_STACK as STACK_LIMIT
from emu.process.layout import STACK_GUARD_GAP
from emu.process.vma import SPECIAL as SPECIAL  # re-exported: the mm syscalls read it with the list
from emu.process.vma import Backing, MemoryBackend, SharedPages, Vma

STACK_NAME = "[stack]"
STACK_PIECES_MAX = 32


class UserFault(Exception):
    """A kernel copy to or from user memory hit an address the guest may not use (EFAULT)."""

    def __init__(self, addr: int) -> None:
        super().__init__(f"bad user address {addr:#x}")
        self.addr = addr


class StringTooLong(UserFault):
    """``read_cstring`` found no NUL within its limit (Linux's getname() says ENAMETOOLONG)."""

    def __init__(self, addr: int, limit: int) -> None:
        super().__init__(addr)
        self.args = (f"no NUL within {limit} bytes of {addr:#x}",)
        self.limit = limit


class Memory:
    """VMA list plus the backend that holds the bytes."""

    def __init__(self, backend: MemoryBackend, mmap_base: int = MMAP_BASE) -> None:
        self.backend = backend
        self.mmap_base = mmap_base
        self._vmas: list[Vma] = []
        self.patch_observers: list[Callable[[int, bytes, bytes], None]] = []  # (addr, old, new) after each patch
        self.map_observers: list[Callable[[Vma], None]] = []  # each new mapping, after map()
        self.user_read_observers: list[Callable[[int, int], None]] = []  # (addr, size) the kernel copies from user
        self._starts: list[int] = []
        self.stack_limit = STACK_LIMIT  # RLIMIT_STACK: how far [stack] may grow down from its top
        self._stack_pieces = 0  # backend regions the stack grew by since it was last one region
        self.backings: list[Backing] = []  # the MAP_SHARED ranges, mapped from host memory other spaces map too

    # --------------------------------------------------------------- queries
    def __iter__(self) -> Iterator[Vma]:
        return iter(tuple(self._vmas))  # a snapshot: callers may change the map while iterating

    def __len__(self) -> int:
        return len(self._vmas)

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
        if length <= 0:
            return None
        top = page_down(min(self.mmap_base if below is None else below, TASK_SIZE))
        floor = max(page_up(above), PAGE_SIZE)
        i = bisect.bisect_left(self._starts, top) - 1  # the last VMA starting below top
        while i >= 0:
            vma = self._vmas[i]
            if vma.end <= top - length:
                break  # [top - length, top) lies above this VMA and below the previous one
            top = min(top, vma.start)
            i -= 1
        return top - length if top - length >= floor else None

    def find_free_above(self, length: int, start: int, limit: int) -> int | None:
        """Lowest page-aligned hole of ``length`` bytes in [start, limit), bottom-up."""
        length = page_up(length)
        if length <= 0:
            return None
        limit = min(limit, TASK_SIZE)
        addr = max(page_up(start), PAGE_SIZE)
        for vma in self.overlapping(addr, limit):
            if vma.start >= addr + length:
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
        backing: tuple[SharedPages, int] | None = None,
    ) -> Vma:
        """Map [start, start+length) (page-rounded), replacing whatever was there (MAP_FIXED).

        ``data`` is written at ``start`` (the rest of the pages read as zeros, unless ``backing``:
        then the pages are those host pages, from that offset, with whatever they hold). A backend
        that cannot map the range (too large for the host) raises :class:`MapFailed`.
        """
        lo, hi = page_down(start), page_up(start + length)
        if length <= 0 or not (0 < lo < hi <= TASK_SIZE):
            raise MemoryFault(f"cannot map {lo:#x}-{hi:#x}")
        self.unmap(lo, hi - lo)
        try:
            if backing is None:
                self.backend.mem_map(lo, hi - lo, prot)
            else:
                self._map_shared(Backing(lo, hi, *backing), prot)
        except Exception as exc:
            raise MapFailed(f"cannot map {lo:#x}-{hi:#x} ({hi - lo:#x} bytes): {exc}") from exc
        if data:
            self.backend.mem_write(start, bytes(data[: hi - start]))
        vma = Vma(lo, hi, prot, name, offset, dev, inode, shared, accounted=not shared and bool(prot & Prot.WRITE))
        self._insert(vma)
        self._coalesce(lo, hi)
        for observer in self.map_observers:
            observer(vma)
        return vma

    def copy_to(self, child: Memory, keep: Callable[[Vma], bool]) -> None:
        """fork's dup_mmap into an empty ``child``: every VMA ``keep`` accepts (the rest are VM_DONTCOPY),
        with its bytes, as private copies (an eager copy-on-write)."""
        child.mmap_base = self.mmap_base
        for vma in self._vmas:
            if keep(vma):
                pos = vma.start
                for b in sorted(self._backings_in(vma.start, vma.end) if vma.shared else [], key=lambda b: b.start):
                    self._copy_range(child, pos, b.start, vma.prot)
                    child._map_shared(b, vma.prot)  # the same host pages: each sees the other's stores, as on Linux
                    pos = b.end
                self._copy_range(child, pos, vma.end, vma.prot)  # private pages: an eager copy-on-write
                child._insert(vma)

    def _copy_range(self, child: Memory, lo: int, hi: int, prot: Prot) -> None:
        if lo < hi:
            child.backend.mem_map(lo, hi - lo, prot)
            child.backend.mem_write(lo, self.backend.mem_read(lo, hi - lo))

    def _backings_in(self, lo: int, hi: int) -> list[Backing]:
        """The shared pieces of [lo, hi), clipped to it."""
        out = []
        for b in self.backings:
            if b.start < hi and lo < b.end:
                start = max(b.start, lo)
                out.append(Backing(start, min(b.end, hi), b.pages, b.offset + start - b.start))
        return out

    def _map_shared(self, backing: Backing, prot: Prot) -> None:
        if backing.offset + backing.end - backing.start > backing.pages.size:
            raise MapFailed(f"{backing.start:#x}-{backing.end:#x} lies beyond its shared pages")
        self.backend.mem_map_shared(backing.start, backing.end - backing.start, prot, backing.pages, backing.offset)
        self.backings.append(backing)

    def backing_at(self, addr: int) -> tuple[SharedPages, int] | None:
        """The shared host pages at ``addr`` and the offset into them (a shared futex's key)."""
        for b in self.backings:
            if b.start <= addr < b.end:
                return b.pages, b.offset + addr - b.start
        return None

    def unmap_all(self) -> None:
        """execve's exec_mmap: the old address space goes, every mapping of it."""
        for vma in list(self._vmas):
            self.unmap(vma.start, vma.size)

    def unmap(self, start: int, length: int) -> None:
        start, end = page_down(start), page_up(start + length)
        if end <= start:
            return
        for vma in self._split(start, end):
            self._remove(vma)
            self.backend.mem_unmap(vma.start, vma.size)
        if self.backings:  # other address spaces keep their mappings of the host pages
            self.backings = [piece for b in self.backings for piece in
                             ((b,) if b.end <= start or end <= b.start else b.cut(start, end))]

    def protect(self, start: int, length: int, prot: Prot) -> bool:
        """mprotect: False (ENOMEM) if part of the range is unmapped."""
        start, end = page_down(start), page_up(start + length)
        if end <= start:
            return True
        covered = sum(min(v.end, end) - max(v.start, start) for v in self.overlapping(start, end))
        if covered != end - start:
            return False
        for vma in self._split(start, end):
            accounted = vma.accounted or (not vma.shared and bool(prot & Prot.WRITE))
            self._replace(vma, dataclasses.replace(vma, prot=prot, accounted=accounted))
            self.backend.mem_protect(vma.start, vma.size, prot)
        self._coalesce(start, end)
        return True

    def grow_stack(self, addr: int) -> bool:
        """expand_stack for a fault at ``addr`` below [stack]: True if the stack now covers it. Refused
        beyond the stack rlimit, or within the stack guard gap of the mapping below."""
        i = bisect.bisect_right(self._starts, addr)
        if i >= len(self._vmas) or self._vmas[i].name != STACK_NAME:
            return False
        stack = self._vmas[i]
        new_start = page_down(addr)
        if stack.end - new_start > self.stack_limit:
            return False
        below = self._vmas[i - 1] if i else None
        if below is not None and below.end + STACK_GUARD_GAP > new_start:
            return False
        self.map(new_start, stack.start - new_start, stack.prot, name=STACK_NAME)
        self._stack_pieces += 1
        grown = self.find(new_start)
        if self._stack_pieces >= STACK_PIECES_MAX and grown is not None and grown.end == stack.end:
            self._stack_pieces = 0
            self._one_region(new_start, stack.end, stack.prot)
        return True

    def _one_region(self, start: int, end: int, prot: Prot) -> None:
        """Make the backend hold [start, end) as one region again: Unicorn's mem_map costs grow with
        its number of regions, and a stack grows page by page."""
        data = self.backend.mem_read(start, end - start)
        self.backend.mem_unmap(start, end - start)
        self.backend.mem_map(start, end - start, prot)
        self.backend.mem_write(start, data)

    def sealed_in(self, start: int, end: int) -> bool:
        """Does any VMA overlapping [start, end) carry VM_SEALED?"""
        return any(v.sealed for v in self.overlapping(page_down(start), page_up(end)))

    def seal(self, start: int, end: int) -> None:
        """mseal's apply step over a range the caller checked is fully mapped."""
        for vma in self._split(start, end):
            self._replace(vma, dataclasses.replace(vma, sealed=True))
        self._coalesce(start, end)

    def rename(self, start: int, end: int, name: str) -> None:
        """Name the mapped parts of [start, end) (like PR_SET_VMA_ANON_NAME); splits VMAs at the edges."""
        start, end = page_down(start), page_up(end)
        if end <= start:
            return
        for vma in self._split(start, end):
            self._replace(vma, dataclasses.replace(vma, name=name))
        self._coalesce(start, end)

    def _split(self, start: int, end: int) -> list[Vma]:
        """Split the VMAs that straddle ``start`` or ``end``; return those now inside [start, end)."""
        inside = []
        for vma in self.overlapping(start, end):
            lo, hi = max(vma.start, start), min(vma.end, end)
            if (lo, hi) != (vma.start, vma.end):
                self._remove(vma)
                if vma.start < lo:
                    self._insert(vma.slice(vma.start, lo))
                if hi < vma.end:
                    self._insert(vma.slice(hi, vma.end))
                vma = vma.slice(lo, hi)
                self._insert(vma)
            inside.append(vma)
        return inside

    def _index(self, vma: Vma) -> int:
        i = bisect.bisect_left(self._starts, vma.start)
        if i == len(self._vmas) or self._vmas[i] != vma:
            raise AssertionError(f"VMA {vma} is not in the list")
        return i

    def _insert(self, vma: Vma) -> None:
        i = bisect.bisect_left(self._starts, vma.start)
        self._vmas.insert(i, vma)
        self._starts.insert(i, vma.start)

    def _remove(self, vma: Vma) -> None:
        i = self._index(vma)
        del self._vmas[i]
        del self._starts[i]

    def _replace(self, old: Vma, new: Vma) -> None:
        assert (old.start, old.end) == (new.start, new.end)
        self._vmas[self._index(old)] = new

    def _coalesce(self, start: int, end: int) -> None:
        """Merge compatible neighbours among the VMAs touching [start, end], as Linux's vma_merge
        does: /proc/self/maps shows one line for them."""
        i = max(bisect.bisect_right(self._starts, start) - 2, 0)
        while i + 1 < len(self._vmas) and self._vmas[i].start <= end:
            left, right = self._vmas[i], self._vmas[i + 1]
            if left.continues(right):
                self._vmas[i] = dataclasses.replace(left, end=right.end)
                del self._vmas[i + 1]
                del self._starts[i + 1]
            else:
                i += 1

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
        """access_ok plus the page walk: :class:`UserFault` at the first byte not mapped with ``need``."""
        if size < 0 or addr < 0:
            raise UserFault(addr)
        end = addr + size
        pos = addr
        bits = int(need)  # plain ints: enum.Flag's __and__ is a Python call on this hot path
        while pos < end:
            vma = self.find(pos)
            if vma is None and self.grow_stack(pos):  # a kernel copy onto the stack grows it too
                vma = self.find(pos)
            if vma is None or not (int(vma.prot) & bits):
                raise UserFault(pos)
            pos = vma.end

    def read_user(self, addr: int, size: int) -> bytes:
        """copy_from_user: EFAULT (:class:`UserFault`) unless every byte is readable."""
        if size == 0:
            return b""
        self.check_user(addr, size, Prot.READ)
        for observer in self.user_read_observers:
            observer(addr, size)
        return self.backend.mem_read(addr, size)

    def write_user(self, addr: int, data: bytes) -> None:
        """copy_to_user: EFAULT (:class:`UserFault`) unless every byte is writable."""
        if not data:
            return
        self.check_user(addr, len(data), Prot.WRITE)
        self.backend.mem_write(addr, data)

    def read_cstring(self, addr: int, limit: int = 4096) -> bytes:
        """strncpy_from_user: a NUL-terminated string of fewer than ``limit`` bytes.

        :class:`UserFault` if an unreadable byte comes before the NUL; :class:`StringTooLong`
        (a UserFault) if ``limit`` bytes hold no NUL.
        """
        start = addr
        out = bytearray()
        while len(out) < limit:
            vma = self.find(addr)
            if vma is None or not (vma.prot & Prot.READ):
                raise UserFault(addr)
            chunk = self.backend.mem_read(addr, min(vma.end - addr, 256, limit - len(out)))
            nul = chunk.find(0)
            for observer in self.user_read_observers:
                observer(addr, len(chunk) if nul < 0 else nul + 1)
            if nul >= 0:
                return bytes(out + chunk[:nul])
            out += chunk
            addr += len(chunk)
        raise StringTooLong(start, limit)

    def patch(self, addr: int, expect: bytes, new: bytes) -> None:
        """Write code bytes after checking the current ones; drop translated code for the range.

        Ignores page protection (the kernel writes text through FOLL_FORCE); :class:`PatchMismatch`
        if the current bytes are not ``expect`` (nothing is written then).
        """
        current = self.read(addr, len(expect))
        if current != expect:
            raise PatchMismatch(f"at {addr:#x}: expected {expect.hex()} found {current.hex()}")
        old = self.read(addr, len(new))
        self.write(addr, new)
        self.backend.flush_code(addr, addr + len(new))
        for observer in self.patch_observers:
            observer(addr, old, new)

    # ---------------------------------------------------------------- procfs
    def maps_text(self) -> str:
        return "".join(vma.maps_line() + "\n" for vma in self._vmas)
