"""Pipes as Linux has them (fs/pipe.c): a bounded buffer whose full state blocks the writer and
whose empty state blocks the reader, EPIPE and SIGPIPE once no reader is left, F_SETPIPE_SZ.

Blocking here means "let someone else run": a syscall that must wait raises WouldBlock and the
machine restarts it once another thread or process has run (fork.py). With nobody else able to
run it would wait forever, as on Linux; the run then ends as blocked. With O_NONBLOCK it is EAGAIN.

One difference from Linux: a blocking write of more than PIPE_BUF bytes into a pipe with some
room returns a short count (what fitted) instead of sleeping in the middle of the copy; every
writer that loops on short writes (stdio, coreutils' full_write, Python) sees the same bytes.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, NoReturn

from emu import abi
from emu.abi import Signal
from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import GuestBlocked, WouldBlock
from emu.kernel.fs import MAX_IO, FdEntry, _signed32, _writable
from emu.kernel.fs import sys_fcntl as fs_sys_fcntl
from emu.kernel.fs import sys_read as fs_sys_read
from emu.kernel.fs import sys_write as fs_sys_write
from emu.kernel.vfs import Pipe, PipeEnd

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

PAGE = 4096
PIPE_BUF = 4096  # writes up to this size are atomic (all or nothing)
PIPE_DEF_SIZE = 16 * PAGE  # 64 KiB: the default capacity (PIPE_DEF_BUFFERS pages)
PIPE_MAX_SIZE = 1 << 20  # /proc/sys/fs/pipe-max-size: beyond it only CAP_SYS_RESOURCE may go
F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032


def room(pipe: Pipe) -> int:
    return max(0, pipe.capacity - len(pipe.buffer))


def others_can_run(k: Kernel) -> bool:
    """Can another thread of this process or another process change what this one waits for?"""
    return k.sched.threaded or k.family is not None and k.family.has_others(k.ident.pid)


def wait(k: Kernel, entry: FdEntry | None, what: str, on: tuple[object, ...] = ()) -> NoReturn:
    """The syscall must sleep: EAGAIN on a non-blocking descriptor, else wait for the others to run
    (until one of them changes one of ``on``)."""
    if entry is not None and entry.flags & abi.O_NONBLOCK:
        raise SyscallError(errno.EAGAIN)
    if others_can_run(k):
        raise WouldBlock(what, on)
    raise GuestBlocked(f"{what}, and nothing else can run")


def notify(k: Kernel, changed: object) -> None:
    """``changed`` (a pipe, a socket) changed: whoever waits on it runs soon (wake_up_interruptible)."""
    if k.family is not None and k.family.notify(k.ident.pid, changed):
        k.sched.request_switch()


def broken_pipe(k: Kernel) -> NoReturn:
    """A write with no reader left: SIGPIPE to the writer (fatal by default), and EPIPE if it survives."""
    from emu.kernel.signal import send_to_self

    send_to_self(k, Signal.SIGPIPE)
    raise SyscallError(errno.EPIPE)


def pipe_write(k: Kernel, entry: FdEntry, end: PipeEnd, data: bytes) -> int:
    pipe = end.pipe
    if not pipe.readers:
        broken_pipe(k)
    if not data:
        return 0
    free = room(pipe)
    if free == 0 or len(data) <= PIPE_BUF and free < len(data):
        wait(k, entry, f"write to a full pipe ({end.guest_path})", (pipe,))
    taken = data[:free]
    pipe.buffer += taken
    notify(k, pipe)
    return len(taken)


def _pipe_entry(k: Kernel, fd: int, writable: bool) -> tuple[FdEntry, PipeEnd] | None:
    entry = k.files.entries.get(_signed32(fd))
    if entry is None or not isinstance(entry.file, PipeEnd) or entry.file.writable != writable:
        return None
    return entry, entry.file


def sys_read(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    """read(2); an empty pipe with a writer left sleeps (or is EAGAIN)."""
    found = _pipe_entry(k, fd, writable=False)
    if found is None or not count:
        return fs_sys_read(k, fd, buf, count)
    entry, end = found
    if not end.pipe.buffer and end.pipe.writers:
        wait(k, entry, f"read from an empty pipe (fd {_signed32(fd)})", (end.pipe,))
    got = fs_sys_read(k, fd, buf, count)
    if got:
        notify(k, end.pipe)
    return got


def sys_close(k: Kernel, fd: int, *_: int) -> int:
    """close(2); the last close of a pipe end wakes the other side (EOF, or EPIPE for a writer)."""
    entry = k.files.entries.get(_signed32(fd))
    k.files.close(_signed32(fd))
    if entry is not None and isinstance(entry.file, PipeEnd):
        notify(k, entry.file.pipe)
    return 0


def sys_write(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    found = _pipe_entry(k, fd, writable=True)
    if found is None:
        return fs_sys_write(k, fd, buf, count)
    _writable(k, fd)
    entry, end = found
    return pipe_write(k, entry, end, k.mem.read_user(buf, min(count, MAX_IO)))


def sys_writev(k: Kernel, fd: int, iov: int, iovcnt: int, *_: int) -> int:
    from emu.kernel.fs import _iovecs
    from emu.kernel.fs import sys_writev as fs_sys_writev

    found = _pipe_entry(k, fd, writable=True)
    if found is None:
        return fs_sys_writev(k, fd, iov, iovcnt)
    entry, end = found
    data = b"".join(k.mem.read_user(base, length) for base, length in _iovecs(k, iov, iovcnt))
    return pipe_write(k, entry, end, data)


def _round_size(size: int) -> int:
    """round_pipe_size: whole pages, a power of two of them, at least one."""
    pages = max(1, -(-size // PAGE))
    return PAGE << (pages - 1).bit_length()


def sys_fcntl(k: Kernel, fd: int, cmd: int, arg: int, *_: int) -> int:
    cmd &= 0xFFFFFFFF
    if cmd not in (F_SETPIPE_SZ, F_GETPIPE_SZ):
        return fs_sys_fcntl(k, fd, cmd, arg)
    file = k.files.get(_signed32(fd)).file
    if not isinstance(file, PipeEnd):
        raise SyscallError(errno.EBADF)
    pipe = file.pipe
    if cmd == F_GETPIPE_SZ:
        return pipe.capacity
    arg &= 0xFFFFFFFF
    if arg > 1 << 31:
        raise SyscallError(errno.EINVAL)
    size = _round_size(arg)
    if size > PIPE_MAX_SIZE and k.ident.uid != 0:
        raise SyscallError(errno.EPERM)
    if size < len(pipe.buffer):
        raise SyscallError(errno.EBUSY)
    pipe.capacity = size
    return size
