"""File-system syscalls: open/read/write/stat/getdents, descriptors, cwd. Read-only sandbox."""

from __future__ import annotations

import errno
import fcntl as host_fcntl
import os
import stat
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu import abi
from emu.kernel import procfs
from emu.kernel.errno_ import SyscallError
from emu.kernel.vfs import ALLOWED_DEVICES, DevNull, HostFile, OpenFile, Pipe, PipeEnd, StatInfo

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

MAX_FDS = 1024
MAX_IO = 0x7FFFF000  # Linux caps one read/write at this
TCGETS, TIOCGWINSZ, TIOCGPGRP, FIONBIO = 0x5401, 0x5413, 0x540F, 0x5421
TTY_IOCTL_SIZES = {TCGETS: 36, TIOCGWINSZ: 8, TIOCGPGRP: 4}
F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC = 0, 1, 2, 3, 4, 1030
FD_CLOEXEC = 1
WRITE_FLAGS = abi.O_WRONLY | abi.O_RDWR | abi.O_TRUNC | abi.O_APPEND


@dataclass
class FdEntry:
    file: OpenFile
    flags: int
    cloexec: bool


class FdTable:
    def __init__(self) -> None:
        self.entries: dict[int, FdEntry] = {}

    def get(self, fd: int) -> FdEntry:
        entry = self.entries.get(fd)
        if entry is None:
            raise SyscallError(errno.EBADF)
        return entry

    def file(self, fd: int) -> OpenFile:
        return self.get(fd).file

    def install(self, entry: FdEntry, lowest: int = 0) -> int:
        fd = lowest
        while fd in self.entries:
            fd += 1
        if fd >= MAX_FDS:
            raise SyscallError(errno.EMFILE)
        self.entries[fd] = entry
        return fd

    def put(self, fd: int, entry: FdEntry) -> None:
        if not 0 <= fd < MAX_FDS:
            raise SyscallError(errno.EBADF)
        if fd in self.entries:
            self.close(fd)
        self.entries[fd] = entry

    def close(self, fd: int) -> None:
        entry = self.entries.pop(fd, None)
        if entry is None:
            raise SyscallError(errno.EBADF)
        if not any(e.file is entry.file for e in self.entries.values()):
            entry.file.close()

    def close_all(self) -> None:
        for fd in list(self.entries):
            self.close(fd)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _path(k: Kernel, addr: int) -> str:
    raw = k.mem.read_cstring(addr, 4096)
    return os.fsdecode(raw)


def _base_dir(k: Kernel, dirfd: int, path: str) -> str | None:
    """Directory a relative path starts from (None: the cwd)."""
    dirfd = _signed32(dirfd)
    if path.startswith("/") or dirfd == abi.AT_FDCWD:
        return None
    entry = k.files.get(dirfd)
    file = entry.file
    if not isinstance(file, HostFile) or not file.is_dir:
        raise SyscallError(errno.ENOTDIR)
    return file.guest_path


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def lookup(k: Kernel, dirfd: int, path: str, follow: bool = True) -> str:
    """Guest path -> canonical guest path, with /proc/self served by procfs."""
    base = _base_dir(k, dirfd, path)
    absolute = k.vfs.absolute(path, base)
    special = procfs.canonical(k, absolute)
    if special is not None:
        return procfs.follow(k, special) if follow else special
    return k.vfs.resolve(path, base, follow)


def stat_path(k: Kernel, guest: str) -> StatInfo:
    info = procfs.stat_of(k, guest)
    if info is not None:
        return info
    try:
        return StatInfo.from_host(os.lstat(k.vfs.host_path(guest)))
    except OSError as exc:
        raise SyscallError(exc.errno or errno.ENOENT) from None


def open_path(k: Kernel, dirfd: int, path: str, flags: int) -> OpenFile:
    follow = not flags & abi.O_NOFOLLOW
    try:
        guest = lookup(k, dirfd, path, follow)
    except SyscallError as err:
        if err.errno == errno.ENOENT and flags & abi.O_CREAT:
            raise SyscallError(errno.EROFS) from None
        raise
    synthetic = procfs.open_file(k, guest)
    if synthetic is not None:
        if flags & WRITE_FLAGS:
            raise SyscallError(errno.EACCES)
        return synthetic
    if guest == "/dev/null":
        return DevNull()
    host = k.vfs.host_path(guest)
    st = os.lstat(host)
    if stat.S_ISLNK(st.st_mode):
        raise SyscallError(errno.ELOOP)
    if flags & WRITE_FLAGS or (flags & abi.O_TMPFILE) == abi.O_TMPFILE:
        raise SyscallError(errno.EISDIR if stat.S_ISDIR(st.st_mode) else errno.EROFS)
    if flags & abi.O_DIRECTORY and not stat.S_ISDIR(st.st_mode):
        raise SyscallError(errno.ENOTDIR)
    if flags & abi.O_CREAT and flags & abi.O_EXCL:
        raise SyscallError(errno.EEXIST)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or guest in ALLOWED_DEVICES):
        raise SyscallError(errno.EACCES)
    return HostFile(host, guest, stat.S_ISDIR(st.st_mode))


def sys_openat(k: Kernel, dirfd: int, path_addr: int, flags: int, mode: int, *_: int) -> int:
    path = _path(k, path_addr)
    file = open_path(k, dirfd, path, flags)
    return k.files.install(FdEntry(file, flags & ~abi.O_CLOEXEC, bool(flags & abi.O_CLOEXEC)))


def sys_open(k: Kernel, path_addr: int, flags: int, mode: int, *_: int) -> int:
    return sys_openat(k, abi.AT_FDCWD & 0xFFFFFFFF, path_addr, flags, mode)


def sys_close(k: Kernel, fd: int, *_: int) -> int:
    k.files.close(_signed32(fd))
    return 0


def sys_read(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    file = k.files.file(_signed32(fd))
    k.mem.check_user(buf, min(count, MAX_IO), abi.Prot.WRITE)
    data = file.read(min(count, MAX_IO))
    k.mem.write_user(buf, data)
    return len(data)


def sys_pread64(k: Kernel, fd: int, buf: int, count: int, offset: int, *_: int) -> int:
    if _signed(offset) < 0:
        raise SyscallError(errno.EINVAL)
    data = k.files.file(_signed32(fd)).pread(min(count, MAX_IO), offset)
    k.mem.write_user(buf, data)
    return len(data)


def sys_write(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    file = k.files.file(_signed32(fd))
    data = k.mem.read_user(buf, min(count, MAX_IO))
    return file.write(data)


def _iovecs(k: Kernel, iov: int, iovcnt: int) -> list[tuple[int, int]]:
    if _signed32(iovcnt) < 0 or iovcnt > 1024:
        raise SyscallError(errno.EINVAL)
    raw = k.mem.read_user(iov, 16 * iovcnt)
    return [struct.unpack_from("<QQ", raw, 16 * i) for i in range(iovcnt)]


def sys_writev(k: Kernel, fd: int, iov: int, iovcnt: int, *_: int) -> int:
    file = k.files.file(_signed32(fd))
    data = b"".join(k.mem.read_user(base, length) for base, length in _iovecs(k, iov, iovcnt))
    return file.write(data) if data else 0


def sys_readv(k: Kernel, fd: int, iov: int, iovcnt: int, *_: int) -> int:
    file = k.files.file(_signed32(fd))
    total = 0
    for base, length in _iovecs(k, iov, iovcnt):
        data = file.read(length)
        k.mem.write_user(base, data)
        total += len(data)
        if len(data) < length:
            break
    return total


def sys_lseek(k: Kernel, fd: int, offset: int, whence: int, *_: int) -> int:
    if whence > 4:
        raise SyscallError(errno.EINVAL)
    return k.files.file(_signed32(fd)).seek(_signed(offset), whence)


def sys_fstat(k: Kernel, fd: int, buf: int, *_: int) -> int:
    k.mem.write_user(buf, k.files.file(_signed32(fd)).stat().pack_stat())
    return 0


def _stat_at(k: Kernel, dirfd: int, path_addr: int, flags: int) -> StatInfo:
    path = _path(k, path_addr)
    if path == "" and flags & abi.AT_EMPTY_PATH:
        return k.files.file(_signed32(dirfd)).stat()
    guest = lookup(k, dirfd, path, follow=not flags & abi.AT_SYMLINK_NOFOLLOW)
    return stat_path(k, guest)


def sys_newfstatat(k: Kernel, dirfd: int, path_addr: int, buf: int, flags: int, *_: int) -> int:
    k.mem.write_user(buf, _stat_at(k, dirfd, path_addr, flags).pack_stat())
    return 0


def sys_stat(k: Kernel, path_addr: int, buf: int, *_: int) -> int:
    return sys_newfstatat(k, abi.AT_FDCWD & 0xFFFFFFFF, path_addr, buf, 0)


def sys_lstat(k: Kernel, path_addr: int, buf: int, *_: int) -> int:
    return sys_newfstatat(k, abi.AT_FDCWD & 0xFFFFFFFF, path_addr, buf, abi.AT_SYMLINK_NOFOLLOW)


def sys_statx(k: Kernel, dirfd: int, path_addr: int, flags: int, mask: int, buf: int, *_: int) -> int:
    k.mem.write_user(buf, _stat_at(k, dirfd, path_addr, flags).pack_statx())
    return 0


def sys_readlinkat(k: Kernel, dirfd: int, path_addr: int, buf: int, size: int, *_: int) -> int:
    if _signed32(size) <= 0:
        raise SyscallError(errno.EINVAL)
    path = _path(k, path_addr)
    guest = lookup(k, dirfd, path, follow=False)
    target = procfs.readlink(k, guest)
    if target is None:
        host = k.vfs.host_path(guest)
        if not os.path.islink(host):
            raise SyscallError(errno.EINVAL)
        target = os.readlink(host)
    data = os.fsencode(target)[:size]
    k.mem.write_user(buf, data)
    return len(data)


def sys_readlink(k: Kernel, path_addr: int, buf: int, size: int, *_: int) -> int:
    return sys_readlinkat(k, abi.AT_FDCWD & 0xFFFFFFFF, path_addr, buf, size)


def sys_faccessat(k: Kernel, dirfd: int, path_addr: int, mode: int, flags: int = 0, *_: int) -> int:
    if mode & ~7:
        raise SyscallError(errno.EINVAL)
    path = _path(k, path_addr)
    guest = lookup(k, dirfd, path, follow=not flags & abi.AT_SYMLINK_NOFOLLOW)
    info = stat_path(k, guest)
    if mode & os.W_OK and guest != "/dev/null":
        raise SyscallError(errno.EROFS)
    if mode & os.X_OK and not info.mode & 0o111 and not stat.S_ISDIR(info.mode):
        raise SyscallError(errno.EACCES)
    return 0


def sys_faccessat_nf(k: Kernel, dirfd: int, path_addr: int, mode: int, *_: int) -> int:
    return sys_faccessat(k, dirfd, path_addr, mode, 0)


def sys_access(k: Kernel, path_addr: int, mode: int, *_: int) -> int:
    return sys_faccessat(k, abi.AT_FDCWD & 0xFFFFFFFF, path_addr, mode, 0)


def sys_getcwd(k: Kernel, buf: int, size: int, *_: int) -> int:
    data = os.fsencode(k.vfs.cwd) + b"\0"
    if size < len(data):
        raise SyscallError(errno.ERANGE)
    k.mem.write_user(buf, data)
    return len(data)


def sys_chdir(k: Kernel, path_addr: int, *_: int) -> int:
    guest = lookup(k, abi.AT_FDCWD & 0xFFFFFFFF, _path(k, path_addr))
    if not stat.S_ISDIR(stat_path(k, guest).mode):
        raise SyscallError(errno.ENOTDIR)
    k.vfs.cwd = guest
    return 0


def sys_fchdir(k: Kernel, fd: int, *_: int) -> int:
    file = k.files.file(_signed32(fd))
    if not isinstance(file, HostFile) or not file.is_dir:
        raise SyscallError(errno.ENOTDIR)
    k.vfs.cwd = file.guest_path
    return 0


def sys_getdents64(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    file = k.files.file(_signed32(fd))
    if not isinstance(file, HostFile):
        raise SyscallError(errno.ENOTDIR)
    entries = file.dirents()
    out = bytearray()
    while file.dir_pos < len(entries):
        ino, dtype, name = entries[file.dir_pos]
        reclen = (19 + len(name) + 1 + 7) & ~7
        if len(out) + reclen > count:
            if not out:
                raise SyscallError(errno.EINVAL)
            break
        record = struct.pack("<QqHB", ino, file.dir_pos + 1, reclen, dtype) + name
        out += record + b"\0" * (reclen - len(record))
        file.dir_pos += 1
    k.mem.write_user(buf, bytes(out))
    return len(out)


def _dup_to(k: Kernel, old: int, new: int, cloexec: bool) -> int:
    entry = k.files.get(old)
    k.files.put(new, FdEntry(entry.file, entry.flags, cloexec))
    return new


def sys_dup(k: Kernel, fd: int, *_: int) -> int:
    entry = k.files.get(_signed32(fd))
    return k.files.install(FdEntry(entry.file, entry.flags, False))


def sys_dup2(k: Kernel, old: int, new: int, *_: int) -> int:
    old, new = _signed32(old), _signed32(new)
    k.files.get(old)
    return new if old == new else _dup_to(k, old, new, False)


def sys_dup3(k: Kernel, old: int, new: int, flags: int, *_: int) -> int:
    old, new = _signed32(old), _signed32(new)
    if old == new or flags & ~abi.O_CLOEXEC:
        raise SyscallError(errno.EINVAL)
    return _dup_to(k, old, new, bool(flags & abi.O_CLOEXEC))


def sys_fcntl(k: Kernel, fd: int, cmd: int, arg: int, *_: int) -> int:
    entry = k.files.get(_signed32(fd))
    if cmd in (F_DUPFD, F_DUPFD_CLOEXEC):
        return k.files.install(FdEntry(entry.file, entry.flags, cmd == F_DUPFD_CLOEXEC), _signed32(arg))
    if cmd == F_GETFD:
        return FD_CLOEXEC if entry.cloexec else 0
    if cmd == F_SETFD:
        entry.cloexec = bool(arg & FD_CLOEXEC)
        return 0
    if cmd == F_GETFL:
        return entry.flags
    if cmd == F_SETFL:
        changeable = abi.O_APPEND | abi.O_NONBLOCK
        entry.flags = (entry.flags & ~changeable) | (arg & changeable)
        return 0
    raise SyscallError(errno.EINVAL)


def sys_pipe2(k: Kernel, fds_addr: int, flags: int = 0, *_: int) -> int:
    if flags & ~(abi.O_CLOEXEC | abi.O_NONBLOCK):
        raise SyscallError(errno.EINVAL)
    pipe = Pipe()
    k.next_inode += 1
    cloexec = bool(flags & abi.O_CLOEXEC)
    rfd = k.files.install(FdEntry(PipeEnd(pipe, False, k.next_inode), abi.O_RDONLY, cloexec))
    wfd = k.files.install(FdEntry(PipeEnd(pipe, True, k.next_inode), abi.O_WRONLY, cloexec))
    k.mem.write_user(fds_addr, struct.pack("<ii", rfd, wfd))
    return 0


def sys_pipe(k: Kernel, fds_addr: int, *_: int) -> int:
    return sys_pipe2(k, fds_addr, 0)


def sys_ioctl(k: Kernel, fd: int, request: int, arg: int, *_: int) -> int:
    file = k.files.file(_signed32(fd))
    request &= 0xFFFFFFFF
    if request == FIONBIO:
        return 0
    size = TTY_IOCTL_SIZES.get(request)
    host = file.host_fd()
    if size is None:
        raise SyscallError(errno.ENOTTY if host is None or not os.isatty(host) else errno.EINVAL)
    if host is None or not os.isatty(host):
        raise SyscallError(errno.ENOTTY)
    # Read-only terminal queries pass through to the real terminal.
    data = host_fcntl.ioctl(host, request, b"\0" * size)
    k.mem.write_user(arg, data)
    return 0


def sys_umask(k: Kernel, mask: int, *_: int) -> int:
    old, k.umask = k.umask, mask & 0o777
    return old
