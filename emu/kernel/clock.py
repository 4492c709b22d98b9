"""A virtual clock: deterministic, advanced by the guest's own activity, never by the host's."""

from __future__ import annotations

TICK_NS = 1_000  # each reading moves time on by 1 us, so loops waiting for time finish


class VirtualClock:
    def __init__(self, realtime_start_ns: int, monotonic_start_ns: int = 1_000 * 10**9) -> None:
        self.realtime_start = realtime_start_ns
        self.monotonic_start = monotonic_start_ns
        self.elapsed = 0

    def now(self, realtime: bool) -> int:
        self.elapsed += TICK_NS
        return (self.realtime_start if realtime else self.monotonic_start) + self.elapsed

    def advance(self, ns: int) -> None:
        self.elapsed += ns

    def wall_ns(self) -> int:
        """The realtime clock's reading without moving it on (file times)."""
        return self.realtime_start + self.elapsed
