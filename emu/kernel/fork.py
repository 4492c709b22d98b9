"""Processes: fork/vfork (a copied address space and kernel state), wait4, execve's kernel side; the
family of processes one harness run holds is in family.py.

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
from typing import TYPE_CHECKING

from emu.abi import Signal
from emu.designs import Design
from emu.kernel.altstack import DISABLED
from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import PollOthers, WouldBlock
from emu.kernel.family import CLD_EXITED, CLD_KILLED, FamilyOf, ProcessEntry
from emu.kernel.fs.fdtable import SharedFdTable
from emu.kernel.fs.mapped import fork_maps
from emu.kernel.state import SIG_IGN, Brk, CloneArgs, SignalState
from emu.kernel.uprobes.records import UprobeTask
from emu.kernel.uprobes.sites import TRAMPOLINE_NAME
from emu.process.vma import Vma

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

Family = FamilyOf["Kernel"]  # every process of the run (family.py), each with its Kernel

XOL_NAME = "[uprobes]"
WNOHANG = 1
WAIT_OPTIONS = WNOHANG | 2 | 8 | 0x40000000 | 0x80000000 | 0x20000000  # WUNTRACED WCONTINUED __WNOTHREAD __WALL __WCLONE
RUSAGE_SIZE = 144
P_ALL, P_PID, P_PGID = 0, 1, 2
WEXITED, WNOWAIT = 4, 0x01000000
WAITID_OPTIONS = WNOHANG | 2 | 8 | WEXITED | WNOWAIT | 0x40000000 | 0x80000000 | 0x20000000


# ---------------------------------------------------------------------------- fork
def inherited(design: Design) -> Callable[[Vma], bool]:
    """Which VMAs fork copies: all but the VM_DONTCOPY special mappings of the design. Linux 6.18 maps
    its trampoline VM_DONTCOPY (docs/linux-6.18-observed.md section 8, fork): a child that reaches an optimized
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
    child.pgid, child.sid, child.nice = parent.pgid, parent.sid, parent.nice  # timers are not inherited (fork(2))
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
    if isinstance(k.files, SharedFdTable):
        k.files.close_on_exec()
    task = k.task
    for other in k.sched.live():
        if other is not task:
            k.sched.exit(other)
    actions = task.signals.actions
    for signo in [s for s in actions if k.signals.handler(s) != SIG_IGN]:
        del actions[signo]
    task.signals.altstack = DISABLED
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
def _reapable(k: Kernel, pid: int, options: int, what: str) -> ProcessEntry[Kernel] | None:
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
