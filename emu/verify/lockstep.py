"""Lockstep: a probed run must look exactly like the unprobed one from outside.

Compared: stdout, stderr, exit status, and the syscall trace (the uprobe syscalls
335/336/462 never reach the log). Results of calls that return addresses (mmap,
mremap, brk) are compared as success or failure only: the kernel's own pages
([uprobes], trampolines) legitimately move where later mappings land.

With several threads the trace is compared thread by thread (a SyscallLog records which thread
made each call): a probe adds instructions (a trampoline's, an out-of-line step's), so the
scheduler's slices end elsewhere and the threads interleave differently, which is not a
difference the program can see. For the same reason the calls whose results are the
interleaving itself (futex contention, sched_yield) are left out of a threaded comparison; what
each thread computes still shows in its other calls, its output and the exit status.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from emu.kernel.sched import Scheduler

ADDRESS_RESULTS = frozenset({"mmap", "mremap", "brk"})
INTERLEAVING_RESULTS = frozenset({"futex", "sched_yield"})
Call = tuple[str, tuple[int, ...], int]
Trace = list[Call]


class SyscallLog(list[Call]):
    """A Kernel.syscall_log that also records the thread making each call (``tids``)."""

    def __init__(self, sched: Scheduler) -> None:
        super().__init__()
        self.sched = sched
        self.tids: list[int] = []

    def append(self, call: Call) -> None:
        super().append(call)
        self.tids.append(self.sched.current.tid)


@dataclass(frozen=True, slots=True)
class Observed:
    stdout: bytes
    stderr: bytes
    exit_status: int
    trace: Trace


def _norm(call: tuple[str, tuple[int, ...], int]) -> tuple[object, ...]:
    name, args, ret = call
    if name in ADDRESS_RESULTS:
        return (name, ret < 0 or ret >= 1 << 63)
    return (name, ret)


def first_divergence(reference: Observed, probed: Observed) -> str | None:
    """None if the runs agree; otherwise one line saying where they first differ."""
    differs = _trace_divergence(reference.trace, probed.trace)
    if differs is not None:
        return differs
    return _output_divergence(reference, probed)


def _trace_divergence(reference: Trace, probed: Trace) -> str | None:
    ref_threads, probed_threads = _by_thread(reference), _by_thread(probed)
    if ref_threads is None or probed_threads is None or len(ref_threads) == len(probed_threads) == 1:
        return _calls_divergence(reference, probed, "")
    if sorted(ref_threads) != sorted(probed_threads):
        return f"threads: unprobed {sorted(ref_threads)}, probed {sorted(probed_threads)}"
    for tid, calls in ref_threads.items():
        differs = _calls_divergence(_unscheduled(calls), _unscheduled(probed_threads[tid]), f"thread {tid}: ")
        if differs is not None:
            return differs
    return None


def _by_thread(trace: Trace) -> dict[int, Trace] | None:
    """The calls of each thread, in order; None for a log that did not record threads."""
    if not isinstance(trace, SyscallLog):
        return None
    threads: dict[int, Trace] = {}
    for tid, call in zip(trace.tids, trace, strict=True):
        threads.setdefault(tid, []).append(call)
    return threads


def _unscheduled(calls: Iterable[Call]) -> Trace:
    return [c for c in calls if c[0] not in INTERLEAVING_RESULTS]


def _calls_divergence(reference: Trace, probed: Trace, who: str) -> str | None:
    for i, (a, b) in enumerate(zip(reference, probed, strict=False)):
        if _norm(a) != _norm(b):
            return f"{who}syscall #{i + 1}: unprobed {a[0]} = {a[2]}, probed {b[0]} = {b[2]}"
    if len(reference) != len(probed):
        return f"{who}syscall count: unprobed {len(reference)}, probed {len(probed)}"
    return None


def _output_divergence(reference: Observed, probed: Observed) -> str | None:
    for name, want, got in (("stdout", reference.stdout, probed.stdout), ("stderr", reference.stderr, probed.stderr)):
        if want != got:
            at = next((i for i, (x, y) in enumerate(zip(want, got, strict=False)) if x != y), min(len(want), len(got)))
            return f"{name} differs at byte {at}: unprobed {want[at:at + 24]!r}, probed {got[at:at + 24]!r}"
    if reference.exit_status != probed.exit_status:
        return f"exit status: unprobed {reference.exit_status}, probed {probed.exit_status}"
    return None
