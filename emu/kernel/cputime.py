"""CPU-time clocks (kernel/time/posix-cpu-timers.c): the time a process has run, on the virtual clock's
rates (emu/kernel/clock.py), counted from when the guest first looked at the time.

A CPU clock id is CLOCK_PROCESS_CPUTIME_ID (2), CLOCK_THREAD_CPUTIME_ID (3), or the encoded form glibc
passes for them to timer_create and clock_getcpuclockid returns: a negative id holding the complemented
pid above bit 3, bit 2 set for a thread's clock, and in the low two bits what it counts (PROF: user and
system time, VIRT: user time, SCHED: both, as the scheduler sees it). A process's threads share its
instruction counter, so a thread's clock reads its process's time.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING

from emu.abi import signed32
from emu.kernel.clock import work_ns
from emu.kernel.errno_ import SyscallError

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

WALL, USER_CPU, ALL_CPU = 0, 1, 2  # what a clock or timer counts: the virtual clock, or the process's CPU time
CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID = 2, 3
CPUCLOCK_VIRT, CPUCLOCK_MAX = 1, 3  # the low two bits: PROF 0, VIRT 1, SCHED 2
CPUCLOCK_PERTHREAD = 4


def cpu_clock_kind(k: Kernel, clock: int) -> int | None:
    """USER_CPU or ALL_CPU for a CPU clock of this process, None for another clock; EINVAL for a CPU
    clock of a process or thread that is not this one, or with a bad low field."""
    clock = signed32(clock)
    if clock in (CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID):
        return ALL_CPU
    if clock >= 0:
        return None
    which, pid = clock & 3, ~(clock >> 3)
    ours = (k.ident.pid,) if not clock & CPUCLOCK_PERTHREAD else tuple(k.sched.tasks)
    if which == CPUCLOCK_MAX or pid not in (0, *ours):
        raise SyscallError(errno.EINVAL)
    return USER_CPU if which == CPUCLOCK_VIRT else ALL_CPU


def cpu_ns(k: Kernel, kind: int) -> int:
    """The process's CPU time, user only (USER_CPU) or user and system (ALL_CPU), in ns; reading it
    makes the clock count from now on."""
    k.clock.observe()
    user, total = k.clock.cpu_work(k.ident.pid)
    return work_ns(user if kind == USER_CPU else total)
