"""Lockstep: a probed run must look exactly like the unprobed one from outside: stdout, stderr, exit
status and the syscall trace (each call's name, result, arguments, and the bytes it writes). Results
that are addresses are compared as success or failure, and pointers as (mapping, offset): the
kernel's own pages move later mappings. With threads the trace is compared per thread, without the
calls whose results are the interleaving itself (futex, sched_yield): a probe moves slice ends.
A run a limit stopped (--max-insns, --timeout) is compared as far as both runs went: each output
must be a prefix of the other's, the calls both made must agree, and exit statuses are not compared.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from emu.kernel.sched import Scheduler
    from emu.process.memory import Memory

ADDRESS_RESULTS = frozenset({"mmap", "mremap", "brk"})
# Calls whose first argument is the address of a mapping: compared by its offset into its page alone. A
# design that maps a page of its own (6.18's trampoline, the slots, the XOL area) moves the mappings
# made after it, as on Linux, so a program unmaps or protects the same mapping at another address.
MAPPING_ADDRESS_ARGS = frozenset({"munmap", "mprotect", "madvise", "mremap", "msync", "mlock", "mlock2", "munlock",
                                  "mincore", "pkey_mprotect", "remap_file_pages"})
PAGE_MASK = 0xFFF
# Reads of a file that lists the process's mappings (/proc/PID/maps): the same design pages show there
# too, so only whether the read succeeded is compared.
LAYOUT_READS = frozenset({"read", "pread64", "readv", "preadv", "preadv2"})
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

    def __init__(self, sched: Scheduler, mem: Memory | None = None, arity: Callable[[str], int] | None = None,
                 lists_mappings: Callable[[int], bool] | None = None) -> None:
        """``lists_mappings(fd)``: the fd reads a listing of the process's mappings (/proc/PID/maps)."""
        super().__init__()
        self.sched, self.mem, self.arity, self.lists_mappings = sched, mem, arity, lists_mappings
        self.tids: list[int] = []
        self.views: list[View] = []

    def append(self, call: Call) -> None:
        name, args, ret = call
        if name in LAYOUT_READS and ret > 0 and self.lists_mappings is not None and self.lists_mappings(args[0]):
            call = (name, args, 1)  # some bytes of the listing: its length depends on the design's own pages
        super().append(call)
        self.tids.append(self.sched.current.tid)
        if self.mem is not None and self.arity is not None:
            name, args, ret = call
            where = [self._where(a) for a in args[: self.arity(name)]]
            if name in MAPPING_ADDRESS_ARGS and where:
                where[0] = ("mapping", args[0] & PAGE_MASK)
            self.views.append((tuple(where), self._written(name, args, ret)))

    def _where(self, value: int) -> object:
        """An argument as compared: a pointer into a mapping as (its name, the offset), else itself."""
        assert self.mem is not None
        vma = self.mem.find(value) if 0 < value < 1 << 47 else None
        if vma is None:
            return value
        return vma.name, value - (vma.end if vma.name == "[stack]" else vma.start)

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
    stopped: bool = False  # a limit stopped the run: what it shows is a prefix of the whole


Logged = list[tuple[Call, "View | None"]]  # calls with their views (None: not recorded)


def _norm(call: Call) -> tuple[object, ...]:
    name, _args, ret = call
    return (name, ret < 0 or ret >= 1 << 63) if name in ADDRESS_RESULTS else (name, ret)


def _logged(trace: Trace) -> Logged:
    views: Sequence[View | None] = trace.views if isinstance(trace, SyscallLog) and len(trace.views) == len(trace) \
        else [None] * len(trace)
    return list(zip(trace, views, strict=True))


def first_divergence(reference: Observed, probed: Observed) -> str | None:
    """None if the runs agree; otherwise one line saying where they first differ."""
    partial = reference.stopped or probed.stopped
    differs = _trace_divergence(reference.trace, probed.trace, partial)
    return differs if differs is not None else _output_divergence(reference, probed, partial)


def _trace_divergence(reference: Trace, probed: Trace, partial: bool) -> str | None:
    ref_threads, probed_threads = _by_thread(reference), _by_thread(probed)
    if ref_threads is None or probed_threads is None or len(ref_threads) == len(probed_threads) == 1:
        return _calls_divergence(_logged(reference), _logged(probed), "", partial)
    if partial:  # a thread the stopped run never started is not a difference
        ref_threads = {t: c for t, c in ref_threads.items() if t in probed_threads}
    elif sorted(ref_threads) != sorted(probed_threads):
        return f"threads: unprobed {sorted(ref_threads)}, probed {sorted(probed_threads)}"
    for tid, calls in ref_threads.items():
        differs = _calls_divergence(_unscheduled(calls), _unscheduled(probed_threads[tid]), f"thread {tid}: ", partial)
        if differs is not None:
            return differs
    return None


def _by_thread(trace: Trace) -> dict[int, Logged] | None:
    """The calls of each thread, in order; None for a log that did not record threads."""
    if not isinstance(trace, SyscallLog):
        return None
    threads: dict[int, Logged] = {}
    for tid, logged in zip(trace.tids, _logged(trace), strict=True):
        threads.setdefault(tid, []).append(logged)
    return threads


def _unscheduled(calls: Iterable[tuple[Call, View | None]]) -> Logged:
    return [(c, v) for c, v in calls if c[0] not in INTERLEAVING_RESULTS]


def _calls_divergence(reference: Logged, probed: Logged, who: str, partial: bool) -> str | None:
    for i, ((a, want), (b, got)) in enumerate(zip(reference, probed, strict=False)):
        if _norm(a) != _norm(b):
            return f"{who}syscall #{i + 1}: unprobed {a[0]} = {a[2]}, probed {b[0]} = {b[2]}"
        if want is not None and got is not None and want != got:
            return _view_divergence(f"{who}syscall #{i + 1} {a[0]}", want, got)
    if len(reference) != len(probed) and not partial:
        return f"{who}syscall count: unprobed {len(reference)}, probed {len(probed)}"
    return None


def _bytes_divergence(want: bytes, got: bytes, at_word: str) -> str:
    at = next((i for i, (x, y) in enumerate(zip(want, got, strict=False)) if x != y), min(len(want), len(got)))
    return f"{at_word} {at}: unprobed {want[at:at + 24]!r}, probed {got[at:at + 24]!r}"


def _output_divergence(reference: Observed, probed: Observed, partial: bool) -> str | None:
    for name, want, got in (("stdout", reference.stdout, probed.stdout), ("stderr", reference.stderr, probed.stderr)):
        if (want[:len(got)] != got[:len(want)]) if partial else want != got:
            return f"{name} differs {_bytes_divergence(want, got, 'at byte')}"
    if reference.exit_status != probed.exit_status and not partial:
        return f"exit status: unprobed {reference.exit_status}, probed {probed.exit_status}"
    return None


def _view_divergence(where: str, want: View, got: View) -> str:
    (want_args, want_data), (got_args, got_data) = want, got
    if want_args != got_args:
        return f"{where}: arguments unprobed {_shown(want_args)}, probed {_shown(got_args)}"
    assert isinstance(want_data, bytes) and isinstance(got_data, bytes)
    return f"{where}: bytes written differ {_bytes_divergence(want_data, got_data, 'at')}"


def _shown(args: object) -> str:
    assert isinstance(args, tuple)
    return "(" + ", ".join(f"{a[0] or 'anon'}{a[1]:+#x}" if isinstance(a, tuple) else hex(a) for a in args) + ")"
