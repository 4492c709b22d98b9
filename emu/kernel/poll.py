"""poll, ppoll, select, pselect6: readiness of every kind of descriptor, and waiting for it.

Readiness is what each file's f_op->poll would say now (poll_mask). With nothing ready the call
waits as Linux's does: the machine runs the other threads and processes and restarts it; a timeout
is virtual time, kept across restarts on the task (restart_block), and reached when nothing else
can make progress. Nothing ready, no timeout and nobody else able to run is a deadlock.
"""

from __future__ import annotations

import errno
import struct
from typing import TYPE_CHECKING

from emu.abi import signed32
from emu.kernel.blocking import others_can_run
from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import GuestBlocked, WouldBlock
from emu.kernel.files import OpenFile, Stream
from emu.kernel.pipe import PIPE_BUF, PipeEnd, room

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

POLLIN, POLLOUT, POLLERR, POLLHUP, POLLNVAL, POLLRDNORM, POLLWRNORM = 0x1, 0x4, 0x8, 0x10, 0x20, 0x40, 0x100
DEFAULT_POLLMASK = POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM
POLLFD = struct.Struct("<ihh")
POLLPRI = 0x2
FD_SETSIZE = 1024
READ_SET = POLLIN | POLLRDNORM | POLLHUP | POLLERR  # POLLIN_SET of fs/select.c
WRITE_SET = POLLOUT | POLLWRNORM | POLLERR
EXCEPT_SET = POLLPRI


def _file_poll_mask(file: OpenFile) -> int:
    """What Linux's f_op->poll would say right now (regular files, devices and procfs are always ready)."""
    if isinstance(file, PipeEnd):
        if file.writable:
            return POLLOUT | POLLWRNORM | (POLLERR if not file.pipe.readers else 0)
        ready = POLLIN | POLLRDNORM if file.pipe.buffer else 0
        return ready | (POLLHUP if not file.pipe.writers else 0)
    if isinstance(file, Stream):
        # Captured input is all there (data or EOF); a terminal's read blocks like read() does.
        return (POLLIN | POLLRDNORM if file.reader else 0) | (POLLOUT | POLLWRNORM if file.writer else 0)
    return DEFAULT_POLLMASK


def poll_mask(file: OpenFile) -> int:
    """What f_op->poll reports now. Kernel objects of their own (sockets, eventfd, epoll) answer themselves."""
    own = getattr(file, "poll_mask", None)
    if own is not None:
        return int(own())
    if isinstance(file, PipeEnd) and file.writable:  # pipe_poll: writable while a buffer's worth is free
        writable = POLLOUT | POLLWRNORM if room(file.pipe) >= PIPE_BUF else 0
        return writable | (POLLERR if not file.pipe.readers else 0)
    return _file_poll_mask(file)


def wait_object(file: OpenFile) -> object:
    """What a change of ``file``'s readiness is announced on (pipe.notify)."""
    if isinstance(file, PipeEnd):
        return file.pipe
    return getattr(file, "wait_key", file)


def timer_deadline(file: OpenFile) -> int | None:
    """A timer descriptor becomes readable by itself at this virtual time."""
    deadline = getattr(file, "deadline", None)
    return deadline() if callable(deadline) else None


def finish(k: Kernel, ready: int, timeout_ns: int | None, files: list[OpenFile], what: str) -> int:
    """Return ``ready`` if something is; otherwise wait (WouldBlock) or time out (0)."""
    task = k.task
    if ready:
        task.wake_at = None
        return ready
    if timeout_ns == 0:
        return 0
    now = k.clock.elapsed
    if task.wake_at is None and timeout_ns is not None:
        task.wake_at = now + timeout_ns
    if task.wake_at is not None and now >= task.wake_at:
        task.wake_at = None
        return 0
    times = [t for t in [task.wake_at, *(timer_deadline(f) for f in files)] if t is not None]
    until = min(times) if times else None
    if not others_can_run(k) and not k.timers:
        if until is None:
            raise GuestBlocked(f"{what} with no timeout on descriptors that can never become ready")
        k.clock.advance(until - now)  # nobody else can make anything ready: time passes at once
        if until == task.wake_at:
            task.wake_at = None
            return 0
    raise WouldBlock(what, tuple(wait_object(f) for f in files), until)  # a timer fires: restart


def _poll(k: Kernel, fds_addr: int, nfds: int, timeout_ns: int | None) -> int:
    if nfds > k.rlimits[7][0]:  # RLIMIT_NOFILE
        raise SyscallError(errno.EINVAL)
    raw = bytearray(k.mem.read_user(fds_addr, POLLFD.size * nfds)) if nfds else bytearray()
    ready = 0
    files: list[OpenFile] = []
    for i in range(nfds):
        fd, events, _ = POLLFD.unpack_from(raw, POLLFD.size * i)
        revents = 0
        if fd >= 0:
            entry = k.files.entries.get(fd)
            if entry is None:
                revents = POLLNVAL
            else:
                files.append(entry.file)
                revents = poll_mask(entry.file) & ((events & 0xFFFF) | POLLERR | POLLHUP)
        POLLFD.pack_into(raw, POLLFD.size * i, fd, events, revents - 0x10000 if revents & 0x8000 else revents)
        ready += bool(revents)
    if nfds:
        k.mem.write_user(fds_addr, bytes(raw))
    return finish(k, ready, timeout_ns, files, "poll")


def sys_poll(k: Kernel, fds_addr: int, nfds: int, timeout_ms: int, *_: int) -> int:
    timeout = signed32(timeout_ms)
    return _poll(k, fds_addr, nfds & 0xFFFFFFFF, None if timeout < 0 else timeout * 10**6)


def read_timeout(k: Kernel, addr: int) -> int | None:
    """A timeout given as a struct timespec pointer, in ns; NULL waits forever (None)."""
    if not addr:
        return None
    sec, nsec = struct.unpack("<qq", k.mem.read_user(addr, 16))
    if sec < 0 or not 0 <= nsec < 10**9:
        raise SyscallError(errno.EINVAL)
    ns: int = sec * 10**9 + nsec
    return ns


def sys_ppoll(k: Kernel, fds_addr: int, nfds: int, tmo_addr: int, sigmask: int, sigsetsize: int, *_: int) -> int:
    if sigmask and sigsetsize != 8:
        raise SyscallError(errno.EINVAL)
    return _poll(k, fds_addr, nfds & 0xFFFFFFFF, read_timeout(k, tmo_addr))


def _select(k: Kernel, nfds: int, sets: tuple[int, int, int], timeout_ns: int | None) -> int:
    nfds = signed32(nfds)
    if nfds < 0:
        raise SyscallError(errno.EINVAL)
    nfds = min(nfds, FD_SETSIZE)
    size = (nfds + 63) // 64 * 8
    wanted = [int.from_bytes(k.mem.read_user(addr, size), "little") if addr and size else 0 for addr in sets]
    got = [0, 0, 0]
    files: list[OpenFile] = []
    for fd in range(nfds):
        bit = 1 << fd
        if not (wanted[0] | wanted[1] | wanted[2]) & bit:
            continue
        entry = k.files.entries.get(fd)
        if entry is None:
            raise SyscallError(errno.EBADF)
        files.append(entry.file)
        mask = poll_mask(entry.file)
        for i, kind in enumerate((READ_SET, WRITE_SET, EXCEPT_SET)):
            if wanted[i] & bit and mask & kind:
                got[i] |= bit
    ready = sum(bin(g).count("1") for g in got)
    if ready or timeout_ns == 0 or k.task.wake_at is not None and k.clock.elapsed >= k.task.wake_at:
        for addr, bits in zip(sets, got, strict=True):
            if addr and size:
                k.mem.write_user(addr, bits.to_bytes(size, "little"))
    return finish(k, ready, timeout_ns, files, "select")


def sys_select(k: Kernel, nfds: int, readfds: int, writefds: int, exceptfds: int, tv: int, *_: int) -> int:
    timeout: int | None = None
    if tv:
        sec, usec = struct.unpack("<qq", k.mem.read_user(tv, 16))
        if sec < 0 or not 0 <= usec < 10**6:
            raise SyscallError(errno.EINVAL)
        timeout = sec * 10**9 + usec * 1000
    return _select(k, nfds, (readfds, writefds, exceptfds), timeout)


def sys_pselect6(k: Kernel, nfds: int, readfds: int, writefds: int, exceptfds: int, ts: int, sig: int,
                 *_: int) -> int:
    return _select(k, nfds, (readfds, writefds, exceptfds), read_timeout(k, ts))
