"""Guest paths resolved inside a read-only root directory, and the open-file objects behind fds.

A guest can never change the host: only reads reach host files; writes reach the
guest's stdout/stderr sinks and /dev/null.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from emu.kernel.errno_ import SyscallError

MAX_SYMLINKS = 40
ALLOWED_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random"})

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

    def seek(self, offset: int, whence: int) -> int:
        raise SyscallError(errno.ESPIPE)

    def stat(self) -> StatInfo:
        raise SyscallError(errno.EBADF)

    def dirents(self) -> list[tuple[int, int, bytes]]:
        raise SyscallError(errno.ENOTDIR)

    def host_fd(self) -> int | None:
        """A host descriptor for read-only ioctls (isatty, window size), if there is one."""
        return None

    def mmap_bytes(self, offset: int, length: int) -> bytes:
        raise SyscallError(errno.ENODEV)

    def close(self) -> None:
        pass


class HostFile(OpenFile):
    """A host file or directory opened read-only."""

    def __init__(self, host_path: str, guest_path: str, is_dir: bool) -> None:
        flags = os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECTORY if is_dir else 0)
        try:
            self.fd = os.open(host_path, flags)
        except OSError as exc:
            raise SyscallError(exc.errno or errno.EACCES) from None
        self.host_path = host_path
        self.guest_path = guest_path
        self.is_dir = is_dir
        self.dir_pos = 0
        self._entries: list[tuple[int, int, bytes]] | None = None

    def read(self, size: int) -> bytes:
        if self.is_dir:
            raise SyscallError(errno.EISDIR)
        return os.read(self.fd, size)

    def pread(self, size: int, offset: int) -> bytes:
        if self.is_dir:
            raise SyscallError(errno.EISDIR)
        return os.pread(self.fd, size, offset)

    def seek(self, offset: int, whence: int) -> int:
        if self.is_dir:
            if whence != os.SEEK_SET or offset < 0:
                raise SyscallError(errno.EINVAL)
            self.dir_pos = offset
            return offset
        try:
            return os.lseek(self.fd, offset, whence)
        except OSError as exc:
            raise SyscallError(exc.errno or errno.EINVAL) from None

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
        data = os.pread(self.fd, length, offset)
        return data

    def close(self) -> None:
        os.close(self.fd)


class DevNull(OpenFile):
    guest_path = "/dev/null"

    def read(self, size: int) -> bytes:
        return b""

    def write(self, data: bytes) -> int:
        return len(data)

    def seek(self, offset: int, whence: int) -> int:
        return 0

    def stat(self) -> StatInfo:
        return synthetic_stat(S_IFCHR | 0o666)


class MemFile(OpenFile):
    """A read-only file whose content the kernel made up (procfs)."""

    def __init__(self, guest_path: str, content: bytes) -> None:
        self.guest_path = guest_path
        self.content = content
        self.pos = 0

    def read(self, size: int) -> bytes:
        chunk = self.content[self.pos : self.pos + size]
        self.pos += len(chunk)
        return chunk

    def pread(self, size: int, offset: int) -> bytes:
        return self.content[offset : offset + size]

    def seek(self, offset: int, whence: int) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: len(self.content)}.get(whence)
        if base is None or base + offset < 0:
            raise SyscallError(errno.EINVAL)
        self.pos = base + offset
        return self.pos

    def stat(self) -> StatInfo:
        return synthetic_stat(stat.S_IFREG | 0o444, 0)


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


class Pipe:
    """Both ends share one buffer. A single-threaded guest can never wait on it."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.readers = 1
        self.writers = 1


class PipeEnd(OpenFile):
    def __init__(self, pipe: Pipe, writable: bool, ino: int) -> None:
        self.pipe = pipe
        self.writable = writable
        self.guest_path = f"pipe:[{ino}]"
        self.ino = ino

    def read(self, size: int) -> bytes:
        if self.writable:
            raise SyscallError(errno.EBADF)
        if not self.pipe.buffer and self.pipe.writers:
            raise SyscallError(errno.EAGAIN)  # would block forever: nothing else runs
        chunk = bytes(self.pipe.buffer[:size])
        del self.pipe.buffer[:size]
        return chunk

    def write(self, data: bytes) -> int:
        if not self.writable:
            raise SyscallError(errno.EBADF)
        if not self.pipe.readers:
            raise SyscallError(errno.EPIPE)
        self.pipe.buffer += data
        return len(data)

    def stat(self) -> StatInfo:
        return synthetic_stat(S_IFIFO | 0o600, ino=self.ino)

    def close(self) -> None:
        if self.writable:
            self.pipe.writers -= 1
        else:
            self.pipe.readers -= 1


class Vfs:
    """Resolves guest paths to host paths inside ``root``, following symlinks inside the root."""

    def __init__(self, root: str, cwd: str = "/") -> None:
        self.root = os.path.realpath(root)
        self.cwd = cwd

    def host_path(self, guest_abs: str) -> str:
        return os.path.join(self.root, guest_abs.lstrip("/")) if self.root != "/" else guest_abs

    def absolute(self, path: str, base: str | None = None) -> str:
        if path.startswith("/"):
            return path
        return os.path.join(base or self.cwd, path)

    def resolve(self, path: str, base: str | None = None, follow: bool = True) -> str:
        """Canonical guest path of ``path``; ENOENT/ENOTDIR/ELOOP as Linux would say."""
        if path == "":
            raise SyscallError(errno.ENOENT)
        if len(path) >= 4096:
            raise SyscallError(errno.ENAMETOOLONG)
        pending = [c for c in self.absolute(path, base).split("/") if c]
        trailing_slash = path.endswith("/")
        done: list[str] = []
        links = 0
        while pending:
            comp = pending.pop(0)
            if comp == ".":
                continue
            if comp == "..":
                if done:
                    done.pop()
                continue
            candidate = "/" + "/".join(done + [comp])
            host = self.host_path(candidate)
            try:
                st = os.lstat(host)
            except FileNotFoundError:
                raise SyscallError(errno.ENOENT) from None
            except NotADirectoryError:
                raise SyscallError(errno.ENOTDIR) from None
            except PermissionError:
                raise SyscallError(errno.EACCES) from None
            is_last = not pending
            if stat.S_ISLNK(st.st_mode) and (not is_last or follow or trailing_slash):
                links += 1
                if links > MAX_SYMLINKS:
                    raise SyscallError(errno.ELOOP)
                target = os.readlink(host)
                parts = [c for c in target.split("/") if c]
                if target.startswith("/"):
                    done = []
                pending = parts + pending
                continue
            if not is_last and not stat.S_ISDIR(st.st_mode):
                raise SyscallError(errno.ENOTDIR)
            done.append(comp)
        return "/" + "/".join(done)
