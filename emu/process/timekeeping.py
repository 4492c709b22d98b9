"""One process's CPU on the virtual clock (emu/kernel/clock.py): its instruction counter as its share of
the time, its kernel entries charged, its vDSO readings served, and the stop where one of its timers
expires (emu/kernel/procsig.py).

Linux delivers an asynchronous signal at the next return to user mode; for a process that never
enters the kernel, that is the timer interrupt, at an instruction boundary right after the expiry. So
the counter stops the CPU at the very instruction where the process's work takes the clock past the
expiry (emu/process/icount.py stops there as it does at --max-insns), and the run loop delivers the signal
with rip at the next instruction. An expiry that falls inside a kernel entry stops the CPU once the
entry returns (rip after the syscall instruction). Nothing of this is armed while no timer is.

A counter is made (and the translation cache flushed, so that every block counts) only once the clock
counts, or when process slices need one; before that the process runs as fast as without any.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from emu import hotpath
from emu.kernel.clock import KERNEL_ENTRY_WORK, work_for
from emu.kernel.vdso import reading_offset, write_elapsed
from emu.process.icount import InsnCounter, make_counter

if TYPE_CHECKING:  # for the type checker only: a Protocol class costs start-up time
    from collections.abc import Callable
    from typing import Protocol

    from emu.cpu import Cpu, HookHandle
    from emu.kernel.dispatch import Kernel
    from emu.process.memory import Memory

    class ClockedProcess(Protocol):
        """What the clock's side reads of a process (emu/machine.py's Machine, as its RunLoop has it)."""

        @property
        def cpu(self) -> Cpu: ...
        @property
        def mem(self) -> Memory: ...
        @property
        def kernel(self) -> Kernel: ...
        @property
        def counter(self) -> InsnCounter | None: ...
        @property
        def vdso(self) -> int: ...


class TimeKeeper:
    """The clock's side of one process (its RunLoop owns it; an exec keeps it, a fork makes another)."""

    def __init__(self, process: ClockedProcess) -> None:
        self.process = process
        # a Python block counter costs too much to start on a mere reading (emu/kernel/clock.py)
        process.kernel.clock.readings_count = hotpath.native is not None
        self._own: InsnCounter | None = None  # made here when the run itself counts nothing (no --json)
        self._counting: InsnCounter | None = None  # the counter the clock reads, once it counts
        self._reading_hook: tuple[int, HookHandle] | None = None  # (vDSO address, hook on its reading routine)
        self._counted_before = False  # the clock counted when the CPU last started

    @property
    def counter(self) -> InsnCounter | None:
        """The process's instruction counter: the run's own (--json, --max-insns), or one made here."""
        return self.process.counter or self._own

    def slice_counter(self) -> InsnCounter | None:
        """What counts a process's time slice while another process can run: the counter, made on the
        first slice with the C extension (a C call a block, where Unicorn's exact count costs a hook call
        an instruction); without it, one only if the clock made one (a Python call a block costs more)."""
        if self.counter is None and hotpath.native is not None:
            self._make_counter()
        return self.counter

    def _make_counter(self) -> InsnCounter:
        self._own = make_counter(self.process.cpu, None)
        self.process.cpu.flush_all_code()  # a block translated before has no call to its hook
        return self._own

    # ------------------------------------------------------------------ around each run
    def before_run(self) -> None:
        """Before the CPU runs: the vDSO's readings served, the counter in the clock if it counts, the
        stop for the next timer armed, and the clock able to stop this CPU (it starts counting)."""
        self._hook_readings()
        clock = self.process.kernel.clock
        self._counted_before = clock.counting
        if clock.counting:
            self._count()
            clock.on_change = self.arm
            self.arm()
        else:
            clock.on_start = self.process.cpu.stop

    def after_run(self) -> None:
        clock = self.process.kernel.clock
        clock.on_start = clock.on_change = None

    def _count(self) -> None:
        """The clock counts: this process's counter is its source, and its kernel entries cost time."""
        counter = self.counter or self._make_counter()
        if self._counting is not counter:
            self.process.kernel.clock.add_source(self.process.kernel.ident.pid, counter)
            counter.charge_entries(KERNEL_ENTRY_WORK)
            self._counting = counter

    def arm(self) -> None:
        """Set the counter's stop at the process's next timer expiry (also from a hook, as time moves)."""
        counter, kernel = self._counting, self.process.kernel
        if counter is None:
            return
        if not kernel.timers:
            counter.set_alarm(None, None)
            return
        from emu.kernel.procsig import next_stops  # procsig.py is loaded: a timer was armed

        wall, user_cpu, all_cpu = next_stops(kernel)
        user, total = kernel.clock.cpu_work(kernel.ident.pid)
        work_at = None if wall is None else counter.work + kernel.clock.work_until(wall)
        if all_cpu is not None:
            prof_at = counter.work + max(0, work_for(all_cpu) - total)
            work_at = prof_at if work_at is None else min(work_at, prof_at)
        user_at = None if user_cpu is None else counter.total + max(0, work_for(user_cpu) - user)
        counter.set_alarm(user_at, work_at)

    def started_during_run(self) -> bool:
        """Did the clock start counting while the CPU ran (it stopped for this process's counter)?"""
        return not self._counted_before and self.process.kernel.clock.counting

    def stopped_for_timer(self) -> bool:
        """Did the last run stop where a timer expires (its signal is due now)?"""
        return self._counting is not None and self._counting.alarmed

    def hold_stops(self) -> Callable[[], None] | None:
        """While a kernel action steps the guest (an out-of-line step), no stop; the caller calls the
        function returned (None: nothing to release)."""
        return self._counting.hold_stops() if self._counting is not None else None

    def ended(self) -> None:
        """The process has ended: its work stays in the clock."""
        self.process.kernel.clock.retire(self.process.kernel.ident.pid)

    # ------------------------------------------------------------------ the vDSO
    def _hook_readings(self) -> None:
        """A code hook on the vDSO's reading routine (set again when an exec maps another vDSO)."""
        vdso = self.process.vdso
        if self._reading_hook is not None:
            if self._reading_hook[0] == vdso:
                return
            self.process.cpu.hooks.remove(self._reading_hook[1])
        at = vdso + reading_offset()
        self._reading_hook = vdso, self.process.cpu.hooks.add_code(self._on_reading, at, at)
        self.process.cpu.flush_code(at, at + 1)

    def _on_reading(self, _address: int, _size: int) -> None:
        """The vDSO reads the clock: the time, with its tick, into [vvar] just before it does."""
        clock = self.process.kernel.clock
        if clock.observe(reading=True):
            return  # counting starts: the CPU stops before the routine, which runs again with a counter
        write_elapsed(self.process.mem, self.process.vdso, clock.read_elapsed())
