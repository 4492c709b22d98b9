"""The family of processes one harness run holds, by pid (fork.py explains the process model).

Generic in the kernel type each process carries, so that this module imports no kernel: dispatch.py's
Kernel holds a FamilyOf[Kernel], and fork.py names that one Family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from emu.abi import Signal

if TYPE_CHECKING:
    from emu.kernel.exits import WouldBlock
    from emu.kernel.files import OpenFile
    from emu.kernel.sched import Scheduler

FIRST_CHILD_PID = 5000
PID_STRIDE = 1000  # a process's threads take the tids after its pid
CLD_EXITED, CLD_KILLED = 1, 2


class Scheduled(Protocol):
    """What the family needs of a process's kernel: its threads, to post a signal to one."""

    @property
    def sched(self) -> Scheduler: ...


K = TypeVar("K", bound=Scheduled)


class Process(Protocol[K]):
    kernel: K

    def resume(self) -> bool: ...  # run until it ends or blocks; True if it made progress
    def signal_arrived(self) -> None: ...  # act on pending signals before running on


@dataclass(eq=False)
class ProcessEntry(Generic[K]):
    pid: int
    ppid: int
    process: Process[K]
    status: int | None = None  # the wait status once it has ended (a zombie until reaped)
    reaped: bool = False
    running: bool = False  # on the host call stack (it ran another process while blocked)
    waits: tuple[object, ...] | None = None  # blocked on these objects (() : on any change); None: runnable
    until: int | None = None  # its wait ends by itself at this virtual time (a timeout, a sleep, a timer)


class FamilyOf(Generic[K]):
    """Every process of one run, by pid."""

    def __init__(self) -> None:
        self.procs: dict[int, ProcessEntry[K]] = {}
        self._next_pid = FIRST_CHILD_PID
        self.preempt = False  # the running process woke another one: its slice ends early
        self.ends = 0  # processes ended so far (a poll for a child's end restarts when it changes)
        self.unix_names: dict[bytes, OpenFile] = {}  # bound AF_UNIX addresses of the run: net.py's sockets
        self._wake: int | None = None  # the earliest virtual time a suspended process's wait ends

    def add(self, pid: int, ppid: int, process: Process[K], running: bool = False) -> None:
        self.procs[pid] = ProcessEntry(pid, ppid, process, running=running)

    def new_pid(self) -> int:
        pid = self._next_pid
        self._next_pid += PID_STRIDE
        return pid

    def ended(self, pid: int, status: int) -> None:
        """A process ended: a zombie until reaped; its parent gets SIGCHLD and every waiter a look."""
        entry = self.procs[pid]
        entry.status, entry.waits, entry.until = status, None, None
        self.ends += 1
        parent = self.procs.get(entry.ppid)
        if parent is not None and parent.status is None:
            parent.process.kernel.sched.post_signal(Signal.SIGCHLD, CLD_KILLED if status & 0x7F else CLD_EXITED)
            parent.process.signal_arrived()
        self.notify(pid, None)

    def signal(self, pid: int, signo: int, sender: int) -> None:
        """kill() from ``sender``: pending in ``pid``, which is woken to act on it (a zombie ignores it)."""
        entry = self.procs[pid]
        if entry.status is not None:
            return
        entry.process.kernel.sched.post_signal(signo, 0)
        entry.process.signal_arrived()
        if not entry.running:
            entry.waits = None
        self.preempt = True

    def has_others(self, pid: int) -> bool:
        return any(e.status is None and e.pid != pid for e in self.procs.values())

    def runnable_others(self, pid: int) -> bool:
        """Is another process ready to run now (not ended, not blocked, not on the call stack)? Then
        this one runs in time slices."""
        return any(e.status is None and e.pid != pid and (not e.running and e.waits is None or e.until is not None)
                   for e in self.procs.values())  # a timed waiter needs time to pass: slices advance it

    def due(self, now: int) -> bool:
        """Wake the waiters whose time has come; True if there was one."""
        woke = False
        for entry in self.procs.values():
            if entry.status is None and entry.until is not None and entry.until <= now:
                woke = True
                entry.until = None
                if not entry.running:
                    entry.waits = None
        return woke

    def notify(self, pid: int, changed: object | None) -> bool:
        """Process ``pid`` changed ``changed`` (None: something every waiter may care about, e.g. a
        process ended); wake whoever waits on it. True if one did: the caller's slice should end
        soon (``preempt``) so it gets there, even when it waits further down the call stack."""
        woke = False
        for entry in self.procs.values():
            if entry.pid == pid or entry.status is not None or entry.waits is None:
                continue
            if changed is None or not entry.waits or changed in entry.waits:
                woke = True
                if not entry.running:
                    entry.waits = None
        self.preempt |= woke
        return woke

    def note_wake(self, until: int | None) -> None:
        if until is not None:
            self._wake = until if self._wake is None else min(self._wake, until)

    def take_wake(self, until: int | None) -> int | None:
        """The earliest of ``until`` and the suspended processes' timeouts (which are then forgotten)."""
        self.note_wake(until)
        wake, self._wake = self._wake, None
        return wake

    def set_waiting(self, pid: int, wait: WouldBlock | None, until: int | None = None) -> None:
        entry = self.procs[pid]
        entry.waits, entry.until = (None, None) if wait is None else (wait.on, until)

    def run_others(self, pid: int) -> bool:
        """Run every other live process not already running, until each ends, blocks or is preempted;
        True if any made progress. Those blocked on something nobody changed since are tried only
        when the runnable ones made none (a change notify() missed still gets seen)."""
        progress = self._run_each(pid, blocked=False)
        return progress or self._run_each(pid, blocked=True)

    def _run_each(self, pid: int, blocked: bool) -> bool:
        progress = False
        for entry in list(self.procs.values()):
            if entry.pid == pid or entry.status is not None or entry.running or (entry.waits is not None) != blocked:
                continue
            entry.running = True
            try:
                progress |= entry.process.resume()
            finally:
                entry.running = False
        return progress

    def run(self, pid: int) -> None:
        """Run one process now (a vfork child, before its parent continues)."""
        entry = self.procs[pid]
        entry.running = True
        try:
            entry.process.resume()
        finally:
            entry.running = False

    def children(self, ppid: int, pid: int) -> list[ProcessEntry[K]]:
        """Unreaped children of ``ppid`` matching wait4's pid argument (>0: that one; else: any)."""
        return [e for e in self.procs.values()
                if e.ppid == ppid and not e.reaped and (pid <= 0 or e.pid == pid)]
