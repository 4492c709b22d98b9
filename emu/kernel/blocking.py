"""Syscalls that may sleep, for every kind of descriptor: read, write, writev, close, close_range.

Sleeping means "let someone else run": a syscall that must wait raises WouldBlock and the machine
restarts it once another thread or process has run (fork.py); with nobody else able to run it
would wait forever, as on Linux, and the run ends as blocked; with O_NONBLOCK it is EAGAIN.
Kernel objects that can make a reader or writer wait (pipe.py, net.py, the event descriptors in
events.py) implement ``k_read``/``k_write``; what they change they announce with notify(), so a
waiter on it runs soon.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, NoReturn, Protocol

from emu import abi
from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import GuestBlocked, WouldBlock
from emu.kernel.fs import MAX_FDS, MAX_IO, FdEntry, _iovecs, _readable, _signed32, _writable
from emu.kernel.fs import sys_read as fs_sys_read
from emu.kernel.fs import sys_write as fs_sys_write
from emu.kernel.fs import sys_writev as fs_sys_writev

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

CLOSE_RANGE_UNSHARE, CLOSE_RANGE_CLOEXEC = 2, 4


class Waitable(Protocol):
    def k_read(self, k: Kernel, entry: FdEntry, size: int) -> bytes: ...
    def k_write(self, k: Kernel, entry: FdEntry, data: bytes) -> int: ...


def others_can_run(k: Kernel) -> bool:
    """Can another thread of this process or another process change what this one waits for?"""
    return k.sched.threaded or k.family is not None and k.family.has_others(k.ident.pid)


def wait(k: Kernel, entry: FdEntry | None, what: str, on: tuple[object, ...] = (),
         until: int | None = None) -> NoReturn:
    """The syscall must sleep: EAGAIN on a non-blocking descriptor, else wait for the others to run
    (until one of them changes one of ``on``, or the virtual clock reaches ``until``)."""
    if entry is not None and entry.flags & abi.O_NONBLOCK:
        raise SyscallError(errno.EAGAIN)
    if until is None and not k.timers and not others_can_run(k):
        raise GuestBlocked(f"{what}, and nothing else can run")
    raise WouldBlock(what, on, until)


def notify(k: Kernel, changed: object) -> None:
    """``changed`` (a pipe, a socket) changed: whoever waits on it runs soon (wake_up_interruptible)."""
    if k.family is not None and k.family.notify(k.ident.pid, changed):
        k.sched.request_switch()


def sys_read(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    entry = k.files.get(_signed32(fd))
    reader = getattr(entry.file, "k_read", None)
    if reader is None:
        return fs_sys_read(k, fd, buf, count)
    _readable(k, fd)
    count = min(count, MAX_IO)
    k.mem.check_user(buf, count, abi.Prot.WRITE)
    data: bytes = reader(k, entry, count)
    k.mem.write_user(buf, data)
    return len(data)


def sys_write(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    entry = k.files.get(_signed32(fd))
    writer = getattr(entry.file, "k_write", None)
    if writer is None:
        return fs_sys_write(k, fd, buf, count)
    _writable(k, fd)
    return int(writer(k, entry, k.mem.read_user(buf, min(count, MAX_IO))))


def sys_writev(k: Kernel, fd: int, iov: int, iovcnt: int, *_: int) -> int:
    entry = k.files.get(_signed32(fd))
    writer = getattr(entry.file, "k_write", None)
    if writer is None:
        return fs_sys_writev(k, fd, iov, iovcnt)
    _writable(k, fd)
    data = b"".join(k.mem.read_user(base, length) for base, length in _iovecs(k, iov, iovcnt))
    return int(writer(k, entry, data))


def close_fd(k: Kernel, fd: int) -> None:
    """Drop ``fd``; the last close of a pipe end or socket wakes the other side (EOF, EPIPE, HUP)."""
    entry = k.files.get(fd)
    k.files.close(fd)
    keys = getattr(entry.file, "close_key", None)
    for key in keys() if keys is not None else ():
        notify(k, key)


def sys_close(k: Kernel, fd: int, *_: int) -> int:
    close_fd(k, _signed32(fd))
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
