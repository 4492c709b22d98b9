"""A virtual clock: deterministic, moved by the guest's own activity, never by the host's.

Time is what the run's processes did, on one CPU: the instructions they ran and their kernel entries,
at fixed rates (``work`` below, in instructions), plus what they waited for or read (``waited``: sleeps
and time slices the clock jumps over, and a tick for each reading). The rates are those of a compiled
C loop of loads and multiplies (elf_samples/cpu_bound, about 4 instructions a nanosecond natively) and
of a getpid round trip (about 100 ns) on the machines this project runs on; the README has the figures.
Each process's instructions come from its block counter (emu/process/icount.py, made for the purpose by
emu/process/timekeeping.py), and are read when the time is: nothing is pushed as the CPU runs.

The clock counts instructions from the first time the guest looks at it (a reading, a file's time, a
timer or a timeout armed): before that nothing in the guest can tell how long anything took, so a run
that never asks for the time pays for no counting. A reading through the vDSO (emu/kernel/vdso.py)
goes through ``read_elapsed`` as a syscall's does.

Without the C extension, a block counter costs a Python call a block (python3.11 -c 'print(1)' would
take five times as long), so there a reading alone starts nothing: the count starts with a timer, a
timerfd or a CPU clock, and until then time moves by the waits and by a microsecond a reading.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

TICK_NS = 10  # what a reading adds to its instructions: a vDSO clock_gettime then takes about 20 ns, as natively
UNCOUNTED_TICK_NS = 1_000  # what a reading adds while no instruction counts: loops that wait for time still end
NS_PER_KILO_INSNS = 250  # 4 instructions a nanosecond: the C loop's 3.95, rounded
KERNEL_ENTRY_NS = 100  # what a kernel entry (a syscall, a trap) costs: the getpid round trip's 104 ns, rounded


def work_ns(work: int) -> int:
    """The nanoseconds ``work`` instructions (or instruction-equivalents) take."""
    return work * NS_PER_KILO_INSNS // 1000


def work_for(ns: int) -> int:
    """The least work that takes at least ``ns`` nanoseconds."""
    return -(-max(0, ns) * 1000 // NS_PER_KILO_INSNS)


KERNEL_ENTRY_WORK = work_for(KERNEL_ENTRY_NS)  # 400 instructions' worth


class WorkSource(Protocol):
    """A process's instruction counter, as the clock reads it."""

    @property
    def total(self) -> int: ...  # instructions run (user CPU time)

    @property
    def work(self) -> int: ...  # and its kernel entries' cost (user and system CPU time)


class VirtualClock:
    def __init__(self, realtime_start_ns: int, monotonic_start_ns: int = 1_000 * 10**9) -> None:
        self.realtime_start = realtime_start_ns
        self.monotonic_start = monotonic_start_ns
        self.waited = 0  # ns the clock jumped over (sleeps, slices) and the readings' ticks
        self.counting = False  # the guest has looked: instructions count from here on
        self.readings_count = True  # a reading alone starts the count (not in the pure-Python mode: see above)
        self.on_start: Callable[[], None] | None = None  # counting starts: the running CPU must stop
        self.on_change: Callable[[], None] | None = None  # called by changed()
        self._sources: dict[int, tuple[WorkSource, int, int]] = {}  # pid -> (counter, work and total at start)
        self._retired = 0  # the work of processes that have ended

    # ------------------------------------------------------------------ reading
    @property
    def elapsed(self) -> int:
        """Nanoseconds since the run began (as the kernel sees it; a reading adds its tick, ``read_elapsed``)."""
        return self.waited + work_ns(self.work)

    @property
    def work(self) -> int:
        """Instructions every process has run since the guest first looked, and their kernel entries."""
        return self._retired + sum(source.work - base for source, base, _ in self._sources.values())

    def observe(self, reading: bool = False) -> bool:
        """The guest looks at the time (``reading``) or arms something that depends on it: instructions
        count from here on. True if that starts now and the running CPU was asked to stop (to get its
        counter)."""
        if self.counting or reading and not self.readings_count:
            return False
        self.counting = True
        if self.on_start is None:
            return False
        self.on_start()
        return True

    def read_elapsed(self) -> int:
        """One reading of the clock by the guest (a syscall, or the vDSO): the elapsed time after its tick."""
        self.observe(reading=True)
        self.waited += TICK_NS if self.counting else UNCOUNTED_TICK_NS
        self.changed()
        return self.elapsed

    def now(self, realtime: bool) -> int:
        return (self.realtime_start if realtime else self.monotonic_start) + self.read_elapsed()

    def wall_ns(self) -> int:
        """The realtime clock's reading without moving it on (file times)."""
        self.observe(reading=True)
        return self.realtime_start + self.elapsed

    def advance(self, ns: int) -> None:
        """Time passes with no instruction run: a sleep, a time slice, a jump to the next timeout."""
        self.waited += ns
        self.changed()

    def changed(self) -> None:
        """Time moved with no instruction run, or a timer changed: the running process's stop for its
        timers is set again (emu/process/timekeeping.py)."""
        if self.on_change is not None:
            self.on_change()

    # --------------------------------------------------------------- processes
    def add_source(self, pid: int, source: WorkSource) -> None:
        """Process ``pid``'s counter: what it counts from now on is the process's share of the time."""
        self._sources[pid] = (source, source.work, source.total)

    def retire(self, pid: int) -> None:
        """Process ``pid`` has ended: its work stays in the time, its counter goes."""
        entry = self._sources.pop(pid, None)
        if entry is not None:
            self._retired += entry[0].work - entry[1]

    def cpu_work(self, pid: int) -> tuple[int, int]:
        """Process ``pid``'s CPU time since the clock counts it, in instructions: (user, user + system)."""
        entry = self._sources.get(pid)
        if entry is None:
            return 0, 0
        source, work, total = entry
        return source.total - total, source.work - work

    def work_until(self, elapsed: int) -> int:
        """How much more work (instructions, by any process) takes the clock to ``elapsed`` ns, as
        things stand (0: it is there)."""
        return max(0, work_for(elapsed - self.waited) - self.work)
