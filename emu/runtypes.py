"""What a run is asked to do (RunOptions) and what it reports (Ending, RunResult).

They live apart from emu/machine.py so that the modules building and running a process can name
them without importing the Machine (emu/machine.py re-exports them for every caller)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from emu.abi import Signal
from emu.designs import DEFAULT_DESIGN, Design, get_design
from emu.kernel.dispatch import KernelConfig
from emu.kernel.sched import DEFAULT_QUANTUM


class Ending(enum.Enum):
    EXITED = "exited"
    KILLED = "killed"
    INSN_LIMIT = "insn-limit"
    TIMEOUT = "timeout"
    BLOCKED = "blocked"


LIMITS = (Ending.INSN_LIMIT, Ending.TIMEOUT)  # the endings of a run --max-insns or --timeout stopped

# How a process's run ended: the ending, the exit status (128 + signal when killed), the signal, a message.
Outcome = tuple[Ending, int, Signal | None, str | None]


class Budget:
    """What one run may spend, over every process and thread of it: wall time (--timeout) and
    instructions (--max-insns). Once either runs out, ``spent`` says which, and every process stops."""

    def __init__(self, timeout_s: float | None, max_insns: int | None, start: float | None = None) -> None:
        self.timeout_s = timeout_s or None
        self.deadline = None if self.timeout_s is None else (time.perf_counter() if start is None else start) + self.timeout_s
        self.max_insns = max_insns
        self.insns_left = max_insns  # None: no limit
        self.spent: Ending | None = None

    def remaining_us(self) -> int:
        """Microseconds left before the deadline (at least 1 while it lies ahead); 0: no deadline."""
        if self.deadline is None:
            return 0
        return max(1, int((self.deadline - time.perf_counter()) * 1e6))

    def timed_out(self) -> bool:
        """The deadline has come (within 1% of the timeout: Unicorn's own timeout may stop a bit early)."""
        return self.timeout_s is not None and self.deadline is not None and (
            time.perf_counter() >= self.deadline - self.timeout_s * 0.01)


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How to build and run one process."""

    kernel: KernelConfig = field(default_factory=KernelConfig)
    exe_base: int | None = None  # where an ET_DYN executable goes (default: 0x555555554000 with an interpreter)
    interp_base: int | None = None
    max_insns: int | None = None
    timeout_s: float | None = None
    count_insns: bool = False
    strace: Callable[[str], None] | None = None
    design: str | Design = DEFAULT_DESIGN  # a name or a Design: resolved and checked once, into ``kernel_design``
    sched_quantum: int = DEFAULT_QUANTUM  # instructions a thread runs before the next one gets the CPU
    sched_seed: int | None = None  # random preemption: slice lengths and the next thread drawn from this seed
    aslr: int | None = None  # --aslr SEED: randomize the layout as Linux does (emu/process/layout.py); None: ASLR off
    kernel_design: Design = field(init=False, repr=False, compare=False)  # the design the process is built under

    def __post_init__(self) -> None:
        object.__setattr__(self, "kernel_design", get_design(self.design))  # UsageError for an unknown name

    @property
    def timeout_us(self) -> int:
        """The --timeout in microseconds; 0 for none."""
        return int(self.timeout_s * 1e6) if self.timeout_s else 0


@dataclass(frozen=True, slots=True)
class RunResult:
    ending: Ending
    exit_status: int
    signal: Signal | None
    message: str | None
    insns: int | None
    syscalls: dict[str, int]
    unknown_syscalls: dict[str, int]
    wall_s: float
    probes: tuple[dict[str, Any], ...] = ()
    exits: dict[str, int] = field(default_factory=dict)
    threads: int = 1  # threads the process had over the run (the main one included)
    switches: int = 0  # context switches between them

    def to_json(self) -> dict[str, Any]:
        return {
            "exit_status": self.exit_status,
            "signal": self.signal.name if self.signal else None,
            "ending": self.ending.value,
            "message": self.message,
            "insns": self.insns,
            "syscalls": self.syscalls,
            "unknown_syscalls": self.unknown_syscalls,
            "wall_s": round(self.wall_s, 6),
            "probes": list(self.probes),
            "exits": self.exits,
            "threads": self.threads,
            "switches": self.switches,
        }
