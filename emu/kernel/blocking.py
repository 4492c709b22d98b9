"""How a syscall sleeps, for every kind of descriptor (read, write, close and the others call these).

Sleeping means "let someone else run": a syscall that must wait raises WouldBlock and the machine
restarts it once another thread or process has run (fork.py); with nobody else able to run it
would wait forever, as on Linux, and the run ends as blocked; with O_NONBLOCK it is EAGAIN.
Kernel objects that can make a reader or writer wait (pipe.py, unix.py, the event descriptors in
events.py) implement ``k_read``/``k_write``, which fs/read_write.py calls; what they change they
announce with notify(), so a waiter on it runs soon (a last close too: fs/fds.py).
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, NoReturn

from emu import abi
from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import GuestBlocked, WouldBlock

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel
    from emu.kernel.fs.fdtable import FdEntry


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
