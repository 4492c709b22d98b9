"""Resource limits over the whole run: how many tasks, how much guest memory.

Linux refuses a fork or clone past RLIMIT_NPROC with EAGAIN, and a mapping or a fork the memory
cannot back with ENOMEM. Here each process is a host CPU and memory of its own, so the guest's
memory is also what the tool itself uses: ``KernelConfig.memory_limit`` caps the bytes mapped by
every live process of the run together, plus a fixed cost per process for the host CPU behind it.
The task limit applies to uid 0 too (the sandbox grants no CAP_SYS_RESOURCE).
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import TYPE_CHECKING

from emu.kernel.errno_ import SyscallError

# the run's default cap (state.py, beside the other defaults a Kernel starts from), named here as before

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel
    from emu.process.memory import Memory

RLIMIT_NPROC = 6
PROCESS_COST = 8 << 20  # a process's host CPU, translation cache and kernel state, charged as memory


def _live_kernels(k: Kernel) -> Iterator[Kernel]:
    """Every running process's kernel in the run (just this one outside a machine)."""
    if k.family is None:
        yield k
        return
    seen = False
    for entry in k.family.procs.values():
        other = getattr(entry.process, "kernel", None)
        if entry.status is None and other is not None:
            seen |= other is k
            yield other
    if not seen:
        yield k  # not registered yet (a machine still being built)


def mapped_bytes(mem: Memory) -> int:
    return sum(vma.size for vma in mem.overlapping(0, 1 << 64))


def memory_in_use(k: Kernel) -> int:
    return sum(mapped_bytes(other.mem) + PROCESS_COST for other in _live_kernels(k))


def charge_memory(k: Kernel, extra: int) -> None:
    """ENOMEM if ``extra`` more bytes would take the run past its memory limit."""
    limit = k.config.memory_limit
    if limit is not None and memory_in_use(k) + extra > limit:
        raise SyscallError(errno.ENOMEM)


def charge_task(k: Kernel, new_process: bool) -> None:
    """fork/clone: EAGAIN past RLIMIT_NPROC (tasks of the whole run), ENOMEM when a new process's
    copy of memory would not fit."""
    tasks = sum(len(other.sched.live()) for other in _live_kernels(k))
    if tasks >= k.rlimits[RLIMIT_NPROC][0]:
        raise SyscallError(errno.EAGAIN)
    if new_process:
        charge_memory(k, mapped_bytes(k.mem) + PROCESS_COST)
