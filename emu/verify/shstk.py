"""A CET-style user shadow stack (opt-in ``--shstk``).

Every ``call`` the CPU executes pushes its return address on the shadow stack; every ``ret``
pops and compares with where it really went. A mismatch is what raises #CP on real hardware:
a violation with the pc of the ``ret`` and both addresses. The kernel's own shadow-stack
handling is reproduced through ``Uprobes.shadow_stack`` (spec 2.1 steps 6 and 12, 2.2 step 7,
3.7, 4.2 call emulation, 4.4 FIX_CALL, 5.1 hijack), so a run tells which design would survive
with user shadow stacks on:

* int3, uretprobe-rfc: no trampoline call at all on entry; the emulated ``call`` pushes (LATE10),
  the uretprobe hijack rewrites the top frame, and the return comes back by INT3 or IRET to
  the real return address, never through a ``ret`` in [uprobes]. Survive. (Mainline kernels
  before 6.11 lacked the hijack/emulation updates; the harness applies them to every design,
  as the question here is the trampoline design, not the kernel version.)
* linux-6.18: the ``call`` into [uprobes-trampoline] pushes vaddr+5; sys_uprobe pops it and
  SIGILLs on a mismatch, then pushes args.retaddr for the trampoline's ``ret``. sys_uretprobe
  returns by IRET when shstk is on (its trampoline's ``ret`` would not match). Survives.
* jmp-slots: ``jmp`` to the slot and IRET back: no call, no ret, nothing to track. Survives.
* nop10: ``lea; call`` pushes vaddr+10, the trampoline's ``ret $0x80`` pops it; the kernel does
  the same pop/push as 6.18 (retaddr = vaddr+10). Balanced; survives.

Per thread (the scheduler's switch observers, emu/kernel/sched.py): each thread has its own
shadow stack and RSB model; a new thread starts with an empty shadow stack, as a CET thread's new
shadow stack starts at clone. Calls and rets are seen by emu/callret.py, the kernel's pages
([uprobes-trampoline], [uprobes], jmp slots) like any other code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu.callret import CallRetTracker
from emu.verify.violations import Check, Violation

if TYPE_CHECKING:
    from emu.machine import Machine


@dataclass(slots=True)
class _ThreadShadow:
    """A thread's shadow stack and the probe it hit last, while another thread runs."""

    frames: list[int]
    last_probe: str
    last_site: int
    last_hit: int


SIGNAL_TOKEN = -1  # the restore token a signal frame leaves on the shadow stack (never a return address)


class ShadowStack:
    """The user shadow stack of the running thread (the others' kept aside at each switch), and
    the kernel's shstk_* helpers on it.

    Installed as ``machine.uprobes.shadow_stack``; the uprobe kernel code calls push/pop/
    update_last_frame where Linux calls shstk_push/shstk_pop/shstk_update_last_frame."""

    enabled = True

    def __init__(self, machine: Machine, tracker: CallRetTracker, report: Callable[[Violation], None]) -> None:
        self.machine = machine
        self.tracker = tracker
        self.frames: list[int] = []
        self.report = report
        self.mismatches = 0
        self.kernel_ops = 0
        self.last_probe = "-"  # the probe hit last: violations are attributed to it
        self.last_site = 0
        self.last_hit = 0
        self._others: dict[int, _ThreadShadow] = {}  # tid -> its shadow stack while it does not run
        tracker.on_call.append(self._call)
        tracker.on_ret.append(self._ret)
        tracker.on_switch.append(self._switch)
        machine.uprobes.shadow_stack = self
        machine.kernel.signal_frame_observers.append(self._signal_frame)

    def _switch(self, prev: int, nxt: int, prev_alive: bool) -> None:
        if prev_alive:
            self._others[prev] = _ThreadShadow(self.frames, self.last_probe, self.last_site, self.last_hit)
        held = self._others.pop(nxt, None) or _ThreadShadow([], "-", 0, 0)  # a new thread: empty, as at clone
        self.frames, self.last_probe, self.last_site, self.last_hit = (
            held.frames, held.last_probe, held.last_site, held.last_hit)

    # ------------------------------------------------------------ the CPU
    def _call(self, _pc: int, ret_addr: int) -> None:
        self.frames.append(ret_addr)

    def _ret(self, pc: int, target: int) -> None:
        expected = self.frames.pop() if self.frames else None
        if expected == target:
            return
        self.mismatches += 1
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
        self.report(Violation(Check.SHSTK, self.last_probe, self.last_site, summary,
                              {"pc": hex(pc), "region": where, "expected": hex(expected) if expected is not None
                               else None, "actual": hex(target), "insn": self.machine.describe_insn(pc)},
                              self.last_hit))

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
        self.mismatches += 1
        self.report(Violation(Check.SHSTK, self.last_probe, self.last_site, f"kernel: {why}",
                              {"expected": hex(expected) if expected is not None else None,
                               "actual": hex(actual)}, self.last_hit))
