"""Lockstep compares syscall arguments (pointers as offsets into their mapping) and every byte written."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from emu.kernel.sched import Scheduler
from emu.lockstep import Observed, SyscallLog, first_divergence
from emu.process.memory import Memory

ARITY = {"write": 3, "openat": 4, "writev": 3, "exit_group": 1, "munmap": 2, "mprotect": 3}


class FakeMemory:
    """One anonymous mapping at ``base`` holding ``data``, and a [stack] page."""

    def __init__(self, base: int, data: bytes) -> None:
        self.base, self.data = base, data

    def find(self, addr: int) -> SimpleNamespace | None:
        if self.base <= addr < self.base + 0x1000:
            return SimpleNamespace(name="", start=self.base, end=self.base + 0x1000)
        if 0x7FFF0000 <= addr < 0x7FFF1000:
            return SimpleNamespace(name="[stack]", start=0x7FFF0000, end=0x7FFF1000)
        return None

    def read(self, addr: int, size: int) -> bytes:
        return self.data[addr - self.base : addr - self.base + size]


def _run(base: int, data: bytes, calls: list[tuple[str, tuple[int, ...], int]]) -> Observed:
    log = SyscallLog(cast(Scheduler, SimpleNamespace(current=SimpleNamespace(tid=1))),
                     cast(Memory, FakeMemory(base, data)), lambda name: ARITY.get(name, 6))
    for call in calls:
        log.append(call)
    return Observed(b"", b"", 0, log)


def test_a_pointer_is_compared_as_an_offset_into_its_mapping() -> None:
    one = _run(0x10000, b"hello", [("write", (3, 0x10000, 5, 0xDEAD), 5), ("exit_group", (0,), 0)])
    moved = _run(0x50000, b"hello", [("write", (3, 0x50000, 5, 0xBEEF), 5), ("exit_group", (0,), 0)])
    assert first_divergence(one, moved) is None  # another layout, and a register past the arity: the same


def test_a_different_argument_is_a_divergence() -> None:
    one = _run(0x10000, b"hello", [("openat", (-100, 0x7FFF0F00, 0, 0), 3)])
    other = _run(0x10000, b"hello", [("openat", (-100, 0x7FFF0F08, 0, 0), 3)])
    found = first_divergence(one, other)
    assert found is not None and "syscall #1 openat: arguments" in found and "[stack]-0x100" in found


def test_a_mapping_unmapped_at_another_address_is_the_same_call() -> None:
    """A design's own page moves the later mappings (as on Linux): munmap of the same length at another
    page is the same call; another length (the negative control) or a misaligned address is not."""
    one = _run(0x10000, b"", [("munmap", (0x7FFFED843000, 0x4A000), 0), ("mprotect", (0x7FFFED000000, 0x1000, 1), 0)])
    moved = _run(0x10000, b"", [("munmap", (0x7FFFED842000, 0x4A000), 0), ("mprotect", (0x7FFFEC000000, 0x1000, 1), 0)])
    assert first_divergence(one, moved) is None
    shorter = _run(0x10000, b"", [("munmap", (0x7FFFED842000, 0x49000), 0)])
    misaligned = _run(0x10000, b"", [("munmap", (0x7FFFED842008, 0x4A000), 0)])
    for other in (shorter, misaligned):
        found = first_divergence(one, other)
        assert found is not None and "syscall #1 munmap: arguments" in found


def test_a_read_of_the_mappings_list_compares_only_its_success() -> None:
    """/proc/self/maps lists a design's own pages (as on Linux): its read is compared by success alone;
    a read of any other fd (the negative control) by its length."""
    def run(size: int, fd: int = 5) -> Observed:
        log = SyscallLog(cast(Scheduler, SimpleNamespace(current=SimpleNamespace(tid=1))),
                         cast(Memory, FakeMemory(0x10000, b"")), lambda name: 3, lambda fd: fd == 5)
        log.append(("read", (fd, 0x10000, 4096), size))
        return Observed(b"", b"", 0, log)

    assert first_divergence(run(781), run(875)) is None
    found = first_divergence(run(781, fd=3), run(875, fd=3))
    assert found is not None and "unprobed read = 781, probed read = 875" in found
    assert first_divergence(run(781), run(-14)) is not None  # EFAULT against success


def test_bytes_written_to_a_file_are_compared() -> None:
    one = _run(0x10000, b"hello", [("write", (3, 0x10000, 5), 5)])
    other = _run(0x10000, b"hellO", [("write", (3, 0x10000, 5), 5)])
    found = first_divergence(one, other)
    assert found is not None and "bytes written differ at 4" in found


def test_writev_bytes_are_gathered_from_the_iovec() -> None:
    iov = (0x10030).to_bytes(8, "little") + (3).to_bytes(8, "little") + (0x10040).to_bytes(8, "little") + \
        (2).to_bytes(8, "little")
    data = iov + bytes(16) + b"abc" + bytes(13) + b"de"
    other_data = iov + bytes(16) + b"abc" + bytes(13) + b"dX"
    one = _run(0x10000, data, [("writev", (3, 0x10000, 2), 5)])
    assert cast(SyscallLog, one.trace).views[0][1] == b"abcde"
    found = first_divergence(one, _run(0x10000, other_data, [("writev", (3, 0x10000, 2), 5)]))
    assert found is not None and "bytes written differ at 4" in found


def _stopped(run: Observed, stdout: bytes, status: int, stopped: bool) -> Observed:
    return Observed(stdout, b"", status, run.trace, stopped=stopped)


def test_a_run_a_limit_stopped_is_compared_as_far_as_it_went() -> None:
    whole = _run(0x10000, b"hello", [("write", (1, 0x10000, 5), 5), ("write", (1, 0x10000, 5), 5),
                                    ("exit_group", (0,), 0)])
    cut = _run(0x10000, b"hello", [("write", (1, 0x10000, 5), 5)])
    full, part = _stopped(whole, b"hellohello", 0, False), _stopped(cut, b"hello", 101, True)
    assert first_divergence(full, part) is None and first_divergence(part, full) is None
    unstopped = _stopped(cut, b"hello", 101, False)  # the same cut, not known to be one: it differs
    assert first_divergence(full, unstopped) == "syscall count: unprobed 3, probed 1"


def test_a_stopped_run_still_differs_where_it_ran() -> None:
    whole = _run(0x10000, b"hello", [("write", (1, 0x10000, 5), 5), ("exit_group", (0,), 0)])
    cut = _run(0x10000, b"hellO", [("write", (1, 0x10000, 5), 5)])
    found = first_divergence(_stopped(whole, b"hello", 0, False), _stopped(cut, b"hellO", 101, True))
    assert found is not None and "bytes written differ at 4" in found
    same_calls = _run(0x10000, b"hello", [("write", (1, 0x10000, 5), 5)])
    found = first_divergence(_stopped(same_calls, b"hello!", 0, True), _stopped(same_calls, b"help", 101, True))
    assert found is not None and found.startswith("stdout differs at byte 3")
