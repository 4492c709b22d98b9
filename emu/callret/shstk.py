"""A CET-style user shadow stack (opt-in ``--shstk``): every ``call`` the CPU executes pushes its
return address and every ``ret`` pops and compares, a mismatch being what raises #CP on real
hardware. The kernel's shadow-stack handling is reproduced through ``Uprobes.shadow_stack`` (spec
2.1 steps 6 and 12, 2.2 step 7, 3.7, 4.2, 4.4, 5.1), so a run tells which design survives with user
shadow stacks on (all of the built-in ones do). Per thread: a new thread starts empty, as at clone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from emu.callret.tracker import CallRetTracker
from emu.violations import Check, Violation

if TYPE_CHECKING:
    from emu.machine import Machine


SIGNAL_TOKEN = -1  # the restore token a signal frame leaves on the shadow stack (never a return address)


class ShadowStack:
    """The running thread's shadow stack, and the kernel's shstk_* helpers on it: installed as
    ``machine.uprobes.shadow_stack``, where the uprobe code calls push/pop/update_last_frame."""

    enabled = True

    def __init__(self, machine: Machine, tracker: CallRetTracker, report: Callable[[Violation], None]) -> None:
        self.machine, self.tracker, self.report = machine, tracker, report
        self.frames: list[int] = []
        self.mismatches = self.kernel_ops = 0
        self.last_probe, self.last_site, self.last_hit = "-", 0, 0  # the probe hit last: violations go to it
        self._others: dict[int, tuple[list[int], str, int, int]] = {}  # tid -> the above, while it does not run
        tracker.on_call.append(self._call)
        tracker.on_ret.append(self._ret)
        tracker.on_switch.append(self._switch)
        machine.uprobes.shadow_stack = self
        machine.kernel.signal_frame_observers.append(self._signal_frame)

    def _switch(self, prev: int, nxt: int, prev_alive: bool) -> None:
        if prev_alive:
            self._others[prev] = (self.frames, self.last_probe, self.last_site, self.last_hit)
        # a new thread starts with an empty one, as at clone
        self.frames, self.last_probe, self.last_site, self.last_hit = self._others.pop(nxt, ([], "-", 0, 0))

    # ------------------------------------------------------------ the CPU
    def _call(self, _pc: int, ret_addr: int) -> None:
        self.frames.append(ret_addr)

    def _ret(self, pc: int, target: int) -> None:
        expected = self.frames.pop() if self.frames else None
        if expected == target:
            return
        vma = self.machine.mem.find(pc)
        where = vma.name if vma is not None and vma.name else "?"
        if expected is None:
            summary = f"#CP: ret at {pc:#x} ({where}) to {target:#x} with an empty shadow stack"
        else:
            summary = f"#CP: ret at {pc:#x} ({where}) to {target:#x}, shadow stack holds {expected:#x}"
            # Go on as if the fault had been fixed up, so one fault is reported once: a ret to a
            # frame further down unwinds to it; a ret to nowhere on the stack consumes nothing.
            if target in self.frames:
                while self.frames.pop() != target:
                    pass
            else:
                self.frames.append(expected)
        self._report(summary, {"pc": hex(pc), "region": where, "expected": hex(expected) if expected is not None
                               else None, "actual": hex(target), "insn": self.machine.describe_insn(pc)})

    def _report(self, summary: str, detail: dict[str, Any]) -> None:
        self.mismatches += 1
        self.report(Violation(Check.SHSTK, self.last_probe, self.last_site, summary, detail, self.last_hit))

    # ---------------------------------------------------------- the kernel
    def _signal_frame(self, restorer: int | None, interrupted: int) -> None:
        """Signal delivery pushes a restore token and the restorer, for the handler's ret; rt_sigreturn
        takes the shadow stack back to below the token (Linux's shstk signal frame)."""
        self.tracker.settle(interrupted)  # a fault inside a block: its end never ran
        if restorer is not None:
            self.frames += [SIGNAL_TOKEN, restorer]
        elif SIGNAL_TOKEN in self.frames:
            while self.frames.pop() != SIGNAL_TOKEN:
                pass

    def push(self, addr: int) -> None:
        """shstk_push."""
        self.tracker.sync()
        self.kernel_ops += 1
        self.frames.append(addr)

    def pop(self) -> int | None:
        """shstk_pop: None if the shadow stack is empty (the kernel would fault: -EFAULT)."""
        self.tracker.sync()
        self.kernel_ops += 1
        return self.frames.pop() if self.frames else None

    def update_last_frame(self, addr: int) -> None:
        """shstk_update_last_frame."""
        self.tracker.sync()
        self.kernel_ops += 1
        if self.frames:
            self.frames[-1] = addr
        else:
            self.frames.append(addr)

    def kernel_violation(self, why: str, expected: int | None, actual: int) -> None:
        """The kernel refused the shadow stack (e.g. sys_uprobe's shstk_pop mismatch: SIGILL)."""
        self._report(f"kernel: {why}", {"expected": hex(expected) if expected is not None else None, "actual": hex(actual)})
