"""Thread syscalls: clone/clone3 of a thread, exit of one thread (gettid and set_tid_address: process.py).

A new thread shares everything but its registers and per-thread state (tasks.py): it starts as a
copy of the caller's CPU context at the ``syscall`` (kernel/fork.c copy_thread: the child returns 0
from the same instruction), on the stack and with the TLS the caller passed. It runs when the
scheduler picks it; the caller carries on with the new tid.
"""

from __future__ import annotations

import errno
import struct
from typing import TYPE_CHECKING

from emu.cpu import Reg
from emu.kernel import limits
from emu.kernel.altstack import DISABLED
from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import GuestExit
from emu.kernel.futex import FUTEX_BITSET_MATCH_ANY, futex_wake
from emu.kernel.state import CloneArgs, SignalState
from emu.kernel.tasks import Task
from emu.process.memory import UserFault

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

CLONE_VM, CLONE_FS, CLONE_FILES, CLONE_SIGHAND = 0x100, 0x200, 0x400, 0x800
CLONE_PIDFD, CLONE_VFORK, CLONE_THREAD, CLONE_SYSVSEM = 0x1000, 0x4000, 0x10000, 0x40000
CLONE_SETTLS, CLONE_PARENT_SETTID, CLONE_CHILD_CLEARTID = 0x80000, 0x100000, 0x200000
CLONE_DETACHED, CLONE_UNTRACED, CLONE_CHILD_SETTID = 0x400000, 0x800000, 0x01000000
CSIGNAL = 0xFF
THREAD_FLAGS = CLONE_VM | CLONE_SIGHAND | CLONE_THREAD
THREAD_OPTIONAL = (CLONE_FS | CLONE_FILES | CLONE_SYSVSEM | CLONE_SETTLS | CLONE_PARENT_SETTID
                   | CLONE_CHILD_CLEARTID | CLONE_DETACHED | CLONE_UNTRACED | CLONE_CHILD_SETTID)
CLONE_ARGS_SIZE_VER0 = 64
CLONE_ARGS_FORMAT = "<11Q"  # flags pidfd child_tid parent_tid exit_signal stack stack_size tls set_tid set_tid_size cgroup


def sys_clone(k: Kernel, flags: int, newsp: int, parent_tid: int, child_tid: int, tls: int, *_: int) -> int:
    """clone(2), x86-64 argument order: flags, newsp, parent_tid, child_tid, tls."""
    args = CloneArgs(flags & ~CSIGNAL, child_tid, parent_tid, flags & CSIGNAL, newsp, tls)
    return do_clone(k, args)


def sys_clone3(k: Kernel, uargs: int, size: int, *_: int) -> int:
    if size < CLONE_ARGS_SIZE_VER0 or size > 4096:
        raise SyscallError(errno.EINVAL)
    raw = k.mem.read_user(uargs, size)
    if any(raw[88:]):  # fields this kernel does not know must be zero (copy_struct_from_user)
        raise SyscallError(errno.E2BIG)
    (flags, _pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, _n,
     cgroup) = struct.unpack(CLONE_ARGS_FORMAT, raw[:88].ljust(88, b"\0"))
    if exit_signal & ~CSIGNAL or set_tid or cgroup or bool(stack) != bool(stack_size):
        raise SyscallError(errno.EINVAL)
    return do_clone(k, CloneArgs(flags, child_tid, parent_tid, exit_signal, stack + stack_size if stack else 0, tls))


def do_clone(k: Kernel, args: CloneArgs) -> int:
    if args.flags & CLONE_THREAD and not args.flags & CLONE_SIGHAND or (
            args.flags & CLONE_SIGHAND and not args.flags & CLONE_VM):
        raise SyscallError(errno.EINVAL)
    if args.flags & THREAD_FLAGS == THREAD_FLAGS:
        if args.flags & ~(THREAD_FLAGS | THREAD_OPTIONAL):
            raise SyscallError(errno.EINVAL)  # namespaces, pidfds, ptrace: not modelled
        limits.charge_task(k, new_process=False)
        return _new_thread(k, args)
    if k.fork is None or args.flags & CLONE_VM and not args.flags & CLONE_VFORK:
        raise SyscallError(errno.ENOSYS)  # one address space shared by two processes is not modelled
    limits.charge_task(k, new_process=True)
    return k.fork(k, args)


def _new_thread(k: Kernel, args: CloneArgs) -> int:
    parent = k.task
    tid = k.sched.new_tid()
    rip = k.cpu.read(Reg.RIP)  # at the syscall instruction
    signals = SignalState(actions=parent.signals.actions, mask=parent.signals.mask,
                          altstack=DISABLED)  # CLONE_VM without CLONE_VFORK: no alternate stack
    child = Task(tid, signals, pc=rip + 2, context=k.cpu.save_context())
    child.resume_regs = {Reg.RAX: 0, Reg.RCX: rip + 2, Reg.R11: k.cpu.read(Reg.RFLAGS)}
    if args.stack:
        child.resume_regs[Reg.RSP] = args.stack
    if args.flags & CLONE_SETTLS:
        child.resume_regs[Reg.FS_BASE] = args.tls
    if args.flags & CLONE_CHILD_CLEARTID:
        child.clear_child_tid = args.child_tid
    tid_word = struct.pack("<I", tid)
    if args.flags & CLONE_PARENT_SETTID:
        k.mem.write_user(args.parent_tid, tid_word)
    if args.flags & CLONE_CHILD_SETTID:
        k.mem.write_user(args.child_tid, tid_word)
    k.sched.add(child)
    return tid


def sys_exit(k: Kernel, status: int, *_: int) -> int:
    """exit(2) ends the calling thread; the last thread's exit ends the process with its status."""
    task = k.task
    if len(k.sched.live()) == 1:
        raise GuestExit(status)
    if task.clear_child_tid:  # mm_release: *clear_child_tid = 0, then wake one waiter (pthread_join)
        try:
            k.mem.write_user(task.clear_child_tid, bytes(4))
            futex_wake(k, task.clear_child_tid, 1, FUTEX_BITSET_MATCH_ANY)
        except UserFault:
            pass
    k.trace_exit("exit", status)
    k.sched.exit(task)
    k.sched.request_switch()
    return 0
