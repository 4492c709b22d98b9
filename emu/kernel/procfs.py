"""/proc/self (and /proc/<pid>, /proc/thread-self) as the guest sees itself, never the host's.

Everything here is made up from the emulated process: its memory map, auxv, argv,
environment, descriptors and identity. Paths are canonical ``/proc/<guest pid>/...``.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import stat
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

from emu import abi
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import (
    DT_TYPES,
    Device,
    HostFile,
    MemFile,
    OpenFile,
    StatInfo,
    SyntheticDir,
    kernel_made_file,
    synthetic_stat,
)
from emu.process import layout
from emu.process.memory import SPECIAL

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel
    from emu.process.vma import Vma

_SELF = re.compile(r"^/proc/(self|thread-self|\d+)(/.*)?$")
_DIRS = ("", "/fd")
_LINKS = ("/exe", "/cwd", "/root")
_FD_LINK = re.compile(r"^/fd/(\d+)$")
_FILES = ("/auxv", "/cmdline", "/comm", "/environ", "/maps", "/mem", "/mountinfo", "/mounts", "/status")
MAPS_NAME_COLUMN = 73  # show_vma_header_prefix: seq_setwidth(25 + 6 * sizeof(void *) - 1), then one space
MAX_MAGIC_HOPS = 8
DT_DIR, DT_REG, DT_LNK = DT_TYPES[stat.S_IFDIR], DT_TYPES[stat.S_IFREG], DT_TYPES[stat.S_IFLNK]


def _normalize(path: str) -> str:
    parts: list[str] = []
    for comp in path.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if parts:
                parts.pop()
        else:
            parts.append(comp)
    return "/" + "/".join(parts)


def canonical(k: Kernel, absolute: str) -> str | None:
    """``/proc/self/...`` with the pid spelled as the guest's own; None for everything else."""
    path = _normalize(absolute)
    match = _SELF.match(path)
    if match is None:
        return None
    who = match.group(1)
    if who.isdigit() and int(who) != k.ident.pid:
        return None
    return f"/proc/{k.ident.pid}{match.group(2) or ''}"


def intercepts(k: Kernel) -> Callable[[str], bool]:
    """For Vfs.resolve: True for a path prefix procfs serves (so the host's /proc/self is never consulted)."""
    def special(prefix: str) -> bool:
        return prefix.startswith("/proc/") and canonical(k, prefix) is not None

    return special


def self_link(k: Kernel, absolute: str) -> str | None:
    """What readlink says for the /proc/self and /proc/thread-self links themselves."""
    path = _normalize(absolute)
    if path == "/proc/self":
        return str(k.ident.pid)
    if path == "/proc/thread-self":
        return f"{k.ident.pid}/task/{k.ident.pid}"
    return None


def _tail(k: Kernel, guest: str) -> str | None:
    prefix = f"/proc/{k.ident.pid}"
    if guest == prefix or guest.startswith(prefix + "/"):
        return guest[len(prefix):]
    return None


def _fd_of(k: Kernel, tail: str) -> int | None:
    match = _FD_LINK.match(tail)
    if match is None:
        return None
    fd = int(match.group(1))
    if fd not in k.files.entries:
        raise SyscallError(errno.ENOENT)
    return fd


def fd_file(k: Kernel, guest: str) -> OpenFile | None:
    """The open file behind ``/proc/<pid>/fd/N`` (what stat() and open() of the link reach)."""
    tail = _tail(k, guest)
    fd = _fd_of(k, tail) if tail is not None else None
    return k.files.file(fd) if fd is not None else None


def readlink(k: Kernel, guest: str) -> str | None:
    tail = _tail(k, guest)
    if tail is None:
        return None
    if tail == "/exe":
        return k.ident.exe
    if tail == "/cwd":
        return k.vfs.cwd
    if tail == "/root":
        return "/"
    fd = _fd_of(k, tail)
    if fd is not None:
        return k.files.file(fd).guest_path
    return None


def follow(k: Kernel, guest: str) -> str:
    """Resolve the magic links (exe, cwd, root, fd/N) the way open() and stat() follow them.

    An fd link to a pipe, a stream or a procfs file stays as it is: open() of it reaches the
    same open file (see ``open_file``), as Linux's magic links do, not a path.
    """
    for _ in range(MAX_MAGIC_HOPS):
        target = readlink(k, guest)
        if target is None or not target.startswith("/"):
            return guest
        file = fd_file(k, guest)
        if file is not None and not isinstance(file, HostFile | Device):
            return guest
        resolved = k.vfs.resolve(target, special=intercepts(k))
        again = canonical(k, resolved)
        if again is None:
            return resolved
        guest = again
    raise SyscallError(errno.ELOOP)


def render_maps(vmas: list[Vma]) -> str:
    """/proc/self/maps exactly as show_map_vma() prints it (fs/proc/task_mmu.c), the gate area
    ([vsyscall], no VMA of the process) last.

    ``%08lx-%08lx rwxp %08llx MM:mm inode `` then, for a named mapping, pad to column 73.
    """
    lines = []
    for vma in vmas:
        head = (
            f"{vma.start:08x}-{vma.end:08x} {vma.perms()} {vma.offset:08x} "
            f"{vma.dev[0]:02x}:{vma.dev[1]:02x} {vma.inode} "
        )
        if vma.name:
            head = head.ljust(MAPS_NAME_COLUMN - 1) + " " + vma.name
        lines.append(head + "\n")
    lines.append(f"{layout.VSYSCALL_LINE} ".ljust(MAPS_NAME_COLUMN - 1) + " [vsyscall]\n")
    return "".join(lines)


class MapsFile(MemFile):
    """/proc/pid/maps is a seq_file: made at the first read, so it shows what was mapped after open."""

    def __init__(self, k: Kernel, guest_path: str, info: StatInfo | None) -> None:
        super().__init__(guest_path, b"", info)
        self.k: Kernel | None = k

    def _made(self) -> None:
        if self.k is not None:
            self.content, self.k = render_maps(list(self.k.mem)).encode(), None

    def read(self, size: int) -> bytes:
        self._made()
        return super().read(size)

    def pread(self, size: int, offset: int) -> bytes:
        self._made()
        return super().pread(size, offset)


def _content(k: Kernel, tail: str) -> bytes | None:
    if tail == "/maps":
        return render_maps(list(k.mem)).encode()
    if tail == "/auxv":
        return b"".join(struct.pack("<QQ", key, value) for key, value in k.ident.auxv)
    if tail == "/cmdline":
        return b"".join(arg + b"\0" for arg in k.ident.argv)
    if tail == "/environ":
        return b"".join(env + b"\0" for env in k.ident.envp)
    if tail == "/comm":
        return _comm(k).encode() + b"\n"
    if tail == "/status":
        return _status(k).encode()
    if tail in ("/mounts", "/mountinfo"):
        return _mounts(k, tail == "/mountinfo").encode()
    return None


class ProcMem(OpenFile):
    """/proc/<pid>/mem of the process itself (fs/proc/base.c mem_rw): the file offset is the
    address. Reads and writes go page by page as access_remote_vm with FOLL_FORCE does: a write
    reaches a read-only private mapping (the process's own text included), a page that is unmapped
    or has no pages behind it (the special mappings marked io) ends the transfer, and a transfer
    that moved nothing is EIO."""

    def __init__(self, k: Kernel, guest_path: str, info: StatInfo) -> None:
        self.guest_path = guest_path
        self.k = k
        self.pos = 0
        self._info = info

    def _reachable(self, addr: int, write: bool) -> bool:
        vma = self.k.mem.find(addr)
        if vma is None or (vma.name in SPECIAL and SPECIAL[vma.name].io):
            return False
        return not (write and vma.shared and not vma.prot & abi.Prot.WRITE)

    def _span(self, addr: int, size: int, write: bool) -> int:
        """How many bytes from ``addr`` the transfer can move before an unreachable page."""
        done = 0
        while done < size and self._reachable(addr + done, write):
            done += min(size - done, abi.PAGE_SIZE - (addr + done) % abi.PAGE_SIZE)
        if size and not done:
            raise SyscallError(errno.EIO)
        return done

    def pread(self, size: int, offset: int) -> bytes:
        return self.k.mem.read(offset, self._span(offset, size, write=False))

    def pwrite(self, data: bytes, offset: int) -> int:
        n = self._span(offset, len(data), write=True)
        self.k.mem.write(offset, data[:n])
        self.k.mem.backend.flush_code(offset, offset + n)  # a write into text runs as written
        return n

    def read(self, size: int) -> bytes:
        data = self.pread(size, self.pos)
        self.pos += len(data)
        return data

    def write(self, data: bytes) -> int:
        n = self.pwrite(data, self.pos)
        self.pos += n
        return n

    def seek(self, offset: int, whence: int) -> int:
        """mem_lseek: SEEK_SET and SEEK_CUR only; any 64-bit position (an address) is valid."""
        if whence not in (os.SEEK_SET, os.SEEK_CUR):
            raise SyscallError(errno.EINVAL)
        self.pos = ((self.pos if whence == os.SEEK_CUR else 0) + offset) & 0xFFFFFFFFFFFFFFFF
        return self.pos

    def stat(self) -> StatInfo:
        return self._info


def _mounts(k: Kernel, info: bool) -> str:
    """The mount table. With the host's root, the host's own (the guest shares its file systems),
    every mount marked ``ro`` as the sandbox serves it; with a --rootfs, that one read-only root."""
    if k.vfs.root != "/":
        dev = os.stat(k.vfs.root).st_dev
        if info:
            return f"1 0 {os.major(dev)}:{os.minor(dev)} / / ro - rootfs rootfs ro\n"
        return "rootfs / rootfs ro 0 0\n"
    try:
        with open(f"/proc/self/{'mountinfo' if info else 'mounts'}", encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    out = []
    for line in lines:
        fields = line.split(" ")
        for i in ((5, len(fields) - 1) if info else (3,)):
            if 0 <= i < len(fields):
                fields[i] = re.sub(r"^rw(?=,|$)", "ro", fields[i])
        out.append(" ".join(fields) + "\n")
    return "".join(out)


def _comm(k: Kernel) -> str:
    """The basename of the path given to execve (AT_EXECFN), not of the resolved exe: ``sh``, not ``dash``."""
    name = k.ident.exe
    execfn = dict(k.ident.auxv).get(abi.AuxType.AT_EXECFN)
    if execfn:
        try:
            name = k.mem.read_cstring(execfn, 4096).decode(errors="replace")
        except Exception:  # the guest unmapped its own stack strings: fall back to the exe
            name = k.ident.exe
    return name.rsplit("/", 1)[-1][:15]


def _status(k: Kernel) -> str:
    i = k.ident
    return (
        f"Name:\t{_comm(k)}\nUmask:\t{k.umask:04o}\nState:\tR (running)\nTgid:\t{i.pid}\nNgid:\t0\n"
        f"Pid:\t{i.pid}\nPPid:\t{i.ppid}\nTracerPid:\t0\nUid:\t{i.uid}\t{i.uid}\t{i.uid}\t{i.uid}\n"
        f"Gid:\t{i.gid}\t{i.gid}\t{i.gid}\t{i.gid}\nThreads:\t1\n"
        f"Cpus_allowed:\t{k.cpu_model.affinity_hex(k.affinity)}\n"
        f"Cpus_allowed_list:\t{k.cpu_model.cpu_list(k.affinity)}\n"
    )


def _dir_entries(k: Kernel, tail: str) -> Callable[[], list[tuple[int, int, bytes]]]:
    base_ino = 0x1000 + k.ident.pid * 0x100

    def listing() -> list[tuple[int, int, bytes]]:
        entries = [(base_ino, DT_DIR, b"."), (base_ino - 1, DT_DIR, b"..")]
        if tail == "/fd":
            entries += [(base_ino + 0x10 + fd, DT_LNK, str(fd).encode()) for fd in sorted(k.files.entries)]
            return entries
        names = [(n[1:], DT_REG) for n in _FILES] + [(n[1:], DT_LNK) for n in _LINKS] + [("fd", DT_DIR)]
        entries += [(base_ino + 1 + i, dtype, name.encode()) for i, (name, dtype) in enumerate(sorted(names))]
        return entries

    return listing


def open_file(k: Kernel, guest: str, flags: int = abi.O_RDONLY) -> OpenFile | None:
    """The open file for a procfs path, or None for any other path. Nothing here is writable."""
    tail = _tail(k, guest)
    if tail is None:
        return None
    writing = (flags & abi.O_ACCMODE) != abi.O_RDONLY or flags & abi.O_TRUNC
    fd = _fd_of(k, tail)
    if fd is not None:
        if flags & abi.O_NOFOLLOW:
            raise SyscallError(errno.ELOOP)
        return k.files.file(fd)  # a pipe or stream reached through its magic link: the same open file
    if tail in _LINKS:
        raise SyscallError(errno.ELOOP)  # only reached with O_NOFOLLOW: lookup follows them otherwise
    if tail in _DIRS:
        if writing or flags & abi.O_CREAT:
            raise SyscallError(errno.EISDIR)
        return SyntheticDir(guest, _dir_entries(k, tail), stat_of(k, guest))
    if tail == "/mem":
        info = stat_of(k, guest)
        assert info is not None
        return ProcMem(k, guest, info)
    if tail == "/maps" and not writing and not flags & abi.O_DIRECTORY:
        return MapsFile(k, guest, stat_of(k, guest))
    return kernel_made_file(guest, _content(k, tail), flags, stat_of(k, guest), render=lambda: _content(k, tail) or b"")


def _pstat(k: Kernel, mode: int, size: int = 0, nlink: int = 1) -> StatInfo:
    """procfs inodes belong to the process's owner and are as old as the process."""
    born = k.config.realtime_start_ns
    return dataclasses.replace(synthetic_stat(mode, size), nlink=nlink, uid=k.ident.uid, gid=k.ident.gid,
                               blksize=1024, atime_ns=born, mtime_ns=born, ctime_ns=born)


_FD_LINK_MODES = {abi.O_RDONLY: 0o500, abi.O_WRONLY: 0o300, abi.O_RDWR: 0o700}


def stat_of(k: Kernel, guest: str) -> StatInfo | None:
    tail = _tail(k, guest)
    if tail is None:
        return None
    if tail == "":
        return _pstat(k, stat.S_IFDIR | 0o555, nlink=9)
    if tail == "/fd":
        return _pstat(k, stat.S_IFDIR | 0o500, size=len(k.files.entries), nlink=2)
    if tail in _LINKS:
        return _pstat(k, stat.S_IFLNK | 0o777)
    fd = _fd_of(k, tail)
    if fd is not None:
        access = k.files.get(fd).flags & abi.O_ACCMODE
        return _pstat(k, stat.S_IFLNK | _FD_LINK_MODES.get(access, 0o700), size=64)
    if tail == "/mem":
        return _pstat(k, stat.S_IFREG | 0o600)
    if tail in _FILES:
        return _pstat(k, stat.S_IFREG | (0o400 if tail in ("/auxv", "/environ") else 0o444))
    raise SyscallError(errno.ENOENT)
