"""emu.process.elf: the load plan of every sample, checked against pyelftools, and of hand-built ELFs."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from emu.abi import PAGE_SIZE, TASK_SIZE, Prot
from emu.errors import LoadError
from emu.process.elf import EHDR, PHDR, FileId, LoadPlan, load_plan, plan_from_bytes, read_file

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "elf_samples"
ALL_SAMPLES = sorted(p.name for p in SAMPLES.iterdir() if p.name != "MANIFEST")
R, RW, RX = Prot.READ, Prot.READ | Prot.WRITE, Prot.READ | Prot.EXEC
PT_LOAD, PT_INTERP, PT_PHDR, PT_GNU_STACK = 1, 3, 6, 0x6474E551
PF_X, PF_W, PF_R = 1, 2, 4
FAKE = FileId("/x/test.elf", (8, 1), 99)


def build_elf(phdrs: list[tuple[int, int, int, int, int, int]], *, e_type: int = 2, entry: int = 0x401000,
              size: int = 0x3000, content: dict[int, bytes] | None = None, phoff: int = 64) -> bytes:
    """An ELF64 x86-64 file: ``phdrs`` are (p_type, p_flags, p_offset, p_vaddr, p_filesz, p_memsz)."""
    data = bytearray(size)
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    data[: EHDR.size] = EHDR.pack(ident, e_type, 62, 1, entry, phoff, 0, 0, 64, 56, len(phdrs), 64, 0, 0)
    for i, (p_type, flags, offset, vaddr, filesz, memsz) in enumerate(phdrs):
        PHDR.pack_into(data, phoff + i * 56, p_type, flags, offset, vaddr, vaddr, filesz, memsz, 0x1000)
    for at, blob in (content or {}).items():
        data[at : at + len(blob)] = blob
    return bytes(data)


def plan(data: bytes) -> LoadPlan:
    return plan_from_bytes(data, FAKE)


def test_elf_module_does_not_import_unicorn() -> None:
    code = "import sys, emu.process.elf; assert 'unicorn' not in sys.modules, 'unicorn imported'"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- samples
@pytest.mark.parametrize("name", ALL_SAMPLES)
def test_sample_plan_agrees_with_pyelftools(name: str) -> None:
    path = str(SAMPLES / name)
    got = load_plan(path)
    elf = ELFFile(io.BytesIO((SAMPLES / name).read_bytes()))
    loads = [s.header for s in elf.iter_segments() if s.header.p_type == "PT_LOAD"]
    assert [(s.vaddr, s.memsz, s.offset, s.filesz) for s in got.segments] == [
        (h.p_vaddr, h.p_memsz, h.p_offset, h.p_filesz) for h in loads
    ]
    for seg, h in zip(got.segments, loads, strict=True):
        assert bool(seg.prot & Prot.READ) == bool(h.p_flags & PF_R)
        assert bool(seg.prot & Prot.WRITE) == bool(h.p_flags & PF_W)
        assert bool(seg.prot & Prot.EXEC) == bool(h.p_flags & PF_X)
    assert got.entry == elf.header.e_entry
    assert got.is_dyn == (elf.header.e_type == "ET_DYN")
    assert (got.phoff, got.phentsize, got.phnum) == (elf.header.e_phoff, 56, elf.header.e_phnum)
    interps = [s.get_interp_name() for s in elf.iter_segments() if s.header.p_type == "PT_INTERP"]  # type: ignore[attr-defined]
    assert got.interp == (interps[0] if interps else None)
    st = os.stat(path)
    assert got.file == FileId(path, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino)


def test_hello_asm_plan() -> None:
    p = load_plan(str(SAMPLES / "hello_asm"))
    assert not p.is_dyn and p.interp is None and p.phdr_vaddr is None
    assert p.entry == 0x401000
    assert [(s.vaddr, s.memsz, s.offset, s.filesz, s.prot) for s in p.segments] == [
        (0x400000, 0x120, 0, 0x120, R),
        (0x401000, 0x22, 0x1000, 0x22, RX),
        (0x402000, 3, 0x2000, 3, R),
    ]
    assert (p.low, p.high) == (0x400000, 0x402003)
    # No PT_PHDR: AT_PHDR is where e_phoff (64) lands in the first PT_LOAD.
    assert p.phdr_address(0) == 0x400040


def test_hello_static_plan_has_a_bss() -> None:
    p = load_plan(str(SAMPLES / "hello_static"))
    assert not p.is_dyn and p.interp is None
    data_seg = p.segments[-1]
    assert data_seg.prot == RW and data_seg.memsz > data_seg.filesz
    assert p.phdr_address(0) == 0x400040


def test_hello_static_pie_plan() -> None:
    p = load_plan(str(SAMPLES / "hello_static_pie"))
    assert p.is_dyn and p.interp is None and p.low == 0
    assert p.phdr_address(0x7FFFF7000000) == 0x7FFFF7000040


def test_hello_dynamic_plan() -> None:
    p = load_plan(str(SAMPLES / "hello_dynamic"))
    assert p.is_dyn
    assert p.interp == "/lib64/ld-linux-x86-64.so.2"
    assert p.phdr_vaddr == 0x40
    assert p.phdr_address(0x555555554000) == 0x555555554040


# --------------------------------------------------------------------------- AT_PHDR
def test_phdr_address_ignores_a_lying_pt_phdr() -> None:
    """Linux >= 5.18 takes AT_PHDR from the PT_LOAD holding e_phoff, not from PT_PHDR."""
    data = build_elf([
        (PT_PHDR, PF_R, 64, 0x400999, 112, 112),
        (PT_LOAD, PF_R | PF_X, 0, 0x400000, 0x200, 0x200),
    ])
    p = plan(data)
    assert p.phdr_vaddr == 0x400999
    assert p.phdr_address(0) == 0x400040
    assert p.phdr_address(0x1000) == 0x401040


def test_phdr_address_uses_the_last_pt_load_that_contains_the_headers() -> None:
    data = build_elf([
        (PT_LOAD, PF_R, 0, 0x400000, 0x200, 0x200),
        (PT_LOAD, PF_R, 0, 0x600000, 0x200, 0x200),
    ])
    assert plan(data).phdr_address(0) == 0x600040


def test_phdr_address_when_no_segment_holds_the_headers_is_the_bias() -> None:
    # The program headers live at 0x2000, outside every PT_LOAD's file bytes.
    data = build_elf([(PT_LOAD, PF_R | PF_X, 0, 0x400000, 0x100, 0x100)], phoff=0x2000, size=0x3000)
    p = plan(data)
    assert p.phdr_address(0) == 0
    assert p.phdr_address(0x555555554000) == 0x555555554000


# --------------------------------------------------------------------------- PT_INTERP
def test_first_pt_interp_wins() -> None:
    data = build_elf([
        (PT_INTERP, PF_R, 0x1000, 0, 9, 9),
        (PT_INTERP, PF_R, 0x1100, 0, 9, 9),
        (PT_LOAD, PF_R | PF_X, 0, 0x400000, 0x200, 0x200),
    ], content={0x1000: b"/lib/one\0", 0x1100: b"/lib/two\0"})
    assert plan(data).interp == "/lib/one"


@pytest.mark.parametrize("blob,size,problem", [
    (b"/lib/ld.so", 10, "not NUL-terminated"),
    (b"\0", 1, "size 1"),
    (b"\0\0", 2, "empty path"),
    (b"", 5000, "size 5000"),
])
def test_bad_pt_interp(blob: bytes, size: int, problem: str) -> None:
    data = build_elf([(PT_INTERP, PF_R, 0x1000, 0, size, size), (PT_LOAD, PF_R, 0, 0x400000, 0x200, 0x200)],
                     content={0x1000: blob})
    with pytest.raises(LoadError, match=problem):
        plan(data)


def test_pt_interp_path_keeps_undecodable_bytes() -> None:
    data = build_elf([(PT_INTERP, PF_R, 0x1000, 0, 8, 8), (PT_LOAD, PF_R, 0, 0x400000, 0x200, 0x200)],
                     content={0x1000: b"/lib/\xff\xfe\0"})
    assert os.fsencode(plan(data).interp or "") == b"/lib/\xff\xfe"


# --------------------------------------------------------------------------- validation
def test_segments_are_checked_like_load_elf_binary() -> None:
    ok = (PT_LOAD, PF_R, 0, 0x400000, 0x200, 0x200)
    cases = [
        ((PT_LOAD, PF_R, 0, 0x400000, 0x300, 0x200), "p_filesz 0x300 > p_memsz 0x200"),
        ((PT_LOAD, PF_R, 0, TASK_SIZE - PAGE_SIZE, 0, 2 * PAGE_SIZE), "beyond the user address space"),
        ((PT_LOAD, PF_R, 0, 0x400000, 0, 1 << 63), "beyond the user address space"),
        ((PT_LOAD, PF_R, 0, 1 << 63, 0, 0x1000), "beyond the user address space"),
        ((PT_LOAD, PF_R, 0, 0x400000, 0, 1 << 44), "absurd size"),
        ((PT_LOAD, PF_R, 0x2F00, 0x401F00, 0x200, 0x200), "extends past the end of the file"),
        ((PT_LOAD, PF_R, 0x100, 0x400000, 0x10, 0x10), "not page-congruent"),
    ]
    for bad, problem in cases:
        with pytest.raises(LoadError, match=problem):
            plan(build_elf([ok, bad]))
    with pytest.raises(LoadError, match="more than 1024 GiB"):
        plan(build_elf([ok, (PT_LOAD, PF_R, 0, 0x400000 + (1 << 41), 0x10, 0x10)]))
    with pytest.raises(LoadError, match="no PT_LOAD"):
        plan(build_elf([(PT_GNU_STACK, PF_R | PF_W, 0, 0, 0, 0)]))


def test_header_checks_in_order() -> None:
    good = build_elf([(PT_LOAD, PF_R, 0, 0x400000, 0x200, 0x200)])

    def patched(offset: int, fmt: str, value: int) -> bytes:
        data = bytearray(good)
        struct.pack_into(fmt, data, offset, value)
        return bytes(data)

    cases = [
        (b"", "not an ELF file"),
        (b"\x7fEL", "not an ELF file"),
        (b"#!/bin/sh\n", "not an ELF file"),
        (good[:63], "truncated ELF header"),
        (patched(4, "B", 1), "32-bit ELF"),
        (patched(4, "B", 7), "bad ELF class 7"),
        (patched(5, "B", 2), "not a little-endian ELF"),
        (patched(18, "<H", 183), r"not an x86-64 ELF \(e_machine 183: AArch64\)"),
        (patched(16, "<H", 1), r"relocatable object \(ET_REL\)"),
        (patched(16, "<H", 4), "core dump"),
        (patched(54, "<H", 32), "bad program header size 32"),
        (patched(56, "<H", 0), "no program headers"),
        (patched(56, "<H", 0xFFFF), "too many program headers"),
        (patched(32, "<Q", len(good) - 20), "truncated program headers"),
        (patched(32, "<Q", 1 << 63), "truncated program headers"),
    ]
    for data, problem in cases:
        with pytest.raises(LoadError, match=problem) as info:
            plan(data)
        assert str(info.value).startswith("/x/test.elf: ")
    assert plan(good).segments


def test_zero_sized_and_bss_only_segments_are_accepted() -> None:
    p = plan(build_elf([
        (PT_LOAD, PF_R | PF_X, 0, 0x400000, 0x200, 0x200),
        (PT_LOAD, PF_R | PF_W, 0, 0x600000, 0, 0),
        (PT_LOAD, PF_R | PF_W, 0x123, 0x601123, 0, 0x5000),
    ]))
    assert [s.memsz for s in p.segments] == [0x200, 0, 0x5000]
    assert p.high == 0x606123


# --------------------------------------------------------------------------- reading files
def test_read_file_problems(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="no such file"):
        read_file(str(tmp_path / "missing"))
    with pytest.raises(LoadError, match="is a directory"):
        read_file(str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(LoadError, match="not a regular file"):
        read_file(str(fifo))  # must not block opening it
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(LoadError, match="Not a directory"):
        read_file(str(tmp_path / "file" / "child"))
    with pytest.raises(LoadError, match="bad path"):
        read_file(str(tmp_path / "nul\0byte"))
    with pytest.raises(LoadError, match="too long"):
        read_file(str(tmp_path / ("n" * 300)))


def test_load_error_is_one_line_even_for_hostile_names(tmp_path: Path) -> None:
    with pytest.raises(LoadError) as info:
        read_file(str(tmp_path / "two\nlines\x1b[31m"))
    text = str(info.value)
    assert "\n" not in text and "\x1b" not in text and "two\\nlines\\x1b[31m" in text
