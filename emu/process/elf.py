"""ELF file -> LoadPlan. Reads and validates; maps nothing (so it is testable without a CPU).

The ELF header and program headers are decoded with :mod:`struct`, not pyelftools:
they are two fixed-size records, and every field is checked here, in the order
and with the limits of Linux's ``load_elf_binary`` (fs/binfmt_elf.c), so that any
file, however damaged, either yields a plan or one :class:`LoadError` line.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass

from emu.abi import PAGE_SIZE, TASK_SIZE, Prot
from emu.errors import LoadError

EM_X86_64 = 62
ET_EXEC = 2
ET_DYN = 3
PT_LOAD = 1
PT_INTERP = 3
PT_PHDR = 6
PT_GNU_STACK = 0x6474E551
PF_X, PF_W, PF_R = 1, 2, 4
PATH_MAX = 4096
MAX_IMAGE_SPAN = 1 << 40  # a mapping plan larger than this is nonsense, not a program
MAX_PHDRS_SIZE = 65536  # Linux's load_elf_phdrs() refuses larger program header tables

EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr, 64 bytes
PHDR = struct.Struct("<IIQQQQQQ")  # Elf64_Phdr, 56 bytes

_MACHINES = {3: "i386", 40: "ARM", 183: "AArch64", 243: "RISC-V", 62: "x86-64"}
_TYPES = {0: "ET_NONE", 1: "a relocatable object (ET_REL)", 4: "a core dump (ET_CORE)"}


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
    phdr_vaddr: int | None  # PT_PHDR's p_vaddr, if there is one (informative: see phdr_address)
    segments: tuple[Segment, ...]
    interp: str | None

    @property
    def low(self) -> int:
        return min(s.vaddr for s in self.segments) & ~(PAGE_SIZE - 1)

    @property
    def high(self) -> int:
        return max(s.vaddr + s.memsz for s in self.segments)

    def file_offset(self, vaddr: int) -> int | None:
        """Where link-time address ``vaddr`` lies in the file (None: not file-backed)."""
        for seg in self.segments:
            if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
                return vaddr - seg.vaddr + seg.offset
        return None

    def phdr_address(self, bias: int) -> int:
        """AT_PHDR, as Linux >= 5.18 computes it: where e_phoff lands in the (last) PT_LOAD whose
        file bytes contain it, plus the bias; just the bias if none does. PT_PHDR is not consulted
        (fs/binfmt_elf.c, "Fix AT_PHDR for unusual ELF files")."""
        found = 0
        for seg in self.segments:
            if seg.offset <= self.phoff < seg.offset + seg.filesz:
                found = seg.vaddr + (self.phoff - seg.offset)
        return found + bias


def read_file(path: str) -> tuple[bytes, FileId]:
    """Read a whole file for loading; every failure becomes a one-line LoadError."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise LoadError(path, "no such file") from None
    except OSError as exc:
        raise LoadError(path, exc.strerror or str(exc)) from None
    except ValueError as exc:  # an embedded NUL: no such path can exist
        raise LoadError(path, f"bad path ({exc})") from None
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
    if flags & PF_R:
        prot |= Prot.READ
    if flags & PF_W:
        prot |= Prot.WRITE
    if flags & PF_X:
        prot |= Prot.EXEC
    return prot


def _check_ident(path: str, data: bytes) -> None:
    if len(data) < 4 or data[:4] != b"\x7fELF":
        raise LoadError(path, "not an ELF file")
    if len(data) < EHDR.size:
        raise LoadError(path, f"truncated ELF header ({len(data)} of {EHDR.size} bytes)")
    if data[4] == 1:
        raise LoadError(path, "32-bit ELF (ELFCLASS32) is not supported")
    if data[4] != 2:
        raise LoadError(path, f"bad ELF class {data[4]}")
    if data[5] != 1:
        raise LoadError(path, "not a little-endian ELF")
    machine = int.from_bytes(data[18:20], "little")
    if machine != EM_X86_64:
        name = _MACHINES.get(machine, "unknown")
        raise LoadError(path, f"not an x86-64 ELF (e_machine {machine}: {name})")
    e_type = int.from_bytes(data[16:18], "little")
    if e_type not in (ET_EXEC, ET_DYN):
        what = _TYPES.get(e_type, f"e_type {e_type}")
        raise LoadError(path, f"not an executable or shared object ({what})")


def plan_from_bytes(data: bytes, file: FileId) -> LoadPlan:
    """Validate and describe the file; raise LoadError with a one-line reason."""
    path = file.path
    _check_ident(path, data)
    fields = EHDR.unpack_from(data)
    e_type, e_entry, phoff, phentsize, phnum = fields[1], fields[4], fields[5], fields[9], fields[10]
    if phnum == 0:
        raise LoadError(path, "no program headers")
    if phentsize != PHDR.size:
        raise LoadError(path, f"bad program header size {phentsize} (want {PHDR.size})")
    if phnum * phentsize > MAX_PHDRS_SIZE:
        raise LoadError(path, f"too many program headers ({phnum})")
    if phoff + phnum * phentsize > len(data):
        raise LoadError(path, f"truncated program headers ({phnum} at offset {phoff:#x}, file is {len(data)} bytes)")
    segments: list[Segment] = []
    interp: str | None = None
    phdr_vaddr: int | None = None
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz, p_memsz, _align = PHDR.unpack_from(
            data, phoff + i * phentsize
        )
        if p_type == PT_LOAD:
            segments.append(_load_segment(path, p_vaddr, p_memsz, p_offset, p_filesz, p_flags, len(data)))
        elif p_type == PT_INTERP and interp is None:  # Linux uses the first one
            interp = _interp_path(path, p_offset, p_filesz, data)
        elif p_type == PT_PHDR and phdr_vaddr is None:
            phdr_vaddr = p_vaddr
    if not segments:
        raise LoadError(path, "no PT_LOAD segment")
    low = min(s.vaddr for s in segments)
    high = max(s.vaddr + s.memsz for s in segments)
    if high - low > MAX_IMAGE_SPAN:
        raise LoadError(path, f"segments span {low:#x}-{high:#x}, more than {MAX_IMAGE_SPAN >> 30} GiB")
    return LoadPlan(
        file=file,
        data=data,
        is_dyn=e_type == ET_DYN,
        entry=e_entry,
        phoff=phoff,
        phentsize=phentsize,
        phnum=phnum,
        phdr_vaddr=phdr_vaddr,
        segments=tuple(segments),
        interp=interp,
    )


def _load_segment(path: str, vaddr: int, memsz: int, offset: int, filesz: int, flags: int, file_size: int) -> Segment:
    # The checks of load_elf_binary(): p_filesz <= p_memsz, the segment inside TASK_SIZE.
    if filesz > memsz:
        raise LoadError(path, f"segment at {vaddr:#x} has p_filesz {filesz:#x} > p_memsz {memsz:#x}")
    if vaddr >= TASK_SIZE or memsz > TASK_SIZE or vaddr + memsz > TASK_SIZE:
        raise LoadError(path, f"segment at {vaddr:#x} of {memsz:#x} bytes is beyond the user address space")
    if memsz > MAX_IMAGE_SPAN:
        raise LoadError(path, f"segment at {vaddr:#x} has an absurd size ({memsz:#x} bytes)")
    # Linux would map it and SIGBUS on the missing pages; a harness says so up front.
    if offset + filesz > file_size:
        raise LoadError(path, f"segment at {vaddr:#x} extends past the end of the file")
    # mmap() needs the file offset and the address congruent modulo the page size.
    if (vaddr - offset) % PAGE_SIZE:
        raise LoadError(path, f"segment at {vaddr:#x} is not page-congruent with its file offset {offset:#x}")
    return Segment(vaddr, memsz, offset, filesz, _prot(flags))


def _interp_path(path: str, offset: int, size: int, data: bytes) -> str:
    # Linux: 2 <= p_filesz <= PATH_MAX, and the last byte must be the NUL terminator.
    if size < 2 or size > PATH_MAX:
        raise LoadError(path, f"bad PT_INTERP (size {size})")
    if offset + size > len(data):
        raise LoadError(path, "bad PT_INTERP (past the end of the file)")
    raw = data[offset : offset + size]
    if raw[-1] != 0:
        raise LoadError(path, "bad PT_INTERP (not NUL-terminated)")
    name = raw.split(b"\0", 1)[0]
    if not name:
        raise LoadError(path, "bad PT_INTERP (empty path)")
    return os.fsdecode(name)


def load_plan(path: str) -> LoadPlan:
    data, file = read_file(path)
    return plan_from_bytes(data, file)


def load_executable(path: str) -> LoadPlan:
    """load_plan of the program a run starts with, which execve would refuse without an execute bit
    (EACCES, root included: root may skip the check only where some execute bit is set)."""
    data, file = read_file(path)
    if not os.stat(path).st_mode & 0o111:
        raise LoadError(path, "permission denied: no execute bit (execve would fail with EACCES)")
    return plan_from_bytes(data, file)
