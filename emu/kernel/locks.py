"""Advisory file locks: flock(2), and fcntl's POSIX record locks and open-file-description locks.

One table for the whole run (the processes share it as they share the file system). POSIX locks
belong to a process, OFD locks and flock locks to an open file description. A lock that would
have to wait for another process's blocks the caller (the scheduler runs the others first, as
with a pipe), which ends the run as a deadlock only when nothing else can release it.
"""

from __future__ import annotations

import errno
import os
import struct
from typing import TYPE_CHECKING

from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import WouldBlock
from emu.kernel.state import FileKey, RangeLock

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel
    from emu.kernel.files import OpenFile

F_GETLK, F_SETLK, F_SETLKW = 5, 6, 7
F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW = 36, 37, 38
LOCK_COMMANDS = frozenset({F_GETLK, F_SETLK, F_SETLKW, F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW})
F_RDLCK, F_WRLCK, F_UNLCK = 0, 1, 2
LOCK_SH, LOCK_EX, LOCK_NB, LOCK_UN = 1, 2, 4, 8
OFFSET_MAX = (1 << 63) - 1
FLOCK = struct.Struct("<hh4xqqi4x")  # struct flock on x86-64

def _key(file: OpenFile) -> FileKey:
    info = file.stat()
    return info.dev, info.ino


def _range(file: OpenFile, whence: int, start: int, length: int) -> tuple[int, int]:
    base = {os.SEEK_SET: 0, os.SEEK_CUR: None, os.SEEK_END: None}
    if whence not in base:
        raise SyscallError(errno.EINVAL)
    if whence == os.SEEK_CUR:
        start += file.seek(0, os.SEEK_CUR)
    elif whence == os.SEEK_END:
        start += file.stat().size
    if length < 0:
        start, length = start + length, -length
    if start < 0:
        raise SyscallError(errno.EINVAL)
    return start, OFFSET_MAX if length == 0 else start + length


def fcntl_lock(k: Kernel, fd: int, cmd: int, arg: int) -> int:
    """F_GETLK/F_SETLK/F_SETLKW and their OFD twins."""
    entry = k.files.get(fd)
    file = entry.file
    ltype, whence, start, length, pid = FLOCK.unpack(k.mem.read_user(arg, FLOCK.size))
    if ltype not in (F_RDLCK, F_WRLCK, F_UNLCK):
        raise SyscallError(errno.EINVAL)
    ofd = cmd in (F_OFD_GETLK, F_OFD_SETLK, F_OFD_SETLKW)
    if ofd and pid != 0:
        raise SyscallError(errno.EINVAL)
    lo, hi = _range(file, whence, start, length)
    owner = id(file) if ofd else k.ident.pid
    table = k.vfs.locks
    key = _key(file)
    if cmd in (F_GETLK, F_OFD_GETLK):
        if ltype == F_UNLCK:
            raise SyscallError(errno.EINVAL)
        held = table.conflict(key, owner, ltype == F_WRLCK, lo, hi)
        if held is None:
            out = FLOCK.pack(F_UNLCK, whence, start, length, pid)
        else:
            out = FLOCK.pack(F_WRLCK if held.write else F_RDLCK, os.SEEK_SET, held.start,
                             0 if held.end == OFFSET_MAX else held.end - held.start, held.pid)
        k.mem.write_user(arg, out)
        return 0
    access = entry.flags & 3
    if (ltype == F_RDLCK and access == 1) or (ltype == F_WRLCK and access == 0):
        raise SyscallError(errno.EBADF)  # a read lock needs a readable fd, a write lock a writable one
    if ltype != F_UNLCK and table.conflict(key, owner, ltype == F_WRLCK, lo, hi) is not None:
        if cmd in (F_SETLK, F_OFD_SETLK):
            raise SyscallError(errno.EAGAIN)
        raise WouldBlock(f"fcntl lock on fd {fd} held by another process")
    table.set(key, RangeLock(owner, ltype == F_WRLCK, lo, hi, -1 if ofd else k.ident.pid), ltype == F_UNLCK)
    return 0


def sys_flock(k: Kernel, fd: int, operation: int, *_: int) -> int:
    entry = k.files.get(fd & 0xFFFFFFFF if fd < 1 << 31 else fd - (1 << 32))
    op = operation & ~LOCK_NB
    if op not in (LOCK_SH, LOCK_EX, LOCK_UN):
        raise SyscallError(errno.EINVAL)
    key = _key(entry.file)
    holders = k.vfs.locks.flocks.setdefault(key, {})
    me = id(entry.file)
    if op == LOCK_UN:
        holders.pop(me, None)
        return 0
    exclusive = op == LOCK_EX
    if any(other != me and (excl or exclusive) for other, excl in holders.items()):
        if operation & LOCK_NB:
            raise SyscallError(errno.EWOULDBLOCK)
        raise WouldBlock(f"flock on fd {fd} held by another open file")
    holders[me] = exclusive
    return 0


def closed(k: Kernel, file: OpenFile, last: bool) -> None:
    """close(2) drops the process's POSIX locks on the file; the last close of a description its own."""
    try:
        key = _key(file)
    except SyscallError:
        return
    table = k.vfs.locks
    if key in table.ranges:
        table.ranges[key] = [lock for lock in table.ranges[key]
                             if lock.owner != k.ident.pid and not (last and lock.owner == id(file))]
    if last:
        table.flocks.get(key, {}).pop(id(file), None)
