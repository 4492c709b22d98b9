"""Maps a LoadPlan into guest memory the way binfmt_elf's elf_load() does.

Per PT_LOAD: whole file pages (the bytes past p_filesz up to the page end are the
file's, as mmap shows them), then, if p_memsz > p_filesz, padzero() of the rest of
the last file page and an anonymous rw mapping for the remaining bss pages.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from emu.abi import PAGE_SIZE, TASK_SIZE, Prot, page_down, page_up
from emu.errors import LoadError, MemoryFault
from emu.process.elf import LoadPlan, Segment
from emu.process.memory import Memory


@dataclass(frozen=True, slots=True)
class LoadedImage:
    plan: LoadPlan
    bias: int

    @property
    def entry(self) -> int:
        """e_entry plus the load bias, wrapping as the kernel's unsigned long sum does."""
        return (self.plan.entry + self.bias) & ((1 << 64) - 1)

    @property
    def phdr(self) -> int:
        return self.plan.phdr_address(self.bias)

    def vaddr_of_offset(self, offset: int) -> int | None:
        """Where file offset ``offset`` is mapped (None: not in any PT_LOAD's file bytes)."""
        for seg in self.plan.segments:
            if seg.offset <= offset < seg.offset + seg.filesz:
                return seg.vaddr + (offset - seg.offset) + self.bias
        return None

    @property
    def end(self) -> int:
        """End of the highest segment (where brk starts)."""
        return self.plan.high + self.bias


def choose_bias(memory: Memory, plan: LoadPlan, fixed_base: int | None) -> int:
    """ET_EXEC loads where linked; ET_DYN at ``fixed_base`` or in the top-down mmap area."""
    if not plan.is_dyn:
        return 0
    span = page_up(plan.high) - plan.low
    if fixed_base is not None:
        return page_down(fixed_base) - plan.low
    base = memory.find_free(span)
    if base is None:
        raise LoadError(plan.file.path, f"no room in the address space for {span:#x} bytes")
    return base - plan.low


def map_image(memory: Memory, plan: LoadPlan, bias: int, *, name: str | None = None) -> LoadedImage:
    """Map every PT_LOAD; refuse segments that collide with something already mapped.

    The file mappings are named ``name`` in /proc/self/maps; by default the file's canonical
    absolute path, as Linux's d_path() shows it (a caller with a guest root passes the guest path).
    """
    path = plan.file.path
    low, high = plan.low + bias, page_up(plan.high + bias)
    if low < PAGE_SIZE or high > TASK_SIZE:
        raise LoadError(path, f"segments at {low:#x}-{high:#x} fall outside the user address space")
    if not memory.is_free(low, high):
        raise LoadError(path, f"segments at {low:#x}-{high:#x} overlap an existing mapping")
    label = os.path.realpath(path) if name is None else name
    # Linux maps segment after segment, each MAP_FIXED over the pages of the ones before. Work out
    # the final layout first and map each piece once: replacing part of a large Unicorn region
    # copies the whole region (seconds, and gigabytes of RSS, for a mutated multi-GiB p_memsz).
    pieces: list[_Piece] = []
    for seg in plan.segments:
        for piece in _segment_pieces(plan, seg, bias):
            pieces = _paint(pieces, piece)
    for piece in pieces:
        try:
            if piece.offset is None:
                memory.map(piece.start, piece.size, piece.prot)
            else:
                memory.map(piece.start, piece.size, piece.prot, name=label, offset=piece.offset,
                           dev=plan.file.dev, inode=plan.file.inode, data=piece.data)
        except MemoryFault as exc:
            raise LoadError(path, f"segment at {piece.start:#x}: {exc}") from None
    return LoadedImage(plan, bias)


@dataclass(frozen=True, slots=True)
class _Piece:
    """Pages [start, end) with one protection: file-backed from ``offset``, or anonymous (None)."""

    start: int
    end: int
    prot: Prot
    offset: int | None
    data: bytes  # the contents from ``start``; shorter than the piece: the rest reads as zeros

    @property
    def size(self) -> int:
        return self.end - self.start

    def cut(self, start: int, end: int) -> _Piece:
        skip = start - self.start
        offset = None if self.offset is None else self.offset + skip
        return _Piece(start, end, self.prot, offset, self.data[skip : skip + (end - start)])


def _paint(pieces: list[_Piece], new: _Piece) -> list[_Piece]:
    """``pieces`` with ``new`` mapped over them (MAP_FIXED): what it covers is gone."""
    out = [new]
    for old in pieces:
        if old.end <= new.start or old.start >= new.end:
            out.append(old)
            continue
        if old.start < new.start:
            out.append(old.cut(old.start, new.start))
        if new.end < old.end:
            out.append(old.cut(new.end, old.end))
    return sorted(out, key=lambda p: p.start)


def _segment_pieces(plan: LoadPlan, seg: Segment, bias: int) -> list[_Piece]:
    """What elf_load() maps for one PT_LOAD."""
    if seg.memsz == 0:
        return []  # elf_load() maps nothing for an empty segment
    vaddr = seg.vaddr + bias
    start = page_down(vaddr)
    pieces = []
    anon_start = start
    if seg.filesz:
        file_start = seg.offset - (vaddr - start)
        file_map_end = page_up(vaddr + seg.filesz)
        data = plan.data[file_start : file_start + (file_map_end - start)]
        # padzero() clears the rest of the last file page, but Linux ignores its failure on a
        # read-only page: then the file's bytes stay visible there.
        if seg.memsz > seg.filesz and seg.prot & Prot.WRITE:
            data = data[: vaddr + seg.filesz - start]
        pieces.append(_Piece(start, file_map_end, seg.prot, file_start, data))
        anon_start = file_map_end
    anon_end = page_up(vaddr + seg.memsz)
    if seg.memsz > seg.filesz and anon_end > anon_start:
        # vm_brk_flags(): the bss pages are anonymous, always rw, executable only if the segment is.
        pieces.append(_Piece(anon_start, anon_end, Prot.READ | Prot.WRITE | (seg.prot & Prot.EXEC), None, b""))
    return pieces
