"""Descriptors: dup, dup2, dup3, close, close_range, fcntl (fs/file.c, fs/fcntl.c), and the
calls that only check one: fsync, fdatasync, fadvise64."""

from __future__ import annotations

import errno
import stat
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32, signed64
from emu.kernel import locks, pipe
from emu.kernel.blocking import notify
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import Stream
from emu.kernel.fs.fdtable import MAX_FDS, FdEntry
from emu.kernel.pipe import PipeEnd

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_DUPFD_CLOEXEC = 0, 1, 2, 3, 4, 1030


FD_CLOEXEC = 1


POSIX_FADV_MAX = 5


CLOSE_RANGE_UNSHARE, CLOSE_RANGE_CLOEXEC = 2, 4


def _dup_to(k: Kernel, old: int, new: int, cloexec: bool) -> int:
    entry = k.files.get(old)
    k.files.put(new, FdEntry(entry.file, entry.flags, cloexec))
    return new


def sys_dup(k: Kernel, fd: int, *_: int) -> int:
    entry = k.files.get(signed32(fd))
    return k.files.install(FdEntry(entry.file, entry.flags, False))


def sys_dup2(k: Kernel, old: int, new: int, *_: int) -> int:
    old, new = signed32(old), signed32(new)
    k.files.get(old)
    return new if old == new else _dup_to(k, old, new, False)


def sys_dup3(k: Kernel, old: int, new: int, flags: int, *_: int) -> int:
    old, new = signed32(old), signed32(new)
    if old == new or flags & ~abi.O_CLOEXEC:
        raise SyscallError(errno.EINVAL)
    return _dup_to(k, old, new, bool(flags & abi.O_CLOEXEC))


def close_fd(k: Kernel, fd: int) -> None:
    """Drop ``fd``: the process's POSIX locks on the file go, and the description's own locks with
    its last descriptor; the last close of a pipe end or socket wakes the other side (EOF, EPIPE, HUP)."""
    entry = k.files.get(fd)
    if k.vfs.locks.ranges or k.vfs.locks.flocks:  # before the close: the file's identity is read from it
        last = not any(e.file is entry.file for other, e in k.files.entries.items() if other != fd)
        locks.closed(k, entry.file, last=last)
    k.files.close(fd)
    keys = getattr(entry.file, "close_key", None)
    for key in keys() if keys is not None else ():
        notify(k, key)


def sys_close(k: Kernel, fd: int, *_: int) -> int:
    close_fd(k, signed32(fd))
    return 0


def sys_close_range(k: Kernel, first: int, last: int, flags: int, *_: int) -> int:
    first, last = first & 0xFFFFFFFF, last & 0xFFFFFFFF
    if flags & ~(CLOSE_RANGE_UNSHARE | CLOSE_RANGE_CLOEXEC) or first > last:
        raise SyscallError(errno.EINVAL)
    for fd in [fd for fd in k.files.entries if first <= fd <= min(last, MAX_FDS)]:
        if flags & CLOSE_RANGE_CLOEXEC:
            k.files.entries[fd].cloexec = True
        else:
            close_fd(k, fd)
    return 0


def sys_fcntl(k: Kernel, fd: int, cmd: int, arg: int, *_: int) -> int:
    cmd &= 0xFFFFFFFF
    if cmd in pipe.PIPE_COMMANDS:
        return pipe.pipe_fcntl(k, fd, cmd, arg)  # F_SETPIPE_SZ, F_GETPIPE_SZ
    entry = k.files.get(signed32(fd))
    if cmd in (F_DUPFD, F_DUPFD_CLOEXEC):
        return k.files.install(FdEntry(entry.file, entry.flags, cmd == F_DUPFD_CLOEXEC), signed32(arg))
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
    if cmd in locks.LOCK_COMMANDS:
        return locks.fcntl_lock(k, signed32(fd), cmd, arg)
    raise SyscallError(errno.EINVAL)


def sys_fsync(k: Kernel, fd: int, *_: int) -> int:
    """Nothing is ever dirty; pipes and streams cannot be synced (EINVAL), as on Linux."""
    file = k.files.file(signed32(fd))
    if isinstance(file, PipeEnd | Stream):
        raise SyscallError(errno.EINVAL)
    return 0


def sys_fadvise64(k: Kernel, fd: int, offset: int, length: int, advice: int, *_: int) -> int:
    """Advice only: checked like Linux (ESPIPE for pipes, EINVAL for unknown advice), then ignored."""
    file = k.files.file(signed32(fd))
    if stat.S_ISFIFO(file.stat().mode):
        raise SyscallError(errno.ESPIPE)
    if not 0 <= advice <= POSIX_FADV_MAX or signed64(length) < 0:
        raise SyscallError(errno.EINVAL)
    return 0
