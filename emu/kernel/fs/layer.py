"""What a change to the file system checks first: permissions (generic_permission()), the new
name or the existing one, the kernel's own names; on a ``--read-only`` mount, EROFS in Linux's order.

The changes themselves go to the guest's in-memory layer (overlay.py)."""

from __future__ import annotations

import errno
import stat
from typing import TYPE_CHECKING

from emu.kernel import procfs, sysfs
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import StatInfo
from emu.kernel.fs.namei import getname, lookup, parent_must_exist
from emu.kernel.overlay import Inode, Kind, Overlay

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


MAY_EXEC, MAY_WRITE, MAY_READ = 1, 2, 4


def overlay(k: Kernel) -> Overlay | None:
    return k.vfs.overlay


def permitted(k: Kernel, info: StatInfo, want: int) -> bool:
    """generic_permission(): owner, group, then other bits; root needs an x bit only to execute."""
    if k.ident.uid == 0:
        return not want & MAY_EXEC or stat.S_ISDIR(info.mode) or bool(info.mode & 0o111)
    shift = 6 if info.uid == k.ident.uid else 3 if info.gid == k.ident.gid else 0
    return (info.mode >> shift) & want == want


def require(k: Kernel, info: StatInfo, want: int) -> None:
    if not permitted(k, info, want):
        raise SyscallError(errno.EACCES)


def kernel_owned(k: Kernel, guest: str) -> bool:
    """procfs and sysfs names: the kernel's own, never the guest's to change."""
    return procfs.stat_of(k, guest) is not None or sysfs.serves(guest)


def new_name(k: Kernel, dirfd: int, path: str) -> tuple[str, str]:
    """(parent, canonical new path) for a call that creates ``path``: EEXIST if it is there."""
    parent = parent_must_exist(k, dirfd, path)
    name = path.rstrip("/").rpartition("/")[2]
    guest = parent.rstrip("/") + "/" + name
    if k.vfs.overlay is None:
        return parent, guest  # the caller says EEXIST or EROFS, as a read-only mount does
    if k.vfs.overlay.exists(guest):
        raise SyscallError(errno.EEXIST)
    if kernel_owned(k, parent):
        raise SyscallError(errno.EACCES)
    require(k, k.vfs.lstat(parent), MAY_WRITE | MAY_EXEC)
    return parent, guest


def existing(k: Kernel, dirfd: int, path: str, follow: bool = False) -> str:
    guest = lookup(k, dirfd, path, follow)
    if kernel_owned(k, guest):
        raise SyscallError(errno.EPERM)
    return guest


def parent_writable(k: Kernel, guest: str) -> None:
    parent = guest.rpartition("/")[0] or "/"
    require(k, k.vfs.lstat(parent), MAY_WRITE | MAY_EXEC)


def new_inode(k: Kernel, ov: Overlay, parent: str, kind: Kind, perm: int) -> Inode:
    return ov.new_inode(kind, perm & ~k.umask, k.ident.uid, k.ident.gid, ov.dev_for(parent))


def refuse_existing(k: Kernel, dirfd: int, path_addr: int, follow: bool = False) -> int:
    """A change to an existing file: the lookup's errors first (ENOENT...), then EROFS."""
    lookup(k, dirfd, getname(k, path_addr), follow)
    raise SyscallError(errno.EROFS)


def refuse_new(k: Kernel, dirfd: int, path_addr: int) -> int:
    """Creating a name: ENOENT/ENOTDIR for a missing parent, EEXIST if the name exists, else EROFS."""
    path = getname(k, path_addr)
    parent_must_exist(k, dirfd, path)
    try:
        lookup(k, dirfd, path.rstrip("/") or path, follow=False)
    except SyscallError as err:
        if err.errno != errno.ENOENT:
            raise
        raise SyscallError(errno.EROFS) from None
    raise SyscallError(errno.EEXIST)
