"""The records the Kernel object and its tasks hold, apart from the syscall handlers that change them.

dispatch.py builds a Kernel from these and tasks.py a Task, importing no handler module (the handlers
import dispatch.py for its Kernel type: were these beside them, each would import the other).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from emu.kernel.altstack import DISABLED, AltStack
from emu.kernel.uprobes.consumers import Consumer

SIG_DFL, SIG_IGN = 0, 1
RLIM_INFINITY = (1 << 64) - 1
DEFAULT_FRACTION = 8  # the default memory limit: this fraction of the host's RAM
FALLBACK_LIMIT = 2 << 30


# ---------------------------------------------------------------------------- the run's defaults
def default_memory_limit(meminfo: str = "/proc/meminfo") -> int:
    """An eighth of the host's RAM (2 GiB where /proc/meminfo cannot say)."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 // DEFAULT_FRACTION
    except (OSError, ValueError, IndexError):
        pass
    return FALLBACK_LIMIT


FALLBACK_RLIMITS = {  # where the host cannot say (no resource module)
    0: (RLIM_INFINITY, RLIM_INFINITY),  # CPU
    1: (RLIM_INFINITY, RLIM_INFINITY),  # FSIZE
    2: (RLIM_INFINITY, RLIM_INFINITY),  # DATA
    3: (8 << 20, RLIM_INFINITY),  # STACK
    4: (0, RLIM_INFINITY),  # CORE
    5: (RLIM_INFINITY, RLIM_INFINITY),  # RSS
    6: (63432, 63432),  # NPROC
    7: (1024, 1048576),  # NOFILE
    8: (8 << 20, 8 << 20),  # MEMLOCK
    9: (RLIM_INFINITY, RLIM_INFINITY),  # AS
    10: (RLIM_INFINITY, RLIM_INFINITY),  # LOCKS
    11: (63432, 63432),  # SIGPENDING
    12: (819200, 819200),  # MSGQUEUE
    13: (0, 0),  # NICE
    14: (0, 0),  # RTPRIO
    15: (RLIM_INFINITY, RLIM_INFINITY),  # RTTIME
}
RLIMIT_STACK = 3


def host_rlimits() -> dict[int, tuple[int, int]]:
    """The limits a native child of the harness would inherit, so `ulimit -a` prints the same:
    getrlimit of this process for each resource, but RLIMIT_STACK, which stays the table's 8 MiB:
    the layout (mmap base, stack growth) is computed from it."""
    try:
        import resource
    except ImportError:
        return dict(FALLBACK_RLIMITS)

    def unbounded(value: int) -> int:
        return RLIM_INFINITY if value == resource.RLIM_INFINITY else value

    limits = dict(FALLBACK_RLIMITS)
    for which in limits:
        if which != RLIMIT_STACK:
            soft, hard = resource.getrlimit(which)
            limits[which] = (unbounded(soft), unbounded(hard))
    return limits


# ---------------------------------------------------------------------------- memory (mm.py)
@dataclass
class Brk:
    """The program break: where the heap starts (after the loaded image) and where it ends now."""

    start: int
    current: int


# ---------------------------------------------------------------------------- signals (signal.py, procsig.py)
@dataclass
class SignalState:
    actions: dict[int, bytes] = field(default_factory=dict)  # signo -> struct kernel_sigaction (32 bytes)
    mask: int = 0
    pending: int = 0
    altstack: AltStack = DISABLED  # per thread (altstack.py)
    pending_code: dict[int, int] = field(default_factory=dict)  # signo -> si_code of the pending instance

    def handler(self, signo: int) -> int:
        raw = self.actions.get(signo)
        return struct.unpack_from("<Q", raw)[0] if raw else SIG_DFL


@dataclass
class Timer:
    signo: int
    expiry: int | None = None  # virtual ns (clock.elapsed); None: disarmed
    interval: int = 0
    overrun: int = 0  # expiries the signal delivered last stood for (timer_getoverrun)
    realtime: bool = False  # CLOCK_REALTIME: TIMER_ABSTIME values are wall-clock times
    kind: int = 0  # what it counts (cputime.py): WALL, the virtual clock; USER_CPU or ALL_CPU, the process's CPU time
    overrun_pending: int = 0  # expiries since its signal was sent, not yet delivered


# ---------------------------------------------------------------------------- threads (threads.py, futex.py)
@dataclass(frozen=True, slots=True)
class CloneArgs:
    flags: int
    child_tid: int
    parent_tid: int
    exit_signal: int
    stack: int  # the child's initial rsp; 0: the caller's
    tls: int


@dataclass(frozen=True, slots=True)
class FutexWait:
    """Why a task sleeps: a futex word, the FUTEX_WAIT_BITSET mask, and when it gives up."""

    uaddr: int
    bitset: int
    deadline: int | None  # in the virtual clock's elapsed nanoseconds; None: no timeout
    seq: int  # wake order: first come, first woken

    def describe(self) -> str:
        timeout = "" if self.deadline is None else " with a timeout"
        return f"futex {self.uaddr:#x}{timeout}"


# ---------------------------------------------------------------------------- file locks (locks.py)
FileKey = tuple[int, int]  # (st_dev, st_ino)


@dataclass(frozen=True, slots=True)
class RangeLock:
    owner: int  # a pid (POSIX) or the id of an open description (OFD)
    write: bool
    start: int
    end: int  # exclusive
    pid: int  # what F_GETLK reports (-1 for OFD locks)


@dataclass
class LockTable:
    ranges: dict[FileKey, list[RangeLock]] = field(default_factory=dict)
    flocks: dict[FileKey, dict[int, bool]] = field(default_factory=dict)  # description id -> exclusive

    def conflict(self, key: FileKey, owner: int, write: bool, start: int, end: int) -> RangeLock | None:
        for lock in self.ranges.get(key, ()):
            if lock.owner != owner and lock.start < end and start < lock.end and (write or lock.write):
                return lock
        return None

    def set(self, key: FileKey, new: RangeLock, unlock: bool) -> None:
        """The owner's locks over [start, end) are replaced (split where they stick out)."""
        kept: list[RangeLock] = []
        for lock in self.ranges.get(key, ()):
            if lock.owner != new.owner or lock.end <= new.start or new.end <= lock.start:
                kept.append(lock)
                continue
            if lock.start < new.start:
                kept.append(RangeLock(lock.owner, lock.write, lock.start, new.start, lock.pid))
            if new.end < lock.end:
                kept.append(RangeLock(lock.owner, lock.write, new.end, lock.end, lock.pid))
        if not unlock:
            kept.append(new)
        self.ranges[key] = kept


# ---------------------------------------------------------------------------- perf events (perf.py)
# (guest path, file offset, return probe, ref_ctr offset, consumer) -> detach
PerfAttach = Callable[[str, int, bool, int, Consumer], Callable[[], None]]
