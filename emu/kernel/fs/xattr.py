"""Extended attributes (fs/xattr.c): the host's, read through; the guest's layer keeps none."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32
from emu.kernel import procfs
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import Device, HostFile, MemFile, SyntheticDir
from emu.kernel.fs.layer import existing, overlay, refuse_existing
from emu.kernel.fs.namei import CWD, getname, host_errno, lookup

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


XATTR_SIZE_MAX = 65536


def _xattr_target(k: Kernel, path_addr: int, follow: bool) -> str:
    """A host path for the xattr calls; procfs keeps none (EOPNOTSUPP, as Linux's procfs says)."""
    guest = lookup(k, abi.AT_FDCWD & 0xFFFFFFFF, getname(k, path_addr), follow)
    if procfs.stat_of(k, guest) is not None:
        raise SyscallError(errno.EOPNOTSUPP)
    return k.vfs.host_path(guest)


def _xattr_fd(k: Kernel, fd: int) -> str | int:
    """What an fd's xattrs are read from: its host file, or nothing (pipes: ENODATA; procfs: EOPNOTSUPP)."""
    file = k.files.file(signed32(fd))
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
        raise host_errno(exc, errno.ENODATA) from None
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
        raise host_errno(exc, errno.EOPNOTSUPP) from None
    return _copy_sized(k, b"".join(os.fsencode(n) + b"\0" for n in names), buf, size)


def sys_listxattr(k: Kernel, path_addr: int, buf: int, size: int, *_: int) -> int:
    return _listxattr(k, lambda: _xattr_target(k, path_addr, True), buf, size)


def sys_llistxattr(k: Kernel, path_addr: int, buf: int, size: int, *_: int) -> int:
    return _listxattr(k, lambda: _xattr_target(k, path_addr, False), buf, size)


def sys_flistxattr(k: Kernel, fd: int, buf: int, size: int, *_: int) -> int:
    return _listxattr(k, lambda: _xattr_fd(k, fd), buf, size)


# ---------------------------------------------------------------- on a --read-only mount: EROFS, in Linux's order
def _read_only_setxattr(k: Kernel, path_addr: int, *_: int) -> int:
    return refuse_existing(k, CWD, path_addr, follow=True)


def _read_only_lsetxattr(k: Kernel, path_addr: int, *_: int) -> int:
    return refuse_existing(k, CWD, path_addr)


def _read_only_fsetxattr(k: Kernel, fd: int, *_: int) -> int:
    k.files.file(signed32(fd))
    raise SyscallError(errno.EROFS)


# ---------------------------------------------------------------- in the guest's in-memory layer
def sys_setxattr(k: Kernel, path_addr: int, *_: int) -> int:
    """The in-memory layer keeps no extended attributes (EOPNOTSUPP, as a file system without them)."""
    if overlay(k) is None:
        return _read_only_setxattr(k, path_addr)
    existing(k, CWD, getname(k, path_addr), follow=True)
    raise SyscallError(errno.EOPNOTSUPP)


def sys_lsetxattr(k: Kernel, path_addr: int, *_: int) -> int:
    if overlay(k) is None:
        return _read_only_lsetxattr(k, path_addr)
    existing(k, CWD, getname(k, path_addr))
    raise SyscallError(errno.EOPNOTSUPP)


def sys_fsetxattr(k: Kernel, fd: int, *_: int) -> int:
    if overlay(k) is None:
        return _read_only_fsetxattr(k, fd)
    k.files.file(signed32(fd))
    raise SyscallError(errno.EOPNOTSUPP)
