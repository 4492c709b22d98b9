"""futex(2): wait, wake, requeue, for the threads of one process (kernel/futex/).

Private futexes are keyed by address: every waiter shares the one address space. A shared one
(no FUTEX_PRIVATE_FLAG) on a MAP_SHARED page while other processes live is keyed by the host
page and offset, which all processes mapping it share: its waiter waits as for a pipe (the
machine restarts the call once another process has run), and a FUTEX_WAKE from any process
counts on the page, which ends the waits begun before it. A waiting thread is put to sleep with
its syscall already returning 0 (what a wake gives it); a timeout or an interrupting signal
rewrites that result before it runs again.
Timeouts count on the virtual clock: FUTEX_WAIT's is relative (CLOCK_MONOTONIC), FUTEX_WAIT_BITSET's
absolute on CLOCK_MONOTONIC, or CLOCK_REALTIME with FUTEX_CLOCK_REALTIME.
"""

from __future__ import annotations

import errno
import struct
from typing import TYPE_CHECKING

from emu.kernel.errno_ import SyscallError
from emu.kernel.exits import WouldBlock

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel
    from emu.process.vma import SharedPages

FUTEX_WAIT, FUTEX_WAKE, FUTEX_REQUEUE, FUTEX_CMP_REQUEUE = 0, 1, 3, 4
FUTEX_WAIT_BITSET, FUTEX_WAKE_BITSET = 9, 10
FUTEX_PRIVATE_FLAG, FUTEX_CLOCK_REALTIME = 128, 256
FUTEX_CMD_MASK = 0x7F
FUTEX_BITSET_MATCH_ANY = 0xFFFFFFFF
INT_MAX = 0x7FFFFFFF


def sys_futex(k: Kernel, uaddr: int, op: int, val: int, timeout: int, uaddr2: int, val3: int) -> int:
    cmd = op & FUTEX_CMD_MASK
    if op & FUTEX_CLOCK_REALTIME and cmd != FUTEX_WAIT_BITSET:
        raise SyscallError(errno.ENOSYS)
    if uaddr % 4:
        raise SyscallError(errno.EINVAL)
    val &= 0xFFFFFFFF
    if not op & FUTEX_PRIVATE_FLAG and cmd in (FUTEX_WAIT, FUTEX_WAIT_BITSET, FUTEX_WAKE, FUTEX_WAKE_BITSET):
        shared = _shared_word(k, uaddr)
        if shared is not None:
            realtime, absolute = bool(op & FUTEX_CLOCK_REALTIME), cmd == FUTEX_WAIT_BITSET
            if cmd in (FUTEX_WAKE, FUTEX_WAKE_BITSET):
                return _shared_wake(k, shared, uaddr, val, _bitset(val3) if cmd == FUTEX_WAKE_BITSET else ~0)
            deadline = _deadline(k, timeout, absolute=absolute, realtime=realtime)
            return _shared_wait(k, shared, uaddr, val, deadline)
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
    ns: int = sec * 10**9 + nsec
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


def _shared_word(k: Kernel, uaddr: int) -> tuple[SharedPages, int] | None:
    """The host page and offset of a futex word other live processes may wait on; None: a local one."""
    if k.family is None or not k.family.has_others(k.ident.pid):
        return None
    return k.mem.backing_at(uaddr)


def _shared_wait(k: Kernel, shared: tuple[SharedPages, int], uaddr: int, val: int, deadline: int | None) -> int:
    pages, offset = shared
    wakes = pages.wakes.get(offset, 0)
    seen, k.task.shared_wait = k.task.shared_wait, None
    if seen is not None and seen[0] is pages and seen[1] == offset and wakes > seen[2]:
        return 0  # a FUTEX_WAKE came while it waited
    if load_word(k, uaddr) != val:
        raise SyscallError(errno.EAGAIN)
    if deadline is not None and deadline <= k.clock.elapsed:
        raise SyscallError(errno.ETIMEDOUT)
    k.task.shared_wait = (pages, offset, seen[2] if seen is not None and seen[0] is pages and seen[1] == offset
                          else wakes)
    raise WouldBlock(f"shared futex {uaddr:#x}", on=(pages,), until=deadline)


def _shared_wake(k: Kernel, shared: tuple[SharedPages, int], uaddr: int, count: int, bitset: int) -> int:
    """Wake this process's own sleepers of the word, and end the other processes' waits on it."""
    pages, offset = shared
    woken = futex_wake(k, uaddr, count, bitset & FUTEX_BITSET_MATCH_ANY)
    if woken < count:
        pages.wakes[offset] = pages.wakes.get(offset, 0) + 1
        assert k.family is not None
        if k.family.notify(k.ident.pid, pages):
            woken += 1
    return woken
