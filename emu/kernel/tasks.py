"""One guest thread as the fake kernel sees it: its saved CPU context and its per-thread kernel state.

Shared by every thread of the process (one address space, one Unicorn CPU): memory, files,
signal actions, probes. Per thread (as in Linux's task_struct): registers and fs base (the saved
context), tid, signal mask and pending set, alternate stack, clear_child_tid, robust list, rseq
area, and the uprobe task state (return instances, an out-of-line step in progress).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from emu.cpu import CpuContext, Reg
from emu.kernel.state import FutexWait, SignalState
from emu.kernel.uprobes.records import UprobeTask


class TaskState(enum.Enum):
    RUNNABLE = "runnable"
    BLOCKED = "blocked"
    EXITED = "exited"


@dataclass(eq=False)
class Task:
    tid: int
    signals: SignalState
    uprobe: UprobeTask = field(default_factory=UprobeTask)
    pc: int = 0  # where the task resumes
    context: CpuContext | None = None  # None: the CPU holds it (the running task) or it never ran
    state: TaskState = TaskState.RUNNABLE
    clear_child_tid: int = 0
    robust_list: int = 0
    rseq: tuple[int, int, int] | None = None
    wait: FutexWait | None = None
    resume_regs: dict[Reg, int] = field(default_factory=dict)  # written after the context is loaded
    wake_at: int | None = None  # virtual time a restarted poll/select times out (its restart_block)
    # A futex wait on memory other processes share, restarted until woken: (pages, offset, wakes seen)
    shared_wait: tuple[object, int, int] | None = None

    @property
    def alive(self) -> bool:
        return self.state is not TaskState.EXITED

    def describe(self) -> str:
        what = self.wait.describe() if self.wait is not None else self.state.value
        return f"tid {self.tid}: {what}"
