"""Signals between the run's processes, process groups, waiting for a signal, and timers that send one.

kill(2) reaches any process of the run (by pid, process group, or -1 for all but the caller); the
target acts on it when it next runs, and one that sleeps is woken for it (family.py). A child's
end sends SIGCHLD to its parent. rt_sigsuspend and pause sleep until a signal is handled.

Timers (kernel/time/itimer.c, posix-timers.c, posix-cpu-timers.c) belong to their process: alarm and
setitimer(ITIMER_REAL) share one, on the virtual clock; ITIMER_VIRTUAL counts the process's user CPU
time (the instructions it runs) and ITIMER_PROF its user and system time (its kernel entries too), as
do POSIX timers on a CPU clock (cputime.py); the other POSIX timers (timer_create with SIGEV_SIGNAL)
run on the virtual clock. A timer expires when its clock passes the expiry, busy or not: the running
process's CPU stops there (emu/process/timekeeping.py) and the signal comes as at any return to user mode. An
interval timer goes on from its expiry; a signal not yet delivered takes the later expiries in (one
SIGALRM pending at a time), and a POSIX timer counts them as overruns, which timer_getoverrun reports
for the signal delivered last.
"""

from __future__ import annotations

import errno
import struct
from typing import TYPE_CHECKING

from emu.abi import DEFAULT_IGNORED, SI_USER, Signal, signed32
from emu.kernel.blocking import wait
from emu.kernel.cputime import ALL_CPU, USER_CPU, WALL, cpu_clock_kind, cpu_ns
from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import GuestKilled
from emu.kernel.sigframe import Action, SigInfo
from emu.kernel.signal import NSIG, SI_TIMER, UNBLOCKABLE, deliver, send_to_self, timer_signal_taken
from emu.kernel.state import SIG_DFL, SIG_IGN, Timer

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

ALARM_TIMER, VIRTUAL_TIMER, PROF_TIMER = -1, -2, -3  # the itimers (alarm shares ITIMER_REAL's); POSIX ones are >= 0
ITIMER_REAL, ITIMER_VIRTUAL, ITIMER_PROF = 0, 1, 2
ITIMERS = {  # which -> (timer id, signal, clock)
    ITIMER_REAL: (ALARM_TIMER, Signal.SIGALRM, WALL),
    ITIMER_VIRTUAL: (VIRTUAL_TIMER, Signal.SIGVTALRM, USER_CPU),
    ITIMER_PROF: (PROF_TIMER, Signal.SIGPROF, ALL_CPU),
}
CLOCK_REALTIME = 0
WALL_TIMER_CLOCKS = (0, 1, 7, 8, 9)  # realtime, monotonic, boottime and their alarm kinds
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


def _process(k: Kernel, pid: int) -> Kernel:
    """The kernel state of process ``pid`` of the run (0: the caller); ESRCH if there is none."""
    pid = signed32(pid)
    if pid in (0, k.ident.pid):
        return k
    if k.family is None or pid not in k.family.procs:
        raise SyscallError(errno.ESRCH)
    return k.family.procs[pid].process.kernel


def sys_getpgid(k: Kernel, pid: int, *_: int) -> int:
    return _process(k, pid).pgid


def sys_getpgrp(k: Kernel, *_: int) -> int:
    return k.pgid


def sys_setsid(k: Kernel, *_: int) -> int:
    """A new session and process group led by the caller; a process group leader may not (EPERM)."""
    if k.pgid == k.ident.pid:
        raise SyscallError(errno.EPERM)
    k.sid = k.pgid = k.ident.pid
    return k.sid


def sys_getsid(k: Kernel, pid: int, *_: int) -> int:
    return _process(k, pid).sid


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
    if code == SI_TIMER:
        timer_signal_taken(k, signo)
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
def _now(k: Kernel, timer: Timer) -> int:
    """The time on ``timer``'s clock: the virtual clock, or the process's CPU time, in ns."""
    kind = timer.kind
    return k.clock.elapsed if kind == WALL else cpu_ns(k, kind)


def next_expiry(k: Kernel) -> int | None:
    """The first expiry of a timer on the virtual clock (CPU-time timers do not move while it sleeps)."""
    return next_stops(k)[WALL]


def next_stops(k: Kernel) -> tuple[int | None, int | None, int | None]:
    """Where the process must stop next for a timer: the first expiry on the virtual clock, on its user
    CPU time and on its whole CPU time (ns; None: no timer armed on that clock), indexed by kind."""
    firsts: dict[int, int] = {}
    for timer in k.timers.values():
        if timer.expiry is not None:
            kind = timer.kind
            firsts[kind] = min(firsts.get(kind, timer.expiry), timer.expiry)
    return firsts.get(WALL), firsts.get(USER_CPU), firsts.get(ALL_CPU)


def fire_timers(k: Kernel) -> bool:
    """Send the signal of every timer whose clock has passed its expiry; True if one sent one."""
    fired = False
    for timer in k.timers.values():
        if timer.expiry is None:
            continue
        now = _now(k, timer)
        if timer.expiry > now:
            continue
        periods = 1
        if timer.interval:  # hrtimer_forward: the next expiry after now, on the interval's grid
            periods = (now - timer.expiry) // timer.interval + 1
            timer.expiry += periods * timer.interval
        else:
            timer.expiry = None
        fired |= _send(k, timer, periods)
    return fired


def _send(k: Kernel, timer: Timer, periods: int) -> bool:
    """A timer expired ``periods`` times: its signal is sent, unless the last one is still pending (then
    they are overruns of that one: posix_timer_queue_signal)."""
    if not timer.signo:
        return False  # SIGEV_NONE
    bit = 1 << (timer.signo - 1)
    state = k.signals
    queued = state.pending & bit and state.pending_code.get(timer.signo) == SI_TIMER
    timer.overrun_pending = timer.overrun_pending + periods if queued else periods - 1
    if not queued:
        state.pending |= bit
        state.pending_code[timer.signo] = SI_TIMER
    return True


def _arm(k: Kernel, timer: Timer, value: int, interval: int, absolute_base: int | None = None) -> None:
    if value:
        k.clock.observe()  # a timer depends on time: from here on the instructions run count
    timer.interval = interval
    now = _now(k, timer)
    if value == 0:
        timer.expiry = None
    elif absolute_base is not None:
        timer.expiry = max(now, value - absolute_base)
    else:
        timer.expiry = now + value
    k.clock.changed()  # the running process's stop for its timers moves


def _left(k: Kernel, timer: Timer | None) -> tuple[int, int]:
    """(time left, interval) in ns."""
    if timer is None or timer.expiry is None:
        return 0, timer.interval if timer is not None else 0
    return max(1, timer.expiry - _now(k, timer)), timer.interval


def _itimer(k: Kernel, which: int) -> Timer:
    ident, signo, kind = ITIMERS[which]
    return k.timers.setdefault(ident, Timer(signo, kind=kind))


def sys_alarm(k: Kernel, seconds: int, *_: int) -> int:
    timer = _itimer(k, ITIMER_REAL)
    left = _left(k, timer)[0]
    _arm(k, timer, (seconds & 0xFFFFFFFF) * 10**9, 0)
    return -(-left // 10**9)


def _timeval_pair(ns: tuple[int, int]) -> bytes:
    interval, value = ns[1], ns[0]
    return struct.pack("<qqqq", interval // 10**9, interval % 10**9 // 1000, value // 10**9, value % 10**9 // 1000)


def _which(which: int) -> int:
    which = signed32(which)
    if which not in ITIMERS:
        raise SyscallError(errno.EINVAL)
    return which


def sys_getitimer(k: Kernel, which: int, cur: int, *_: int) -> int:
    ident = ITIMERS[_which(which)][0]
    k.mem.write_user(cur, _timeval_pair(_left(k, k.timers.get(ident))))
    return 0


def sys_setitimer(k: Kernel, which: int, new: int, old: int, *_: int) -> int:
    """A NULL new value disarms the timer, as Linux still allows (with a warning in its log)."""
    isec = iusec = vsec = vusec = 0
    if new:
        isec, iusec, vsec, vusec = struct.unpack("<qqqq", k.mem.read_user(new, 32))
        if min(isec, iusec, vsec, vusec) < 0 or iusec >= 10**6 or vusec >= 10**6:
            raise SyscallError(errno.EINVAL)
    timer = _itimer(k, _which(which))
    if old:
        k.mem.write_user(old, _timeval_pair(_left(k, timer)))
    _arm(k, timer, vsec * 10**9 + vusec * 1000, isec * 10**9 + iusec * 1000)
    return 0


def sys_timer_create(k: Kernel, clock: int, sevp: int, timer_id: int, *_: int) -> int:
    cpu_kind = cpu_clock_kind(k, clock)
    if cpu_kind is None and clock not in WALL_TIMER_CLOCKS:
        raise SyscallError(errno.EINVAL)
    signo, notify = Signal.SIGALRM, SIGEV_SIGNAL
    if sevp:
        signo, notify, _tid = SIGEVENT.unpack(k.mem.read_user(sevp + 8, SIGEVENT.size))
    if notify not in (SIGEV_SIGNAL, SIGEV_NONE, SIGEV_THREAD_ID) or notify != SIGEV_NONE and not 1 <= signo <= NSIG:
        raise SyscallError(errno.EINVAL)
    ident = next(i for i in range(MAX_TIMERS + 1) if i not in k.timers)
    if ident >= MAX_TIMERS:
        raise SyscallError(errno.EAGAIN)
    k.timers[ident] = Timer(0 if notify == SIGEV_NONE else signo, realtime=clock == CLOCK_REALTIME,
                                   kind=WALL if cpu_kind is None else cpu_kind)
    k.mem.write_user(timer_id, struct.pack("<i", ident))
    return 0


def _posix_timer(k: Kernel, ident: int) -> Timer:
    timer = k.timers.get(signed32(ident))
    if timer is None or signed32(ident) < 0:
        raise SyscallError(errno.EINVAL)
    return timer


def _itimerspec(ns: tuple[int, int]) -> bytes:
    left, interval = ns
    return struct.pack("<qqqq", interval // 10**9, interval % 10**9, left // 10**9, left % 10**9)


def _absolute_base(k: Kernel, timer: Timer) -> int:
    """What a TIMER_ABSTIME value counts from: the clock's start (CPU time counts from 0)."""
    if timer.kind != WALL:
        return 0
    return k.clock.realtime_start if timer.realtime else k.clock.monotonic_start


def sys_timer_settime(k: Kernel, ident: int, flags: int, new: int, old: int, *_: int) -> int:
    timer = _posix_timer(k, ident)
    isec, insec, vsec, vnsec = struct.unpack("<qqqq", k.mem.read_user(new, 32))
    if min(isec, insec, vsec, vnsec) < 0 or insec >= 10**9 or vnsec >= 10**9:
        raise SyscallError(errno.EINVAL)
    if old:
        k.mem.write_user(old, _itimerspec(_left(k, timer)))
    base = _absolute_base(k, timer) if flags & 1 else None  # TIMER_ABSTIME
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
    k.clock.changed()
    return 0
