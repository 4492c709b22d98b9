"""Event descriptors: epoll, eventfd, timerfd, signalfd (fs/eventpoll.c, eventfd.c, timerfd.c, signalfd.c).

epoll is level-triggered over poll.poll_mask of each registered file; EPOLLET is reported as
level-triggered (a program that reads until EAGAIN, as edge-triggered ones must, sees the same
events), EPOLLONESHOT disables the registration after one report. Timers run on the virtual
clock, which the instructions run move on too: a busy process finds its timer expired when it next reads
or polls it, and a wait for one makes time jump to its expiry when nothing else can run.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu import abi
from emu.abi import signed32
from emu.kernel.blocking import notify, wait
from emu.kernel.errno_ import SyscallError
from emu.kernel.files import HostFile, MemFile, OpenFile, StatInfo, SyntheticDir, synthetic_stat
from emu.kernel.fs.fdtable import FdEntry
from emu.kernel.poll import finish, poll_mask, read_timeout
from emu.kernel.signal import SI_TIMER, UNBLOCKABLE, timer_signal_taken

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

EPOLL_CTL_ADD, EPOLL_CTL_DEL, EPOLL_CTL_MOD = 1, 2, 3
EPOLLIN, EPOLLOUT, EPOLLERR, EPOLLHUP = 0x1, 0x4, 0x8, 0x10
EPOLLEXCLUSIVE, EPOLLWAKEUP, EPOLLONESHOT, EPOLLET = 1 << 28, 1 << 29, 1 << 30, 1 << 31
EPOLL_CLOEXEC = 0o2000000
EPOLL_EVENT = struct.Struct("<IQ")  # struct epoll_event is packed on x86-64: 12 bytes
EP_MAX_EVENTS = 0x7FFFFFFF // EPOLL_EVENT.size
EFD_SEMAPHORE, EFD_NONBLOCK, EFD_CLOEXEC = 1, 0o4000, 0o2000000
EVENTFD_MAX = (1 << 64) - 2
TFD_TIMER_ABSTIME, TFD_TIMER_CANCEL_ON_SET = 1, 2
TFD_NONBLOCK, TFD_CLOEXEC = 0o4000, 0o2000000
CLOCK_REALTIME, CLOCK_MONOTONIC, CLOCK_BOOTTIME = 0, 1, 7
ANON_MODE = 0o600


def _anon(k: Kernel, name: str) -> tuple[int, str]:
    k.next_inode += 1
    return k.next_inode, f"anon_inode:{name}"


def _flags(nonblock: bool) -> int:
    return abi.O_RDWR | (abi.O_NONBLOCK if nonblock else 0)


# ---------------------------------------------------------------------------- epoll
@dataclass(eq=False)
class Interest:
    fd: int
    file: OpenFile
    events: int
    data: int
    armed: bool = True  # EPOLLONESHOT: off after one report until EPOLL_CTL_MOD


class Epoll(OpenFile):
    def __init__(self, ino: int, path: str, k: Kernel) -> None:
        self.ino, self.guest_path = ino, path
        self.kernel = k  # whose descriptor numbers the registrations name
        self.interest: dict[tuple[int, int], Interest] = {}  # (fd, id(file)) -> registration

    def stat(self) -> StatInfo:
        return synthetic_stat(ANON_MODE, ino=self.ino)

    def ready(self, k: Kernel) -> list[tuple[Interest, int]]:
        out = []
        for item in list(self.interest.values()):
            entry = k.files.entries.get(item.fd)
            if entry is None or entry.file is not item.file:
                if getattr(item.file, "closed", False):
                    del self.interest[(item.fd, id(item.file))]  # ep_remove on the last close
                continue
            if not item.armed:
                continue
            got = poll_mask(item.file) & (item.events | EPOLLERR | EPOLLHUP)
            if got:
                out.append((item, got))
        return out

    def poll_mask(self) -> int:
        return EPOLLIN if self.ready(self.kernel) else 0


def sys_epoll_create1(k: Kernel, flags: int, *_: int) -> int:
    if flags & ~EPOLL_CLOEXEC:
        raise SyscallError(errno.EINVAL)
    ino, path = _anon(k, "[eventpoll]")
    return k.files.install(FdEntry(Epoll(ino, path, k), abi.O_RDWR, bool(flags & EPOLL_CLOEXEC)))


def sys_epoll_create(k: Kernel, size: int, *_: int) -> int:
    if signed32(size) <= 0:
        raise SyscallError(errno.EINVAL)
    return sys_epoll_create1(k, 0)


def _epoll(k: Kernel, epfd: int) -> Epoll:
    file = k.files.get(signed32(epfd)).file
    if not isinstance(file, Epoll):
        raise SyscallError(errno.EINVAL)
    return file


def sys_epoll_ctl(k: Kernel, epfd: int, op: int, fd: int, event: int, *_: int) -> int:
    ep = _epoll(k, epfd)
    fd = signed32(fd)
    target = k.files.get(fd).file
    if target is ep:
        raise SyscallError(errno.EINVAL)
    if isinstance(target, HostFile | MemFile | SyntheticDir):
        raise SyscallError(errno.EPERM)  # regular files and directories have no f_op->poll
    key = (fd, id(target))
    if op == EPOLL_CTL_DEL:
        if ep.interest.pop(key, None) is None:
            raise SyscallError(errno.ENOENT)
        return 0
    if op not in (EPOLL_CTL_ADD, EPOLL_CTL_MOD):
        raise SyscallError(errno.EINVAL)
    events, data = EPOLL_EVENT.unpack(k.mem.read_user(event, EPOLL_EVENT.size))
    if op == EPOLL_CTL_ADD:
        if key in ep.interest:
            raise SyscallError(errno.EEXIST)
        ep.interest[key] = Interest(fd, target, events, data)
        return 0
    item = ep.interest.get(key)
    if item is None:
        raise SyscallError(errno.ENOENT)
    if events & EPOLLEXCLUSIVE or item.events & EPOLLEXCLUSIVE:
        raise SyscallError(errno.EINVAL)
    item.events, item.data, item.armed = events, data, True
    return 0


def _epoll_wait(k: Kernel, epfd: int, events: int, maxevents: int, timeout_ns: int | None) -> int:
    ep = _epoll(k, epfd)
    maxevents = signed32(maxevents)
    if not 0 < maxevents <= EP_MAX_EVENTS:
        raise SyscallError(errno.EINVAL)
    k.mem.check_user(events, maxevents * EPOLL_EVENT.size, abi.Prot.WRITE)
    ready = ep.ready(k)[:maxevents]
    for i, (item, got) in enumerate(ready):
        k.mem.write_user(events + i * EPOLL_EVENT.size, EPOLL_EVENT.pack(got, item.data))
        if item.events & EPOLLONESHOT:
            item.armed = False
    return finish(k, len(ready), timeout_ns, [item.file for item in ep.interest.values()], "epoll_wait")


def _ms(timeout: int) -> int | None:
    timeout = signed32(timeout)
    return None if timeout < 0 else timeout * 10**6


def sys_epoll_wait(k: Kernel, epfd: int, events: int, maxevents: int, timeout: int, *_: int) -> int:
    return _epoll_wait(k, epfd, events, maxevents, _ms(timeout))


def sys_epoll_pwait(k: Kernel, epfd: int, events: int, maxevents: int, timeout: int, sigmask: int,
                    size: int, *_: int) -> int:
    if sigmask and size != 8:
        raise SyscallError(errno.EINVAL)
    return _epoll_wait(k, epfd, events, maxevents, _ms(timeout))


def sys_epoll_pwait2(k: Kernel, epfd: int, events: int, maxevents: int, ts: int, sigmask: int,
                     size: int, *_: int) -> int:
    if sigmask and size != 8:
        raise SyscallError(errno.EINVAL)
    return _epoll_wait(k, epfd, events, maxevents, read_timeout(k, ts))


# ---------------------------------------------------------------------------- eventfd
class EventFd(OpenFile):
    def __init__(self, ino: int, path: str, count: int, semaphore: bool) -> None:
        self.ino, self.guest_path = ino, path
        self.count = count
        self.semaphore = semaphore

    def stat(self) -> StatInfo:
        return synthetic_stat(ANON_MODE, ino=self.ino)

    def poll_mask(self) -> int:
        return (EPOLLIN if self.count else 0) | (EPOLLOUT if self.count < EVENTFD_MAX else 0)

    def k_read(self, k: Kernel, entry: FdEntry, size: int) -> bytes:
        if size < 8:
            raise SyscallError(errno.EINVAL)
        if not self.count:
            wait(k, entry, f"read of a zero {self.guest_path}", (self,))
        value = 1 if self.semaphore else self.count
        self.count -= value
        notify(k, self)
        return struct.pack("<Q", value)

    def k_write(self, k: Kernel, entry: FdEntry, data: bytes) -> int:
        if len(data) < 8:
            raise SyscallError(errno.EINVAL)
        (value,) = struct.unpack_from("<Q", data)
        if value == (1 << 64) - 1:
            raise SyscallError(errno.EINVAL)
        if self.count + value > EVENTFD_MAX:
            wait(k, entry, f"write to a full {self.guest_path}", (self,))
        self.count += value
        notify(k, self)
        return 8


def sys_eventfd2(k: Kernel, initval: int, flags: int, *_: int) -> int:
    if flags & ~(EFD_SEMAPHORE | EFD_NONBLOCK | EFD_CLOEXEC):
        raise SyscallError(errno.EINVAL)
    ino, path = _anon(k, "[eventfd]")
    efd = EventFd(ino, path, initval & 0xFFFFFFFF, bool(flags & EFD_SEMAPHORE))
    return k.files.install(FdEntry(efd, _flags(bool(flags & EFD_NONBLOCK)), bool(flags & EFD_CLOEXEC)))


def sys_eventfd(k: Kernel, initval: int, *_: int) -> int:
    return sys_eventfd2(k, initval, 0)


# ---------------------------------------------------------------------------- timerfd
class TimerFd(OpenFile):
    """Expiry and interval in virtual nanoseconds since the run began (clock.elapsed)."""

    def __init__(self, ino: int, path: str, clock_id: int, k: Kernel) -> None:
        self.ino, self.guest_path = ino, path
        self.clock_id = clock_id
        self.kernel = k
        self.expiry: int | None = None
        self.interval = 0
        self.ticks = 0

    def stat(self) -> StatInfo:
        return synthetic_stat(ANON_MODE, ino=self.ino)

    def _collect(self) -> None:
        now = self.kernel.clock.elapsed
        if self.expiry is None or now < self.expiry:
            return
        if self.interval:
            periods = (now - self.expiry) // self.interval + 1
            self.ticks += periods
            self.expiry += periods * self.interval
        else:
            self.ticks += 1
            self.expiry = None

    def deadline(self) -> int | None:
        return None if self.ticks else self.expiry

    def poll_mask(self) -> int:
        self._collect()
        return EPOLLIN if self.ticks else 0

    def k_read(self, k: Kernel, entry: FdEntry, size: int) -> bytes:
        if size < 8:
            raise SyscallError(errno.EINVAL)
        self._collect()
        if not self.ticks:
            if self.expiry is None and not entry.flags & abi.O_NONBLOCK:
                wait(k, entry, f"read of a disarmed {self.guest_path}", (self,))
            wait(k, entry, f"read of {self.guest_path}", (self,), self.expiry)
        ticks, self.ticks = self.ticks, 0
        return struct.pack("<Q", ticks)

    def base(self) -> int:
        clock = self.kernel.clock
        return clock.realtime_start if self.clock_id == CLOCK_REALTIME else clock.monotonic_start


def _itimerspec(value: tuple[int, int, int, int]) -> tuple[int, int]:
    isec, insec, vsec, vnsec = value
    if isec < 0 or vsec < 0 or not (0 <= insec < 10**9 and 0 <= vnsec < 10**9):
        raise SyscallError(errno.EINVAL)
    return isec * 10**9 + insec, vsec * 10**9 + vnsec


def _timerfd(k: Kernel, fd: int) -> TimerFd:
    file = k.files.get(signed32(fd)).file
    if not isinstance(file, TimerFd):
        raise SyscallError(errno.EINVAL)
    return file


def sys_timerfd_create(k: Kernel, clock_id: int, flags: int, *_: int) -> int:
    if clock_id not in (CLOCK_REALTIME, CLOCK_MONOTONIC, CLOCK_BOOTTIME, 8, 9):
        raise SyscallError(errno.EINVAL)
    if flags & ~(TFD_NONBLOCK | TFD_CLOEXEC):
        raise SyscallError(errno.EINVAL)
    ino, path = _anon(k, "[timerfd]")
    timer = TimerFd(ino, path, clock_id, k)
    return k.files.install(FdEntry(timer, _flags(bool(flags & TFD_NONBLOCK)), bool(flags & TFD_CLOEXEC)))


def _current(timer: TimerFd) -> bytes:
    timer._collect()
    now = timer.kernel.clock.elapsed
    left = max(0, timer.expiry - now) if timer.expiry is not None else 0
    i = timer.interval
    return struct.pack("<qqqq", i // 10**9, i % 10**9, left // 10**9, left % 10**9)


def sys_timerfd_settime(k: Kernel, fd: int, flags: int, new: int, old: int, *_: int) -> int:
    timer = _timerfd(k, fd)
    if flags & ~(TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET):
        raise SyscallError(errno.EINVAL)
    interval, value = _itimerspec(struct.unpack("<qqqq", k.mem.read_user(new, 32)))
    if old:
        k.mem.write_user(old, _current(timer))
    timer.ticks, timer.interval = 0, interval
    if value:
        k.clock.observe()  # it expires by the clock: from here on the instructions run count
    if value == 0:
        timer.expiry = None
    elif flags & TFD_TIMER_ABSTIME:
        timer.expiry = max(0, value - timer.base())
    else:
        timer.expiry = k.clock.elapsed + value
    notify(k, timer)
    return 0


def sys_timerfd_gettime(k: Kernel, fd: int, cur: int, *_: int) -> int:
    k.mem.write_user(cur, _current(_timerfd(k, fd)))
    return 0


# ---------------------------------------------------------------------------- signalfd
SFD_NONBLOCK, SFD_CLOEXEC = 0o4000, 0o2000000
SIGNALFD_SIGINFO_SIZE = 128


class SignalFd(OpenFile):
    """Reads take the pending signals of ``mask`` (blocked, as signalfd(2) wants them) of the reader."""

    def __init__(self, ino: int, path: str, mask: int, k: Kernel) -> None:
        self.ino, self.guest_path = ino, path
        self.mask = mask
        self.kernel = k

    def stat(self) -> StatInfo:
        return synthetic_stat(ANON_MODE, ino=self.ino)

    def poll_mask(self) -> int:
        return EPOLLIN if self.kernel.signals.pending & self.mask else 0

    @property
    def wait_key(self) -> object:
        return self.kernel  # FamilyOf.signal wakes the process it signals

    def k_read(self, k: Kernel, entry: FdEntry, size: int) -> bytes:
        if size < SIGNALFD_SIGINFO_SIZE:
            raise SyscallError(errno.EINVAL)
        state = k.signals
        out = b""
        while len(out) + SIGNALFD_SIGINFO_SIZE <= size:
            ready = state.pending & self.mask
            if not ready:
                break
            signo = (ready & -ready).bit_length()
            state.pending &= ~(1 << (signo - 1))
            code = state.pending_code.pop(signo, 0)
            if code == SI_TIMER:
                timer_signal_taken(k, signo)
            out += struct.pack("<IiiII", signo, 0, code, k.ident.pid, k.ident.uid).ljust(SIGNALFD_SIGINFO_SIZE, b"\0")
        if not out:
            wait(k, entry, f"read of {self.guest_path}", (k,))
        return out


def sys_signalfd4(k: Kernel, fd: int, mask_addr: int, size: int, flags: int, *_: int) -> int:
    if size != 8 or flags & ~(SFD_NONBLOCK | SFD_CLOEXEC):
        raise SyscallError(errno.EINVAL)
    (mask,) = struct.unpack("<Q", k.mem.read_user(mask_addr, 8))
    mask &= ~UNBLOCKABLE
    fd = signed32(fd)
    if fd != -1:
        file = k.files.get(fd).file
        if not isinstance(file, SignalFd):
            raise SyscallError(errno.EINVAL)
        file.mask = mask
        return fd
    ino, path = _anon(k, "[signalfd]")
    sfd = SignalFd(ino, path, mask, k)
    return k.files.install(FdEntry(sfd, _flags(bool(flags & SFD_NONBLOCK)), bool(flags & SFD_CLOEXEC)))


def sys_signalfd(k: Kernel, fd: int, mask_addr: int, size: int, *_: int) -> int:
    return sys_signalfd4(k, fd, mask_addr, size, 0)
