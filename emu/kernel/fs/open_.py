"""open, openat, creat, access, faccessat, umask (fs/open.c): Linux's order of checks, the host's
files read-only and the guest's own (and its writes) in the in-memory layer."""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32
from emu.kernel import cpufs, procfs, sysfs
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import ALLOWED_DEVICES, Device, HostFile, OpenFile, SyntheticDir
from emu.kernel.fs.fdtable import FdEntry
from emu.kernel.fs.layer import MAY_EXEC, MAY_READ, MAY_WRITE, new_inode, new_name, overlay, permitted, require
from emu.kernel.fs.namei import getname, host_errno, lookup, stat_path
from emu.kernel.overlay import Inode, Kind
from emu.kernel.overlay_files import LowerFile, OverlayFile

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


O_TMPFILE_BIT = 0o20000000  # __O_TMPFILE: O_TMPFILE without O_DIRECTORY


O_LARGEFILE = 0o100000


def wants_write(flags: int) -> bool:
    return (flags & abi.O_ACCMODE) in (abi.O_WRONLY, abi.O_RDWR)


def open_path(k: Kernel, dirfd: int, path: str, flags: int, mode: int = 0o666) -> OpenFile:
    """Linux's order of checks in open: lookup, O_CREAT|O_EXCL, type checks, then the mount's."""
    follow = not flags & abi.O_NOFOLLOW and not (flags & abi.O_CREAT and flags & abi.O_EXCL)
    try:
        guest = lookup(k, dirfd, path, follow)
    except SyscallError as err:
        if err.errno == errno.ENOENT and flags & abi.O_CREAT and not flags & O_TMPFILE_BIT:
            return create(k, dirfd, path, flags, mode)  # EROFS on a read-only mount
        raise
    synthetic = procfs.open_file(k, guest, flags) or sysfs.open_file(guest, flags) or cpufs.open_file(k, guest, flags)
    if synthetic is not None:
        return synthetic
    node = k.vfs.backing(guest)
    if isinstance(node, Inode):
        return open_inode(k, guest, node, flags)
    host = node
    try:
        st = os.lstat(host)
    except OSError as exc:
        raise host_errno(exc, errno.ENOENT) from None
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
            return tmpfile(k, guest, flags, mode)  # EROFS on a read-only mount
        raise SyscallError(errno.ENOTDIR)
    if flags & abi.O_CREAT and is_dir:
        raise SyscallError(errno.EISDIR)
    if flags & abi.O_DIRECTORY and not is_dir:
        raise SyscallError(errno.ENOTDIR)
    if is_dir and (wants_write(flags) or flags & abi.O_TRUNC):
        raise SyscallError(errno.EISDIR)
    if guest in ALLOWED_DEVICES and stat.S_ISCHR(st.st_mode):
        return Device(guest, host, k.random.randbytes)
    if wants_write(flags) or (flags & abi.O_TRUNC and stat.S_ISREG(st.st_mode)):
        if k.vfs.overlay is None or not stat.S_ISREG(st.st_mode):
            raise SyscallError(errno.EROFS)
        return open_host_for_write(k, guest, flags)
    if not (stat.S_ISREG(st.st_mode) or is_dir):
        raise SyscallError(errno.EACCES)  # host devices, fifos, sockets stay out of the sandbox
    if is_dir and k.vfs.overlay is not None and k.vfs.overlay.touched(guest):
        return open_dir(k, guest)  # the host's entries and the guest's
    if k.vfs.overlay is not None and not is_dir:
        return LowerFile(host, guest, k.vfs.overlay.copied)  # sees the guest's later writes too
    return HostFile(host, guest, is_dir)


def _open_fifo(k: Kernel, inode: Inode, guest: str, flags: int) -> OpenFile:
    """A FIFO the guest made (mknod, mkfifo): emu/kernel/fifo.py."""
    from emu.kernel.fifo import open_fifo  # loaded with the first FIFO opened (most runs open none)

    return open_fifo(k, inode, flags, guest)


def sys_openat(k: Kernel, dirfd: int, path_addr: int, flags: int, mode: int, *_: int) -> int:
    path = getname(k, path_addr)
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


def create(k: Kernel, dirfd: int, path: str, flags: int, mode: int) -> OpenFile:
    """open(O_CREAT) of a missing name."""
    ov = overlay(k)
    if path.endswith("/"):
        raise SyscallError(errno.EISDIR)
    parent, guest = new_name(k, dirfd, path)
    if ov is None:
        raise SyscallError(errno.EROFS)
    inode = new_inode(k, ov, parent, Kind.REG, mode)
    ov.put(guest, inode)
    return OverlayFile(inode, guest, wants_write(flags), ov.now_ns)


def tmpfile(k: Kernel, guest: str, flags: int, mode: int) -> OpenFile:
    """O_TMPFILE: an unnamed file in the directory (nlink 0 until linkat gives it a name)."""
    ov = overlay(k)
    if ov is None:
        raise SyscallError(errno.EROFS)
    if not wants_write(flags):
        raise SyscallError(errno.EINVAL)
    require(k, k.vfs.lstat(guest), MAY_WRITE | MAY_EXEC)
    inode = new_inode(k, ov, guest, Kind.REG, mode)
    inode.nlink = 0
    return OverlayFile(inode, f"{guest.rstrip('/')}/#{inode.ino} (deleted)", True, ov.now_ns)


def open_dir(k: Kernel, guest: str) -> OpenFile:
    ov = overlay(k)
    assert ov is not None
    return SyntheticDir(guest, lambda: ov.listing(guest), ov.lstat(guest))


def open_inode(k: Kernel, guest: str, inode: Inode, flags: int) -> OpenFile:
    """open(2) of a name the guest's layer holds, checked in open_path's order."""
    ov = overlay(k)
    assert ov is not None
    if flags & abi.O_CREAT and flags & abi.O_EXCL:
        raise SyscallError(errno.EEXIST)
    is_dir = inode.kind is Kind.DIR
    if flags & abi.O_PATH:
        if flags & abi.O_DIRECTORY and not is_dir:
            raise SyscallError(errno.ENOTDIR)
        return open_dir(k, guest) if is_dir else OverlayFile(inode, guest, False, ov.now_ns)
    if inode.kind is Kind.LNK:
        raise SyscallError(errno.ELOOP)
    if flags & O_TMPFILE_BIT:
        if not is_dir:
            raise SyscallError(errno.ENOTDIR)
        return tmpfile(k, guest, flags, 0o600)
    if is_dir:
        if flags & abi.O_CREAT or wants_write(flags) or flags & abi.O_TRUNC:
            raise SyscallError(errno.EISDIR)
        return open_dir(k, guest)
    if flags & abi.O_DIRECTORY:
        raise SyscallError(errno.ENOTDIR)
    if inode.kind not in (Kind.REG, Kind.FIFO):
        raise SyscallError(errno.EACCES)  # devices and sockets stay out of the sandbox, as on the host
    writable = wants_write(flags)
    require(k, inode.stat(), (MAY_WRITE if writable or flags & abi.O_TRUNC and inode.kind is Kind.REG else 0)
             | (0 if (flags & abi.O_ACCMODE) == abi.O_WRONLY else MAY_READ))
    if inode.kind is Kind.FIFO:
        return _open_fifo(k, inode, guest, flags)
    file = OverlayFile(inode, guest, writable, ov.now_ns)
    if flags & abi.O_TRUNC and inode.size:
        file.truncate(0)
    return file


def open_host_for_write(k: Kernel, guest: str, flags: int) -> OpenFile:
    """A host regular file opened for writing: the guest gets its own copy (the host's stays as it is)."""
    ov = overlay(k)
    if ov is None:
        raise SyscallError(errno.EROFS)
    return open_inode(k, guest, ov.copy_up(guest), flags)


def sys_faccessat(k: Kernel, dirfd: int, path_addr: int, mode: int, flags: int = 0, *_: int) -> int:
    if mode & ~7 or flags & ~(abi.AT_SYMLINK_NOFOLLOW | abi.AT_EMPTY_PATH | 0x200):  # 0x200: AT_EACCESS
        raise SyscallError(errno.EINVAL)
    path = getname(k, path_addr)
    if path == "" and flags & abi.AT_EMPTY_PATH:
        file = k.files.file(signed32(dirfd))
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
        if not permitted(k, info, mode):
            raise SyscallError(errno.EACCES)
        return 0
    try:
        # root's writes go to the guest's layer even where the host's own mount is read-only
        allowed = os.access(host, mode & ~os.W_OK if k.ident.uid == 0 else mode, follow_symlinks=False)
    except OSError as exc:
        raise host_errno(exc, errno.EACCES) from None
    if not allowed:
        raise SyscallError(errno.EACCES)
    return 0


def sys_faccessat_nf(k: Kernel, dirfd: int, path_addr: int, mode: int, *_: int) -> int:
    return sys_faccessat(k, dirfd, path_addr, mode, 0)


def sys_access(k: Kernel, path_addr: int, mode: int, *_: int) -> int:
    return sys_faccessat(k, abi.AT_FDCWD & 0xFFFFFFFF, path_addr, mode, 0)


def sys_umask(k: Kernel, mask: int, *_: int) -> int:
    old, k.umask = k.umask, mask & 0o777
    return old
