"""read, write, pread64, pwrite64, readv, writev, lseek (fs/read_write.c).

Kernel objects that can make a reader or writer sleep (pipes, sockets, event descriptors) implement
``k_read``/``k_write`` (blocking.py says how a syscall sleeps); files are read and written here."""

from __future__ import annotations

import errno
import os
import struct
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32, signed64
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import OpenFile

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel


MAX_IO = 0x7FFFF000  # Linux caps one read/write at this


def readable(k: Kernel, fd: int) -> OpenFile:
    entry = k.files.get(signed32(fd))
    if entry.flags & abi.O_PATH or (entry.flags & abi.O_ACCMODE) == abi.O_WRONLY:
        raise SyscallError(errno.EBADF)
    return entry.file


def writable(k: Kernel, fd: int) -> OpenFile:
    entry = k.files.get(signed32(fd))
    if entry.flags & abi.O_PATH or (entry.flags & abi.O_ACCMODE) == abi.O_RDONLY:
        raise SyscallError(errno.EBADF)
    return entry.file


def sys_read(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    entry = k.files.get(signed32(fd))
    reader = getattr(entry.file, "k_read", None)
    if reader is None:
        return _read_file(k, fd, buf, count)
    readable(k, fd)
    count = min(count, MAX_IO)
    k.mem.check_user(buf, count, abi.Prot.WRITE)
    data: bytes = reader(k, entry, count)
    k.mem.write_user(buf, data)
    return len(data)


def _read_file(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    file = readable(k, fd)
    k.mem.check_user(buf, min(count, MAX_IO), abi.Prot.WRITE)
    data = file.read(min(count, MAX_IO))
    k.mem.write_user(buf, data)
    return len(data)


def sys_pread64(k: Kernel, fd: int, buf: int, count: int, offset: int, *_: int) -> int:
    if signed64(offset) < 0:
        raise SyscallError(errno.EINVAL)
    file = readable(k, fd)
    k.mem.check_user(buf, min(count, MAX_IO), abi.Prot.WRITE)
    data = file.pread(min(count, MAX_IO), offset)
    k.mem.write_user(buf, data)
    return len(data)


def sys_write(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    entry = k.files.get(signed32(fd))
    writer = getattr(entry.file, "k_write", None)
    if writer is None:
        return _write_file(k, fd, buf, count)
    writable(k, fd)
    return int(writer(k, entry, k.mem.read_user(buf, min(count, MAX_IO))))


def _write_file(k: Kernel, fd: int, buf: int, count: int, *_: int) -> int:
    file = _appending(k, fd)
    data = k.mem.read_user(buf, min(count, MAX_IO))
    return file.write(data)


def _appending(k: Kernel, fd: int) -> OpenFile:
    """The writable file behind fd; with O_APPEND, every write starts at the end (as Linux does)."""
    entry = k.files.get(signed32(fd))
    file = writable(k, fd)
    if entry.flags & abi.O_APPEND and file.seekable_end:
        file.seek(0, os.SEEK_END)
    return file


def sys_pwrite64(k: Kernel, fd: int, buf: int, count: int, offset: int, *_: int) -> int:
    if signed64(offset) < 0:
        raise SyscallError(errno.EINVAL)
    file = writable(k, fd)
    data = k.mem.read_user(buf, min(count, MAX_IO))
    return file.pwrite(data, offset)


def iovecs(k: Kernel, iov: int, iovcnt: int) -> list[tuple[int, int]]:
    if signed32(iovcnt) < 0 or iovcnt > 1024:
        raise SyscallError(errno.EINVAL)
    raw = k.mem.read_user(iov, 16 * iovcnt)
    return [struct.unpack_from("<QQ", raw, 16 * i) for i in range(iovcnt)]


def sys_writev(k: Kernel, fd: int, iov: int, iovcnt: int, *_: int) -> int:
    entry = k.files.get(signed32(fd))
    writer = getattr(entry.file, "k_write", None)
    if writer is None:
        return _writev_file(k, fd, iov, iovcnt)
    writable(k, fd)
    data = b"".join(k.mem.read_user(base, length) for base, length in iovecs(k, iov, iovcnt))
    return int(writer(k, entry, data))


def _writev_file(k: Kernel, fd: int, iov: int, iovcnt: int, *_: int) -> int:
    file = _appending(k, fd)
    data = b"".join(k.mem.read_user(base, length) for base, length in iovecs(k, iov, iovcnt))
    return file.write(data) if data else 0


def sys_readv(k: Kernel, fd: int, iov: int, iovcnt: int, *_: int) -> int:
    file = readable(k, fd)
    total = 0
    for base, length in iovecs(k, iov, iovcnt):
        data = file.read(length)
        k.mem.write_user(base, data)
        total += len(data)
        if len(data) < length:
            break
    return total


def sys_lseek(k: Kernel, fd: int, offset: int, whence: int, *_: int) -> int:
    if whence > 4:
        raise SyscallError(errno.EINVAL)
    return k.files.file(signed32(fd)).seek(signed64(offset), whence)
