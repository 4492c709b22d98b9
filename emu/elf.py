"""ELF file -> LoadPlan. Reads and validates; maps nothing (so it is testable without a CPU)."""

from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass

from elftools.common.exceptions import ELFError
from elftools.elf.constants import P_FLAGS
from elftools.elf.elffile import ELFFile

from emu.abi import PAGE_SIZE, TASK_SIZE, Prot
from emu.errors import LoadError

EM_X86_64 = 62
PT_LOAD = "PT_LOAD"
PT_INTERP = "PT_INTERP"
PT_PHDR = "PT_PHDR"
PT_GNU_STACK = "PT_GNU_STACK"
MAX_IMAGE_SPAN = 1 << 40  # a mapping plan larger than this is nonsense, not a program


@dataclass(frozen=True, slots=True)
class Segment:
    """One PT_LOAD: file bytes [offset, offset+filesz) at vaddr, zero-filled up to memsz."""

    vaddr: int
    memsz: int
    offset: int
    filesz: int
    prot: Prot


@dataclass(frozen=True, slots=True)
class FileId:
    """What /proc/self/maps shows for a file: path, device, inode."""

    path: str
    dev: tuple[int, int]
    inode: int


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """Everything the process builder needs from one ELF file."""

    file: FileId
    data: bytes
    is_dyn: bool
    entry: int
    phoff: int
    phentsize: int
    phnum: int
    phdr_vaddr: int | None
    segments: tuple[Segment, ...]
    interp: str | None

    @property
    def low(self) -> int:
        return min(s.vaddr for s in self.segments) & ~(PAGE_SIZE - 1)

    @property
    def high(self) -> int:
        return max(s.vaddr + s.memsz for s in self.segments)

    def phdr_address(self, bias: int) -> int:
        """AT_PHDR: PT_PHDR's address, or where the headers fall inside a loaded segment."""
        if self.phdr_vaddr is not None:
            return self.phdr_vaddr + bias
        for seg in self.segments:
            if seg.offset <= self.phoff < seg.offset + seg.filesz:
                return seg.vaddr + (self.phoff - seg.offset) + bias
        return 0


def read_file(path: str) -> tuple[bytes, FileId]:
    """Read a whole file for loading; every failure becomes a one-line LoadError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise LoadError(path, "no such file") from None
    except OSError as exc:
        raise LoadError(path, exc.strerror or str(exc)) from None
    if stat.S_ISDIR(st.st_mode):
        raise LoadError(path, "is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise LoadError(path, "not a regular file")
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise LoadError(path, f"cannot read: {exc.strerror or exc}") from None
    dev = (os.major(st.st_dev), os.minor(st.st_dev))
    return data, FileId(path, dev, st.st_ino)


def _prot(flags: int) -> Prot:
    prot = Prot.NONE
    if flags & P_FLAGS.PF_R:
        prot |= Prot.READ
    if flags & P_FLAGS.PF_W:
        prot |= Prot.WRITE
    if flags & P_FLAGS.PF_X:
        prot |= Prot.EXEC
    return prot


def _check_ident(path: str, data: bytes) -> None:
    if len(data) < 4 or data[:4] != b"\x7fELF":
        raise LoadError(path, "not an ELF file")
    if len(data) < 64:
        raise LoadError(path, "truncated ELF header")
    if data[4] != 2:
        raise LoadError(path, "not a 64-bit ELF (ELFCLASS32 is not supported)" if data[4] == 1 else "bad ELF class")
    if data[5] != 1:
        raise LoadError(path, "not a little-endian ELF")
    machine = int.from_bytes(data[18:20], "little")
    if machine != EM_X86_64:
        raise LoadError(path, f"not an x86-64 ELF (e_machine {machine})")
    e_type = int.from_bytes(data[16:18], "little")
    if e_type not in (2, 3):
        raise LoadError(path, f"not an executable or shared object (e_type {e_type})")


def plan_from_bytes(data: bytes, file: FileId) -> LoadPlan:
    """Validate and describe the file; raise LoadError with a one-line reason."""
    path = file.path
    _check_ident(path, data)
    phoff = int.from_bytes(data[32:40], "little")
    phentsize = int.from_bytes(data[54:56], "little")
    phnum = int.from_bytes(data[56:58], "little")
    if phnum == 0:
        raise LoadError(path, "no program headers")
    if phentsize != 56:
        raise LoadError(path, f"bad program header size {phentsize}")
    if phoff + phnum * phentsize > len(data):
        raise LoadError(path, "truncated program headers")
    try:
        elf = ELFFile(io.BytesIO(data))
        segments, interp, phdr_vaddr = _read_segments(path, elf, data)
    except ELFError as exc:
        raise LoadError(path, f"malformed ELF: {exc}") from None
    return LoadPlan(
        file=file,
        data=data,
        is_dyn=elf.header["e_type"] == "ET_DYN",
        entry=elf.header["e_entry"],
        phoff=phoff,
        phentsize=phentsize,
        phnum=phnum,
        phdr_vaddr=phdr_vaddr,
        segments=segments,
        interp=interp,
    )


def _read_segments(path: str, elf: ELFFile, data: bytes) -> tuple[tuple[Segment, ...], str | None, int | None]:
    segments: list[Segment] = []
    interp: str | None = None
    phdr_vaddr: int | None = None
    for i in range(elf.num_segments()):
        hdr = elf._get_segment_header(i)  # header only: a bad PT_INTERP must not crash the parse
        kind = hdr["p_type"]
        if kind == PT_LOAD:
            segments.append(_load_segment(path, hdr, len(data)))
        elif kind == PT_INTERP:
            interp = _interp_path(path, hdr, data)
        elif kind == PT_PHDR:
            phdr_vaddr = hdr["p_vaddr"]
    if not segments:
        raise LoadError(path, "no PT_LOAD segment")
    low = min(s.vaddr for s in segments)
    high = max(s.vaddr + s.memsz for s in segments)
    if high - low > MAX_IMAGE_SPAN or high > TASK_SIZE:
        raise LoadError(path, f"segments span {low:#x}-{high:#x}, beyond the user address space")
    return tuple(segments), interp, phdr_vaddr


def _load_segment(path: str, hdr: dict, file_size: int) -> Segment:
    vaddr, memsz, offset, filesz = hdr["p_vaddr"], hdr["p_memsz"], hdr["p_offset"], hdr["p_filesz"]
    if offset + filesz > file_size:
        raise LoadError(path, f"segment at {vaddr:#x} extends past the end of the file")
    if filesz > memsz:
        raise LoadError(path, f"segment at {vaddr:#x} has p_filesz > p_memsz")
    if memsz > MAX_IMAGE_SPAN or vaddr + memsz > TASK_SIZE:
        raise LoadError(path, f"segment at {vaddr:#x} has an absurd size ({memsz:#x} bytes)")
    if (vaddr - offset) % PAGE_SIZE:
        raise LoadError(path, f"segment at {vaddr:#x} is not page-congruent with its file offset")
    return Segment(vaddr, memsz, offset, filesz, _prot(hdr["p_flags"]))


def _interp_path(path: str, hdr: dict, data: bytes) -> str:
    offset, size = hdr["p_offset"], hdr["p_filesz"]
    if size == 0 or size > 4096 or offset + size > len(data):
        raise LoadError(path, "bad PT_INTERP")
    raw = data[offset : offset + size]
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def load_plan(path: str) -> LoadPlan:
    data, file = read_file(path)
    return plan_from_bytes(data, file)
