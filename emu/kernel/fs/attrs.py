"""A file's attributes and size: chmod, chown, truncate, fallocate, utimensat and their fd and *at
forms (fs/attr.c, fs/open.c), on the guest's layer (a host file is copied up first); EROFS on a
``--read-only`` mount after the lookup's errors."""

from __future__ import annotations

import errno
import stat
import struct
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32, signed64
from emu.kernel import procfs
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import Device, HostFile, MemFile, OpenFile, SyntheticDir
from emu.kernel.fs.layer import MAY_WRITE, kernel_owned, overlay, refuse_existing, require
from emu.kernel.fs.namei import CWD, getname, lookup, stat_path
from emu.kernel.overlay import Inode, Kind, Overlay
from emu.kernel.overlay_files import OverlayFile

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
FALLOC_FL_KEEP_SIZE = 1


# ---------------------------------------------------------------- on a --read-only mount: EROFS, in Linux's order
def _read_only_fchmodat(k: Kernel, dirfd: int, path_addr: int, *_: int) -> int:
    return refuse_existing(k, dirfd, path_addr, follow=True)


def _read_only_fchownat(k: Kernel, dirfd: int, path_addr: int, owner: int, group: int, flags: int, *_: int) -> int:
    path = getname(k, path_addr)
    if path == "" and flags & abi.AT_EMPTY_PATH:
        return _read_only_fchown(k, dirfd)
    lookup(k, dirfd, path, follow=not flags & abi.AT_SYMLINK_NOFOLLOW)
    raise SyscallError(errno.EROFS)


def _read_only_truncate(k: Kernel, path_addr: int, length: int, *_: int) -> int:
    guest = lookup(k, CWD, getname(k, path_addr))
    if stat.S_ISDIR(stat_path(k, guest).mode):
        raise SyscallError(errno.EISDIR)
    raise SyscallError(errno.EROFS)


def _fd_change(k: Kernel, fd: int) -> int:
    """fchmod/fchown on a descriptor: the file lives on the read-only mount unless it is a pipe."""
    file = k.files.file(signed32(fd))
    if isinstance(file, HostFile | MemFile):
        raise SyscallError(errno.EROFS)
    return 0 if isinstance(file, Device) else _raise(errno.EPERM)


def _raise(err: int) -> int:
    raise SyscallError(err)


def _read_only_fchmod(k: Kernel, fd: int, *_: int) -> int:
    return _fd_change(k, fd)


def _read_only_fchown(k: Kernel, fd: int, *_: int) -> int:
    return _fd_change(k, fd)


def _read_only_ftruncate(k: Kernel, fd: int, length: int, *_: int) -> int:
    entry = k.files.get(signed32(fd))
    if signed64(length) < 0:
        raise SyscallError(errno.EINVAL)
    if not isinstance(entry.file, HostFile) or entry.file.is_dir or not entry.flags & abi.O_ACCMODE:
        raise SyscallError(errno.EINVAL)  # not open for writing, or not a regular file
    raise SyscallError(errno.EROFS)


def _read_only_utimensat(k: Kernel, dirfd: int, path_addr: int, times: int, flags: int, *_: int) -> int:
    if path_addr == 0:  # futimens(fd)
        file = k.files.file(signed32(dirfd))
        if isinstance(file, HostFile | MemFile):
            raise SyscallError(errno.EROFS)
        return 0
    lookup(k, dirfd, getname(k, path_addr), follow=not flags & abi.AT_SYMLINK_NOFOLLOW)
    raise SyscallError(errno.EROFS)


# ---------------------------------------------------------------- in the guest's in-memory layer
def _inode_of_fd(k: Kernel, fd: int) -> Inode | None:
    """The guest's own inode behind a descriptor (a host file is copied up first); None: not a file."""
    return _inode_of_file(k, k.files.file(signed32(fd)))


def _inode_of_file(k: Kernel, file: OpenFile) -> Inode | None:
    ov = overlay(k)
    if isinstance(file, OverlayFile):
        return file.inode
    if ov is not None and isinstance(file, HostFile | SyntheticDir) and not kernel_owned(k, file.guest_path):
        return ov.copy_up(file.guest_path)
    return None


def _inode_at(k: Kernel, ov: Overlay, dirfd: int, path: str, follow: bool) -> Inode:
    """The inode a path names, copied up; /proc/self/fd/N reaches the open file itself, as Linux's
    magic links do (``chmod /proc/self/fd/3`` changes what fd 3 is open on)."""
    guest = lookup(k, dirfd, path, follow)
    file = procfs.fd_file(k, guest) if follow else None
    if file is not None:
        inode = _inode_of_file(k, file)
        if inode is None:
            raise SyscallError(errno.EPERM)  # a pipe or stream
        return inode
    if kernel_owned(k, guest):
        raise SyscallError(errno.EPERM)
    return ov.copy_up(guest)


def _chmod(k: Kernel, inode: Inode, mode: int) -> int:
    if k.ident.uid not in (0, inode.uid):
        raise SyscallError(errno.EPERM)
    inode.mode = stat.S_IFMT(inode.mode) | mode & 0o7777
    inode.ctime_ns = k.clock.wall_ns()
    return 0


def sys_fchmodat(k: Kernel, dirfd: int, path_addr: int, mode: int, *_: int) -> int:
    ov = overlay(k)
    if ov is None:
        return _read_only_fchmodat(k, dirfd, path_addr)
    return _chmod(k, _inode_at(k, ov, dirfd, getname(k, path_addr), follow=True), mode)


def sys_chmod(k: Kernel, path_addr: int, mode: int, *_: int) -> int:
    return sys_fchmodat(k, CWD, path_addr, mode)


def sys_fchmod(k: Kernel, fd: int, mode: int, *_: int) -> int:
    inode = _inode_of_fd(k, fd)
    return _read_only_fchmod(k, fd) if inode is None else _chmod(k, inode, mode)


def _chown(k: Kernel, inode: Inode, owner: int, group: int) -> int:
    owner, group = owner & 0xFFFFFFFF, group & 0xFFFFFFFF
    if k.ident.uid != 0 and (owner not in (0xFFFFFFFF, inode.uid) or k.ident.uid != inode.uid):
        raise SyscallError(errno.EPERM)
    if owner != 0xFFFFFFFF:
        inode.uid = owner
    if group != 0xFFFFFFFF:
        inode.gid = group
    inode.ctime_ns = k.clock.wall_ns()
    return 0


def sys_fchownat(k: Kernel, dirfd: int, path_addr: int, owner: int, group: int, flags: int, *_: int) -> int:
    ov = overlay(k)
    path = getname(k, path_addr)
    if ov is None:
        return _read_only_fchownat(k, dirfd, path_addr, owner, group, flags)
    if path == "" and flags & abi.AT_EMPTY_PATH:
        return sys_fchown(k, dirfd, owner, group)
    return _chown(k, _inode_at(k, ov, dirfd, path, follow=not flags & abi.AT_SYMLINK_NOFOLLOW), owner, group)


def sys_chown(k: Kernel, path_addr: int, owner: int, group: int, *_: int) -> int:
    return sys_fchownat(k, CWD, path_addr, owner, group, 0)


def sys_lchown(k: Kernel, path_addr: int, owner: int, group: int, *_: int) -> int:
    return sys_fchownat(k, CWD, path_addr, owner, group, abi.AT_SYMLINK_NOFOLLOW)


def sys_fchown(k: Kernel, fd: int, owner: int, group: int, *_: int) -> int:
    inode = _inode_of_fd(k, fd)
    return _read_only_fchown(k, fd) if inode is None else _chown(k, inode, owner, group)


def _resize(k: Kernel, inode: Inode, length: int) -> int:
    if inode.kind is Kind.DIR:
        raise SyscallError(errno.EISDIR)
    if inode.kind is not Kind.REG:
        raise SyscallError(errno.EINVAL)
    OverlayFile(inode, "", True, k.clock.wall_ns).truncate(length)
    return 0


def sys_truncate(k: Kernel, path_addr: int, length: int, *_: int) -> int:
    ov = overlay(k)
    if ov is None:
        return _read_only_truncate(k, path_addr, length)
    if signed64(length) < 0:
        raise SyscallError(errno.EINVAL)
    inode = _inode_at(k, ov, CWD, getname(k, path_addr), follow=True)
    if inode.kind is Kind.DIR:
        raise SyscallError(errno.EISDIR)
    require(k, inode.stat(), MAY_WRITE)
    return _resize(k, inode, length)


def sys_ftruncate(k: Kernel, fd: int, length: int, *_: int) -> int:
    entry = k.files.get(signed32(fd))
    if isinstance(entry.file, OverlayFile) and entry.file.writable:
        if signed64(length) < 0:
            raise SyscallError(errno.EINVAL)
        return _resize(k, entry.file.inode, length)
    return _read_only_ftruncate(k, fd, length)


def sys_fallocate(k: Kernel, fd: int, mode: int, offset: int, length: int, *_: int) -> int:
    """Reserve space: the file grows to offset+length unless FALLOC_FL_KEEP_SIZE (nothing is reserved
    in memory); punching and collapsing holes are EOPNOTSUPP, as on a file system without them."""
    entry = k.files.get(signed32(fd))
    offset, length = signed64(offset), signed64(length)
    if offset < 0 or length <= 0:
        raise SyscallError(errno.EINVAL)
    if not entry.flags & abi.O_ACCMODE:
        raise SyscallError(errno.EBADF)
    file = entry.file
    if not isinstance(file, OverlayFile):
        raise SyscallError(errno.ESPIPE if stat.S_ISFIFO(file.stat().mode) else errno.ENODEV)
    if mode & ~FALLOC_FL_KEEP_SIZE:
        raise SyscallError(errno.EOPNOTSUPP)
    if not mode & FALLOC_FL_KEEP_SIZE and offset + length > file.inode.size:
        file.truncate(offset + length)
    return 0


def _times(k: Kernel, times: int) -> tuple[int | None, int | None]:
    """utimensat's two timespecs: None where UTIME_OMIT; the virtual clock for NULL and UTIME_NOW."""
    now = k.clock.wall_ns()
    if not times:
        return now, now
    out: list[int | None] = []
    for sec, nsec in struct.iter_unpack("<qq", k.mem.read_user(times, 32)):
        if nsec == UTIME_OMIT:
            out.append(None)
        elif nsec == UTIME_NOW:
            out.append(now)
        elif not 0 <= nsec < 10**9:
            raise SyscallError(errno.EINVAL)
        else:
            out.append(sec * 10**9 + nsec)
    return out[0], out[1]


def sys_utimensat(k: Kernel, dirfd: int, path_addr: int, times: int, flags: int, *_: int) -> int:
    ov = overlay(k)
    if ov is None:
        return _read_only_utimensat(k, dirfd, path_addr, times, flags)
    atime, mtime = _times(k, times)
    if path_addr == 0:
        inode = _inode_of_fd(k, dirfd)
        if inode is None:
            return 0
    else:
        inode = _inode_at(k, ov, dirfd, getname(k, path_addr), follow=not flags & abi.AT_SYMLINK_NOFOLLOW)
    if atime is not None:
        inode.atime_ns = atime
    if mtime is not None:
        inode.mtime_ns = mtime
    inode.ctime_ns = k.clock.wall_ns()
    return 0
