"""A deterministic scheduler for the threads of one process on one emulated CPU.

Round-robin over runnable threads in creation order; a thread runs a slice of ``quantum``
instructions unless it blocks, exits or yields first (a long unseeded slice ends at the first block
boundary past it, see EXACT_SLICES_BELOW). With a seed, each slice length is drawn from 1..quantum
and the next thread from the runnable ones, by one seeded generator: the same seed gives the same
interleaving. A single live thread runs uncounted (no
slices), at full speed. Blocked threads (futex) never run; when none is runnable the earliest
futex timeout fires (the virtual clock jumps to it); with no timeout left it is a deadlock.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Callable

from emu.cpu import Reg
from emu.errors import UsageError
from emu.kernel.clock import VirtualClock
from emu.kernel.exits import GuestBlocked
from emu.kernel.state import FutexWait
from emu.kernel.tasks import Task, TaskState

DEFAULT_QUANTUM = 1_000_000  # instructions: 0.25 ms of the virtual clock, under Linux's base slice
# A slice at least this long, its length not drawn by a seed, may end at the first translated block's
# boundary past it (counted a block at a time, at the engine's speed); a shorter or seeded one ends at
# its exact instruction (counted one instruction at a time): the preemption a race hunt needs.
EXACT_SLICES_BELOW = 1_000


class Scheduler:
    def __init__(self, main: Task, clock: VirtualClock, stop_cpu: Callable[[], None],
                 quantum: int = DEFAULT_QUANTUM, seed: int | None = None) -> None:
        self.tasks: dict[int, Task] = {main.tid: main}
        self.current = main
        self.clock = clock
        self.quantum = quantum
        self.rng: random.Random | None = None
        self.configure(quantum, seed)
        self.switch_requested = False
        self.switches = 0
        # (from, to) after each context switch: per-thread state kept outside the kernel (e.g. a verifier's
        # open transaction, which today assumes one thread) follows the running thread through these
        self.switch_observers: list[Callable[[Task, Task], None]] = []
        self._stop_cpu = stop_cpu
        self._next_tid = main.tid + 1
        self._wait_seq = 0

    def configure(self, quantum: int, seed: int | None) -> None:
        if quantum < 1:
            raise UsageError(f"scheduler quantum {quantum}: must be at least 1 instruction")
        self.quantum = quantum
        self.rng = random.Random(seed) if seed is not None else None

    # ------------------------------------------------------------------ tasks
    def new_tid(self) -> int:
        tid = self._next_tid
        self._next_tid += 1
        return tid

    def add(self, task: Task) -> None:
        self.tasks[task.tid] = task

    def live(self) -> list[Task]:
        return [t for t in self.tasks.values() if t.alive]

    def post_signal(self, signo: int, code: int) -> None:
        """A signal from another process (or the kernel, for SIGCHLD): pending on a thread that does not
        block it, waking that thread from a futex wait; acted on when the process next runs."""
        bit = 1 << (signo - 1)
        live = self.live()
        task = next((t for t in live if not t.signals.mask & bit), live[0] if live else self.current)
        task.signals.pending |= bit
        task.signals.pending_code[signo] = code
        if task.wait is not None and not task.signals.mask & bit:
            self.wake(task, -errno.EINTR)

    @property
    def threaded(self) -> bool:
        return sum(1 for t in self.tasks.values() if t.alive) > 1

    @property
    def exact_slices(self) -> bool:
        """Must a slice end at its exact instruction (a seed draws the lengths, or the quantum is short)?"""
        return self.rng is not None or self.quantum < EXACT_SLICES_BELOW

    def slice_length(self) -> int:
        """Instructions the next slice may run; 0 (no limit) while only one thread lives."""
        if not self.threaded:
            return 0
        return self.rng.randint(1, self.quantum) if self.rng is not None else self.quantum

    def request_switch(self) -> None:
        """From a syscall: stop the CPU once the syscall returns and schedule (the task blocked, exited or yielded)."""
        self.switch_requested = True
        self._stop_cpu()

    # ------------------------------------------------------------- sleeping
    def block(self, task: Task, uaddr: int, bitset: int, deadline: int | None) -> None:
        self._wait_seq += 1
        task.state = TaskState.BLOCKED
        task.wait = FutexWait(uaddr, bitset, deadline, self._wait_seq)

    def wake(self, task: Task, result: int | None = None) -> None:
        """Make ``task`` runnable; ``result`` (if any) becomes its syscall's return value."""
        task.state = TaskState.RUNNABLE
        task.wait = None
        if result is not None:
            task.resume_regs[Reg.RAX] = result & 0xFFFFFFFFFFFFFFFF

    def waiters(self, uaddr: int, bitset: int) -> list[Task]:
        """Tasks sleeping on ``uaddr`` whose mask meets ``bitset``, in the order they went to sleep."""
        found = [t for t in self.tasks.values()
                 if t.wait is not None and t.wait.uaddr == uaddr and t.wait.bitset & bitset]
        return sorted(found, key=lambda t: t.wait.seq if t.wait else 0)

    def exit(self, task: Task) -> None:
        task.state = TaskState.EXITED
        task.wait = None
        task.context = None

    # ------------------------------------------------------------- choosing
    def pick_next(self, yielding: bool = False) -> Task:
        """The task to run next (possibly the current one, unless ``yielding`` and another can run).
        Raises GuestBlocked on a deadlock."""
        self._expire_timeouts(self.clock.elapsed)
        runnable = [t for t in self.tasks.values() if t.state is TaskState.RUNNABLE]
        if not runnable:
            runnable = self._jump_to_first_timeout()
        if yielding and len(runnable) > 1 and self.current in runnable:
            runnable.remove(self.current)
        if self.rng is not None:
            return self.rng.choice(runnable)
        order = list(self.tasks.values())
        start = order.index(self.current) + 1 if self.current in order else 0
        for task in order[start:] + order[:start]:
            if task in runnable:
                return task
        raise AssertionError("unreachable: runnable is not empty")

    def _expire_timeouts(self, now: int) -> list[Task]:
        expired = [t for t in self.tasks.values()
                   if t.wait is not None and t.wait.deadline is not None and t.wait.deadline <= now]
        for task in expired:
            self.wake(task, -errno.ETIMEDOUT)
        return expired

    def _jump_to_first_timeout(self) -> list[Task]:
        deadlines = [t.wait.deadline for t in self.tasks.values() if t.wait is not None and t.wait.deadline is not None]
        if not deadlines:
            waiting = ", ".join(t.describe() for t in self.live())
            raise GuestBlocked(f"deadlock: no thread can run ({waiting})")
        first = min(deadlines)
        self.clock.advance(max(0, first - self.clock.elapsed))
        return self._expire_timeouts(first)
