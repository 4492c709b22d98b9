"""File-system syscalls: open/read/write/stat/getdents, descriptors, cwd. Read-only sandbox."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu import abi
from emu.kernel import cpufs, procfs, sysfs
from emu.kernel.errno_ import SyscallError
from emu.kernel.vfs import (
    ALLOWED_DEVICES,
    STATFS_SIZE,
    STATX_SIZE,
    SYS_FSTATFS,
    SYS_STATFS,
    SYS_STATX,
    Device,
    HostFile,
    MemFile,
    OpenFile,
    PipeEnd,
    StatInfo,
    Stream,
    SyntheticDir,
    host_syscall,
)
from emu.memory import StringTooLong

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

MAX_FDS = 1024
PATH_MAX = 4096
MAX_IO = 0x7FFFF000  # Linux caps one read/write at this
TCGETS, TIOCGWINSZ, TIOCGPGRP, FIONBIO = 0x5401, 0x5413, 0x540F, 0x5421
FIONREAD, FIONCLEX, FIOCLEX = 0x541B, 0x5450, 0x5451
# TCSETS/W/F, TCSBRK, TCXONC, TCFLSH, TIOCSCTTY, TIOCSPGRP, TIOCSTI, TIOCSWINSZ, TCSBRKP, TIOCSETD, TIOCNOTTY
TCSBRK = 0x5409
TTY_SETTERS = frozenset({0x5402, 0x5403, 0x5404, 0x5409, 0x540A, 0x540B, 0x540E, 0x5410, 0x5412, 0x5414, 0x5425,
                         0x5423, 0x5422})
TTY_IOCTL_SIZES = {TCGETS: 36, TIOCGWINSZ: 8, TIOCGPGRP: 4}
F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC = 0, 1, 2, 3, 4, 1030
FD_CLOEXEC = 1
WRITE_FLAGS = abi.O_WRONLY | abi.O_RDWR | abi.O_TRUNC | abi.O_APPEND
O_TMPFILE_BIT = 0o20000000  # __O_TMPFILE: O_TMPFILE without O_DIRECTORY
ST_RDONLY = 1  # statfs f_flags: the sandbox mounts everything read-only
ST_NOSUID, ST_NODEV = 2, 4
PROC_SUPER_MAGIC, PIPEFS_MAGIC = 0x9FA0, 0x50495045
STATFS_FLAGS_OFFSET = 88  # f_flags in struct statfs (x86-64)
XATTR_SIZE_MAX = 65536
POSIX_FADV_MAX = 5
O_LARGEFILE = 0o100000


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
    """getname(): a path of fewer than PATH_MAX bytes, else ENAMETOOLONG (EFAULT if unreadable)."""
    try:
        raw = k.mem.read_cstring(addr, PATH_MAX)
    except StringTooLong:
        raise SyscallError(errno.ENAMETOOLONG) from None
    return os.fsdecode(raw)


def _base_dir(k: Kernel, dirfd: int, path: str) -> str | None:
    """Directory a relative path starts from (None: the cwd)."""
    dirfd = _signed32(dirfd)
    if path.startswith("/") or dirfd == abi.AT_FDCWD:
        return None
    entry = k.files.get(dirfd)
    file = entry.file
    if not file.is_directory:
        raise SyscallError(errno.ENOTDIR)
    return file.guest_path


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def lookup(k: Kernel, dirfd: int, path: str, follow: bool = True) -> str:
    """Guest path -> canonical guest path, with /proc/self served by procfs, never by the host."""
    base = _base_dir(k, dirfd, path)
    if sysfs.serves(k.vfs.absolute(path, base)):
        return sysfs.normalize(k.vfs.absolute(path, base))
    if cpufs.serves(k, k.vfs.absolute(path, base)):
        return sysfs.normalize(k.vfs.absolute(path, base))
    special = procfs.canonical(k, k.vfs.absolute(path, base))
    if special is None:
        resolved = k.vfs.resolve(path, base, follow, special=procfs.intercepts(k))
        special = procfs.canonical(k, resolved)
        if special is None:
            return resolved
    return procfs.follow(k, special) if follow else special


def _host_errno(exc: OSError, default: int = errno.EIO) -> SyscallError:
    return SyscallError(exc.errno or default)


def stat_path(k: Kernel, guest: str) -> StatInfo:
    info = procfs.stat_of(k, guest) or sysfs.stat_of(guest) or cpufs.stat_of(k, guest)
    if info is not None:
        return info
    return k.vfs.lstat(guest)


def _parent_must_exist(k: Kernel, dirfd: int, path: str) -> str:
    """For calls that would create ``path``: resolve its directory (ENOENT/ENOTDIR as Linux) and return it."""
    head, _, name = path.rstrip("/").rpartition("/")
    if not name or name in (".", ".."):
        raise SyscallError(errno.EEXIST if path.rstrip("/") in ("", ".", "..") else errno.ENOENT)
    parent = lookup(k, dirfd, head or ("/" if path.startswith("/") else "."))
    if not stat.S_ISDIR(stat_path(k, parent).mode):
        raise SyscallError(errno.ENOTDIR)
    return parent


def _wants_write(flags: int) -> bool:
    return (flags & abi.O_ACCMODE) in (abi.O_WRONLY, abi.O_RDWR)


def open_path(k: Kernel, dirfd: int, path: str, flags: int, mode: int = 0o666) -> OpenFile:
    """Linux's order of checks in open: lookup, O_CREAT|O_EXCL, type checks, then the mount's."""
    from emu.kernel import fswrite
    from emu.kernel.overlay import Inode

    follow = not flags & abi.O_NOFOLLOW and not (flags & abi.O_CREAT and flags & abi.O_EXCL)
    try:
        guest = lookup(k, dirfd, path, follow)
    except SyscallError as err:
        if err.errno == errno.ENOENT and flags & abi.O_CREAT and not flags & O_TMPFILE_BIT:
            return fswrite.create(k, dirfd, path, flags, mode)  # EROFS on a read-only mount
        raise
    synthetic = procfs.open_file(k, guest, flags) or sysfs.open_file(guest, flags) or cpufs.open_file(k, guest, flags)
    if synthetic is not None:
        return synthetic
    node = k.vfs.backing(guest)
    if isinstance(node, Inode):
        return fswrite.open_inode(k, guest, node, flags)
    host = node
    try:
        st = os.lstat(host)
    except OSError as exc:
        raise _host_errno(exc, errno.ENOENT) from None
    if flags & abi.O_CREAT and flags & abi.O_EXCL:
        raise SyscallError(errno.EEXIST)
    is_dir = stat.S_ISDIR(st.st_mode)
    if flags & abi.O_PATH:
        # O_PATH ignores the access mode and O_CREAT/O_TRUNC; with O_NOFOLLOW it names the symlink itself.
        if flags & abi.O_DIRECTORY and not is_dir:
            raise SyscallError(errno.ENOTDIR)
        return HostFile(host, guest, is_dir, path_only=True)
    if stat.S_ISLNK(st.st_mode):
        raise SyscallError(errno.ELOOP)
    if flags & O_TMPFILE_BIT:
        if is_dir:
            return fswrite.tmpfile(k, guest, flags, mode)  # EROFS on a read-only mount
        raise SyscallError(errno.ENOTDIR)
    if flags & abi.O_CREAT and is_dir:
        raise SyscallError(errno.EISDIR)
    if flags & abi.O_DIRECTORY and not is_dir:
        raise SyscallError(errno.ENOTDIR)
    if is_dir and (_wants_write(flags) or flags & abi.O_TRUNC):
        raise SyscallError(errno.EISDIR)
    if guest in ALLOWED_DEVICES and stat.S_ISCHR(st.st_mode):
        return Device(guest, host, k.random.randbytes)
    if _wants_write(flags) or (flags & abi.O_TRUNC and stat.S_ISREG(st.st_mode)):
        if k.vfs.overlay is None or not stat.S_ISREG(st.st_mode):
            raise SyscallError(errno.EROFS)
        return fswrite.open_host_for_write(k, guest, flags)
    if not (stat.S_ISREG(st.st_mode) or is_dir):
        raise SyscallError(errno.EACCES)  # host devices, fifos, sockets stay out of the sandbox
    if is_dir and k.vfs.overlay is not None and k.vfs.overlay.touched(guest):
        return fswrite.open_dir(k, guest)  # the host's entries and the guest's
    if k.vfs.overlay is not None and not is_dir:
        from emu.kernel.overlay import LowerFile

        return LowerFile(host, guest, k.vfs.overlay.copied)  # sees the guest's later writes too
    return HostFile(host, guest, is_dir)


def sys_openat(k: Kernel, dirfd: int, path_addr: int, flags: int, mode: int, *_: int) -> int:
    path = _path(k, path_addr)
    flags &= 0xFFFFFFFF
    file = open_path(k, dirfd, path, flags, mode & 0o7777)
    # F_GETFL shows O_LARGEFILE (forced on 64-bit), never O_CLOEXEC or the creation flags.
    if flags & abi.O_PATH:
        kept = flags & (abi.O_PATH | abi.O_DIRECTORY | abi.O_NOFOLLOW)
    else:
        kept = flags & ~(abi.O_CLOEXEC | abi.O_CREAT | abi.O_EXCL | abi.O_NOCTTY | abi.O_TRUNC) | O_LARGEFILE
    return k.files.install(FdEntry(file, kept, bool(flags & abi.O_CLOEXEC)))


def sys_open(k: Kernel, path_addr: int, flags: int, mode: int, *_: int) -> int:
    return sys_openat(k, abi.AT_FDCWD & 0xFFFFFFFF, path_addr, flags, mode)


def sys_creat(k: Kernel, path_addr: int, mode: int, *_: int) -> int:
    return sys_openat(k, abi.AT_FDCWD & 0xFFFFFFFF, path_addr, abi.O_CREAT | abi.O_WRONLY | abi.O_TRUNC, mode)


def sys_close(k: Kernel, fd: int, *_: int) -> int:
    file = k.files.file(_signed32(fd))
    k.files.close(_signed32(fd))
    if k.vfs.locks.ranges or k.vfs.locks.flocks:
        from emu.kernel import locks

        locks.closed(k, file, last=not any(e.file is file for e in k.files.entries.values()))
    return 0


def _readable(k: Kernel, fd: int) -> OpenFile:
    entry = k.files.get(_signed32(fd))
    if entry.flags & abi.O_PATH or (entry.flags & abi.O_ACCMODE) == abi.O_WRONLY:
        raise SyscallError(errno.EBADF)
    return entry.file


def _writable(k: Kernel, fd: int) -> OpenFile:
    entry = k.files.get(_signed32(fd))
    if entry.flags & abi.O_PATH or (entry.flags & abi.O_ACCMODE) == abi.O_RDONLY:
        raise SyscallError(errno.EBADF)
    return entry.file


def sys_read(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    file = _readable(k, fd)
    k.mem.check_user(buf, min(count, MAX_IO), abi.Prot.WRITE)
    data = file.read(min(count, MAX_IO))
    k.mem.write_user(buf, data)
    return len(data)


def sys_pread64(k: Kernel, fd: int, buf: int, count: int, offset: int, *_: int) -> int:
    if _signed(offset) < 0:
        raise SyscallError(errno.EINVAL)
    file = _readable(k, fd)
    k.mem.check_user(buf, min(count, MAX_IO), abi.Prot.WRITE)
    data = file.pread(min(count, MAX_IO), offset)
    k.mem.write_user(buf, data)
    return len(data)


def sys_write(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    file = _appending(k, fd)
    data = k.mem.read_user(buf, min(count, MAX_IO))
    return file.write(data)


def _appending(k: Kernel, fd: int) -> OpenFile:
    """The writable file behind fd; with O_APPEND, every write starts at the end (as Linux does)."""
    entry = k.files.get(_signed32(fd))
    file = _writable(k, fd)
    if entry.flags & abi.O_APPEND and file.seekable_end:
        file.seek(0, os.SEEK_END)
    return file


def sys_pwrite64(k: Kernel, fd: int, buf: int, count: int, offset: int, *_: int) -> int:
    if _signed(offset) < 0:
        raise SyscallError(errno.EINVAL)
    file = _writable(k, fd)
    data = k.mem.read_user(buf, min(count, MAX_IO))
    return file.pwrite(data, offset)


def _iovecs(k: Kernel, iov: int, iovcnt: int) -> list[tuple[int, int]]:
    if _signed32(iovcnt) < 0 or iovcnt > 1024:
        raise SyscallError(errno.EINVAL)
    raw = k.mem.read_user(iov, 16 * iovcnt)
    return [struct.unpack_from("<QQ", raw, 16 * i) for i in range(iovcnt)]


def sys_writev(k: Kernel, fd: int, iov: int, iovcnt: int, *_: int) -> int:
    file = _appending(k, fd)
    data = b"".join(k.mem.read_user(base, length) for base, length in _iovecs(k, iov, iovcnt))
    return file.write(data) if data else 0


def sys_readv(k: Kernel, fd: int, iov: int, iovcnt: int, *_: int) -> int:
    file = _readable(k, fd)
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
    follow = not flags & abi.AT_SYMLINK_NOFOLLOW
    guest = lookup(k, dirfd, path, follow)
    if follow:
        behind = procfs.fd_file(k, guest)  # /proc/self/fd/N of a pipe or stream: the open file itself
        if behind is not None:
            return behind.stat()
    return stat_path(k, guest)


def sys_newfstatat(k: Kernel, dirfd: int, path_addr: int, buf: int, flags: int, *_: int) -> int:
    k.mem.write_user(buf, _stat_at(k, dirfd, path_addr, flags).pack_stat())
    return 0


def sys_stat(k: Kernel, path_addr: int, buf: int, *_: int) -> int:
    return sys_newfstatat(k, abi.AT_FDCWD & 0xFFFFFFFF, path_addr, buf, 0)


def sys_lstat(k: Kernel, path_addr: int, buf: int, *_: int) -> int:
    return sys_newfstatat(k, abi.AT_FDCWD & 0xFFFFFFFF, path_addr, buf, abi.AT_SYMLINK_NOFOLLOW)


STATX_RESERVED = 0x80000000
AT_STATX_SYNC_TYPE = 0x6000
STATX_FLAGS = abi.AT_SYMLINK_NOFOLLOW | abi.AT_EMPTY_PATH | 0x800 | AT_STATX_SYNC_TYPE  # 0x800: AT_NO_AUTOMOUNT


def _host_statx(host_fd: int | None, host_path: str, mask: int) -> bytes | None:
    """The host's own struct statx (stx_mask, btime, attributes, mnt_id as a native run sees them)."""
    buf = ctypes.create_string_buffer(STATX_SIZE)
    try:
        if host_fd is not None:
            host_syscall(SYS_STATX, host_fd, b"", abi.AT_EMPTY_PATH, mask, buf)
        else:
            host_syscall(SYS_STATX, abi.AT_FDCWD, os.fsencode(host_path), abi.AT_SYMLINK_NOFOLLOW, mask, buf)
    except SyscallError as err:
        if err.errno == errno.ENOSYS:
            return None
        raise
    return buf.raw


def sys_statx(k: Kernel, dirfd: int, path_addr: int, flags: int, mask: int, buf: int, *_: int) -> int:
    if flags & ~STATX_FLAGS or flags & AT_STATX_SYNC_TYPE == AT_STATX_SYNC_TYPE or mask & STATX_RESERVED:
        raise SyscallError(errno.EINVAL)
    path = _path(k, path_addr)
    raw: bytes | None = None
    if path == "" and flags & abi.AT_EMPTY_PATH:
        file = k.files.file(_signed32(dirfd))
        if isinstance(file, HostFile) and file.host_is_current():
            raw = _host_statx(file.fd, file.host_path, mask)
        info = file.stat()
    else:
        guest = lookup(k, dirfd, path, follow=not flags & abi.AT_SYMLINK_NOFOLLOW)
        info = stat_path(k, guest)
        host = k.vfs.host_of(guest) if procfs.stat_of(k, guest) is None and not sysfs.serves(guest) else None
        if host is not None:
            raw = _host_statx(None, host, mask)
    k.mem.write_user(buf, raw if raw is not None else info.pack_statx())
    return 0


def sys_readlinkat(k: Kernel, dirfd: int, path_addr: int, buf: int, size: int, *_: int) -> int:
    if _signed32(size) <= 0:
        raise SyscallError(errno.EINVAL)
    path = _path(k, path_addr)
    target = procfs.self_link(k, k.vfs.absolute(path, _base_dir(k, dirfd, path)))
    if target is None:
        guest = lookup(k, dirfd, path, follow=False)
        target = procfs.readlink(k, guest)
        if target is None and procfs.stat_of(k, guest) is not None:
            raise SyscallError(errno.EINVAL)  # a procfs file or directory, not a link
    if target is None:
        target = k.vfs.readlink(guest)
    data = os.fsencode(target)[:size]
    k.mem.write_user(buf, data)
    return len(data)


def sys_readlink(k: Kernel, path_addr: int, buf: int, size: int, *_: int) -> int:
    return sys_readlinkat(k, abi.AT_FDCWD & 0xFFFFFFFF, path_addr, buf, size)


def sys_faccessat(k: Kernel, dirfd: int, path_addr: int, mode: int, flags: int = 0, *_: int) -> int:
    if mode & ~7 or flags & ~(abi.AT_SYMLINK_NOFOLLOW | abi.AT_EMPTY_PATH | 0x200):  # 0x200: AT_EACCESS
        raise SyscallError(errno.EINVAL)
    path = _path(k, path_addr)
    if path == "" and flags & abi.AT_EMPTY_PATH:
        file = k.files.file(_signed32(dirfd))
        guest, info = file.guest_path, file.stat()
    else:
        guest = lookup(k, dirfd, path, follow=not flags & abi.AT_SYMLINK_NOFOLLOW)
        info = stat_path(k, guest)
    kind = stat.S_IFMT(info.mode)
    # inode_permission(): a write to a file, directory or symlink of a read-only mount is EROFS first.
    if mode & os.W_OK and kind in (stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK) and k.vfs.overlay is None:
        raise SyscallError(errno.EROFS)
    host = k.vfs.host_of(guest) if procfs.stat_of(k, guest) is None else None
    if host is None:
        from emu.kernel.fswrite import permitted

        if not permitted(k, info, mode):
            raise SyscallError(errno.EACCES)
        return 0
    try:
        # root's writes go to the guest's layer even where the host's own mount is read-only
        allowed = os.access(host, mode & ~os.W_OK if k.ident.uid == 0 else mode, follow_symlinks=False)
    except OSError as exc:
        raise _host_errno(exc, errno.EACCES) from None
    if not allowed:
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
    if not file.is_directory:
        raise SyscallError(errno.ENOTDIR)
    k.vfs.cwd = file.guest_path
    return 0


def sys_getdents64(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    entry = k.files.get(_signed32(fd))
    if entry.flags & abi.O_PATH:
        raise SyscallError(errno.EBADF)
    count = min(count & 0xFFFFFFFF, MAX_IO)
    k.mem.check_user(buf, count, abi.Prot.WRITE)
    data = entry.file.getdents(count)
    k.mem.write_user(buf, data)
    return len(data)


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
    from emu.kernel import locks

    if cmd in locks.LOCK_COMMANDS:
        return locks.fcntl_lock(k, _signed32(fd), cmd, arg)
    raise SyscallError(errno.EINVAL)


def sys_ioctl(k: Kernel, fd: int, request: int, arg: int, *_: int) -> int:
    entry = k.files.get(_signed32(fd))
    file = entry.file
    request &= 0xFFFFFFFF
    if entry.flags & abi.O_PATH:
        raise SyscallError(errno.EBADF)
    own = file.ioctl(request, arg)
    if own is not None:
        return own
    # The generic file ioctls (fs/ioctl.c do_vfs_ioctl) work on any descriptor.
    if request in (FIOCLEX, FIONCLEX):
        entry.cloexec = request == FIOCLEX
        return 0
    if request == FIONBIO:
        (on,) = struct.unpack("<i", k.mem.read_user(arg, 4))
        entry.flags = entry.flags | abi.O_NONBLOCK if on else entry.flags & ~abi.O_NONBLOCK
        return 0
    if request == FIONREAD and not file.is_directory:
        available = _bytes_available(file)
        if available is not None:
            k.mem.write_user(arg, struct.pack("<i", min(available, 0x7FFFFFFF)))
            return 0
    host = file.host_fd()
    if host is None or not os.isatty(host):
        raise SyscallError(errno.ENOTTY)  # Linux: every tty request on a non-tty, and any unknown request
    if request == TIOCGPGRP:
        # The guest is the foreground process group of its own world (getpgrp() says its pid too).
        k.mem.write_user(arg, struct.pack("<i", k.ident.pid))
        return 0
    if request == TCSBRK and arg:
        return 0  # tcdrain(): our writes are already out
    if request in TTY_SETTERS:
        raise SyscallError(errno.EPERM)  # the sandbox never changes the host's terminal
    size = TTY_IOCTL_SIZES.get(request)
    if size is None:
        raise SyscallError(errno.ENOTTY)
    # Read-only terminal queries pass through to the real terminal.
    import fcntl as host_fcntl

    try:
        data = host_fcntl.ioctl(host, request, b"\0" * size)
    except OSError as exc:
        raise _host_errno(exc, errno.ENOTTY) from None
    k.mem.write_user(arg, data)
    return 0


def _bytes_available(file: OpenFile) -> int | None:
    if isinstance(file, PipeEnd):
        return len(file.pipe.buffer)
    if isinstance(file, MemFile):
        return max(0, len(file.content) - file.pos)
    if isinstance(file, HostFile):
        return file.size_left()
    return None


def sys_umask(k: Kernel, mask: int, *_: int) -> int:
    old, k.umask = k.umask, mask & 0o777
    return old


# ---------------------------------------------------------------- file systems, xattrs, advice
def _synthetic_statfs(magic: int, flags: int = ST_RDONLY | ST_NOSUID | ST_NODEV) -> bytes:
    """struct statfs of a kernel-made file system (procfs, pipefs, tmpfs): no blocks, 255-byte names."""
    return struct.pack("<qqqqqqqiiqqq4q", magic, 4096, 0, 0, 0, 0, 0, 0, 0, 255, 4096, flags, 0, 0, 0, 0)


def _host_statfs(target: int | str, read_only: bool = True) -> bytes:
    """The host's struct statfs (120 bytes), with ST_RDONLY set when the sandbox mounts it read-only."""
    buf = ctypes.create_string_buffer(STATFS_SIZE)
    if isinstance(target, int):
        host_syscall(SYS_FSTATFS, target, buf)
    else:
        host_syscall(SYS_STATFS, os.fsencode(target), buf)
    raw = bytearray(buf.raw)
    (flags,) = struct.unpack_from("<q", raw, STATFS_FLAGS_OFFSET)
    struct.pack_into("<q", raw, STATFS_FLAGS_OFFSET, flags | ST_RDONLY if read_only else flags & ~ST_RDONLY)
    return bytes(raw)


def sys_statfs(k: Kernel, path_addr: int, buf: int, *_: int) -> int:
    guest = lookup(k, abi.AT_FDCWD & 0xFFFFFFFF, _path(k, path_addr))
    k.mem.write_user(buf, _statfs_of(k, guest))
    return 0


def _statfs_of(k: Kernel, guest: str) -> bytes:
    if procfs.stat_of(k, guest) is not None:
        return _synthetic_statfs(PROC_SUPER_MAGIC)
    host = k.vfs.host_of(guest)
    while host is None:  # a name only the guest's layer holds: the file system of its nearest host directory
        guest = guest.rpartition("/")[0] or "/"
        host = k.vfs.host_of(guest)
    return _host_statfs(host, k.vfs.overlay is None)


def sys_fstatfs(k: Kernel, fd: int, buf: int, *_: int) -> int:
    from emu.kernel.overlay import OverlayFile

    file = k.files.file(_signed32(fd))
    if isinstance(file, OverlayFile):
        data = _statfs_of(k, file.guest_path.rpartition("/")[0] or "/")  # its directory's file system
    elif isinstance(file, HostFile):
        data = _host_statfs(file.fd, k.vfs.overlay is None)
    elif isinstance(file, Device) and file.host_path is not None:
        data = _host_statfs(file.host_path)
    elif file.host_fd() is not None:
        data = _host_statfs(file.host_fd())  # type: ignore[arg-type]
    else:
        data = _synthetic_statfs(PIPEFS_MAGIC if isinstance(file, PipeEnd | Stream) else PROC_SUPER_MAGIC)
    k.mem.write_user(buf, data)
    return 0


def _xattr_target(k: Kernel, path_addr: int, follow: bool) -> str:
    """A host path for the xattr calls; procfs keeps none (EOPNOTSUPP, as Linux's procfs says)."""
    guest = lookup(k, abi.AT_FDCWD & 0xFFFFFFFF, _path(k, path_addr), follow)
    if procfs.stat_of(k, guest) is not None:
        raise SyscallError(errno.EOPNOTSUPP)
    return k.vfs.host_path(guest)


def _xattr_fd(k: Kernel, fd: int) -> str | int:
    """What an fd's xattrs are read from: its host file, or nothing (pipes: ENODATA; procfs: EOPNOTSUPP)."""
    file = k.files.file(_signed32(fd))
    if isinstance(file, HostFile):
        if file.path_only:
            raise SyscallError(errno.EBADF)
        return file.fd
    if isinstance(file, Device) and file.host_path is not None:
        return file.host_path
    host = file.host_fd()
    if host is not None:
        return host
    raise SyscallError(errno.EOPNOTSUPP if isinstance(file, MemFile | SyntheticDir) else errno.ENODATA)


def _xattr_name(k: Kernel, name_addr: int) -> str:
    name = k.mem.read_cstring(name_addr, 256)
    if not name or len(name) > 255:
        raise SyscallError(errno.ERANGE)
    return os.fsdecode(name)


def _copy_sized(k: Kernel, value: bytes, buf: int, size: int) -> int:
    """The xattr size protocol: size 0 asks for the length; a short buffer is ERANGE."""
    if size == 0:
        return len(value)
    if len(value) > size:
        raise SyscallError(errno.ERANGE)
    k.mem.write_user(buf, value)
    return len(value)


def _getxattr(k: Kernel, target: str | int, name_addr: int, buf: int, size: int) -> int:
    name = _xattr_name(k, name_addr)
    try:
        # Paths are canonical (already followed or not, as asked): never follow again on the host.
        value = os.getxattr(target, name, follow_symlinks=isinstance(target, int))
    except OSError as exc:
        raise _host_errno(exc, errno.ENODATA) from None
    return _copy_sized(k, value, buf, min(size, XATTR_SIZE_MAX))


def sys_getxattr(k: Kernel, path_addr: int, name_addr: int, buf: int, size: int, *_: int) -> int:
    return _getxattr(k, _xattr_target(k, path_addr, True), name_addr, buf, size)


def sys_lgetxattr(k: Kernel, path_addr: int, name_addr: int, buf: int, size: int, *_: int) -> int:
    return _getxattr(k, _xattr_target(k, path_addr, False), name_addr, buf, size)


def sys_fgetxattr(k: Kernel, fd: int, name_addr: int, buf: int, size: int, *_: int) -> int:
    return _getxattr(k, _xattr_fd(k, fd), name_addr, buf, size)


def _listxattr(k: Kernel, find: Callable[[], str | int], buf: int, size: int) -> int:
    try:
        target = find()
    except SyscallError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.ENODATA):
            raise
        return 0  # procfs and pipes: an empty list
    try:
        names = os.listxattr(target, follow_symlinks=isinstance(target, int))
    except OSError as exc:
        raise _host_errno(exc, errno.EOPNOTSUPP) from None
    return _copy_sized(k, b"".join(os.fsencode(n) + b"\0" for n in names), buf, size)


def sys_listxattr(k: Kernel, path_addr: int, buf: int, size: int, *_: int) -> int:
    return _listxattr(k, lambda: _xattr_target(k, path_addr, True), buf, size)


def sys_llistxattr(k: Kernel, path_addr: int, buf: int, size: int, *_: int) -> int:
    return _listxattr(k, lambda: _xattr_target(k, path_addr, False), buf, size)


def sys_flistxattr(k: Kernel, fd: int, buf: int, size: int, *_: int) -> int:
    return _listxattr(k, lambda: _xattr_fd(k, fd), buf, size)


def sys_fadvise64(k: Kernel, fd: int, offset: int, length: int, advice: int, *_: int) -> int:
    """Advice only: checked like Linux (ESPIPE for pipes, EINVAL for unknown advice), then ignored."""
    file = k.files.file(_signed32(fd))
    if stat.S_ISFIFO(file.stat().mode):
        raise SyscallError(errno.ESPIPE)
    if not 0 <= advice <= POSIX_FADV_MAX or _signed(length) < 0:
        raise SyscallError(errno.EINVAL)
    return 0


# ---------------------------------------------------------------- writes refused: a read-only mount
def _refuse_existing(k: Kernel, dirfd: int, path_addr: int, follow: bool = False) -> int:
    """A change to an existing file: the lookup's errors first (ENOENT...), then EROFS."""
    lookup(k, dirfd, _path(k, path_addr), follow)
    raise SyscallError(errno.EROFS)


def _refuse_new(k: Kernel, dirfd: int, path_addr: int) -> int:
    """Creating a name: ENOENT/ENOTDIR for a missing parent, EEXIST if the name exists, else EROFS."""
    path = _path(k, path_addr)
    _parent_must_exist(k, dirfd, path)
    try:
        lookup(k, dirfd, path.rstrip("/") or path, follow=False)
    except SyscallError as err:
        if err.errno != errno.ENOENT:
            raise
        raise SyscallError(errno.EROFS) from None
    raise SyscallError(errno.EEXIST)


_CWD = abi.AT_FDCWD & 0xFFFFFFFF


def sys_mkdir(k: Kernel, path_addr: int, *_: int) -> int:
    return _refuse_new(k, _CWD, path_addr)


def sys_mkdirat(k: Kernel, dirfd: int, path_addr: int, *_: int) -> int:
    return _refuse_new(k, dirfd, path_addr)


def sys_symlink(k: Kernel, target_addr: int, path_addr: int, *_: int) -> int:
    return _refuse_new(k, _CWD, path_addr)


def sys_symlinkat(k: Kernel, target_addr: int, dirfd: int, path_addr: int, *_: int) -> int:
    return _refuse_new(k, dirfd, path_addr)


def sys_link(k: Kernel, old_addr: int, new_addr: int, *_: int) -> int:
    lookup(k, _CWD, _path(k, old_addr), follow=False)
    return _refuse_new(k, _CWD, new_addr)


def sys_linkat(k: Kernel, olddirfd: int, old_addr: int, newdirfd: int, new_addr: int, flags: int, *_: int) -> int:
    lookup(k, olddirfd, _path(k, old_addr), follow=bool(flags & abi.AT_SYMLINK_FOLLOW))
    return _refuse_new(k, newdirfd, new_addr)


def sys_unlink(k: Kernel, path_addr: int, *_: int) -> int:
    return _refuse_existing(k, _CWD, path_addr)


def sys_unlinkat(k: Kernel, dirfd: int, path_addr: int, flags: int, *_: int) -> int:
    if flags & ~abi.AT_REMOVEDIR:
        raise SyscallError(errno.EINVAL)
    return _refuse_existing(k, dirfd, path_addr)


def sys_rmdir(k: Kernel, path_addr: int, *_: int) -> int:
    return _refuse_existing(k, _CWD, path_addr)


def sys_rename(k: Kernel, old_addr: int, new_addr: int, *_: int) -> int:
    return _refuse_existing(k, _CWD, old_addr)


def sys_renameat(k: Kernel, olddirfd: int, old_addr: int, *_: int) -> int:
    return _refuse_existing(k, olddirfd, old_addr)


def sys_chmod(k: Kernel, path_addr: int, *_: int) -> int:
    return _refuse_existing(k, _CWD, path_addr, follow=True)


def sys_fchmodat(k: Kernel, dirfd: int, path_addr: int, *_: int) -> int:
    return _refuse_existing(k, dirfd, path_addr, follow=True)


def sys_chown(k: Kernel, path_addr: int, *_: int) -> int:
    return _refuse_existing(k, _CWD, path_addr, follow=True)


def sys_lchown(k: Kernel, path_addr: int, *_: int) -> int:
    return _refuse_existing(k, _CWD, path_addr)


def sys_fchownat(k: Kernel, dirfd: int, path_addr: int, owner: int, group: int, flags: int, *_: int) -> int:
    path = _path(k, path_addr)
    if path == "" and flags & abi.AT_EMPTY_PATH:
        return sys_fchown(k, dirfd)
    lookup(k, dirfd, path, follow=not flags & abi.AT_SYMLINK_NOFOLLOW)
    raise SyscallError(errno.EROFS)


def sys_truncate(k: Kernel, path_addr: int, length: int, *_: int) -> int:
    guest = lookup(k, _CWD, _path(k, path_addr))
    if stat.S_ISDIR(stat_path(k, guest).mode):
        raise SyscallError(errno.EISDIR)
    raise SyscallError(errno.EROFS)


def _fd_change(k: Kernel, fd: int) -> int:
    """fchmod/fchown on a descriptor: the file lives on the read-only mount unless it is a pipe."""
    file = k.files.file(_signed32(fd))
    if isinstance(file, HostFile | MemFile):
        raise SyscallError(errno.EROFS)
    return 0 if isinstance(file, Device) else _raise(errno.EPERM)


def _raise(err: int) -> int:
    raise SyscallError(err)


def sys_fchmod(k: Kernel, fd: int, *_: int) -> int:
    return _fd_change(k, fd)


def sys_fchown(k: Kernel, fd: int, *_: int) -> int:
    return _fd_change(k, fd)


def sys_ftruncate(k: Kernel, fd: int, length: int, *_: int) -> int:
    entry = k.files.get(_signed32(fd))
    if _signed(length) < 0:
        raise SyscallError(errno.EINVAL)
    if not isinstance(entry.file, HostFile) or entry.file.is_dir or not entry.flags & abi.O_ACCMODE:
        raise SyscallError(errno.EINVAL)  # not open for writing, or not a regular file
    raise SyscallError(errno.EROFS)


def sys_utimensat(k: Kernel, dirfd: int, path_addr: int, times: int, flags: int, *_: int) -> int:
    if path_addr == 0:  # futimens(fd)
        file = k.files.file(_signed32(dirfd))
        if isinstance(file, HostFile | MemFile):
            raise SyscallError(errno.EROFS)
        return 0
    lookup(k, dirfd, _path(k, path_addr), follow=not flags & abi.AT_SYMLINK_NOFOLLOW)
    raise SyscallError(errno.EROFS)


def sys_setxattr(k: Kernel, path_addr: int, *_: int) -> int:
    return _refuse_existing(k, _CWD, path_addr, follow=True)


def sys_lsetxattr(k: Kernel, path_addr: int, *_: int) -> int:
    return _refuse_existing(k, _CWD, path_addr)


def sys_fsetxattr(k: Kernel, fd: int, *_: int) -> int:
    k.files.file(_signed32(fd))
    raise SyscallError(errno.EROFS)


def sys_fsync(k: Kernel, fd: int, *_: int) -> int:
    """Nothing is ever dirty; pipes and streams cannot be synced (EINVAL), as on Linux."""
    file = k.files.file(_signed32(fd))
    if isinstance(file, PipeEnd | Stream):
        raise SyscallError(errno.EINVAL)
    return 0


# ---------------------------------------------------------------- poll: nothing else runs, so nothing changes
POLLIN, POLLOUT, POLLERR, POLLHUP, POLLNVAL, POLLRDNORM, POLLWRNORM = 0x1, 0x4, 0x8, 0x10, 0x20, 0x40, 0x100
DEFAULT_POLLMASK = POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM
POLLFD = struct.Struct("<ihh")


def _poll_mask(file: OpenFile) -> int:
    """What Linux's f_op->poll would say right now (regular files, devices and procfs are always ready)."""
    if isinstance(file, PipeEnd):
        if file.writable:
            return POLLOUT | POLLWRNORM | (POLLERR if not file.pipe.readers else 0)
        ready = POLLIN | POLLRDNORM if file.pipe.buffer else 0
        return ready | (POLLHUP if not file.pipe.writers else 0)
    if isinstance(file, Stream):
        # Captured input is all there (data or EOF); a terminal's read blocks like read() does.
        return (POLLIN | POLLRDNORM if file.reader else 0) | (POLLOUT | POLLWRNORM if file.writer else 0)
    return DEFAULT_POLLMASK
