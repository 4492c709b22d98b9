"""File-system syscalls that change names, contents or metadata: served by the guest's in-memory
layer (overlay.py), or refused with EROFS under ``--read-only`` (fs.py's refusals).

Errors come in Linux's order: the lookup's (ENOENT, ENOTDIR, ELOOP), then EEXIST/EISDIR/ENOTEMPTY,
then permissions. Permission bits are checked as generic_permission() does for a caller without
CAP_DAC_OVERRIDE; root passes everything but the execute bit.
"""

from __future__ import annotations

import errno
import stat
import struct
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import PAGE_SIZE
from emu.kernel import fs, procfs, sysfs
from emu.kernel.errno_ import SyscallError
from emu.kernel.overlay import Inode, Kind, Overlay, OverlayFile, SharedMap
from emu.kernel.vfs import HostFile, OpenFile, StatInfo, SyntheticDir

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

_CWD = abi.AT_FDCWD & 0xFFFFFFFF
MAY_EXEC, MAY_WRITE, MAY_READ = 1, 2, 4
RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT = 1, 2, 4
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
MS_ASYNC, MS_INVALIDATE, MS_SYNC = 1, 2, 4


def _overlay(k: Kernel) -> Overlay | None:
    return k.vfs.overlay


def permitted(k: Kernel, info: StatInfo, want: int) -> bool:
    """generic_permission(): owner, group, then other bits; root needs an x bit only to execute."""
    if k.ident.uid == 0:
        return not want & MAY_EXEC or stat.S_ISDIR(info.mode) or bool(info.mode & 0o111)
    shift = 6 if info.uid == k.ident.uid else 3 if info.gid == k.ident.gid else 0
    return (info.mode >> shift) & want == want


def _require(k: Kernel, info: StatInfo, want: int) -> None:
    if not permitted(k, info, want):
        raise SyscallError(errno.EACCES)


def _kernel_owned(k: Kernel, guest: str) -> bool:
    """procfs and sysfs names: the kernel's own, never the guest's to change."""
    return procfs.stat_of(k, guest) is not None or sysfs.serves(guest)


def _new_name(k: Kernel, dirfd: int, path: str) -> tuple[str, str]:
    """(parent, canonical new path) for a call that creates ``path``: EEXIST if it is there."""
    parent = fs._parent_must_exist(k, dirfd, path)
    name = path.rstrip("/").rpartition("/")[2]
    guest = parent.rstrip("/") + "/" + name
    if k.vfs.overlay is None:
        return parent, guest  # the caller says EEXIST or EROFS, as a read-only mount does
    if k.vfs.overlay.exists(guest):
        raise SyscallError(errno.EEXIST)
    if _kernel_owned(k, parent):
        raise SyscallError(errno.EACCES)
    _require(k, k.vfs.lstat(parent), MAY_WRITE | MAY_EXEC)
    return parent, guest


def _existing(k: Kernel, dirfd: int, path: str, follow: bool = False) -> str:
    guest = fs.lookup(k, dirfd, path, follow)
    if _kernel_owned(k, guest):
        raise SyscallError(errno.EPERM)
    return guest


def _parent_writable(k: Kernel, guest: str) -> None:
    parent = guest.rpartition("/")[0] or "/"
    _require(k, k.vfs.lstat(parent), MAY_WRITE | MAY_EXEC)


def _new_inode(k: Kernel, ov: Overlay, parent: str, kind: Kind, perm: int) -> Inode:
    return ov.new_inode(kind, perm & ~k.umask, k.ident.uid, k.ident.gid, ov.dev_for(parent))


# ---------------------------------------------------------------- open
def create(k: Kernel, dirfd: int, path: str, flags: int, mode: int) -> OpenFile:
    """open(O_CREAT) of a missing name."""
    ov = _overlay(k)
    if path.endswith("/"):
        raise SyscallError(errno.EISDIR)
    parent, guest = _new_name(k, dirfd, path)
    if ov is None:
        raise SyscallError(errno.EROFS)
    inode = _new_inode(k, ov, parent, Kind.REG, mode)
    ov.put(guest, inode)
    return OverlayFile(inode, guest, fs._wants_write(flags), ov.now_ns)


def tmpfile(k: Kernel, guest: str, flags: int, mode: int) -> OpenFile:
    """O_TMPFILE: an unnamed file in the directory (nlink 0 until linkat gives it a name)."""
    ov = _overlay(k)
    if ov is None:
        raise SyscallError(errno.EROFS)
    if not fs._wants_write(flags):
        raise SyscallError(errno.EINVAL)
    _require(k, k.vfs.lstat(guest), MAY_WRITE | MAY_EXEC)
    inode = _new_inode(k, ov, guest, Kind.REG, mode)
    inode.nlink = 0
    return OverlayFile(inode, f"{guest.rstrip('/')}/#{inode.ino} (deleted)", True, ov.now_ns)


def open_dir(k: Kernel, guest: str) -> OpenFile:
    ov = _overlay(k)
    assert ov is not None
    return SyntheticDir(guest, lambda: ov.listing(guest), ov.lstat(guest))


def open_inode(k: Kernel, guest: str, inode: Inode, flags: int) -> OpenFile:
    """open(2) of a name the guest's layer holds, checked in open_path's order."""
    ov = _overlay(k)
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
    if flags & fs.O_TMPFILE_BIT:
        if not is_dir:
            raise SyscallError(errno.ENOTDIR)
        return tmpfile(k, guest, flags, 0o600)
    if is_dir:
        if flags & abi.O_CREAT or fs._wants_write(flags) or flags & abi.O_TRUNC:
            raise SyscallError(errno.EISDIR)
        return open_dir(k, guest)
    if flags & abi.O_DIRECTORY:
        raise SyscallError(errno.ENOTDIR)
    if inode.kind is not Kind.REG:
        raise SyscallError(errno.EACCES)  # fifos and devices stay out of the sandbox, as on the host
    writable = fs._wants_write(flags)
    _require(k, inode.stat(), (MAY_WRITE if writable or flags & abi.O_TRUNC else 0)
             | (0 if (flags & abi.O_ACCMODE) == abi.O_WRONLY else MAY_READ))
    file = OverlayFile(inode, guest, writable, ov.now_ns)
    if flags & abi.O_TRUNC and inode.size:
        file.truncate(0)
    return file


def open_host_for_write(k: Kernel, guest: str, flags: int) -> OpenFile:
    """A host regular file opened for writing: the guest gets its own copy (the host's stays as it is)."""
    ov = _overlay(k)
    if ov is None:
        raise SyscallError(errno.EROFS)
    return open_inode(k, guest, ov.copy_up(guest), flags)


# ---------------------------------------------------------------- names
def sys_mkdirat(k: Kernel, dirfd: int, path_addr: int, mode: int, *_: int) -> int:
    ov = _overlay(k)
    if ov is None:
        return fs.sys_mkdirat(k, dirfd, path_addr)
    parent, guest = _new_name(k, dirfd, fs._path(k, path_addr))
    ov.put(guest, _new_inode(k, ov, parent, Kind.DIR, mode & 0o7777))
    return 0


def sys_mkdir(k: Kernel, path_addr: int, mode: int, *_: int) -> int:
    return sys_mkdirat(k, _CWD, path_addr, mode)


def sys_mknodat(k: Kernel, dirfd: int, path_addr: int, mode: int, dev: int, *_: int) -> int:
    """Regular files, fifos and sockets as Linux makes them; device nodes need CAP_MKNOD (EPERM)."""
    fmt = stat.S_IFMT(mode)
    kind = {0: Kind.REG, stat.S_IFREG: Kind.REG, stat.S_IFIFO: Kind.FIFO, stat.S_IFSOCK: Kind.OTHER}.get(fmt)
    if kind is None and fmt not in (stat.S_IFCHR, stat.S_IFBLK):
        raise SyscallError(errno.EINVAL)
    ov = _overlay(k)
    if ov is None:
        return fs._refuse_new(k, dirfd, path_addr)  # EROFS before the capability check, as Linux
    parent, guest = _new_name(k, dirfd, fs._path(k, path_addr))
    if kind is None:
        raise SyscallError(errno.EPERM)  # the sandbox holds no CAP_MKNOD
    inode = _new_inode(k, ov, parent, kind, mode & 0o7777)
    if kind is Kind.OTHER:
        inode.mode = stat.S_IFSOCK | inode.mode & 0o7777
    ov.put(guest, inode)
    return 0


def sys_mknod(k: Kernel, path_addr: int, mode: int, dev: int, *_: int) -> int:
    return sys_mknodat(k, _CWD, path_addr, mode, dev)


def sys_symlinkat(k: Kernel, target_addr: int, dirfd: int, path_addr: int, *_: int) -> int:
    ov = _overlay(k)
    if ov is None:
        return fs.sys_symlinkat(k, target_addr, dirfd, path_addr)
    target = fs._path(k, target_addr)
    parent, guest = _new_name(k, dirfd, fs._path(k, path_addr))
    inode = ov.new_inode(Kind.LNK, 0o777, k.ident.uid, k.ident.gid, ov.dev_for(parent))
    inode.target = target
    ov.put(guest, inode)
    return 0


def sys_symlink(k: Kernel, target_addr: int, path_addr: int, *_: int) -> int:
    return sys_symlinkat(k, target_addr, _CWD, path_addr)


def sys_linkat(k: Kernel, olddirfd: int, old_addr: int, newdirfd: int, new_addr: int, flags: int, *_: int) -> int:
    ov = _overlay(k)
    if ov is None:
        return fs.sys_linkat(k, olddirfd, old_addr, newdirfd, new_addr, flags)
    if flags & ~(abi.AT_SYMLINK_FOLLOW | abi.AT_EMPTY_PATH):
        raise SyscallError(errno.EINVAL)
    old = fs._path(k, old_addr)
    inode: Inode
    if old == "" and flags & abi.AT_EMPTY_PATH:
        file = k.files.file(fs._signed32(olddirfd))
        if not isinstance(file, OverlayFile):
            raise SyscallError(errno.ENOENT if isinstance(file, HostFile) else errno.EXDEV)
        inode = file.inode
    else:
        src = _existing(k, olddirfd, old, follow=bool(flags & abi.AT_SYMLINK_FOLLOW))
        if stat.S_ISDIR(k.vfs.lstat(src).mode):
            raise SyscallError(errno.EPERM)
        inode = ov.copy_up(src)
    guest = _new_name(k, newdirfd, fs._path(k, new_addr))[1]
    inode.nlink += 1
    inode.ctime_ns = ov.now_ns()
    ov.put(guest, inode)
    return 0


def sys_link(k: Kernel, old_addr: int, new_addr: int, *_: int) -> int:
    return sys_linkat(k, _CWD, old_addr, _CWD, new_addr, 0)


def _unlink_name(k: Kernel, ov: Overlay, guest: str) -> None:
    node = ov.backing(guest)
    if isinstance(node, Inode):
        node.nlink -= 1
        node.ctime_ns = ov.now_ns()
    ov.remove(guest)


def _rmdir(k: Kernel, ov: Overlay, dirfd: int, path: str) -> int:
    if path.rstrip("/").rpartition("/")[2] == ".":
        raise SyscallError(errno.EINVAL)
    guest = _existing(k, dirfd, path)
    if not stat.S_ISDIR(k.vfs.lstat(guest).mode):
        raise SyscallError(errno.ENOTDIR)
    if guest == "/":
        raise SyscallError(errno.EBUSY)
    if not ov.is_empty_dir(guest):
        raise SyscallError(errno.ENOTEMPTY)
    _parent_writable(k, guest)
    ov.remove(guest)
    return 0


def sys_unlinkat(k: Kernel, dirfd: int, path_addr: int, flags: int, *_: int) -> int:
    ov = _overlay(k)
    if ov is None or flags & ~abi.AT_REMOVEDIR:
        return fs.sys_unlinkat(k, dirfd, path_addr, flags)
    path = fs._path(k, path_addr)
    if flags & abi.AT_REMOVEDIR:
        return _rmdir(k, ov, dirfd, path)
    guest = _existing(k, dirfd, path)
    if stat.S_ISDIR(k.vfs.lstat(guest).mode):
        raise SyscallError(errno.EISDIR)
    _parent_writable(k, guest)
    _unlink_name(k, ov, guest)
    return 0


def sys_unlink(k: Kernel, path_addr: int, *_: int) -> int:
    return sys_unlinkat(k, _CWD, path_addr, 0)


def sys_rmdir(k: Kernel, path_addr: int, *_: int) -> int:
    ov = _overlay(k)
    if ov is None:
        return fs.sys_rmdir(k, path_addr)
    return _rmdir(k, ov, _CWD, fs._path(k, path_addr))


def sys_renameat2(k: Kernel, olddirfd: int, old_addr: int, newdirfd: int, new_addr: int, flags: int = 0,
                  *_: int) -> int:
    ov = _overlay(k)
    if ov is None:
        return fs.sys_renameat(k, olddirfd, old_addr)
    if flags & ~(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) or flags & RENAME_WHITEOUT:
        raise SyscallError(errno.EINVAL)
    old, new = fs._path(k, old_addr), fs._path(k, new_addr)
    if old.rstrip("/").rpartition("/")[2] in (".", "..") or new.rstrip("/").rpartition("/")[2] in (".", ".."):
        raise SyscallError(errno.EBUSY)
    src = _existing(k, olddirfd, old)
    src_dir = stat.S_ISDIR(k.vfs.lstat(src).mode)
    parent = fs._parent_must_exist(k, newdirfd, new)
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
    _parent_writable(k, src)
    _parent_writable(k, dst)
    if flags & RENAME_EXCHANGE:
        ov.exchange(src, dst)
        return 0
    if ov.exists(dst):
        _unlink_name(k, ov, dst)
    ov.move(src, dst)
    return 0


def sys_rename(k: Kernel, old_addr: int, new_addr: int, *_: int) -> int:
    return sys_renameat2(k, _CWD, old_addr, _CWD, new_addr, 0)


def sys_renameat(k: Kernel, olddirfd: int, old_addr: int, newdirfd: int, new_addr: int, *_: int) -> int:
    return sys_renameat2(k, olddirfd, old_addr, newdirfd, new_addr, 0)


# ---------------------------------------------------------------- metadata and sizes
def _inode_of_fd(k: Kernel, fd: int) -> Inode | None:
    """The guest's own inode behind a descriptor (a host file is copied up first); None: not a file."""
    return _inode_of_file(k, k.files.file(fs._signed32(fd)))


def _inode_of_file(k: Kernel, file: OpenFile) -> Inode | None:
    ov = _overlay(k)
    if isinstance(file, OverlayFile):
        return file.inode
    if ov is not None and isinstance(file, HostFile | SyntheticDir) and not _kernel_owned(k, file.guest_path):
        return ov.copy_up(file.guest_path)
    return None


def _inode_at(k: Kernel, ov: Overlay, dirfd: int, path: str, follow: bool) -> Inode:
    """The inode a path names, copied up; /proc/self/fd/N reaches the open file itself, as Linux's
    magic links do (``chmod /proc/self/fd/3`` changes what fd 3 is open on)."""
    guest = fs.lookup(k, dirfd, path, follow)
    file = procfs.fd_file(k, guest) if follow else None
    if file is not None:
        inode = _inode_of_file(k, file)
        if inode is None:
            raise SyscallError(errno.EPERM)  # a pipe or stream
        return inode
    if _kernel_owned(k, guest):
        raise SyscallError(errno.EPERM)
    return ov.copy_up(guest)


def _chmod(k: Kernel, inode: Inode, mode: int) -> int:
    if k.ident.uid not in (0, inode.uid):
        raise SyscallError(errno.EPERM)
    inode.mode = stat.S_IFMT(inode.mode) | mode & 0o7777
    inode.ctime_ns = k.clock.wall_ns()
    return 0


def sys_fchmodat(k: Kernel, dirfd: int, path_addr: int, mode: int, *_: int) -> int:
    ov = _overlay(k)
    if ov is None:
        return fs.sys_fchmodat(k, dirfd, path_addr)
    return _chmod(k, _inode_at(k, ov, dirfd, fs._path(k, path_addr), follow=True), mode)


def sys_chmod(k: Kernel, path_addr: int, mode: int, *_: int) -> int:
    return sys_fchmodat(k, _CWD, path_addr, mode)


def sys_fchmod(k: Kernel, fd: int, mode: int, *_: int) -> int:
    inode = _inode_of_fd(k, fd)
    return fs.sys_fchmod(k, fd) if inode is None else _chmod(k, inode, mode)


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
    ov = _overlay(k)
    path = fs._path(k, path_addr)
    if ov is None:
        return fs.sys_fchownat(k, dirfd, path_addr, owner, group, flags)
    if path == "" and flags & abi.AT_EMPTY_PATH:
        return sys_fchown(k, dirfd, owner, group)
    return _chown(k, _inode_at(k, ov, dirfd, path, follow=not flags & abi.AT_SYMLINK_NOFOLLOW), owner, group)


def sys_chown(k: Kernel, path_addr: int, owner: int, group: int, *_: int) -> int:
    return sys_fchownat(k, _CWD, path_addr, owner, group, 0)


def sys_lchown(k: Kernel, path_addr: int, owner: int, group: int, *_: int) -> int:
    return sys_fchownat(k, _CWD, path_addr, owner, group, abi.AT_SYMLINK_NOFOLLOW)


def sys_fchown(k: Kernel, fd: int, owner: int, group: int, *_: int) -> int:
    inode = _inode_of_fd(k, fd)
    return fs.sys_fchown(k, fd) if inode is None else _chown(k, inode, owner, group)


def _resize(k: Kernel, inode: Inode, length: int) -> int:
    if inode.kind is Kind.DIR:
        raise SyscallError(errno.EISDIR)
    if inode.kind is not Kind.REG:
        raise SyscallError(errno.EINVAL)
    OverlayFile(inode, "", True, k.clock.wall_ns).truncate(length)
    return 0


def sys_truncate(k: Kernel, path_addr: int, length: int, *_: int) -> int:
    ov = _overlay(k)
    if ov is None:
        return fs.sys_truncate(k, path_addr, length)
    if fs._signed(length) < 0:
        raise SyscallError(errno.EINVAL)
    inode = _inode_at(k, ov, _CWD, fs._path(k, path_addr), follow=True)
    if inode.kind is Kind.DIR:
        raise SyscallError(errno.EISDIR)
    _require(k, inode.stat(), MAY_WRITE)
    return _resize(k, inode, length)


def sys_ftruncate(k: Kernel, fd: int, length: int, *_: int) -> int:
    entry = k.files.get(fs._signed32(fd))
    if isinstance(entry.file, OverlayFile) and entry.file.writable:
        if fs._signed(length) < 0:
            raise SyscallError(errno.EINVAL)
        return _resize(k, entry.file.inode, length)
    return fs.sys_ftruncate(k, fd, length)


FALLOC_FL_KEEP_SIZE = 1


def sys_fallocate(k: Kernel, fd: int, mode: int, offset: int, length: int, *_: int) -> int:
    """Reserve space: the file grows to offset+length unless FALLOC_FL_KEEP_SIZE (nothing is reserved
    in memory); punching and collapsing holes are EOPNOTSUPP, as on a file system without them."""
    entry = k.files.get(fs._signed32(fd))
    offset, length = fs._signed(offset), fs._signed(length)
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
    ov = _overlay(k)
    if ov is None:
        return fs.sys_utimensat(k, dirfd, path_addr, times, flags)
    atime, mtime = _times(k, times)
    if path_addr == 0:
        inode = _inode_of_fd(k, dirfd)
        if inode is None:
            return 0
    else:
        inode = _inode_at(k, ov, dirfd, fs._path(k, path_addr), follow=not flags & abi.AT_SYMLINK_NOFOLLOW)
    if atime is not None:
        inode.atime_ns = atime
    if mtime is not None:
        inode.mtime_ns = mtime
    inode.ctime_ns = k.clock.wall_ns()
    return 0


def sys_setxattr(k: Kernel, path_addr: int, *_: int) -> int:
    """The in-memory layer keeps no extended attributes (EOPNOTSUPP, as a file system without them)."""
    if _overlay(k) is None:
        return fs.sys_setxattr(k, path_addr)
    _existing(k, _CWD, fs._path(k, path_addr), follow=True)
    raise SyscallError(errno.EOPNOTSUPP)


def sys_lsetxattr(k: Kernel, path_addr: int, *_: int) -> int:
    if _overlay(k) is None:
        return fs.sys_lsetxattr(k, path_addr)
    _existing(k, _CWD, fs._path(k, path_addr))
    raise SyscallError(errno.EOPNOTSUPP)


def sys_fsetxattr(k: Kernel, fd: int, *_: int) -> int:
    if _overlay(k) is None:
        return fs.sys_fsetxattr(k, fd)
    k.files.file(fs._signed32(fd))
    raise SyscallError(errno.EOPNOTSUPP)


# ---------------------------------------------------------------- shared mappings of the guest's files
def mapped(k: Kernel, file: OpenFile, start: int, offset: int, length: int, shared: bool) -> None:
    """mmap of an overlay file: a shared mapping writes back to it (and sees its writes)."""
    if shared and isinstance(file, OverlayFile):
        file.mapped_in(k.mem, start, offset, length)
        ov = _overlay(k)
        if ov is not None:
            ov.mapped.add(file.inode)


def fork_maps(parent: Kernel, child: Kernel) -> None:
    """fork: the child's copies of the parent's shared file mappings write back to their files too."""
    ov = _overlay(parent)
    for inode in list(ov.mapped) if ov is not None else []:
        inode.maps += [SharedMap(child.mem, m.start, m.offset, m.length) for m in inode.maps if m.mem is parent.mem]


def write_back(k: Kernel, addr: int, length: int) -> None:
    """The guest's stores through shared mappings of [addr, addr+length) reach their files
    (before munmap, and on msync)."""
    ov = _overlay(k)
    if ov is None or not ov.mapped:
        return
    for inode in list(ov.mapped):
        inode.release_maps(k.mem, addr, addr + length)


def sys_msync(k: Kernel, addr: int, length: int, flags: int, *_: int) -> int:
    if addr % PAGE_SIZE or flags & ~(MS_ASYNC | MS_INVALIDATE | MS_SYNC) or (
            flags & MS_ASYNC and flags & MS_SYNC):
        raise SyscallError(errno.EINVAL)
    length = abi.page_up(length)
    covered = sum(min(v.end, addr + length) - max(v.start, addr) for v in k.mem.overlapping(addr, addr + length))
    if covered < length:
        raise SyscallError(errno.ENOMEM)
    write_back(k, addr, length)
    return 0
