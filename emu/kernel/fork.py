"""Processes: fork/vfork (a copied address space and kernel state), wait4, execve's kernel side, and
the family of processes one harness run holds.

Model: every process is its own Machine (its own Unicorn CPU and memory); a forked child is a
copy of the parent taken at the ``syscall``. The process the run started with drives the others: when
it blocks (wait4 for a live child, a read of an empty pipe, a write to a full one, a poll) or its time
slice ends while another process can run, the others run in pid order, each until it ends, blocks or
uses up its own slice (it is then suspended and control comes back), and the blocked syscall is
restarted. A process that changes a pipe or socket another one waits on ends its slice early, so
the waiter runs soon (Family.notify): a busy writer cannot starve its reader. Time slices count
instructions, as between threads (sched.py), and are used only while another process is runnable:
a process alone, or with every other one blocked, runs uncounted at full speed. A vfork parent
lets the child run first. When the first process ends, the others run to their end.

File descriptions are shared between the processes' tables as after fork(2): one is closed (a pipe
end released) only when the last table holding it drops it.
"""

from __future__ import annotations

import dataclasses
import errno
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from emu.abi import Signal
from emu.designs import Design
from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import PollOthers, WouldBlock
from emu.kernel.fs.fdtable import FdEntry, FdTable
from emu.kernel.fs.mapped import fork_maps
from emu.kernel.state import SIG_IGN, Brk, CloneArgs, SignalState
from emu.kernel.uprobes.records import UprobeTask
from emu.kernel.uprobes.sites import TRAMPOLINE_NAME
from emu.vma import Vma

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel
    from emu.kernel.unix import UnixSocket

XOL_NAME = "[uprobes]"
FIRST_CHILD_PID = 5000
PID_STRIDE = 1000  # a process's threads take the tids after its pid
WNOHANG = 1
WAIT_OPTIONS = WNOHANG | 2 | 8 | 0x40000000 | 0x80000000 | 0x20000000  # WUNTRACED WCONTINUED __WNOTHREAD __WALL __WCLONE
RUSAGE_SIZE = 144
P_ALL, P_PID, P_PGID = 0, 1, 2
WEXITED, WNOWAIT = 4, 0x01000000
WAITID_OPTIONS = WNOHANG | 2 | 8 | WEXITED | WNOWAIT | 0x40000000 | 0x80000000 | 0x20000000
CLD_EXITED, CLD_KILLED = 1, 2


class Process(Protocol):
    kernel: Kernel

    def resume(self) -> bool: ...  # run until it ends or blocks; True if it made progress
    def signal_arrived(self) -> None: ...  # act on pending signals before running on


@dataclass(eq=False)
class ProcessEntry:
    pid: int
    ppid: int
    process: Process
    status: int | None = None  # the wait status once it has ended (a zombie until reaped)
    reaped: bool = False
    running: bool = False  # on the host call stack (it ran another process while blocked)
    waits: tuple[object, ...] | None = None  # blocked on these objects (() : on any change); None: runnable
    until: int | None = None  # its wait ends by itself at this virtual time (a timeout, a sleep, a timer)


class Family:
    """Every process of one run, by pid."""

    def __init__(self) -> None:
        self.procs: dict[int, ProcessEntry] = {}
        self._next_pid = FIRST_CHILD_PID
        self.preempt = False  # the running process woke another one: its slice ends early
        self.ends = 0  # processes ended so far (a poll for a child's end restarts when it changes)
        self.unix_names: dict[bytes, UnixSocket] = {}  # bound AF_UNIX addresses of the run (net.py)
        self._wake: int | None = None  # the earliest virtual time a suspended process's wait ends

    def add(self, pid: int, ppid: int, process: Process, running: bool = False) -> None:
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
            from emu.kernel.procsig import post  # procsig.py loads only when a child's end signals anyone

            post(parent.process.kernel, Signal.SIGCHLD, CLD_KILLED if status & 0x7F else CLD_EXITED)
            parent.process.signal_arrived()
        self.notify(pid, None)

    def signal(self, pid: int, signo: int, sender: int) -> None:
        """kill() from ``sender``: pending in ``pid``, which is woken to act on it (a zombie ignores it)."""
        from emu.kernel.procsig import post  # procsig.py loads with the first kill between processes

        entry = self.procs[pid]
        if entry.status is not None:
            return
        post(entry.process.kernel, signo, 0)
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

    def children(self, ppid: int, pid: int) -> list[ProcessEntry]:
        """Unreaped children of ``ppid`` matching wait4's pid argument (>0: that one; else: any)."""
        return [e for e in self.procs.values()
                if e.ppid == ppid and not e.reaped and (pid <= 0 or e.pid == pid)]


# ---------------------------------------------------------------------------- file tables
class SharedFdTable(FdTable):
    """An fd table whose open files may also be held by other processes' tables (after fork)."""

    def __init__(self, holders: dict[int, int] | None = None) -> None:
        super().__init__()
        self.holders = holders if holders is not None else {}  # id(file) -> tables holding it, if > 1

    def close(self, fd: int) -> None:
        entry = self.entries.pop(fd, None)
        if entry is None:
            raise SyscallError(errno.EBADF)
        file = entry.file
        if any(e.file is file for e in self.entries.values()):
            return
        others = self.holders.get(id(file), 1) - 1
        if others > 0:
            self.holders[id(file)] = others
            return
        self.holders.pop(id(file), None)
        file.close()

    def fork(self) -> SharedFdTable:
        child = SharedFdTable(self.holders)
        child.entries = {fd: FdEntry(e.file, e.flags, e.cloexec) for fd, e in self.entries.items()}
        for file in {id(e.file): e.file for e in self.entries.values()}:
            self.holders[file] = self.holders.get(file, 1) + 1
        return child

    def close_on_exec(self) -> None:
        for fd in [fd for fd, e in self.entries.items() if e.cloexec]:
            self.close(fd)


# ---------------------------------------------------------------------------- fork
def inherited(design: Design) -> Callable[[Vma], bool]:
    """Which VMAs fork copies: all but the VM_DONTCOPY special mappings of the design. Linux 6.18 maps
    its trampoline VM_DONTCOPY (notes/linux-6.18-observed.md, fork): a child that reaches an optimized
    site dies with SIGSEGV at the trampoline; a design says so with Trampoline.inherited_on_fork."""
    keep_trampolines = design.trampoline is None or design.trampoline.inherited_on_fork

    def keep(vma: Vma) -> bool:
        if vma.name == XOL_NAME:
            return False  # xol_area: VM_DONTCOPY (kernel/events/uprobes.c); re-created on demand
        return keep_trampolines or vma.name != TRAMPOLINE_NAME

    return keep


def fork_kernel_state(parent: Kernel, child: Kernel, args: CloneArgs) -> None:
    """copy_process for a new process: files, cwd, limits, identity, the forking thread's signal state."""
    # threads.py loads with the first clone (a plain run never forks)
    from emu.kernel.threads import CLONE_CHILD_CLEARTID, CLONE_CHILD_SETTID, CLONE_PARENT_SETTID

    pid = child.config.pid
    child.files = parent.files.fork()
    child.vfs = parent.vfs.fork()  # one file system (and its in-memory layer) for the whole run
    if child.vfs.overlay is not None and child.vfs.overlay.mapped:
        fork_maps(parent, child)
    # attr.inherit: the child's own copy of the event (perf.py loads with a fork, not with a plain run)
    from emu.kernel.perf import inherit_events

    inherit_events(child.files.entries, pid)
    child.clock = parent.clock  # one virtual timeline for the whole run
    child.random.setstate(parent.random.getstate())
    child.rlimits = dict(parent.rlimits)
    child.brk = Brk(parent.brk.start, parent.brk.current)
    child.ident = dataclasses.replace(parent.ident, pid=pid, ppid=parent.ident.pid)
    child.umask, child.next_inode, child.tracer = parent.umask, parent.next_inode, parent.tracer
    child.affinity = parent.affinity
    child.pgid = parent.pgid  # timers are not inherited (fork(2))
    theirs, main = parent.task, child.task
    main.signals = SignalState(actions=dict(theirs.signals.actions), mask=theirs.signals.mask,
                               altstack=theirs.signals.altstack)
    main.rseq = theirs.rseq
    main.uprobe = theirs.uprobe.fork_copy()  # dup_utask: the pending return instances come along
    pid_word = struct.pack("<I", pid)
    if args.flags & CLONE_CHILD_CLEARTID:
        main.clear_child_tid = args.child_tid
    if args.flags & CLONE_CHILD_SETTID:
        child.mem.write_user(args.child_tid, pid_word)
    if args.flags & CLONE_PARENT_SETTID:
        parent.mem.write_user(args.parent_tid, pid_word)


def exec_kernel_state(k: Kernel) -> None:
    """What execve resets (fs/exec.c): close-on-exec fds, handled signals back to SIG_DFL (ignored
    ones stay ignored), the alternate stack, POSIX timers, rseq, robust list, clear_child_tid, other threads."""
    from emu.kernel.threads import SS_DISABLE_ALTSTACK  # threads.py loads with an execve, not with a plain run

    if isinstance(k.files, SharedFdTable):
        k.files.close_on_exec()
    task = k.task
    for other in k.sched.live():
        if other is not task:
            k.sched.exit(other)
    actions = task.signals.actions
    for signo in [s for s in actions if k.signals.handler(s) != SIG_IGN]:
        del actions[signo]
    task.signals.altstack = SS_DISABLE_ALTSTACK
    for ident in [i for i in k.timers if i >= 0]:
        del k.timers[ident]  # POSIX timers go; the alarm stays (execve(2))
    task.rseq = None
    task.robust_list = task.clear_child_tid = 0
    task.uprobe = UprobeTask()


def wait_status(exited: bool, code: int, signal: Signal | None) -> int:
    """The int wait4 stores: exit code << 8, or the terminating signal (no core dumps: RLIMIT_CORE is 0)."""
    if exited or signal is None:
        return (code & 0xFF) << 8
    return int(signal) & 0x7F


# ---------------------------------------------------------------------------- syscalls
def _reapable(k: Kernel, pid: int, options: int, what: str) -> ProcessEntry | None:
    """The first ended child matching ``pid``; None with WNOHANG when none has ended yet; otherwise
    the caller waits (WouldBlock) until another process has run."""
    family = k.family
    candidates = family.children(k.ident.pid, pid) if family is not None else []
    if not candidates:
        raise SyscallError(errno.ECHILD)
    for entry in candidates:
        if entry.status is not None:
            return entry
    if options & WNOHANG:
        if any(not e.running for e in candidates):
            raise PollOthers(f"{what} with WNOHANG", 0)  # let a child that has not run yet get there
        return None
    raise WouldBlock(f"{what} for {'any child' if pid <= 0 else f'pid {pid}'}")


def sys_wait4(k: Kernel, pid: int, status_ptr: int, options: int, rusage: int, *_: int) -> int:
    pid = pid & 0xFFFFFFFF
    pid = pid - (1 << 32) if pid >= 1 << 31 else pid  # pid_t is an int
    if options & ~WAIT_OPTIONS & 0xFFFFFFFF:
        raise SyscallError(errno.EINVAL)
    entry = _reapable(k, pid, options, "wait4")
    if entry is None:
        return 0
    assert entry.status is not None
    if status_ptr:
        k.mem.write_user(status_ptr, struct.pack("<i", entry.status))
    if rusage:
        k.mem.write_user(rusage, bytes(RUSAGE_SIZE))
    entry.reaped = True
    return entry.pid


def sys_waitid(k: Kernel, idtype: int, ident: int, infop: int, options: int, rusage: int, *_: int) -> int:
    """waitid(2) for exited children: P_ALL or P_PID (process groups are the caller's children here)."""
    if idtype not in (P_ALL, P_PID, P_PGID) or not options & WEXITED or options & ~WAITID_OPTIONS:
        raise SyscallError(errno.EINVAL)
    pid = ident & 0xFFFFFFFF if idtype == P_PID else -1
    entry = _reapable(k, pid, options, "waitid")
    info = bytes(128)
    if entry is not None:
        assert entry.status is not None
        killed = entry.status & 0x7F
        code, value = (CLD_KILLED, killed) if killed else (CLD_EXITED, entry.status >> 8)
        info = struct.pack("<iii4xiIi", Signal.SIGCHLD, 0, code, entry.pid, k.ident.uid, value).ljust(128, b"\0")
        entry.reaped = not options & WNOWAIT
    if infop:
        k.mem.write_user(infop, info)
    if rusage:
        k.mem.write_user(rusage, bytes(RUSAGE_SIZE))
    return 0


def sys_fork(k: Kernel, *_: int) -> int:
    from emu.kernel.threads import do_clone  # threads.py loads with the first clone (a plain run never forks)

    return do_clone(k, CloneArgs(0, 0, 0, Signal.SIGCHLD, 0, 0))


def sys_vfork(k: Kernel, *_: int) -> int:
    # threads.py loads with the first clone (a plain run never forks)
    from emu.kernel.threads import CLONE_VFORK, CLONE_VM, do_clone

    return do_clone(k, CloneArgs(CLONE_VM | CLONE_VFORK, 0, 0, Signal.SIGCHLD, 0, 0))


def _string_vector(k: Kernel, addr: int) -> list[bytes]:
    out: list[bytes] = []
    while addr:
        (ptr,) = struct.unpack("<Q", k.mem.read_user(addr + 8 * len(out), 8))
        if not ptr:
            return out
        if len(out) >= 1 << 16:
            raise SyscallError(errno.E2BIG)
        out.append(k.mem.read_cstring(ptr, 1 << 17))
    return out


def sys_execve(k: Kernel, path: int, argv: int, envp: int, *_: int) -> int:
    name = k.mem.read_cstring(path).decode("utf-8", "surrogateescape")
    args, env = _string_vector(k, argv), _string_vector(k, envp)
    if k.exec is None:
        raise SyscallError(errno.ENOSYS)
    k.exec(name, args, env)  # checks the file now; the image is replaced before the next instruction
    return 0
