"""Lockstep: a probed run must look exactly like the unprobed one from outside.

Compared: stdout, stderr, exit status, and the syscall trace (the uprobe syscalls
335/336/462 never reach the log). Results of calls that return addresses (mmap,
mremap, brk) are compared as success or failure only: the kernel's own pages
([uprobes], trampolines) legitimately move where later mappings land.
"""

from __future__ import annotations

from dataclasses import dataclass

ADDRESS_RESULTS = frozenset({"mmap", "mremap", "brk"})
Trace = list[tuple[str, tuple[int, ...], int]]


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
    for i, (a, b) in enumerate(zip(reference.trace, probed.trace, strict=False)):
        if _norm(a) != _norm(b):
            return f"syscall #{i + 1}: unprobed {a[0]} = {a[2]}, probed {b[0]} = {b[2]}"
    if len(reference.trace) != len(probed.trace):
        return f"syscall count: unprobed {len(reference.trace)}, probed {len(probed.trace)}"
    for name, want, got in (("stdout", reference.stdout, probed.stdout), ("stderr", reference.stderr, probed.stderr)):
        if want != got:
            at = next((i for i, (x, y) in enumerate(zip(want, got, strict=False)) if x != y), min(len(want), len(got)))
            return f"{name} differs at byte {at}: unprobed {want[at:at + 24]!r}, probed {got[at:at + 24]!r}"
    if reference.exit_status != probed.exit_status:
        return f"exit status: unprobed {reference.exit_status}, probed {probed.exit_status}"
    return None
