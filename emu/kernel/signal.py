"""Signal syscalls: actions, masks, alternate stacks, and signals a process sends itself.

Masks, pending sets and alternate stacks are per thread (Kernel.signals is the running thread's);
actions are shared. raise() marks the signal pending on the calling thread; tgkill/tkill on the named
one, which acts on it when the scheduler next runs it. kill() between processes: procsig.py.
"""

from __future__ import annotations

import errno
import functools
import struct
from typing import TYPE_CHECKING

from emu.abi import DEFAULT_IGNORED, SI_TKILL, SI_USER, Signal
from emu.cpu import Reg
from emu.kernel.altstack import STACK_T, changed
from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import GuestKilled
from emu.kernel.state import SIG_DFL, SIG_IGN
from emu.process.memory import UserFault

if TYPE_CHECKING:  # sigframe.py loads when a signal is first delivered (most runs deliver none)
    from emu.kernel.dispatch import Kernel
    from emu.kernel.sigframe import SigInfo

SIG_BLOCK, SIG_UNBLOCK, SIG_SETMASK = 0, 1, 2
SI_TIMER = -2  # the si_code of a timer's signal (procsig.py)
DELAYTIMER_MAX = 0x7FFFFFFF  # timer_getoverrun saturates here (timer_overrun_to_int)
SIGSET_SIZE = 8
UNBLOCKABLE = (1 << (Signal.SIGKILL - 1)) | (1 << (Signal.SIGSTOP - 1))
NSIG = 64


def _check_signo(signo: int) -> None:
    if not 1 <= signo <= NSIG:
        raise SyscallError(errno.EINVAL)


def sys_rt_sigaction(k: Kernel, signo: int, act: int, oldact: int, sigsetsize: int, *_: int) -> int:
    _check_signo(signo)
    if sigsetsize != SIGSET_SIZE:
        raise SyscallError(errno.EINVAL)
    state = k.signals
    if oldact:
        k.mem.write_user(oldact, state.actions.get(signo, bytes(32)))
    if act:
        if signo in (Signal.SIGKILL, Signal.SIGSTOP):
            raise SyscallError(errno.EINVAL)
        state.actions[signo] = k.mem.read_user(act, 32)
    return 0


def sys_rt_sigprocmask(k: Kernel, how: int, new: int, old: int, sigsetsize: int, *_: int) -> int:
    if sigsetsize != SIGSET_SIZE:
        raise SyscallError(errno.EINVAL)
    state = k.signals
    if old:
        k.mem.write_user(old, struct.pack("<Q", state.mask))
    if new:
        (value,) = struct.unpack("<Q", k.mem.read_user(new, 8))
        if how == SIG_BLOCK:
            state.mask |= value
        elif how == SIG_UNBLOCK:
            state.mask &= ~value
        elif how == SIG_SETMASK:
            state.mask = value
        else:
            raise SyscallError(errno.EINVAL)
        state.mask &= ~UNBLOCKABLE
        deliver_pending(k)
    return 0


def sys_sigaltstack(k: Kernel, new: int, old: int, *_: int) -> int:
    """do_sigaltstack (altstack.py): the old stack is reported as it was, once the new one is accepted."""
    rsp, current = k.cpu.read(Reg.RSP), k.signals.altstack
    if new:
        k.signals.altstack = changed(current, k.mem.read_user(new, STACK_T.size), rsp)
    if old:
        k.mem.write_user(old, current.reported(rsp))
    return 0


def send_to_self(k: Kernel, signo: int, code: int = SI_USER) -> None:
    """A signal for this process: pending while blocked, otherwise acted on now."""
    if signo == 0:
        return
    _check_signo(signo)
    k.signals.pending |= 1 << (signo - 1)
    k.signals.pending_code[signo] = code
    deliver_pending(k)


def timer_signal_taken(k: Kernel, signo: int) -> None:
    """The timers' signal ``signo`` is taken (delivered, or read from a signalfd or a wait): the expiries
    it stood for are the overruns timer_getoverrun reports from now on (posixtimer_deliver_signal)."""
    for timer in k.timers.values():
        if timer.signo == signo:
            timer.overrun, timer.overrun_pending = min(timer.overrun_pending, DELAYTIMER_MAX), 0


def deliver_pending(k: Kernel) -> None:
    state = k.signals
    ready = state.pending & ~state.mask
    for signo in range(1, NSIG + 1):
        if not ready & (1 << (signo - 1)):
            continue
        state.pending &= ~(1 << (signo - 1))
        handler = state.handler(signo)
        if handler == SIG_IGN:
            continue
        sig = Signal(signo) if signo in Signal._value2member_map_ else None
        if handler == SIG_DFL:
            if sig is None or sig in DEFAULT_IGNORED:
                continue
            raise GuestKilled(sig, None, "sent by the process itself")
        from emu.kernel.sigframe import SigInfo  # sigframe.py loads with the first signal delivered

        code = state.pending_code.pop(signo, SI_USER)
        if code == SI_TIMER:
            timer_signal_taken(k, signo)
        info = SigInfo(signo, code, pid=k.ident.pid, uid=k.ident.uid)
        k.defer(functools.partial(deliver, k, signo, info))  # once the current syscall has returned
        return  # the rest wait: the handler's mask decides, and sigreturn delivers them


def handles(k: Kernel, signo: int) -> bool:
    """Would a forced signal reach a guest handler (not blocked, a handler installed)?"""
    handler = k.signals.handler(signo)
    return handler not in (SIG_DFL, SIG_IGN) and not k.signals.mask & (1 << (signo - 1))


def deliver(k: Kernel, signo: int, info: SigInfo, resume_ip: int | None = None) -> None:
    """Build the signal frame on the current user state and enter the handler (setup_rt_frame)."""
    from emu.kernel.sigframe import Action, setup_frame  # sigframe.py loads with the first signal delivered

    state = k.cpu.read_user_state()
    if resume_ip is not None:
        state[16] = resume_ip
    action = Action.parse(k.signals.actions[signo])
    for observer in k.signal_frame_observers:  # before the frame's stores: they are the kernel's, not a hit's
        observer(action.restorer, state[16])
    try:
        new = setup_frame(k, signo, info, state, action)
    except UserFault:
        raise GuestKilled(Signal.SIGSEGV, state[16], f"cannot write the frame for signal {signo}") from None
    k.cpu.write_user_state(new, write_rip=True)


def sys_rt_sigreturn(k: Kernel, nr: int, entry: list[int] | None = None) -> None:
    """Restore what the frame saved (every register, the mask); Unicorn adds 2 to rip afterwards."""
    from emu.kernel.sigframe import restore_frame  # sigframe.py is loaded: a frame was set up

    current = k.cpu.read_user_state()
    sp, ip = current[7], current[16]
    try:
        state = restore_frame(k, sp)
    except SyscallError:
        raise GuestKilled(Signal.SIGSEGV, None, "rt_sigreturn with a bad frame") from None
    state[16] -= 2
    k.cpu.write_user_state(state, write_rip=True)
    for observer in k.signal_frame_observers:
        observer(None, ip)
    deliver_pending(k)


def sys_tgkill(k: Kernel, tgid: int, tid: int, signo: int, *_: int) -> int:
    if tgid != k.ident.pid:
        raise SyscallError(errno.ESRCH)
    return sys_tkill(k, tid, signo)


def sys_tkill(k: Kernel, tid: int, signo: int, *_: int) -> int:
    target = k.sched.tasks.get(tid)
    if target is None or not target.alive:
        raise SyscallError(errno.ESRCH)
    if target is k.task:
        send_to_self(k, signo, SI_TKILL)
        return 0
    _check_signo(signo)
    if signo == 0:
        return 0
    bit = 1 << (signo - 1)
    target.signals.pending |= bit
    target.signals.pending_code[signo] = SI_TKILL
    if target.wait is not None and not target.signals.mask & bit:
        k.sched.wake(target, -errno.EINTR)  # the signal interrupts its futex wait
    return 0  # delivered when the scheduler next runs it
