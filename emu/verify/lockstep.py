"""Lockstep: a probed run must look exactly like the unprobed one from outside.

Compared: stdout, stderr, exit status, and the syscall trace (the uprobe syscalls
335/336/462 never reach the log): each call's name, result, arguments (as many as the call
takes) and every byte it writes to a file, pipe or socket (write, pwrite64, writev, pwritev,
sendto). Results of calls that return addresses (mmap, mremap, brk) are compared as success
or failure only, and an argument that points into a mapping as that mapping's name and the
offset into it (from its end for ``[stack]``, which grows down): the kernel's own pages
([uprobes], trampolines) legitimately move where later mappings land.

With several threads the trace is compared thread by thread (a SyscallLog records which thread
made each call): a probe adds instructions (a trampoline's, an out-of-line step's), so the
scheduler's slices end elsewhere and the threads interleave differently, which is not a
difference the program can see. For the same reason the calls whose results are the
interleaving itself (futex contention, sched_yield) are left out of a threaded comparison; what
each thread computes still shows in its other calls, its output and the exit status.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from emu.kernel.sched import Scheduler
    from emu.memory import Memory

ADDRESS_RESULTS = frozenset({"mmap", "mremap", "brk"})
INTERLEAVING_RESULTS = frozenset({"futex", "sched_yield"})
Call = tuple[str, tuple[int, ...], int]
Trace = list[Call]
View = tuple[object, ...]  # a call as compared: its arguments made layout-independent, the bytes it wrote
BUFFER_WRITES = frozenset({"write", "pwrite64", "sendto"})  # (fd, buf, count, ...)
VECTOR_WRITES = frozenset({"writev", "pwritev", "pwritev2"})  # (fd, iov, iovcnt, ...)
MAX_KEPT = 1 << 20  # bytes of one call kept for the comparison
_IOVEC = struct.Struct("<QQ")


class SyscallLog(list[Call]):
    """A Kernel.syscall_log that also records the thread making each call (``tids``) and, given
    the memory and each call's arity, what the comparison looks at (``views``)."""

    def __init__(self, sched: Scheduler, mem: Memory | None = None, arity: Callable[[str], int] | None = None) -> None:
        super().__init__()
        self.sched = sched
        self.mem = mem
        self.arity = arity
        self.tids: list[int] = []
        self.views: list[View] = []

    def append(self, call: Call) -> None:
        super().append(call)
        self.tids.append(self.sched.current.tid)
        if self.mem is not None and self.arity is not None:
            self.views.append(self._view(call))

    def _view(self, call: Call) -> View:
        name, args, ret = call
        assert self.mem is not None and self.arity is not None
        shown = tuple(self._where(a) for a in args[: self.arity(name)])
        return shown, self._written(name, args, ret)

    def _where(self, value: int) -> object:
        """An argument as compared: a pointer into a mapping as (its name, the offset), else itself."""
        assert self.mem is not None
        vma = self.mem.find(value) if 0 < value < 1 << 47 else None
        if vma is None:
            return value
        return (vma.name, value - vma.end) if vma.name == "[stack]" else (vma.name, value - vma.start)

    def _written(self, name: str, args: tuple[int, ...], ret: int) -> bytes:
        """The bytes a write-like call wrote (its result says how many)."""
        assert self.mem is not None
        if ret <= 0 or (name not in BUFFER_WRITES and name not in VECTOR_WRITES):
            return b""
        try:
            if name in BUFFER_WRITES:
                return self.mem.read(args[1], min(ret, MAX_KEPT))
            out = b""
            for i in range(min(args[2], 1024)):
                base, size = _IOVEC.unpack(self.mem.read(args[1] + 16 * i, 16))
                out += self.mem.read(base, min(size, ret - len(out), MAX_KEPT))
                if len(out) >= min(ret, MAX_KEPT):
                    break
            return out
        except Exception:  # the buffer is gone: compared by the call's other fields
            return b"?"


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


def _views(trace: Trace) -> list[View] | None:
    return trace.views if isinstance(trace, SyscallLog) and len(trace.views) == len(trace) else None


def first_divergence(reference: Observed, probed: Observed) -> str | None:
    """None if the runs agree; otherwise one line saying where they first differ."""
    differs = _trace_divergence(reference.trace, probed.trace)
    if differs is not None:
        return differs
    return _output_divergence(reference, probed)


def _trace_divergence(reference: Trace, probed: Trace) -> str | None:
    ref_threads, probed_threads = _by_thread(reference), _by_thread(probed)
    if ref_threads is None or probed_threads is None or len(ref_threads) == len(probed_threads) == 1:
        return _calls_divergence(reference, probed, "", _views(reference), _views(probed))
    if sorted(ref_threads) != sorted(probed_threads):
        return f"threads: unprobed {sorted(ref_threads)}, probed {sorted(probed_threads)}"
    for tid, calls in ref_threads.items():
        want, got = _unscheduled(calls), _unscheduled(probed_threads[tid])
        differs = _calls_divergence([c for c, _ in want], [c for c, _ in got], f"thread {tid}: ",
                                    *_thread_views(want, got))
        if differs is not None:
            return differs
    return None


def _thread_views(want: list[tuple[Call, View | None]],
                  got: list[tuple[Call, View | None]]) -> tuple[list[View] | None, list[View] | None]:
    """The views of one thread's calls in both runs, if both logs recorded them."""
    if any(v is None for _, v in want) or any(v is None for _, v in got):
        return None, None
    return [v for _, v in want if v is not None], [v for _, v in got if v is not None]


def _by_thread(trace: Trace) -> dict[int, list[tuple[Call, View | None]]] | None:
    """The calls of each thread, in order, each with its view (None: not recorded); None for a log
    that did not record threads."""
    if not isinstance(trace, SyscallLog):
        return None
    views: list[View | None] = list(trace.views) if len(trace.views) == len(trace) else [None] * len(trace)
    threads: dict[int, list[tuple[Call, View | None]]] = {}
    for tid, call, view in zip(trace.tids, trace, views, strict=True):
        threads.setdefault(tid, []).append((call, view))
    return threads


def _unscheduled(calls: Iterable[tuple[Call, View | None]]) -> list[tuple[Call, View | None]]:
    return [(c, v) for c, v in calls if c[0] not in INTERLEAVING_RESULTS]


def _calls_divergence(reference: Trace, probed: Trace, who: str, ref_views: list[View] | None = None,
                      probed_views: list[View] | None = None) -> str | None:
    for i, (a, b) in enumerate(zip(reference, probed, strict=False)):
        if _norm(a) != _norm(b):
            return f"{who}syscall #{i + 1}: unprobed {a[0]} = {a[2]}, probed {b[0]} = {b[2]}"
        if ref_views is not None and probed_views is not None and ref_views[i] != probed_views[i]:
            return _view_divergence(f"{who}syscall #{i + 1} {a[0]}", ref_views[i], probed_views[i])
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


def _view_divergence(where: str, want: View, got: View) -> str:
    (want_args, want_data), (got_args, got_data) = want, got
    if want_args != got_args:
        return f"{where}: arguments unprobed {_shown(want_args)}, probed {_shown(got_args)}"
    assert isinstance(want_data, bytes) and isinstance(got_data, bytes)
    at = next((i for i, (x, y) in enumerate(zip(want_data, got_data, strict=False)) if x != y),
              min(len(want_data), len(got_data)))
    return f"{where}: bytes written differ at {at}: unprobed {want_data[at:at + 24]!r}, probed {got_data[at:at + 24]!r}"


def _shown(args: object) -> str:
    assert isinstance(args, tuple)
    return "(" + ", ".join(f"{a[0] or 'anon'}{a[1]:+#x}" if isinstance(a, tuple) else hex(a) for a in args) + ")"
