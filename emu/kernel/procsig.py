"""Signals between the run's processes, process groups, waiting for a signal, and timers that send one.

kill(2) reaches any process of the run (by pid, process group, or -1 for all but the caller); the
target acts on it when it next runs, and one that sleeps is woken for it (family.py). A child's
end sends SIGCHLD to its parent. rt_sigsuspend and pause sleep until a signal is handled. alarm,
setitimer(ITIMER_REAL) and POSIX timers (timer_create with SIGEV_SIGNAL) run on the virtual clock:
when every process sleeps, time moves on to the first expiry and the timer's signal is sent.
"""

from __future__ import annotations

import errno
import struct
from typing import TYPE_CHECKING

from emu.abi import DEFAULT_IGNORED, SI_USER, Signal, signed32
from emu.kernel.blocking import wait
from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import GuestKilled
from emu.kernel.sigframe import Action, SigInfo
from emu.kernel.signal import NSIG, UNBLOCKABLE, deliver, send_to_self
from emu.kernel.state import SIG_DFL, SIG_IGN, Timer

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

SI_TIMER = -2
ALARM_TIMER = -1  # alarm and setitimer(ITIMER_REAL) share one timer
ITIMER_REAL = 0
SIGEV_SIGNAL, SIGEV_NONE, SIGEV_THREAD_ID = 0, 1, 4
SIGEVENT = struct.Struct("<iii")  # sigev_value (8) comes first: offsets 8, 12
MAX_TIMERS = 1 << 15


def _check(signo: int) -> None:
    if not 0 <= signo <= NSIG:
        raise SyscallError(errno.EINVAL)


# ---------------------------------------------------------------------------- kill and groups
def _targets(k: Kernel, pid: int) -> list[int]:
    """The pids kill(pid) reaches, ended ones (zombies) included: signalling one succeeds and does nothing."""
    family = k.family
    procs = family.procs if family is not None else {}
    if pid > 0:
        return [pid] if pid in procs or pid == k.ident.pid else []
    if pid == -1:
        return [p for p in procs if p != k.ident.pid]
    group = k.pgid if pid == 0 else -pid
    found = [p for p, e in procs.items() if _pgid(k, p) == group]
    return found or ([k.ident.pid] if k.pgid == group else [])


def _pgid(k: Kernel, pid: int) -> int:
    if pid == k.ident.pid or k.family is None:
        return k.pgid
    return k.family.procs[pid].process.kernel.pgid


def sys_kill(k: Kernel, pid: int, signo: int, *_: int) -> int:
    pid, signo = signed32(pid), signed32(signo)
    _check(signo)
    targets = _targets(k, pid)
    if not targets:
        raise SyscallError(errno.ESRCH)
    family = k.family
    for target in targets:
        if target != k.ident.pid and family is not None and signo:
            family.signal(target, signo, k.ident.pid)
    if k.ident.pid in targets:
        send_to_self(k, signo)  # last: it may end the caller
    return 0


def sys_setpgid(k: Kernel, pid: int, pgid: int, *_: int) -> int:
    pid, pgid = signed32(pid), signed32(pgid)
    if pgid < 0:
        raise SyscallError(errno.EINVAL)
    target = k if pid in (0, k.ident.pid) else _child_kernel(k, pid)
    target.pgid = pgid or target.ident.pid
    return 0


def _child_kernel(k: Kernel, pid: int) -> Kernel:
    entry = k.family.procs.get(pid) if k.family is not None else None
    if entry is None or entry.ppid != k.ident.pid:
        raise SyscallError(errno.ESRCH)
    return entry.process.kernel


def sys_getpgid(k: Kernel, pid: int, *_: int) -> int:
    pid = signed32(pid)
    if pid in (0, k.ident.pid):
        return k.pgid
    if k.family is None or pid not in k.family.procs:
        raise SyscallError(errno.ESRCH)
    return _pgid(k, pid)


def sys_getpgrp(k: Kernel, *_: int) -> int:
    return k.pgid


# ---------------------------------------------------------------------------- waiting for a signal
def _take(k: Kernel, mask: int) -> int | None:
    """The lowest pending signal ``mask`` lets through that does something; ignored ones are dropped."""
    state = k.signals
    for signo in range(1, NSIG + 1):
        bit = 1 << (signo - 1)
        if not state.pending & bit & ~mask:
            continue
        handler = state.handler(signo)
        known = signo in Signal._value2member_map_
        if handler == SIG_IGN or handler == SIG_DFL and (not known or Signal(signo) in DEFAULT_IGNORED):
            state.pending &= ~bit
            continue
        return signo
    return None


def acting_signal(k: Kernel) -> int | None:
    """A pending signal the thread's mask lets through that will run a handler or kill."""
    return _take(k, k.signals.mask)


def _suspend(k: Kernel, mask: int, what: str) -> int:
    """Sleep with ``mask`` blocked until a signal is handled (then EINTR, the handler running with
    the old mask saved in its frame) or kills the process."""
    mask &= ~UNBLOCKABLE
    state = k.signals
    signo = _take(k, mask)
    if signo is None:
        wait(k, None, what, (k,))
    assert signo is not None
    bit = 1 << (signo - 1)
    state.pending &= ~bit
    code = state.pending_code.pop(signo, SI_USER)
    if state.handler(signo) == SIG_DFL:
        raise GuestKilled(Signal(signo), None, "a signal ended the wait")
    old = state.mask
    action = Action.parse(state.actions[signo])
    info = SigInfo(signo, code, pid=k.ident.pid, uid=k.ident.uid)

    def enter() -> None:  # after the syscall has returned -EINTR: the frame saves the mask of before
        state.mask = old
        deliver(k, signo, info)
        state.mask = mask | action.mask | bit

    k.defer(enter)
    raise SyscallError(errno.EINTR)


def sys_rt_sigsuspend(k: Kernel, mask_addr: int, size: int, *_: int) -> int:
    if size != 8:
        raise SyscallError(errno.EINVAL)
    (mask,) = struct.unpack("<Q", k.mem.read_user(mask_addr, 8))
    return _suspend(k, mask, "rt_sigsuspend")


def sys_pause(k: Kernel, *_: int) -> int:
    return _suspend(k, k.signals.mask, "pause")


# ---------------------------------------------------------------------------- timers
def next_expiry(k: Kernel) -> int | None:
    times = [t.expiry for t in k.timers.values() if t.expiry is not None]
    return min(times) if times else None


def fire_timers(k: Kernel) -> bool:
    """Send the signal of every timer the virtual clock has reached; True if one fired."""
    now = k.clock.elapsed
    fired = False
    for timer in k.timers.values():
        if timer.expiry is None or timer.expiry > now:
            continue
        if timer.interval:
            periods = (now - timer.expiry) // timer.interval + 1
            timer.overrun = periods - 1
            timer.expiry += periods * timer.interval
        else:
            timer.expiry = None
        if timer.signo:
            k.signals.pending |= 1 << (timer.signo - 1)
            k.signals.pending_code[timer.signo] = SI_TIMER
            fired = True
    return fired


def _arm(k: Kernel, timer: Timer, value: int, interval: int, absolute_base: int | None = None) -> None:
    timer.interval = interval
    if value == 0:
        timer.expiry = None
    elif absolute_base is not None:
        timer.expiry = max(k.clock.elapsed, value - absolute_base)
    else:
        timer.expiry = k.clock.elapsed + value


def _left(k: Kernel, timer: Timer | None) -> tuple[int, int]:
    """(time left, interval) in ns."""
    if timer is None or timer.expiry is None:
        return 0, timer.interval if timer is not None else 0
    return max(1, timer.expiry - k.clock.elapsed), timer.interval


def _alarm_timer(k: Kernel) -> Timer:
    return k.timers.setdefault(ALARM_TIMER, Timer(Signal.SIGALRM))


def sys_alarm(k: Kernel, seconds: int, *_: int) -> int:
    timer = _alarm_timer(k)
    left = _left(k, timer)[0]
    _arm(k, timer, (seconds & 0xFFFFFFFF) * 10**9, 0)
    return -(-left // 10**9)


def _timeval_pair(ns: tuple[int, int]) -> bytes:
    interval, value = ns[1], ns[0]
    return struct.pack("<qqqq", interval // 10**9, interval % 10**9 // 1000, value // 10**9, value % 10**9 // 1000)


def sys_getitimer(k: Kernel, which: int, cur: int, *_: int) -> int:
    if which != ITIMER_REAL:
        raise SyscallError(errno.EINVAL)  # the virtual and profiling timers count CPU time: not modelled
    k.mem.write_user(cur, _timeval_pair(_left(k, k.timers.get(ALARM_TIMER))))
    return 0


def sys_setitimer(k: Kernel, which: int, new: int, old: int, *_: int) -> int:
    if which != ITIMER_REAL:
        raise SyscallError(errno.EINVAL)
    timer = _alarm_timer(k)
    if old:
        k.mem.write_user(old, _timeval_pair(_left(k, timer)))
    if new:
        isec, iusec, vsec, vusec = struct.unpack("<qqqq", k.mem.read_user(new, 32))
        if min(isec, iusec, vsec, vusec) < 0 or iusec >= 10**6 or vusec >= 10**6:
            raise SyscallError(errno.EINVAL)
        _arm(k, timer, vsec * 10**9 + vusec * 1000, isec * 10**9 + iusec * 1000)
    return 0


def sys_timer_create(k: Kernel, clock: int, sevp: int, timer_id: int, *_: int) -> int:
    if clock not in (0, 1, 7, 8, 9):
        raise SyscallError(errno.EINVAL)
    signo, notify = Signal.SIGALRM, SIGEV_SIGNAL
    if sevp:
        signo, notify, _tid = SIGEVENT.unpack(k.mem.read_user(sevp + 8, SIGEVENT.size))
    if notify not in (SIGEV_SIGNAL, SIGEV_NONE, SIGEV_THREAD_ID) or notify != SIGEV_NONE and not 1 <= signo <= NSIG:
        raise SyscallError(errno.EINVAL)
    ident = next(i for i in range(MAX_TIMERS + 1) if i not in k.timers)
    if ident >= MAX_TIMERS:
        raise SyscallError(errno.EAGAIN)
    k.timers[ident] = Timer(0 if notify == SIGEV_NONE else signo, realtime=clock == 0)
    k.mem.write_user(timer_id, struct.pack("<i", ident))
    return 0


def _posix_timer(k: Kernel, ident: int) -> Timer:
    timer = k.timers.get(signed32(ident))
    if timer is None or signed32(ident) == ALARM_TIMER:
        raise SyscallError(errno.EINVAL)
    return timer


def _itimerspec(ns: tuple[int, int]) -> bytes:
    left, interval = ns
    return struct.pack("<qqqq", interval // 10**9, interval % 10**9, left // 10**9, left % 10**9)


def sys_timer_settime(k: Kernel, ident: int, flags: int, new: int, old: int, *_: int) -> int:
    timer = _posix_timer(k, ident)
    isec, insec, vsec, vnsec = struct.unpack("<qqqq", k.mem.read_user(new, 32))
    if min(isec, insec, vsec, vnsec) < 0 or insec >= 10**9 or vnsec >= 10**9:
        raise SyscallError(errno.EINVAL)
    if old:
        k.mem.write_user(old, _itimerspec(_left(k, timer)))
    base = None
    if flags & 1:  # TIMER_ABSTIME
        base = k.clock.realtime_start if timer.realtime else k.clock.monotonic_start
    _arm(k, timer, vsec * 10**9 + vnsec, isec * 10**9 + insec, base)
    return 0


def sys_timer_gettime(k: Kernel, ident: int, cur: int, *_: int) -> int:
    k.mem.write_user(cur, _itimerspec(_left(k, _posix_timer(k, ident))))
    return 0


def sys_timer_getoverrun(k: Kernel, ident: int, *_: int) -> int:
    return _posix_timer(k, ident).overrun


def sys_timer_delete(k: Kernel, ident: int, *_: int) -> int:
    _posix_timer(k, ident)
    del k.timers[signed32(ident)]
    return 0
