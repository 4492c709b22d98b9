"""stat, fstat, lstat, newfstatat, statx, readlink, readlinkat (fs/stat.c); statx and the
host's files report what the host's own statx says."""

from __future__ import annotations

import ctypes
import errno
import os
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32
from emu.kernel import procfs, sysfs
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import STATX_SIZE, SYS_STATX, HostFile, StatInfo, host_syscall
from emu.kernel.fs.namei import base_dir, getname, lookup, stat_path

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


def sys_fstat(k: Kernel, fd: int, buf: int, *_: int) -> int:
    k.mem.write_user(buf, k.files.file(signed32(fd)).stat().pack_stat())
    return 0


def _stat_at(k: Kernel, dirfd: int, path_addr: int, flags: int) -> StatInfo:
    path = getname(k, path_addr)
    if path == "" and flags & abi.AT_EMPTY_PATH:
        return k.files.file(signed32(dirfd)).stat()
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
    path = getname(k, path_addr)
    raw: bytes | None = None
    if path == "" and flags & abi.AT_EMPTY_PATH:
        file = k.files.file(signed32(dirfd))
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
    if signed32(size) <= 0:
        raise SyscallError(errno.EINVAL)
    path = getname(k, path_addr)
    target = procfs.self_link(k, k.vfs.absolute(path, base_dir(k, dirfd, path)))
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
