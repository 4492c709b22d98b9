"""A virtual clock: deterministic, advanced by the guest's own activity, never by the host's.

The vDSO (emu/kernel/vdso.py) reads it from each process's [vvar] page without entering the
kernel: a page holds the elapsed time as of the kernel's last reading and counts the readings
the vDSO made since. Before the kernel reads or moves the clock it folds those readings in, and
afterwards writes the new elapsed time back to every page, so one timeline serves both.
"""

from __future__ import annotations

import struct
from typing import Protocol

TICK_NS = 1_000  # each reading moves time on by 1 us, so loops waiting for time finish
VV_REALTIME, VV_MONOTONIC, VV_ELAPSED, VV_READINGS, VV_TICK, VV_CPU = 0, 8, 16, 24, 32, 40


class ClockPage(Protocol):
    """Where a process's vDSO finds the clock: ``None`` once the page is gone (exit, exec)."""

    def load(self, offset: int) -> int | None: ...
    def store(self, offset: int, value: int) -> None: ...


class VirtualClock:
    def __init__(self, realtime_start_ns: int, monotonic_start_ns: int = 1_000 * 10**9) -> None:
        self.realtime_start = realtime_start_ns
        self.monotonic_start = monotonic_start_ns
        self.elapsed = 0
        self.pages: list[ClockPage] = []

    def attach(self, page: ClockPage) -> None:
        """A new [vvar] page: the start times, the tick and where time is now (the readings the other
        pages made are folded in first: a forked child's copy must not read earlier than its parent)."""
        self._fold()
        page.store(VV_REALTIME, self.realtime_start)
        page.store(VV_MONOTONIC, self.monotonic_start)
        page.store(VV_TICK, TICK_NS)
        self.pages.append(page)
        self._publish()

    def _fold(self) -> None:
        live = []
        for page in self.pages:
            readings = page.load(VV_READINGS)
            if readings is not None:
                self.elapsed += readings * TICK_NS
                live.append(page)
        self.pages = live

    def _publish(self) -> None:
        for page in self.pages:
            page.store(VV_ELAPSED, self.elapsed)
            page.store(VV_READINGS, 0)

    def now(self, realtime: bool) -> int:
        if self.pages:
            self._fold()
        self.elapsed += TICK_NS
        if self.pages:
            self._publish()
        return (self.realtime_start if realtime else self.monotonic_start) + self.elapsed

    def advance(self, ns: int) -> None:
        if self.pages:
            self._fold()
        self.elapsed += ns
        if self.pages:
            self._publish()

    def wall_ns(self) -> int:
        """The realtime clock's reading without moving it on (file times); the vDSO's readings count."""
        if self.pages:
            self._fold()
            self._publish()
        return self.realtime_start + self.elapsed


def pack_u64(value: int) -> bytes:
    return struct.pack("<Q", value & 0xFFFFFFFFFFFFFFFF)
