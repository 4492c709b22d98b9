"""futex(2): wait, wake, requeue, for the threads of one process (kernel/futex/).

Private and shared futexes are keyed the same way, by address: every waiter shares the one
address space. A waiting thread is put to sleep with its syscall already returning 0 (what a
wake gives it); a timeout or an interrupting signal rewrites that result before it runs again.
Timeouts count on the virtual clock: FUTEX_WAIT's is relative (CLOCK_MONOTONIC), FUTEX_WAIT_BITSET's
absolute on CLOCK_MONOTONIC, or CLOCK_REALTIME with FUTEX_CLOCK_REALTIME.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu.kernel.errno_ import SyscallError

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

FUTEX_WAIT, FUTEX_WAKE, FUTEX_REQUEUE, FUTEX_CMP_REQUEUE = 0, 1, 3, 4
FUTEX_WAIT_BITSET, FUTEX_WAKE_BITSET = 9, 10
FUTEX_PRIVATE_FLAG, FUTEX_CLOCK_REALTIME = 128, 256
FUTEX_CMD_MASK = 0x7F
FUTEX_BITSET_MATCH_ANY = 0xFFFFFFFF
INT_MAX = 0x7FFFFFFF


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


def sys_futex(k: Kernel, uaddr: int, op: int, val: int, timeout: int, uaddr2: int, val3: int) -> int:
    cmd = op & FUTEX_CMD_MASK
    if op & FUTEX_CLOCK_REALTIME and cmd != FUTEX_WAIT_BITSET:
        raise SyscallError(errno.ENOSYS)
    if uaddr % 4:
        raise SyscallError(errno.EINVAL)
    val &= 0xFFFFFFFF
    if cmd == FUTEX_WAIT:
        return futex_wait(k, uaddr, val, _deadline(k, timeout, absolute=False, realtime=False), FUTEX_BITSET_MATCH_ANY)
    if cmd == FUTEX_WAIT_BITSET:
        deadline = _deadline(k, timeout, absolute=True, realtime=bool(op & FUTEX_CLOCK_REALTIME))
        return futex_wait(k, uaddr, val, deadline, _bitset(val3))
    if cmd == FUTEX_WAKE:
        return futex_wake(k, uaddr, val, FUTEX_BITSET_MATCH_ANY)
    if cmd == FUTEX_WAKE_BITSET:
        return futex_wake(k, uaddr, val, _bitset(val3))
    if cmd in (FUTEX_REQUEUE, FUTEX_CMP_REQUEUE):
        if uaddr2 % 4:
            raise SyscallError(errno.EINVAL)
        expected = val3 & 0xFFFFFFFF if cmd == FUTEX_CMP_REQUEUE else None
        return futex_requeue(k, uaddr, uaddr2, val, timeout & 0xFFFFFFFF, expected)
    raise SyscallError(errno.ENOSYS)


def _bitset(val3: int) -> int:
    bitset = val3 & 0xFFFFFFFF
    if bitset == 0:
        raise SyscallError(errno.EINVAL)
    return bitset


def _deadline(k: Kernel, timeout: int, absolute: bool, realtime: bool) -> int | None:
    """The timeout as a point on the virtual clock's elapsed time; None: wait forever."""
    if not timeout:
        return None
    sec, nsec = struct.unpack("<qq", k.mem.read_user(timeout, 16))
    if sec < 0 or not 0 <= nsec < 10**9:
        raise SyscallError(errno.EINVAL)
    ns = sec * 10**9 + nsec
    if not absolute:
        return k.clock.elapsed + ns
    start = k.clock.realtime_start if realtime else k.clock.monotonic_start
    return ns - start


def load_word(k: Kernel, uaddr: int) -> int:
    (value,) = struct.unpack("<I", k.mem.read_user(uaddr, 4))
    return int(value)


def futex_wait(k: Kernel, uaddr: int, val: int, deadline: int | None, bitset: int) -> int:
    if load_word(k, uaddr) != val:
        raise SyscallError(errno.EAGAIN)
    if deadline is not None and deadline <= k.clock.elapsed:
        raise SyscallError(errno.ETIMEDOUT)
    k.sched.block(k.task, uaddr, bitset, deadline)
    k.sched.request_switch()
    return 0  # what the waker's FUTEX_WAKE makes it return


def futex_wake(k: Kernel, uaddr: int, count: int, bitset: int) -> int:
    woken = k.sched.waiters(uaddr, bitset)[: min(count, INT_MAX)]
    for task in woken:
        k.sched.wake(task)
    return len(woken)


def futex_requeue(k: Kernel, uaddr: int, uaddr2: int, wake: int, move: int, expected: int | None) -> int:
    """Wake up to ``wake`` waiters of uaddr and move up to ``move`` of the others to uaddr2."""
    if expected is not None and load_word(k, uaddr) != expected:
        raise SyscallError(errno.EAGAIN)
    waiters = k.sched.waiters(uaddr, FUTEX_BITSET_MATCH_ANY)
    woken = waiters[: min(wake, INT_MAX)]
    for task in woken:
        k.sched.wake(task)
    moved = waiters[len(woken): len(woken) + min(move, INT_MAX)]
    for task in moved:
        assert task.wait is not None
        k.sched.block(task, uaddr2, task.wait.bitset, task.wait.deadline)
    return len(woken) + len(moved)
