"""Maps a LoadPlan into guest memory the way binfmt_elf does (file pages, then zeroed bss)."""

from __future__ import annotations

from dataclasses import dataclass

from emu.abi import Prot, page_down, page_up
from emu.elf import LoadPlan
from emu.errors import LoadError
from emu.memory import Memory


@dataclass(frozen=True, slots=True)
class LoadedImage:
    plan: LoadPlan
    bias: int

    @property
    def entry(self) -> int:
        return self.plan.entry + self.bias

    @property
    def phdr(self) -> int:
        return self.plan.phdr_address(self.bias)

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
        raise LoadError(plan.file.path, "no room in the address space")
    return base - plan.low


def map_image(memory: Memory, plan: LoadPlan, bias: int) -> LoadedImage:
    """Map every PT_LOAD; refuse segments that collide with something already mapped."""
    low, high = plan.low + bias, page_up(plan.high + bias)
    if not memory.is_free(low, high):
        raise LoadError(plan.file.path, f"segments at {low:#x}-{high:#x} overlap an existing mapping")
    for seg in plan.segments:
        _map_segment(memory, plan, seg.vaddr + bias, seg.memsz, seg.offset, seg.filesz, seg.prot)
    return LoadedImage(plan, bias)


def _map_segment(memory: Memory, plan: LoadPlan, vaddr: int, memsz: int, offset: int, filesz: int, prot: Prot) -> None:
    start = page_down(vaddr)
    file_start = offset - (vaddr - start)
    file_end = offset + filesz
    file_map_end = page_up(vaddr + filesz) if filesz else start
    if file_map_end > start:
        data = bytearray(plan.data[file_start:file_end])
        memory.map(
            start,
            file_map_end - start,
            prot,
            name=plan.file.path,
            offset=file_start,
            dev=plan.file.dev,
            inode=plan.file.inode,
            data=bytes(data),
        )
    anon_end = page_up(vaddr + memsz)
    if anon_end > max(file_map_end, start):
        anon_start = max(file_map_end, start)
        memory.map(anon_start, anon_end - anon_start, prot)
