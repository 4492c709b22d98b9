"""The open-file objects behind descriptors, and what they report: host files (read-only), the
allowed devices, directories and files the kernel makes up (procfs, sysfs), the guest's stdio streams.

A guest can never change the host: only reads reach host files; writes reach the guest's own
in-memory layer (overlay.py), its stdout/stderr sinks and /dev/null. Pipes: pipe.py.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import stat
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emu.abi import O_ACCMODE, O_DIRECTORY
from emu.kernel.errno_ import SyscallError

if TYPE_CHECKING:
    from emu.process.vma import SharedPages


ALLOWED_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random"})
SYS_GETDENTS64, SYS_STATFS, SYS_FSTATFS, SYS_STATX = 217, 137, 138, 332  # host calls Python has no wrapper for
STATX_SIZE, STATFS_SIZE = 256, 120

S_IFIFO = 0o010000
S_IFCHR = 0o020000

DT_TYPES = {
    stat.S_IFDIR: 4, stat.S_IFREG: 8, stat.S_IFLNK: 10, stat.S_IFCHR: 2,
    stat.S_IFBLK: 6, stat.S_IFIFO: 1, stat.S_IFSOCK: 12,
}


@dataclass(frozen=True, slots=True)
class StatInfo:
    """The fields of struct stat the guest sees."""

    dev: int
    ino: int
    mode: int
    nlink: int
    uid: int
    gid: int
    rdev: int
    size: int
    blksize: int
    blocks: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def from_host(cls, st: os.stat_result) -> StatInfo:
        return cls(
            st.st_dev, st.st_ino, st.st_mode, st.st_nlink, st.st_uid, st.st_gid, st.st_rdev,
            st.st_size, st.st_blksize, st.st_blocks, st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns,
        )

    def pack_stat(self) -> bytes:
        """struct stat for x86-64 (144 bytes)."""
        return struct.pack(
            "<QQQIIIIQqqqqqqqqq3q",
            self.dev, self.ino, self.nlink, self.mode, self.uid, self.gid, 0, self.rdev,
            self.size, self.blksize, self.blocks,
            self.atime_ns // 10**9, self.atime_ns % 10**9,
            self.mtime_ns // 10**9, self.mtime_ns % 10**9,
            self.ctime_ns // 10**9, self.ctime_ns % 10**9,
            0, 0, 0,
        )

    def pack_statx(self) -> bytes:
        """struct statx (256 bytes) with the basic-stats mask (0x7ff)."""
        head = struct.pack(
            "<IIQIIIHHQQQQ", 0x7FF, self.blksize, 0, self.nlink, self.uid, self.gid,
            self.mode & 0xFFFF, 0, self.ino, self.size, self.blocks, 0,
        )
        times = b"".join(
            struct.pack("<qIi", ns // 10**9, ns % 10**9, 0)
            for ns in (self.atime_ns, self.ctime_ns, self.ctime_ns, self.mtime_ns)
        )
        tail = struct.pack(
            "<IIIIQ", os.major(self.rdev), os.minor(self.rdev), os.major(self.dev), os.minor(self.dev), 0
        )
        blob = head + times + tail
        return blob + b"\0" * (256 - len(blob))


_libc: ctypes.CDLL | None = None


def host_syscall(nr: int, *args: int | bytes | ctypes.Array[ctypes.c_char]) -> int:
    """A read-only host system call (getdents64, statx, statfs) whose exact bytes the guest should see.

    Values pass through unchanged, as stat() results do, so a guest run compares equal to a
    native one. Raises SyscallError with the host's errno; ENOSYS where ctypes cannot reach libc.
    """
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
        except OSError:
            raise SyscallError(errno.ENOSYS) from None
    func = _libc.syscall
    func.restype = ctypes.c_long
    ret = int(func(ctypes.c_long(nr), *(ctypes.c_long(a) if isinstance(a, int) else a for a in args)))
    if ret < 0:
        raise SyscallError(ctypes.get_errno() or errno.EIO)
    return ret


def pack_dirents(entries: Iterable[tuple[int, int, bytes]], start: int, count: int) -> tuple[bytes, int]:
    """struct linux_dirent64 records for ``entries[start:]`` fitting in ``count`` bytes; d_off = index + 1.

    Returns the records and the index after the last one packed; EINVAL if not even one fits.
    """
    out = bytearray()
    index = start
    for ino, dtype, name in list(entries)[start:]:
        reclen = (19 + len(name) + 1 + 7) & ~7
        if len(out) + reclen > count:
            if not out:
                raise SyscallError(errno.EINVAL)
            break
        record = struct.pack("<QqHB", ino, index + 1, reclen, dtype) + name
        out += record + b"\0" * (reclen - len(record))
        index += 1
    return bytes(out), index


def synthetic_stat(mode: int, size: int = 0, ino: int = 1) -> StatInfo:
    return StatInfo(dev=0x16, ino=ino, mode=mode, nlink=1, uid=0, gid=0, rdev=0, size=size,
                    blksize=4096, blocks=0, atime_ns=0, mtime_ns=0, ctime_ns=0)


class OpenFile:
    """Base of everything an fd can refer to. Unsupported operations raise the kernel's errno."""

    guest_path: str = ""
    nonblock: bool = False

    def read(self, size: int) -> bytes:
        raise SyscallError(errno.EBADF)

    def write(self, data: bytes) -> int:
        raise SyscallError(errno.EBADF)

    def pread(self, size: int, offset: int) -> bytes:
        raise SyscallError(errno.ESPIPE)

    def pwrite(self, data: bytes, offset: int) -> int:
        raise SyscallError(errno.ESPIPE)

    # O_APPEND moves the offset to the end before each write (regular files of the guest's layer)
    seekable_end = False

    def seek(self, offset: int, whence: int) -> int:
        raise SyscallError(errno.ESPIPE)

    def stat(self) -> StatInfo:
        raise SyscallError(errno.EBADF)

    def dirents(self) -> list[tuple[int, int, bytes]]:
        raise SyscallError(errno.ENOTDIR)

    def getdents(self, count: int) -> bytes:
        """The next linux_dirent64 records that fit in ``count`` bytes (b"" at the end)."""
        raise SyscallError(errno.ENOTDIR)

    @property
    def is_directory(self) -> bool:
        return False

    def host_fd(self) -> int | None:
        """A host descriptor for read-only ioctls (isatty, window size), if there is one."""
        return None

    def mmap_bytes(self, offset: int, length: int) -> bytes:
        raise SyscallError(errno.ENODEV)

    # A writable shared mapping of this file is allowed (only kernel objects, never host files).
    shared_writable = False

    def shared_pages(self, offset: int, length: int) -> tuple[SharedPages, int] | None:
        """The host pages a MAP_SHARED mapping of [offset, offset+length) shows, and where in them it
        starts: one and the same for every process. None: each mapping has its own copy."""
        return None

    def mapped(self, start: int, length: int) -> None:
        """Told where mmap put it (a perf ring buffer writes its samples there)."""

    def ioctl(self, request: int, arg: int) -> int | None:
        """File-specific ioctls; None: not this file's, the generic ones apply."""
        return None

    def close(self) -> None:
        pass


class HostFile(OpenFile):
    """A host file or directory opened read-only (or O_PATH: a handle that can only be named)."""

    def __init__(self, host_path: str, guest_path: str, is_dir: bool, path_only: bool = False) -> None:
        flags = os.O_CLOEXEC | (os.O_DIRECTORY if is_dir else 0) | (os.O_PATH if path_only else os.O_RDONLY)
        try:
            self.fd = os.open(host_path, flags | os.O_NOFOLLOW)
        except OSError as exc:
            raise SyscallError(exc.errno or errno.EACCES) from None
        self.host_path = host_path
        self.guest_path = guest_path
        self.is_dir = is_dir
        self.path_only = path_only
        self.dir_pos = 0
        self._entries: list[tuple[int, int, bytes]] | None = None

    def host_is_current(self) -> bool:
        """Is the host file still what this descriptor shows (statx may ask the host)?"""
        return True

    def read(self, size: int) -> bytes:
        if self.is_dir:
            raise SyscallError(errno.EISDIR)
        try:
            return os.read(self.fd, size)
        except OSError as exc:
            raise SyscallError(exc.errno or errno.EIO) from None

    def pread(self, size: int, offset: int) -> bytes:
        if self.is_dir:
            raise SyscallError(errno.EISDIR)
        try:
            return os.pread(self.fd, size, offset)
        except OSError as exc:
            raise SyscallError(exc.errno or errno.EIO) from None

    def size_left(self) -> int:
        try:
            return max(0, os.fstat(self.fd).st_size - os.lseek(self.fd, 0, os.SEEK_CUR))
        except OSError as exc:
            raise SyscallError(exc.errno or errno.EIO) from None

    def seek(self, offset: int, whence: int) -> int:
        # Directories too: their positions are the host file system's own d_off cookies.
        try:
            return os.lseek(self.fd, offset, whence)
        except OSError as exc:
            raise SyscallError(exc.errno or errno.EINVAL) from None

    @property
    def is_directory(self) -> bool:
        return self.is_dir

    def getdents(self, count: int) -> bytes:
        """The host's own getdents64 records: same order, d_off cookies and d_type as a native run.

        (Without a reachable libc, records are made from scandir() with index offsets instead.)
        """
        if not self.is_dir:
            raise SyscallError(errno.ENOTDIR)
        size = min(count, 1 << 20)
        buf = ctypes.create_string_buffer(size)
        try:
            n = host_syscall(SYS_GETDENTS64, self.fd, buf, size)
        except SyscallError as err:
            if err.errno != errno.ENOSYS:
                raise
            data, self.dir_pos = pack_dirents(self.dirents(), self.dir_pos, count)
            return data
        return self._root_dotdot(buf.raw[:n])

    def _root_dotdot(self, data: bytes) -> bytes:
        """At the guest's root, ".." is the root itself (its host parent is outside the sandbox)."""
        if self.guest_path != "/" or os.path.samefile(self.host_path, "/"):
            return data
        out = bytearray(data)
        here = os.fstat(self.fd).st_ino
        pos = 0
        while pos < len(out):
            reclen = struct.unpack_from("<H", out, pos + 16)[0]
            if out[pos + 19 : pos + 22] == b"..\0":
                struct.pack_into("<Q", out, pos, here)
            pos += reclen or len(out)
        return bytes(out)

    def stat(self) -> StatInfo:
        return StatInfo.from_host(os.fstat(self.fd))

    def dirents(self) -> list[tuple[int, int, bytes]]:
        if not self.is_dir:
            raise SyscallError(errno.ENOTDIR)
        if self._entries is None:
            here = os.fstat(self.fd)
            parent = os.stat(os.path.join(self.host_path, ".."))
            entries = [(here.st_ino, 4, b"."), (parent.st_ino, 4, b"..")]
            with os.scandir(self.fd) as it:
                for entry in it:
                    st = entry.stat(follow_symlinks=False)
                    entries.append((st.st_ino, DT_TYPES.get(stat.S_IFMT(st.st_mode), 0), os.fsencode(entry.name)))
            self._entries = entries
        return self._entries

    def host_fd(self) -> int | None:
        return self.fd

    def mmap_bytes(self, offset: int, length: int) -> bytes:
        if self.is_dir:
            raise SyscallError(errno.ENODEV)
        try:
            return os.pread(self.fd, length, offset)
        except OSError as exc:
            raise SyscallError(exc.errno or errno.EACCES) from None

    def close(self) -> None:
        os.close(self.fd)


class Device(OpenFile):
    """A character device the sandbox emulates instead of opening the host's: /dev/null, zero, full, (u)random.

    stat() reports the host node (device numbers, owner, times) when there is one, as Linux would.
    """

    MINORS = {"/dev/null": 3, "/dev/zero": 5, "/dev/full": 7, "/dev/random": 8, "/dev/urandom": 9}

    def __init__(self, guest_path: str, host_path: str | None = None,
                 randbytes: Callable[[int], bytes] | None = None) -> None:
        self.guest_path = guest_path
        self.host_path = host_path
        self.randbytes = randbytes

    def read(self, size: int) -> bytes:
        if self.guest_path == "/dev/null":
            return b""
        if self.guest_path in ("/dev/random", "/dev/urandom"):
            # Deterministic: the kernel's seeded generator, like getrandom (DESIGN: conventions).
            return self.randbytes(size) if self.randbytes else bytes(size)
        return bytes(size)

    def pread(self, size: int, offset: int) -> bytes:
        return self.read(size)

    def write(self, data: bytes) -> int:
        if self.guest_path == "/dev/full":
            raise SyscallError(errno.ENOSPC)
        return len(data)

    def pwrite(self, data: bytes, offset: int) -> int:
        return self.write(data)

    def seek(self, offset: int, whence: int) -> int:
        return 0

    def stat(self) -> StatInfo:
        if self.host_path is not None:
            try:
                return StatInfo.from_host(os.stat(self.host_path))
            except OSError:
                pass
        return dataclasses.replace(synthetic_stat(S_IFCHR | 0o666),
                                   rdev=os.makedev(1, self.MINORS.get(self.guest_path, 3)))


class SyntheticDir(OpenFile):
    """A directory whose entries the kernel makes up (procfs); listed afresh when read from the start."""

    def __init__(self, guest_path: str, entries: Callable[[], list[tuple[int, int, bytes]]],
                 info: StatInfo | None = None) -> None:
        self.guest_path = guest_path
        self._entries = entries
        self._snapshot: list[tuple[int, int, bytes]] | None = None
        self._info = info or synthetic_stat(stat.S_IFDIR | 0o555)
        self.dir_pos = 0

    @property
    def is_directory(self) -> bool:
        return True

    def read(self, size: int) -> bytes:
        raise SyscallError(errno.EISDIR)

    def seek(self, offset: int, whence: int) -> int:
        """Positions are entry indexes (what d_off says); SEEK_CUR only tells where we are."""
        target = offset if whence == os.SEEK_SET else self.dir_pos + offset if whence == os.SEEK_CUR else -1
        if target < 0:
            raise SyscallError(errno.EINVAL)
        self.dir_pos = target
        return target

    def stat(self) -> StatInfo:
        return self._info

    def dirents(self) -> list[tuple[int, int, bytes]]:
        if self._snapshot is None or self.dir_pos == 0:
            self._snapshot = self._entries()
        return self._snapshot

    def getdents(self, count: int) -> bytes:
        data, self.dir_pos = pack_dirents(self.dirents(), self.dir_pos, count)
        return data


class MemFile(OpenFile):
    """A read-only file whose content the kernel makes up (procfs).

    With ``render``, the content is made when it is read from the start, as a seq_file's is:
    /proc/self/cmdline opened before an execve shows the new program's arguments.
    """

    def __init__(self, guest_path: str, content: bytes, info: StatInfo | None = None,
                 render: Callable[[], bytes] | None = None) -> None:
        self.guest_path = guest_path
        self.content = content
        self.render = render
        self.pos = 0
        self._info = info or synthetic_stat(stat.S_IFREG | 0o444, 0)

    def _fresh(self, offset: int) -> bytes:
        if self.render is not None and offset == 0:
            self.content = self.render()
        return self.content

    def read(self, size: int) -> bytes:
        chunk = self._fresh(self.pos)[self.pos : self.pos + size]
        self.pos += len(chunk)
        return chunk

    def pread(self, size: int, offset: int) -> bytes:
        return self._fresh(offset)[offset : offset + size]

    def seek(self, offset: int, whence: int) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: len(self.content)}.get(whence)
        if base is None or base + offset < 0:
            raise SyscallError(errno.EINVAL)
        self.pos = base + offset
        return self.pos

    def stat(self) -> StatInfo:
        return self._info


def kernel_made_file(guest_path: str, content: bytes | None, flags: int, info: StatInfo | None,
                     render: Callable[[], bytes] | None = None) -> MemFile:
    """Open a file procfs or sysfs makes up, as they answer: ENOENT without content, ENOTDIR for
    O_DIRECTORY, EACCES for writing."""
    if content is None:
        raise SyscallError(errno.ENOENT)
    if flags & O_DIRECTORY:
        raise SyscallError(errno.ENOTDIR)
    if flags & O_ACCMODE:
        raise SyscallError(errno.EACCES)
    return MemFile(guest_path, content, info, render)


@dataclass
class Stream(OpenFile):
    """A guest standard stream: reads from a source, writes to a sink; may stand on a host fd."""

    reader: Callable[[int], bytes] | None = None
    writer: Callable[[bytes], int] | None = None
    host: int | None = None
    guest_path: str = "pipe:[0]"
    nonblock: bool = False
    _stat: StatInfo = field(default_factory=lambda: synthetic_stat(S_IFIFO | 0o600))

    def read(self, size: int) -> bytes:
        if self.reader is None:
            raise SyscallError(errno.EBADF)
        return self.reader(size)

    def write(self, data: bytes) -> int:
        if self.writer is None:
            raise SyscallError(errno.EBADF)
        return self.writer(data)

    def stat(self) -> StatInfo:
        if self.host is not None:
            return StatInfo.from_host(os.fstat(self.host))
        return self._stat

    def host_fd(self) -> int | None:
        return self.host
