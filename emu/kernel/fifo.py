"""Named pipes as Linux opens them (fs/fifo.c's fifo_open): the processes that open one FIFO of the
guest's file system share one pipe (pipe.py) while any of them holds it open.

An open for reading waits for a writer and an open for writing waits for a reader, unless the other
end is open already, or a partner opened since (a writer that came and went still lets the reader
through: it reads end of file). With O_NONBLOCK a reader does not wait and a writer with no reader
is ENXIO; O_RDWR never waits. The opener that waits is counted on its end while it waits, as Linux
counts it: a partner's open goes through at once and may write before the waiter runs again.

A syscall that waits is restarted (blocking.py): the waiting open is remembered for its thread
(Kernel.open_waits), so that the restarted open takes it up instead of counting itself twice, and
so that one that never completes (EINTR, the process ending: the run loop calls it) uncounts itself.
A FIFO's kernel side belongs to its inode in the guest's file system (overlay.py), kept here.
"""

from __future__ import annotations

import errno
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emu import abi
from emu.kernel.blocking import notify, wait
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import StatInfo
from emu.kernel.pipe import KernelPipeEnd, Pipe

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel
    from emu.kernel.overlay import Inode


@dataclass(eq=False)
class Fifo:
    """One FIFO's kernel side: its pipe while open (None once the last opener closed: the bytes go), and
    how many times each end was opened (a waiting opener lets go once its partner's count moves)."""

    pipe: Pipe | None = None
    opened: dict[str, int] = field(default_factory=lambda: {"r": 0, "w": 0})


_FIFOS: weakref.WeakKeyDictionary[Inode, Fifo] = weakref.WeakKeyDictionary()  # each FIFO inode's, once opened


@dataclass(frozen=True, slots=True)
class WaitingOpen:
    """A thread's open waiting for its partner: the FIFO, its end, and the partner's count then;
    called, it uncounts itself (the open never completes)."""

    k: Kernel
    fifo: Fifo
    end: str
    partner_count: int

    def __call__(self) -> None:
        _uncount(self.k, self)


class FifoEnd(KernelPipeEnd):
    """An open FIFO: its pipe, read, written or both (O_RDWR); fstat tells the FIFO's inode."""

    def __init__(self, fifo: Fifo, pipe: Pipe, readable: bool, writable: bool, guest: str,
                 stat: Callable[[], StatInfo]) -> None:
        super().__init__(pipe, writable, 0)
        self.fifo, self.readable, self.guest_path, self._stat = fifo, readable, guest, stat

    def stat(self) -> StatInfo:
        return self._stat()

    def close(self) -> None:
        pipe = self.pipe
        pipe.readers -= self.readable
        pipe.writers -= self.writable
        if not pipe.readers and not pipe.writers and self.fifo.pipe is pipe:
            self.fifo.pipe = None  # the last opener: free_pipe_info


def open_fifo(k: Kernel, inode: Inode, flags: int, guest: str) -> FifoEnd:
    """fifo_open: the end(s) ``flags`` ask for, once the other end is there (or at once: O_NONBLOCK, O_RDWR)."""
    fifo = _FIFOS.get(inode)
    if fifo is None:
        fifo = _FIFOS[inode] = Fifo()
    stat = inode.stat
    access = flags & abi.O_ACCMODE
    if access == abi.O_RDWR:
        pipe = _pipe(fifo)
        for end in ("r", "w"):
            _count_in(k, fifo, pipe, end)
        return FifoEnd(fifo, pipe, True, True, guest, stat)
    end, partner = ("r", "w") if access == abi.O_RDONLY else ("w", "r")
    waiting = k.open_waits.pop(k.sched.current.tid, None)
    if isinstance(waiting, WaitingOpen) and waiting.fifo is fifo and waiting.end == end and fifo.pipe is not None:
        pipe = fifo.pipe  # (counted while it waited: the pipe stayed)
    else:
        if waiting is not None:
            waiting()  # another open waited here before (it was interrupted): it goes
        pipe = _pipe(fifo)
        if end == "w" and flags & abi.O_NONBLOCK and not pipe.readers:
            _free_if_unused(fifo)
            raise SyscallError(errno.ENXIO)
        _count_in(k, fifo, pipe, end)
        waiting = WaitingOpen(k, fifo, end, fifo.opened[partner])
    if not _partner_there(pipe, end) and fifo.opened[partner] == waiting.partner_count and not flags & abi.O_NONBLOCK:
        k.open_waits[k.sched.current.tid] = waiting
        wait(k, None, f"open of the FIFO {guest} for {'reading' if end == 'r' else 'writing'}", (fifo,))
    return FifoEnd(fifo, pipe, end == "r", end == "w", guest, stat)


def _pipe(fifo: Fifo) -> Pipe:
    if fifo.pipe is None:
        fifo.pipe = Pipe()
        fifo.pipe.readers = fifo.pipe.writers = 0
    return fifo.pipe


def _count_in(k: Kernel, fifo: Fifo, pipe: Pipe, end: str) -> None:
    fifo.opened[end] += 1
    if end == "r":
        pipe.readers += 1
    else:
        pipe.writers += 1
    notify(k, fifo)  # wake_up_partner: an open waiting for this end goes on


def _partner_there(pipe: Pipe, end: str) -> bool:
    return bool(pipe.writers if end == "r" else pipe.readers)


def _uncount(k: Kernel, waiting: WaitingOpen) -> None:
    pipe = waiting.fifo.pipe
    if pipe is None:
        return
    if waiting.end == "r":
        pipe.readers -= 1
    else:
        pipe.writers -= 1
    notify(k, pipe)  # a writer now without a reader gets EPIPE, a reader without a writer end of file
    _free_if_unused(waiting.fifo)


def _free_if_unused(fifo: Fifo) -> None:
    if fifo.pipe is not None and not fifo.pipe.readers and not fifo.pipe.writers:
        fifo.pipe = None
