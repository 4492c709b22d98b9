"""Path arguments and lookup (fs/namei.c): getname(), the directory a relative path starts from,
and a guest path resolved to its canonical name, with procfs, sysfs and the CPU files served by the kernel."""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32
from emu.kernel import cpufs, procfs, sysfs
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import StatInfo
from emu.process.memory import StringTooLong

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


CWD = abi.AT_FDCWD & 0xFFFFFFFF  # AT_FDCWD as a syscall's int argument arrives


PATH_MAX = 4096


def getname(k: Kernel, addr: int) -> str:
    """getname(): a path of fewer than PATH_MAX bytes, else ENAMETOOLONG (EFAULT if unreadable)."""
    try:
        raw = k.mem.read_cstring(addr, PATH_MAX)
    except StringTooLong:
        raise SyscallError(errno.ENAMETOOLONG) from None
    return os.fsdecode(raw)


def base_dir(k: Kernel, dirfd: int, path: str) -> str | None:
    """Directory a relative path starts from (None: the cwd)."""
    dirfd = signed32(dirfd)
    if path.startswith("/") or dirfd == abi.AT_FDCWD:
        return None
    entry = k.files.get(dirfd)
    file = entry.file
    if not file.is_directory:
        raise SyscallError(errno.ENOTDIR)
    return file.guest_path


def lookup(k: Kernel, dirfd: int, path: str, follow: bool = True) -> str:
    """Guest path -> canonical guest path, with /proc/self served by procfs, never by the host."""
    base = base_dir(k, dirfd, path)
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


def host_errno(exc: OSError, default: int = errno.EIO) -> SyscallError:
    return SyscallError(exc.errno or default)


def stat_path(k: Kernel, guest: str) -> StatInfo:
    info = procfs.stat_of(k, guest) or sysfs.stat_of(guest) or cpufs.stat_of(k, guest)
    if info is not None:
        return info
    return k.vfs.lstat(guest)


def parent_must_exist(k: Kernel, dirfd: int, path: str) -> str:
    """For calls that would create ``path``: resolve its directory (ENOENT/ENOTDIR as Linux) and return it."""
    head, _, name = path.rstrip("/").rpartition("/")
    if not name or name in (".", ".."):
        raise SyscallError(errno.EEXIST if path.rstrip("/") in ("", ".", "..") else errno.ENOENT)
    parent = lookup(k, dirfd, head or ("/" if path.startswith("/") else "."))
    if not stat.S_ISDIR(stat_path(k, parent).mode):
        raise SyscallError(errno.ENOTDIR)
    return parent
