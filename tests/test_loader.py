"""emu.process.loader without Unicorn: a LoadPlan mapped into Memory over a fake page backend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from emu.abi import MMAP_BASE, PAGE_SIZE, PIE_BASE, TASK_SIZE, Prot, page_up
from emu.errors import LoadError
from emu.process.elf import EHDR, PHDR, FileId, LoadPlan, load_plan, plan_from_bytes
from emu.process.loader import choose_bias, map_image
from emu.process.memory import Memory
from emu.process.vma import SharedPages

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "elf_samples"
P = PAGE_SIZE
R, RW, RX, RWX = Prot.READ, Prot.READ | Prot.WRITE, Prot.READ | Prot.EXEC, Prot.READ | Prot.WRITE | Prot.EXEC
PT_LOAD, PF_X, PF_W, PF_R = 1, 1, 2, 4
FAKE = FileId("/x/prog", (8, 1), 77)


class PageBackend:
    """Just enough backend: page protections in a dict, contents only for written pages; errors like
    Unicorn's on unmapped access or absurd sizes."""

    def __init__(self, max_map: int = 1 << 34) -> None:
        self.prots: dict[int, Prot] = {}
        self.pages: dict[int, bytearray] = {}
        self.max_map = max_map
        self.unmaps = 0

    def mem_map(self, addr: int, size: int, prot: Prot) -> None:
        if size > self.max_map:
            raise MemoryError("UC_ERR_NOMEM")
        for p in range(addr // P, (addr + size) // P):
            assert p not in self.prots, hex(p * P)
            self.prots[p] = prot

    def mem_unmap(self, addr: int, size: int) -> None:
        self.unmaps += 1
        for p in range(addr // P, (addr + size) // P):
            del self.prots[p]
            self.pages.pop(p, None)

    def mem_protect(self, addr: int, size: int, prot: Prot) -> None:
        for p in range(addr // P, (addr + size) // P):
            self.prots[p] = prot

    def mem_read(self, addr: int, size: int) -> bytes:
        out = bytearray()
        for p in range(addr // P, (addr + size + P - 1) // P):
            if p not in self.prots:
                raise MemoryError(f"read of unmapped {p * P:#x}")
            out += self.pages.get(p, bytes(P))
        skip = addr % P
        return bytes(out[skip : skip + size])

    def mem_write(self, addr: int, data: bytes) -> None:
        for i, b in enumerate(data):
            p = (addr + i) // P
            if p not in self.prots:
                raise MemoryError(f"write to unmapped {p * P:#x}")
            self.pages.setdefault(p, bytearray(P))[(addr + i) % P] = b

    def flush_code(self, begin: int, end: int) -> None:
        pass

    def mem_map_shared(self, addr: int, size: int, prot: Prot, pages: SharedPages, offset: int) -> None:
        self.mem_map(addr, size, prot)  # only protections are kept, so sharing changes nothing here


def build_elf(phdrs: list[tuple[int, int, int, int, int, int]], *, e_type: int = 2, size: int = 0x4000) -> bytes:
    """ELF64 x86-64 whose bytes are a recognisable pattern: byte i of the file is (i * 7 + i // 4096) & 0xff."""
    data = bytearray((i * 7 + i // P) & 0xFF for i in range(size))
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    data[: EHDR.size] = EHDR.pack(ident, e_type, 62, 1, 0x401000, 64, 0, 0, 64, 56, len(phdrs), 64, 0, 0)
    for i, (p_type, flags, offset, vaddr, filesz, memsz) in enumerate(phdrs):
        PHDR.pack_into(data, 64 + i * 56, p_type, flags, offset, vaddr, vaddr, filesz, memsz, 0x1000)
    return bytes(data)


def load(phdrs: list[tuple[int, int, int, int, int, int]], **kw: int) -> tuple[Memory, LoadPlan]:
    plan = plan_from_bytes(build_elf(phdrs, **kw), FAKE)
    mem = Memory(PageBackend())
    map_image(mem, plan, choose_bias(mem, plan, None), name=FAKE.path)
    return mem, plan


def lines(mem: Memory) -> list[tuple[int, int, str, int, str]]:
    return [(v.start, v.end, v.perms(), v.offset, v.name) for v in mem]


def test_loader_does_not_import_unicorn() -> None:
    code = "import sys, emu.process.loader; assert 'unicorn' not in sys.modules, 'unicorn imported'"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- samples
def test_hello_asm_maps_whole_file_pages_named_by_real_path() -> None:
    path = str(SAMPLES / "hello_asm")
    plan = load_plan(os.path.relpath(path))
    mem = Memory(PageBackend())
    image = map_image(mem, plan, 0)
    real = os.path.realpath(path)
    st = os.stat(path)
    assert [(v.start, v.end, v.perms(), v.offset, v.dev, v.inode, v.name) for v in mem] == [
        (0x400000, 0x401000, "r--p", 0x0000, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino, real),
        (0x401000, 0x402000, "r-xp", 0x1000, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino, real),
        (0x402000, 0x403000, "r--p", 0x2000, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino, real),
    ]
    file = Path(path).read_bytes()
    # mmap shows whole file pages: the bytes past p_filesz up to the page end are the file's too.
    assert mem.read(0x400000, 3 * P) == file[: 3 * P].ljust(3 * P, b"\0")
    assert (image.entry, image.phdr, image.end) == (0x401000, 0x400040, 0x402003)


def test_hello_static_maps_like_linux() -> None:
    path = str(SAMPLES / "hello_static")
    plan = load_plan(path)
    mem = Memory(PageBackend())
    map_image(mem, plan, 0, name="/guest/hello_static")
    assert [(s, e, perms, off, name) for s, e, perms, off, name in lines(mem)] == [
        (0x400000, 0x401000, "r--p", 0x00000, "/guest/hello_static"),
        (0x401000, 0x479000, "r-xp", 0x01000, "/guest/hello_static"),
        (0x479000, 0x4A0000, "r--p", 0x79000, "/guest/hello_static"),
        (0x4A0000, 0x4A7000, "rw-p", 0xA0000, "/guest/hello_static"),
        (0x4A7000, 0x4AC000, "rw-p", 0, ""),  # the bss beyond the file pages: anonymous
    ]
    seg = plan.segments[-1]
    file = Path(path).read_bytes()
    file_end = seg.vaddr + seg.filesz
    assert mem.read(seg.vaddr, seg.filesz) == file[seg.offset : seg.offset + seg.filesz]
    assert mem.read(file_end, 0x4A7000 - file_end) == bytes(0x4A7000 - file_end)  # padzero()
    assert mem.read(0x4A0000, seg.vaddr - 0x4A0000) == file[0xA0000 : seg.offset]  # the page head is the file's


def test_static_pie_goes_top_down_in_the_mmap_area() -> None:
    plan = load_plan(str(SAMPLES / "hello_static_pie"))
    mem = Memory(PageBackend())
    bias = choose_bias(mem, plan, None)
    span = page_up(plan.high) - plan.low
    assert bias == MMAP_BASE - span
    image = map_image(mem, plan, bias)
    assert image.entry == bias + plan.entry
    assert image.phdr == bias + 0x40
    assert max(v.end for v in mem) == MMAP_BASE


def test_pie_at_a_fixed_base() -> None:
    plan = load_plan(str(SAMPLES / "hello_dynamic"))
    mem = Memory(PageBackend())
    bias = choose_bias(mem, plan, PIE_BASE)
    assert bias == PIE_BASE
    image = map_image(mem, plan, bias)
    assert image.phdr == PIE_BASE + 0x40
    assert list(mem)[0].start == PIE_BASE


def test_et_exec_ignores_a_fixed_base() -> None:
    plan = load_plan(str(SAMPLES / "hello_asm"))
    assert choose_bias(Memory(PageBackend()), plan, 0x7000000) == 0


# --------------------------------------------------------------------------- segment shapes
def test_writable_segment_with_bss() -> None:
    # file bytes [0x1100, 0x1400) at 0x601100; memsz reaches into a third page.
    mem, plan = load([(PT_LOAD, PF_R | PF_W, 0x1100, 0x601100, 0x300, 0x2000)])
    assert lines(mem) == [
        (0x601000, 0x602000, "rw-p", 0x1000, "/x/prog"),
        (0x602000, 0x604000, "rw-p", 0, ""),
    ]
    assert mem.read(0x601000, 0x100) == plan.data[0x1000:0x1100]
    assert mem.read(0x601100, 0x300) == plan.data[0x1100:0x1400]
    assert mem.read(0x601400, 0xC00) == bytes(0xC00)
    assert mem.read(0x602000, 0x2000) == bytes(0x2000)


def test_read_only_segment_with_bss_keeps_file_bytes_and_gets_an_rw_tail() -> None:
    """padzero() fails silently on a read-only page; vm_brk_flags() maps the rest rw (x only if asked)."""
    mem, plan = load([(PT_LOAD, PF_R, 0x1000, 0x401000, 0x80, 0x1800)])
    assert lines(mem) == [(0x401000, 0x402000, "r--p", 0x1000, "/x/prog"), (0x402000, 0x403000, "rw-p", 0, "")]
    assert mem.read(0x401000, P) == plan.data[0x1000:0x2000]
    mem, _ = load([(PT_LOAD, PF_R | PF_X, 0x1000, 0x401000, 0x80, 0x1800)])
    assert [v.prot for v in mem] == [RX, RWX]


def test_segment_without_file_bytes_is_anonymous_from_its_page_start() -> None:
    mem, _ = load([(PT_LOAD, PF_R, 0, 0x400000, 0x100, 0x100), (PT_LOAD, PF_R | PF_W, 0x123, 0x601123, 0, 0x1000)])
    assert lines(mem)[1:] == [(0x601000, 0x603000, "rw-p", 0, "")]


def test_empty_segment_maps_nothing() -> None:
    mem, plan = load([(PT_LOAD, PF_R, 0, 0x400000, 0x100, 0x100), (PT_LOAD, PF_R | PF_W, 0x123, 0x601123, 0, 0)])
    assert [v.start for v in mem] == [0x400000]
    assert plan.high == 0x601123  # it still counts for where brk starts, as in Linux


def test_segments_sharing_a_page_later_one_wins() -> None:
    mem, plan = load([
        (PT_LOAD, PF_R | PF_X, 0, 0x400000, 0x1100, 0x1100),
        (PT_LOAD, PF_R | PF_W, 0x1100, 0x401100, 0x100, 0x100),
    ])
    assert lines(mem) == [(0x400000, 0x401000, "r-xp", 0, "/x/prog"), (0x401000, 0x402000, "rw-p", 0x1000, "/x/prog")]
    assert mem.read(0x401000, 0x200) == plan.data[0x1000:0x1200]


def test_later_segments_over_a_huge_bss_are_mapped_without_splitting_it() -> None:
    """Each final piece is mapped once: replacing part of a big Unicorn region would copy all of it."""
    plan = plan_from_bytes(build_elf([
        (PT_LOAD, PF_R | PF_W, 0, 0x400000, 0x100, 0x4000000),  # 64 MiB of bss...
        (PT_LOAD, PF_R | PF_X, 0x1000, 0x401000, 0x22, 0x22),  # ...with two segments inside it
        (PT_LOAD, PF_R, 0x2000, 0x402000, 0x3, 0x3),
    ]), FAKE)
    backend = PageBackend()
    mem = Memory(backend)
    map_image(mem, plan, 0, name=FAKE.path)
    assert backend.unmaps == 0
    assert lines(mem) == [
        (0x400000, 0x401000, "rw-p", 0, "/x/prog"),
        (0x401000, 0x402000, "r-xp", 0x1000, "/x/prog"),
        (0x402000, 0x403000, "r--p", 0x2000, "/x/prog"),
        (0x403000, 0x4400000, "rw-p", 0, ""),
    ]


# --------------------------------------------------------------------------- refusals
def test_overlap_with_an_existing_mapping_is_a_load_error() -> None:
    plan = plan_from_bytes(build_elf([(PT_LOAD, PF_R, 0, 0x400000, 0x100, 0x100)]), FAKE)
    mem = Memory(PageBackend())
    mem.map(0x400000, P, RW, name="[stack]")
    with pytest.raises(LoadError, match=r"^/x/prog: segments at 0x400000-0x401000 overlap"):
        map_image(mem, plan, 0)


@pytest.mark.parametrize("bias", [TASK_SIZE, -0x400000, TASK_SIZE - 0x400000])
def test_bias_outside_user_space_is_a_load_error(bias: int) -> None:
    plan = plan_from_bytes(build_elf([(PT_LOAD, PF_R, 0, 0x400000, 0x100, 0x100)]), FAKE)
    with pytest.raises(LoadError, match="outside the user address space"):
        map_image(Memory(PageBackend()), plan, bias)


def test_backend_out_of_memory_is_a_load_error() -> None:
    plan = plan_from_bytes(build_elf([(PT_LOAD, PF_R | PF_W, 0, 0x400000, 0x100, 1 << 36)]), FAKE)
    mem = Memory(PageBackend(max_map=1 << 30))
    with pytest.raises(LoadError, match=r"^/x/prog: segment at 0x401000: cannot map 0x401000-0x1000400000 .*UC_ERR_NOMEM"):
        map_image(mem, plan, 0)


def test_no_room_for_a_pie() -> None:
    plan = plan_from_bytes(build_elf([(PT_LOAD, PF_R, 0, 0, 0x100, 0x100)], e_type=3), FAKE)
    mem = Memory(PageBackend(), mmap_base=0x10000)
    mem.map(0x1000, 0xF000, RW)
    with pytest.raises(LoadError, match="no room"):
        choose_bias(mem, plan, None)
