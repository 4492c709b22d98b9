"""Names: mkdir, mknod, symlink, link, unlink, rmdir, rename and their *at forms (fs/namei.c),
in the guest's in-memory layer; on a ``--read-only`` mount the lookup's errors, then EEXIST or EROFS."""

from __future__ import annotations

import errno
import stat
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import HostFile
from emu.kernel.fs.layer import existing, new_inode, new_name, overlay, parent_writable, refuse_existing, refuse_new
from emu.kernel.fs.namei import CWD, getname, lookup, parent_must_exist
from emu.kernel.overlay import Inode, Kind, Overlay
from emu.kernel.overlay_files import OverlayFile

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT = 1, 2, 4


# ---------------------------------------------------------------- on a --read-only mount: EROFS, in Linux's order
def _read_only_mkdirat(k: Kernel, dirfd: int, path_addr: int, *_: int) -> int:
    return refuse_new(k, dirfd, path_addr)


def _read_only_symlinkat(k: Kernel, target_addr: int, dirfd: int, path_addr: int, *_: int) -> int:
    return refuse_new(k, dirfd, path_addr)


def _read_only_linkat(k: Kernel, olddirfd: int, old_addr: int, newdirfd: int, new_addr: int, flags: int, *_: int) -> int:
    lookup(k, olddirfd, getname(k, old_addr), follow=bool(flags & abi.AT_SYMLINK_FOLLOW))
    return refuse_new(k, newdirfd, new_addr)


def _read_only_unlinkat(k: Kernel, dirfd: int, path_addr: int, flags: int, *_: int) -> int:
    if flags & ~abi.AT_REMOVEDIR:
        raise SyscallError(errno.EINVAL)
    return refuse_existing(k, dirfd, path_addr)


def _read_only_rmdir(k: Kernel, path_addr: int, *_: int) -> int:
    return refuse_existing(k, CWD, path_addr)


def _read_only_renameat(k: Kernel, olddirfd: int, old_addr: int, *_: int) -> int:
    return refuse_existing(k, olddirfd, old_addr)


# ---------------------------------------------------------------- in the guest's in-memory layer
def sys_mkdirat(k: Kernel, dirfd: int, path_addr: int, mode: int, *_: int) -> int:
    ov = overlay(k)
    if ov is None:
        return _read_only_mkdirat(k, dirfd, path_addr)
    parent, guest = new_name(k, dirfd, getname(k, path_addr))
    ov.put(guest, new_inode(k, ov, parent, Kind.DIR, mode & 0o7777))
    return 0


def sys_mkdir(k: Kernel, path_addr: int, mode: int, *_: int) -> int:
    return sys_mkdirat(k, CWD, path_addr, mode)


def sys_mknodat(k: Kernel, dirfd: int, path_addr: int, mode: int, dev: int, *_: int) -> int:
    """Regular files, fifos and sockets as Linux makes them; device nodes need CAP_MKNOD (EPERM)."""
    fmt = stat.S_IFMT(mode)
    kind = {0: Kind.REG, stat.S_IFREG: Kind.REG, stat.S_IFIFO: Kind.FIFO, stat.S_IFSOCK: Kind.OTHER}.get(fmt)
    if kind is None and fmt not in (stat.S_IFCHR, stat.S_IFBLK):
        raise SyscallError(errno.EINVAL)
    ov = overlay(k)
    if ov is None:
        return refuse_new(k, dirfd, path_addr)  # EROFS before the capability check, as Linux
    parent, guest = new_name(k, dirfd, getname(k, path_addr))
    if kind is None:
        raise SyscallError(errno.EPERM)  # the sandbox holds no CAP_MKNOD
    inode = new_inode(k, ov, parent, kind, mode & 0o7777)
    if kind is Kind.OTHER:
        inode.mode = stat.S_IFSOCK | inode.mode & 0o7777
    ov.put(guest, inode)
    return 0


def sys_mknod(k: Kernel, path_addr: int, mode: int, dev: int, *_: int) -> int:
    return sys_mknodat(k, CWD, path_addr, mode, dev)


def sys_symlinkat(k: Kernel, target_addr: int, dirfd: int, path_addr: int, *_: int) -> int:
    ov = overlay(k)
    if ov is None:
        return _read_only_symlinkat(k, target_addr, dirfd, path_addr)
    target = getname(k, target_addr)
    parent, guest = new_name(k, dirfd, getname(k, path_addr))
    inode = ov.new_inode(Kind.LNK, 0o777, k.ident.uid, k.ident.gid, ov.dev_for(parent))
    inode.target = target
    ov.put(guest, inode)
    return 0


def sys_symlink(k: Kernel, target_addr: int, path_addr: int, *_: int) -> int:
    return sys_symlinkat(k, target_addr, CWD, path_addr)


def sys_linkat(k: Kernel, olddirfd: int, old_addr: int, newdirfd: int, new_addr: int, flags: int, *_: int) -> int:
    ov = overlay(k)
    if ov is None:
        return _read_only_linkat(k, olddirfd, old_addr, newdirfd, new_addr, flags)
    if flags & ~(abi.AT_SYMLINK_FOLLOW | abi.AT_EMPTY_PATH):
        raise SyscallError(errno.EINVAL)
    old = getname(k, old_addr)
    inode: Inode
    if old == "" and flags & abi.AT_EMPTY_PATH:
        file = k.files.file(signed32(olddirfd))
        if not isinstance(file, OverlayFile):
            raise SyscallError(errno.ENOENT if isinstance(file, HostFile) else errno.EXDEV)
        inode = file.inode
    else:
        src = existing(k, olddirfd, old, follow=bool(flags & abi.AT_SYMLINK_FOLLOW))
        if stat.S_ISDIR(k.vfs.lstat(src).mode):
            raise SyscallError(errno.EPERM)
        inode = ov.copy_up(src)
    guest = new_name(k, newdirfd, getname(k, new_addr))[1]
    inode.nlink += 1
    inode.ctime_ns = ov.now_ns()
    ov.put(guest, inode)
    return 0


def sys_link(k: Kernel, old_addr: int, new_addr: int, *_: int) -> int:
    return sys_linkat(k, CWD, old_addr, CWD, new_addr, 0)


def _unlink_name(k: Kernel, ov: Overlay, guest: str) -> None:
    node = ov.backing(guest)
    if isinstance(node, Inode):
        node.nlink -= 1
        node.ctime_ns = ov.now_ns()
    ov.remove(guest)


def _rmdir(k: Kernel, ov: Overlay, dirfd: int, path: str) -> int:
    if path.rstrip("/").rpartition("/")[2] == ".":
        raise SyscallError(errno.EINVAL)
    guest = existing(k, dirfd, path)
    if not stat.S_ISDIR(k.vfs.lstat(guest).mode):
        raise SyscallError(errno.ENOTDIR)
    if guest == "/":
        raise SyscallError(errno.EBUSY)
    if not ov.is_empty_dir(guest):
        raise SyscallError(errno.ENOTEMPTY)
    parent_writable(k, guest)
    ov.remove(guest)
    return 0


def sys_unlinkat(k: Kernel, dirfd: int, path_addr: int, flags: int, *_: int) -> int:
    ov = overlay(k)
    if ov is None or flags & ~abi.AT_REMOVEDIR:
        return _read_only_unlinkat(k, dirfd, path_addr, flags)
    path = getname(k, path_addr)
    if flags & abi.AT_REMOVEDIR:
        return _rmdir(k, ov, dirfd, path)
    guest = existing(k, dirfd, path)
    if stat.S_ISDIR(k.vfs.lstat(guest).mode):
        raise SyscallError(errno.EISDIR)
    parent_writable(k, guest)
    _unlink_name(k, ov, guest)
    return 0


def sys_unlink(k: Kernel, path_addr: int, *_: int) -> int:
    return sys_unlinkat(k, CWD, path_addr, 0)


def sys_rmdir(k: Kernel, path_addr: int, *_: int) -> int:
    ov = overlay(k)
    if ov is None:
        return _read_only_rmdir(k, path_addr)
    return _rmdir(k, ov, CWD, getname(k, path_addr))


def sys_renameat2(k: Kernel, olddirfd: int, old_addr: int, newdirfd: int, new_addr: int, flags: int = 0,
                  *_: int) -> int:
    ov = overlay(k)
    if ov is None:
        return _read_only_renameat(k, olddirfd, old_addr)
    if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) or flags & RENAME_WHITEOUT:
        raise SyscallError(errno.EINVAL)
    old, new = getname(k, old_addr), getname(k, new_addr)
    if old.rstrip("/").rpartition("/")[2] in (".", "..") or new.rstrip("/").rpartition("/")[2] in (".", ".."):
        raise SyscallError(errno.EBUSY)
    src = existing(k, olddirfd, old)
    src_dir = stat.S_ISDIR(k.vfs.lstat(src).mode)
    parent = parent_must_exist(k, newdirfd, new)
    dst = parent.rstrip("/") + "/" + new.rstrip("/").rpartition("/")[2]
    if dst == src:
        return 0
    if dst.startswith(src.rstrip("/") + "/"):
        raise SyscallError(errno.EINVAL)
    if ov.exists(dst):
        if flags & RENAME_NOREPLACE:
            raise SyscallError(errno.EEXIST)
        dst_dir = stat.S_ISDIR(ov.lstat(dst).mode)
        if src_dir and not dst_dir:
            raise SyscallError(errno.ENOTDIR)
        if dst_dir and not src_dir:
            raise SyscallError(errno.EISDIR)
        if dst_dir and not flags & RENAME_EXCHANGE and not ov.is_empty_dir(dst):
            raise SyscallError(errno.ENOTEMPTY)
    elif flags & RENAME_EXCHANGE:
        raise SyscallError(errno.ENOENT)
    if not src_dir and old.endswith("/"):
        raise SyscallError(errno.ENOTDIR)
    parent_writable(k, src)
    parent_writable(k, dst)
    if flags & RENAME_EXCHANGE:
        ov.exchange(src, dst)
        return 0
    if ov.exists(dst):
        _unlink_name(k, ov, dst)
    ov.move(src, dst)
    return 0


def sys_rename(k: Kernel, old_addr: int, new_addr: int, *_: int) -> int:
    return sys_renameat2(k, CWD, old_addr, CWD, new_addr, 0)


def sys_renameat(k: Kernel, olddirfd: int, old_addr: int, newdirfd: int, new_addr: int, *_: int) -> int:
    return sys_renameat2(k, olddirfd, old_addr, newdirfd, new_addr, 0)
