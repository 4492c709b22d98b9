"""emu.process.memory without Unicorn: VMAs over a fake page backend.

The backend below behaves like Unicorn where it matters (refuses to map over a
mapping or to touch unmapped pages, refuses absurd sizes) and records code flushes.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emu.abi import MMAP_BASE, PAGE_SIZE, TASK_SIZE, Prot
from emu.errors import EmuError, MapFailed, MemoryFault, PatchMismatch
from emu.process.memory import Memory, StringTooLong, UserFault
from emu.process.vma import SharedPages, Vma

REPO = Path(__file__).resolve().parent.parent
P = PAGE_SIZE
R, RW, RX, NONE = Prot.READ, Prot.READ | Prot.WRITE, Prot.READ | Prot.EXEC, Prot.NONE


class FakeBackendError(Exception):
    pass


@dataclass
class FakeBackend:
    """Pages in a dict; as strict as Unicorn about mapping state, and never imports it."""

    max_map: int = 1 << 34
    pages: dict[int, bytearray] = field(default_factory=dict)
    prots: dict[int, Prot] = field(default_factory=dict)
    flushes: list[tuple[int, int]] = field(default_factory=list)

    @staticmethod
    def _range(addr: int, size: int) -> range:
        if addr % P or size % P or size <= 0:
            raise FakeBackendError(f"unaligned {addr:#x}+{size:#x}")
        return range(addr // P, (addr + size) // P)

    def mem_map(self, addr: int, size: int, prot: Prot) -> None:
        if size > self.max_map:
            raise FakeBackendError("No memory available (UC_ERR_NOMEM)")
        pages = self._range(addr, size)
        if any(p in self.pages for p in pages):
            raise FakeBackendError(f"{addr:#x}+{size:#x} overlaps a mapping")
        for p in pages:
            self.pages[p] = bytearray(P)
            self.prots[p] = prot

    def mem_unmap(self, addr: int, size: int) -> None:
        pages = self._range(addr, size)
        if any(p not in self.pages for p in pages):
            raise FakeBackendError(f"{addr:#x}+{size:#x} not mapped")
        for p in pages:
            del self.pages[p], self.prots[p]

    def mem_protect(self, addr: int, size: int, prot: Prot) -> None:
        pages = self._range(addr, size)
        if any(p not in self.pages for p in pages):
            raise FakeBackendError(f"{addr:#x}+{size:#x} not mapped")
        for p in pages:
            self.prots[p] = prot

    def mem_read(self, addr: int, size: int) -> bytes:
        out = bytearray()
        while len(out) < size:
            page = self.pages.get((addr + len(out)) // P)
            if page is None:
                raise FakeBackendError(f"read of unmapped {addr + len(out):#x}")
            off = (addr + len(out)) % P
            out += page[off : off + size - len(out)]
        return bytes(out)

    def mem_write(self, addr: int, data: bytes) -> None:
        done = 0
        while done < len(data):
            page = self.pages.get((addr + done) // P)
            if page is None:
                raise FakeBackendError(f"write to unmapped {addr + done:#x}")
            off = (addr + done) % P
            n = min(P - off, len(data) - done)
            page[off : off + n] = data[done : done + n]
            done += n

    def flush_code(self, begin: int, end: int) -> None:
        self.flushes.append((begin, end))

    def mem_map_shared(self, addr: int, size: int, prot: Prot, pages: SharedPages, offset: int) -> None:
        # Each page here is its own bytearray: host pages shared between address spaces are not modelled.
        raise FakeBackendError("shared mappings are not modelled")


def new_memory(**kw: int) -> tuple[Memory, FakeBackend]:
    backend = FakeBackend()
    return Memory(backend, **kw), backend


def spans(mem: Memory) -> list[tuple[int, int, Prot]]:
    return [(v.start, v.end, v.prot) for v in mem]


def check_consistent(mem: Memory, backend: FakeBackend) -> None:
    """The VMA list is sorted, disjoint, maximally merged, and the backend holds exactly its pages."""
    vmas = list(mem)
    for a, b in zip(vmas, vmas[1:], strict=False):
        assert a.end <= b.start, (a, b)
        assert not a.continues(b), f"unmerged neighbours {a} {b}"
    expected = {p: v.prot for v in vmas for p in range(v.start // P, v.end // P)}
    assert backend.prots == expected


# --------------------------------------------------------------------------- isolation
def test_memory_elf_loader_initstack_do_not_import_unicorn() -> None:
    code = (
        "import sys, emu.process.elf, emu.process.memory, emu.process.loader, emu.process.initstack, emu.errors\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('unicorn', 'capstone', 'keystone'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- map / find
def test_map_rounds_to_pages_and_writes_data_at_start() -> None:
    mem, backend = new_memory()
    vma = mem.map(0x10010, 0x20, RW, data=b"hello")
    assert (vma.start, vma.end) == (0x10000, 0x11000)
    assert mem.read(0x10010, 5) == b"hello"
    assert mem.read(0x10000, 0x10) == bytes(0x10)
    assert mem.find(0x10fff) == vma and mem.find(0x11000) is None and mem.find(0xffff) is None
    check_consistent(mem, backend)


@pytest.mark.parametrize("start,length", [(0, P), (0x1000, 0), (TASK_SIZE, P), (TASK_SIZE - P, 2 * P)])
def test_map_refuses_outside_user_space(start: int, length: int) -> None:
    mem, backend = new_memory()
    with pytest.raises(MemoryFault):
        mem.map(start, length, RW)
    assert list(mem) == [] and backend.pages == {}


def test_map_backend_failure_is_map_failed_and_leaves_no_vma() -> None:
    mem, backend = new_memory()
    backend.max_map = 16 * P
    with pytest.raises(MapFailed) as info:
        mem.map(0x100000, 17 * P, RW)
    assert isinstance(info.value, EmuError) and "\n" not in str(info.value)
    assert list(mem) == []
    check_consistent(mem, backend)


def test_map_fixed_replaces_the_middle_of_a_file_mapping() -> None:
    mem, backend = new_memory()
    mem.map(0x400000, 4 * P, RX, name="/bin/x", offset=0x2000, dev=(8, 1), inode=77, data=b"\xcc" * (4 * P))
    mem.map(0x401000, 2 * P, RW)
    vmas = list(mem)
    assert [(v.start, v.end, v.prot, v.name, v.offset) for v in vmas] == [
        (0x400000, 0x401000, RX, "/bin/x", 0x2000),
        (0x401000, 0x403000, RW, "", 0),
        (0x403000, 0x404000, RX, "/bin/x", 0x5000),  # the tail keeps its own file offset
    ]
    assert mem.read(0x401000, 2 * P) == bytes(2 * P)  # the new mapping is fresh zero pages
    assert mem.read(0x403000, 4) == b"\xcc" * 4
    check_consistent(mem, backend)


def test_adjacent_compatible_mappings_merge() -> None:
    mem, backend = new_memory()
    mem.map(0x10000, P, RW)
    mem.map(0x12000, P, RW)
    mem.map(0x11000, P, RW)  # fills the hole: one anonymous VMA
    assert spans(mem) == [(0x10000, 0x13000, RW)]
    mem.map(0x13000, P, RW, name="[heap]")  # another name: no merge
    mem.map(0x14000, P, RW, shared=True)  # shared vs private: no merge
    assert len(mem) == 3
    check_consistent(mem, backend)


def test_file_mappings_merge_only_with_contiguous_offsets() -> None:
    mem, backend = new_memory()
    f = dict(name="/lib/a.so", dev=(8, 1), inode=5)
    mem.map(0x20000, P, R, offset=0, **f)  # type: ignore[arg-type]
    mem.map(0x21000, P, R, offset=P, **f)  # type: ignore[arg-type]
    assert spans(mem) == [(0x20000, 0x22000, R)]
    mem.map(0x22000, P, R, offset=5 * P, **f)  # type: ignore[arg-type]
    assert len(mem) == 2
    check_consistent(mem, backend)


def test_unmap_splits_and_keeps_file_offsets() -> None:
    mem, backend = new_memory()
    mem.map(0x400000, 5 * P, R, name="/bin/x", offset=0x10000, dev=(1, 2), inode=3)
    mem.unmap(0x401800, 0x1000)  # rounds out to [0x401000, 0x403000)
    vmas = list(mem)
    assert [(v.start, v.end, v.offset) for v in vmas] == [(0x400000, 0x401000, 0x10000), (0x403000, 0x405000, 0x13000)]
    assert all((v.name, v.dev, v.inode) == ("/bin/x", (1, 2), 3) for v in vmas)
    mem.unmap(0x300000, 0x200000)  # over everything, holes included
    assert list(mem) == [] and backend.pages == {}


def test_unmap_of_nothing_is_harmless() -> None:
    mem, backend = new_memory()
    mem.map(0x10000, P, RW)
    mem.unmap(0x20000, 4 * P)
    mem.unmap(0x10000, 0)
    assert spans(mem) == [(0x10000, 0x11000, RW)]
    check_consistent(mem, backend)


def test_vma_slice_offsets() -> None:
    file_vma = Vma(0x400000, 0x404000, R, "/f", 0x3000, (1, 1), 9)
    assert file_vma.slice(0x402000, 0x403000).offset == 0x5000
    anon = Vma(0x10000, 0x14000, RW)
    assert anon.slice(0x12000, 0x14000).offset == 0
    empty = file_vma.slice(file_vma.end, file_vma.end)  # mremap's "same identity" probe
    assert (empty.name, empty.inode, empty.offset, empty.size) == ("/f", 9, 0x7000, 0)


# --------------------------------------------------------------------------- protect / rename
def test_protect_middle_splits_then_restoring_merges_back() -> None:
    mem, backend = new_memory()
    mem.map(0x10000, 4 * P, R)
    assert mem.protect(0x11000, 2 * P, RW)
    assert spans(mem) == [(0x10000, 0x11000, R), (0x11000, 0x13000, RW), (0x13000, 0x14000, R)]
    assert backend.prots[0x11] == RW and backend.prots[0x13] == R
    check_consistent(mem, backend)
    # Once writable, a private mapping is accounted (VM_ACCOUNT) and never merges back with never-written parts.
    assert mem.protect(0x11000, 2 * P, R)
    assert len(mem) == 3
    check_consistent(mem, backend)


def test_protect_round_trip_merges_when_accounting_allows() -> None:
    mem, backend = new_memory()
    mem.map(0x10000, 4 * P, RW)
    assert mem.protect(0x11000, P, R)
    assert len(mem) == 3
    assert mem.protect(0x11000, P, RW)
    assert spans(mem) == [(0x10000, 0x14000, RW)]
    check_consistent(mem, backend)


def test_protect_that_merges_with_the_next_vma_in_range() -> None:
    """Regression: the first piece merged with a VMA still to be processed, which then was not found."""
    mem, backend = new_memory()
    mem.map(0x10000, P, NONE)
    mem.map(0x11000, P, R)
    mem.map(0x12000, P, NONE)
    assert mem.protect(0x10000, 3 * P, R)
    assert spans(mem) == [(0x10000, 0x13000, R)]
    check_consistent(mem, backend)


def test_relro_style_protect_stays_a_separate_line() -> None:
    """A writable segment's head made read-only next to a read-only segment: two lines, as on Linux."""
    mem, backend = new_memory()
    f = dict(name="/bin/x", dev=(8, 1), inode=5)
    mem.map(0x400000, P, R, offset=0, **f)  # type: ignore[arg-type]
    mem.map(0x401000, 2 * P, RW, offset=P, **f)  # type: ignore[arg-type]
    assert mem.protect(0x401000, P, R)
    assert [(v.start, v.end, v.perms(), v.offset) for v in mem] == [
        (0x400000, 0x401000, "r--p", 0),
        (0x401000, 0x402000, "r--p", P),
        (0x402000, 0x403000, "rw-p", 2 * P),
    ]
    check_consistent(mem, backend)


def test_protect_with_a_hole_fails_and_changes_nothing() -> None:
    mem, backend = new_memory()
    mem.map(0x10000, P, R)
    mem.map(0x12000, P, R)
    assert not mem.protect(0x10000, 3 * P, RW)
    assert spans(mem) == [(0x10000, 0x11000, R), (0x12000, 0x13000, R)]
    assert set(backend.prots.values()) == {R}


def test_rename_splits_at_the_edges() -> None:
    mem, backend = new_memory()
    mem.map(0x10000, 4 * P, RW)
    mem.rename(0x11000, 0x13000, "[anon:x]")
    assert [(v.start, v.end, v.name) for v in mem] == [
        (0x10000, 0x11000, ""), (0x11000, 0x13000, "[anon:x]"), (0x13000, 0x14000, ""),
    ]
    mem.rename(0x10000, 0x14000, "")
    assert spans(mem) == [(0x10000, 0x14000, RW)]
    check_consistent(mem, backend)


# --------------------------------------------------------------------------- finding holes
def test_find_free_top_down_from_mmap_base() -> None:
    mem, _ = new_memory()
    base = MMAP_BASE
    assert mem.find_free(P) == base - P
    mem.map(base - 2 * P, 2 * P, RW)
    assert mem.find_free(P) == base - 3 * P
    mem.map(base - 5 * P, P, RW)  # leaves a 2-page hole at base-4P..base-2P
    assert mem.find_free(2 * P) == base - 4 * P
    assert mem.find_free(3 * P) == base - 8 * P
    assert mem.find_free(1) == base - 3 * P  # lengths round up to pages


def test_find_free_below_and_above_are_page_aligned_bounds() -> None:
    mem, _ = new_memory()
    mem.map(0x500000, 0x10000, RX)
    # ``below`` in the middle of a page: the hole must end at or below it, on a page boundary.
    assert mem.find_free(P, below=0x500123) == 0x4FF000
    assert mem.find_free(P, below=0x50A123) == 0x4FF000  # the mapping is in the way
    assert mem.find_free(P, below=0x500123, above=0x4FF001) is None  # above rounds up to 0x500000
    assert mem.find_free(P, below=0x500123, above=0x4FF000) == 0x4FF000
    assert mem.find_free(0x10000, below=0x8000) is None
    assert mem.find_free(0) is None


def test_find_free_when_mmap_base_is_inside_a_mapping() -> None:
    mem, _ = new_memory(mmap_base=0x800000)
    mem.map(0x7F0000, 0x20000, RW)
    assert mem.find_free(P) == 0x7EF000


def test_find_free_above_bottom_up() -> None:
    mem, _ = new_memory()
    mem.map(0x500000, 2 * P, RX)
    mem.map(0x503000, P, RX)
    assert mem.find_free_above(P, 0x500000, 0x600000) == 0x502000
    assert mem.find_free_above(2 * P, 0x500000, 0x600000) == 0x504000
    assert mem.find_free_above(P, 0x4FF001, 0x600000) == 0x502000  # start rounds up
    assert mem.find_free_above(P, 0x4FE000, 0x600000) == 0x4FE000
    assert mem.find_free_above(1, 0x501000, 0x600000) == 0x502000  # length rounds up
    assert mem.find_free_above(2 * P, 0x500000, 0x505000) is None
    assert mem.find_free_above(P, TASK_SIZE - P, 1 << 64) == TASK_SIZE - P
    assert mem.find_free_above(P, TASK_SIZE, 1 << 64) is None


# --------------------------------------------------------------------------- /proc/self/maps
def test_maps_text_is_byte_for_byte_linux() -> None:
    mem, _ = new_memory()
    mem.map(0x400000, P, R, name="/usr/bin/cat", offset=0, dev=(0xFD, 1), inode=1234)
    mem.map(0x401000, P, RX, name="/usr/bin/cat", offset=P, dev=(0xFD, 1), inode=1234)
    mem.map(0x7FFFF7FF0000, 2 * P, RW)
    mem.map(0x7FFFFFFDE000, 0x21000, RW, name="[stack]")
    mem.map(0x10000, P, R, shared=True, name="/dev/shm/x", dev=(0, 0x1A), inode=4, offset=0x5000)
    expected = (
        f"{'00010000-00011000 r--s 00005000 00:1a 4':<73}/dev/shm/x\n"
        f"{'00400000-00401000 r--p 00000000 fd:01 1234':<73}/usr/bin/cat\n"
        f"{'00401000-00402000 r-xp 00001000 fd:01 1234':<73}/usr/bin/cat\n"
        "7ffff7ff0000-7ffff7ff2000 rw-p 00000000 00:00 0 \n"  # no name: the header's trailing space stays
        f"{'7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0':<73}[stack]\n"
    )
    assert mem.maps_text() == expected
    assert "00400000-00401000 r--p 00000000 fd:01 1234                               /usr/bin/cat\n" in expected


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="no /proc/self/maps on this host")
def test_maps_line_against_this_hosts_proc_self_maps() -> None:
    """Re-render every line of the real /proc/self/maps from its parsed fields."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    for line in lines:
        fields = line.split(maxsplit=5)
        start, end = (int(x, 16) for x in fields[0].split("-"))
        perms, offset, dev, inode = fields[1], int(fields[2], 16), fields[3], int(fields[4])
        name = fields[5] if len(fields) > 5 else ""
        prot = (R if perms[0] == "r" else NONE) | (Prot.WRITE if perms[1] == "w" else NONE)
        prot |= Prot.EXEC if perms[2] == "x" else NONE
        major, minor = (int(x, 16) for x in dev.split(":"))
        vma = Vma(start, end, prot, name, offset, (major, minor), inode, perms[3] == "s")
        assert vma.maps_line() == line


# --------------------------------------------------------------------------- user copies
def test_read_user_and_write_user_check_protection() -> None:
    mem, _ = new_memory()
    mem.map(0x10000, P, R, data=b"abc")
    mem.map(0x11000, P, RW)
    mem.map(0x12000, P, NONE)
    assert mem.read_user(0x10000, 3) == b"abc"
    assert mem.read_user(0x10FFE, 4) == b"\0\0\0\0"  # across two readable VMAs
    mem.write_user(0x11FFC, b"wxyz")
    with pytest.raises(UserFault) as info:
        mem.write_user(0x10FFE, b"1234")  # starts in the read-only page
    assert info.value.addr == 0x10FFE
    with pytest.raises(UserFault) as info:
        mem.read_user(0x11FFE, 4)  # runs into PROT_NONE
    assert info.value.addr == 0x12000
    with pytest.raises(UserFault) as info:
        mem.read_user(0x13000, 1)  # unmapped
    assert info.value.addr == 0x13000
    with pytest.raises(UserFault):
        mem.read_user(0x11000, -1)
    with pytest.raises(UserFault):
        mem.read_user(-8, 8)
    assert mem.read_user(0x13000, 0) == b""  # zero-length copies touch nothing
    mem.write_user(0x13000, b"")
    assert not isinstance(UserFault(0), EmuError)  # a guest errno, not a harness error


def test_raw_read_and_write_of_unmapped_is_memory_fault() -> None:
    mem, _ = new_memory()
    mem.map(0x10000, P, NONE)
    mem.write(0x10000, b"x")  # the harness ignores protection
    assert mem.read(0x10000, 1) == b"x"
    with pytest.raises(MemoryFault):
        mem.read(0x20000, 1)
    with pytest.raises(MemoryFault):
        mem.write(0x10FFF, b"xy")


def test_read_cstring() -> None:
    mem, _ = new_memory()
    mem.map(0x10000, P, R, data=b"/etc/passwd\0junk")
    mem.map(0x11000, P, RW)
    mem.map(0x12000, P, NONE)
    assert mem.read_cstring(0x10000) == b"/etc/passwd"
    assert mem.read_cstring(0x1000B) == b""
    mem.write(0x10FFC, b"abcd")
    mem.write(0x11000, b"efg\0")
    assert mem.read_cstring(0x10FFC) == b"abcdefg"  # across a VMA boundary
    mem.write(0x11000, b"x" * P)
    with pytest.raises(UserFault) as info:
        mem.read_cstring(0x11FF0)  # no NUL before the PROT_NONE page
    assert info.value.addr == 0x12000 and not isinstance(info.value, StringTooLong)
    with pytest.raises(StringTooLong) as too_long:
        mem.read_cstring(0x11000, limit=100)
    assert isinstance(too_long.value, UserFault) and too_long.value.limit == 100
    mem.write(0x11063, b"\0")
    assert mem.read_cstring(0x11000, limit=100) == b"x" * 99  # 99 bytes + NUL fit in 100
    with pytest.raises(UserFault):
        mem.read_cstring(0x30000)


# --------------------------------------------------------------------------- patch
def test_patch_checks_writes_and_flushes() -> None:
    mem, backend = new_memory()
    mem.map(0x401000, P, RX, data=b"\x0f\x1f\x44\x00\x00\x90")
    mem.patch(0x401000, expect=b"\x0f", new=b"\xcc")  # ignores the missing PROT_WRITE, like FOLL_FORCE
    assert mem.read(0x401000, 6) == b"\xcc\x1f\x44\x00\x00\x90"
    assert backend.flushes == [(0x401000, 0x401001)]
    mem.patch(0x401001, expect=b"\x1f\x44\x00\x00", new=b"\x11\x22\x33\x44")
    assert backend.flushes[-1] == (0x401001, 0x401005)


def test_patch_refuses_when_the_bytes_differ() -> None:
    mem, backend = new_memory()
    mem.map(0x401000, P, RX, data=b"\x55\x48\x89\xe5")
    with pytest.raises(PatchMismatch) as info:
        mem.patch(0x401000, expect=b"\x0f\x1f", new=b"\xcc\xcc")
    assert "0x401000" in str(info.value) and "0f1f" in str(info.value) and "5548" in str(info.value)
    assert mem.read(0x401000, 4) == b"\x55\x48\x89\xe5"
    assert backend.flushes == []
    with pytest.raises(MemoryFault):
        mem.patch(0x900000, expect=b"\x90", new=b"\xcc")


# --------------------------------------------------------------------------- model-based
OPS = st.one_of(
    st.tuples(st.just("map"), st.integers(0, 15), st.integers(1, 6), st.sampled_from([NONE, R, RW, RX]),
              st.sampled_from(["", "/f", "[heap]"]), st.booleans()),
    st.tuples(st.just("unmap"), st.integers(0, 15), st.integers(1, 6)),
    st.tuples(st.just("protect"), st.integers(0, 15), st.integers(1, 6), st.sampled_from([NONE, R, RW, RX])),
    st.tuples(st.just("rename"), st.integers(0, 15), st.integers(1, 6), st.sampled_from(["", "[anon:a]"])),
)
BASE = 0x100000


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=25))
def test_vmas_match_a_page_model(ops: list[tuple[Any, ...]]) -> None:
    """Any sequence of map/unmap/protect/rename: per-page attributes equal a naive page model,
    and the VMA list stays sorted, disjoint, maximally merged and in step with the backend."""
    mem, backend = new_memory()
    model: dict[int, tuple[Any, ...]] = {}  # page -> (prot, name, file offset or None, shared, accounted)
    for op in ops:
        kind, first, count = op[0], op[1], op[2]
        pages = range(first, first + count)
        start, length = BASE + first * P, count * P
        if kind == "map":
            prot, name, shared = op[3], op[4], op[5]
            is_file = name == "/f"
            mem.map(start, length, prot, name=name, shared=shared, offset=first * P if is_file else 0,
                    dev=(8, 1) if is_file else (0, 0), inode=42 if is_file else 0)
            for p in pages:
                model[p] = (prot, name, p * P if is_file else None, shared, not shared and bool(prot & Prot.WRITE))
        elif kind == "unmap":
            mem.unmap(start, length)
            for p in pages:
                model.pop(p, None)
        elif kind == "protect":
            ok = mem.protect(start, length, op[3])
            assert ok == all(p in model for p in pages)
            if ok:
                for p in pages:
                    prot0, name, off, shared, acct = model[p]
                    model[p] = (op[3], name, off, shared, acct or (not shared and bool(op[3] & Prot.WRITE)))
        else:
            mem.rename(start, start + length, op[3])
            for p in pages:
                if p in model:
                    prot0, _, off, shared, acct = model[p]
                    model[p] = (prot0, op[3], off, shared, acct)
        check_consistent(mem, backend)
        seen: dict[int, tuple[Any, ...]] = {}
        for v in mem:
            for addr in range(v.start, v.end, P):
                off = v.offset + (addr - v.start) if v.is_file else None
                seen[(addr - BASE) // P] = (v.prot, v.name, off, v.shared, v.accounted)
        assert seen == model
