"""Pipes as Linux has them (fs/pipe.c): a bounded buffer whose full state blocks the writer and
whose empty state blocks the reader, EPIPE and SIGPIPE once no reader is left, F_SETPIPE_SZ.
How a syscall sleeps and who gets woken: blocking.py.

One difference from Linux: a blocking write of more than PIPE_BUF bytes into a pipe with some
room returns a short count (what fitted) instead of sleeping in the middle of the copy; every
writer that loops on short writes (stdio, coreutils' full_write, Python) sees the same bytes.
"""

from __future__ import annotations

import errno
import struct
from typing import TYPE_CHECKING, NoReturn

from emu import abi
from emu.abi import Signal, signed32
from emu.kernel.blocking import notify, wait
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import S_IFIFO, OpenFile, StatInfo, synthetic_stat
from emu.kernel.fs.fdtable import FdEntry
from emu.kernel.signal import send_to_self

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

PAGE = 4096
PIPE_BUF = 4096  # writes up to this size are atomic (all or nothing)
PIPE_DEF_SIZE = 16 * PAGE  # 64 KiB: the default capacity (PIPE_DEF_BUFFERS pages)
PIPE_MAX_SIZE = 1 << 20  # /proc/sys/fs/pipe-max-size: beyond it only CAP_SYS_RESOURCE may go
F_SETPIPE_SZ, F_GETPIPE_SZ = 1031, 1032
PIPE_COMMANDS = (F_SETPIPE_SZ, F_GETPIPE_SZ)


class Pipe:
    """Both ends share one buffer of ``capacity`` bytes (KernelPipeEnd below blocks, wakes and resizes)."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.readers = 1
        self.writers = 1
        self.capacity = 16 * 4096  # PIPE_DEF_BUFFERS pages; F_SETPIPE_SZ changes it


class PipeEnd(OpenFile):
    def __init__(self, pipe: Pipe, writable: bool, ino: int) -> None:
        self.pipe = pipe
        self.writable = writable
        self.readable = not writable  # (a FIFO opened O_RDWR is both: fifo.py)
        self.guest_path = f"pipe:[{ino}]"
        self.ino = ino

    def read(self, size: int) -> bytes:
        if not self.readable:
            raise SyscallError(errno.EBADF)
        if not self.pipe.buffer and self.pipe.writers:
            raise SyscallError(errno.EAGAIN)  # would block forever: nothing else runs
        chunk = bytes(self.pipe.buffer[:size])
        del self.pipe.buffer[:size]
        return chunk

    def write(self, data: bytes) -> int:
        if not self.writable:
            raise SyscallError(errno.EBADF)
        if not self.pipe.readers:
            raise SyscallError(errno.EPIPE)
        self.pipe.buffer += data
        return len(data)

    def stat(self) -> StatInfo:
        return synthetic_stat(S_IFIFO | 0o600, ino=self.ino)

    def close(self) -> None:
        if self.writable:
            self.pipe.writers -= 1
        else:
            self.pipe.readers -= 1



class KernelPipeEnd(PipeEnd):
    """A pipe end whose reads and writes can sleep (fs/read_write.py calls these; blocking.py sleeps)."""

    def k_read(self, k: Kernel, entry: FdEntry, size: int) -> bytes:
        return pipe_read(k, entry, self, size)

    def k_write(self, k: Kernel, entry: FdEntry, data: bytes) -> int:
        return pipe_write(k, entry, self, data)

    def close_key(self) -> tuple[object, ...]:
        return (self.pipe,)


def sys_pipe2(k: Kernel, fds_addr: int, flags: int = 0, *_: int) -> int:
    if flags & ~(abi.O_CLOEXEC | abi.O_NONBLOCK):
        raise SyscallError(errno.EINVAL)
    pipe = Pipe()
    k.next_inode += 1
    cloexec, nonblock = bool(flags & abi.O_CLOEXEC), flags & abi.O_NONBLOCK
    rfd = k.files.install(FdEntry(KernelPipeEnd(pipe, False, k.next_inode), abi.O_RDONLY | nonblock, cloexec))
    try:
        wfd = k.files.install(FdEntry(KernelPipeEnd(pipe, True, k.next_inode), abi.O_WRONLY | nonblock, cloexec))
    except SyscallError:
        k.files.close(rfd)
        raise
    k.mem.write_user(fds_addr, struct.pack("<ii", rfd, wfd))
    return 0


def sys_pipe(k: Kernel, fds_addr: int, *_: int) -> int:
    return sys_pipe2(k, fds_addr, 0)


def room(pipe: Pipe) -> int:
    return max(0, pipe.capacity - len(pipe.buffer))


def broken_pipe(k: Kernel) -> NoReturn:
    """A write with no reader left: SIGPIPE to the writer (fatal by default), and EPIPE if it survives."""
    send_to_self(k, Signal.SIGPIPE)
    raise SyscallError(errno.EPIPE)


def pipe_read(k: Kernel, entry: FdEntry, end: PipeEnd, size: int) -> bytes:
    """An empty pipe with a writer left sleeps (or is EAGAIN); what is taken frees room for writers."""
    pipe = end.pipe
    if size and not pipe.buffer and pipe.writers:
        wait(k, entry, f"read from an empty pipe ({end.guest_path})", (pipe,))
    data = end.read(size)
    if data:
        notify(k, pipe)
    return data


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


def _round_size(size: int) -> int:
    """round_pipe_size: whole pages, a power of two of them, at least one."""
    pages = max(1, -(-size // PAGE))
    return PAGE << (pages - 1).bit_length()


def pipe_fcntl(k: Kernel, fd: int, cmd: int, arg: int) -> int:
    """fcntl's F_SETPIPE_SZ and F_GETPIPE_SZ (fs/fds.py's sys_fcntl passes them here)."""
    file = k.files.get(signed32(fd)).file
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
