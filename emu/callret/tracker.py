"""Every ``call`` and ``ret`` the CPU executes, including those in the kernel's trampoline pages, told
to the models that follow them: the shadow stack (emu/callret/shstk.py) and the RSB model (emu/callret/rsb.py).

Calls and rets are seen with one block hook: the block's last instruction (every call and ret ends a
translation block) is decoded once with capstone and cached; it is acted on when the next block
starts, which is where the ``ret`` went. Per thread (the scheduler's switch observers,
emu/kernel/sched.py), the models keep each thread's state apart.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu.cpu import Reg
from emu.disasm import cs64

if TYPE_CHECKING:
    from emu.kernel.tasks import Task
    from emu.machine import Machine


class Op(enum.Enum):
    NONE = 0
    CALL = 1
    RET = 2


@dataclass(frozen=True, slots=True)
class BlockEnd:
    op: Op
    start: int  # address of the block
    pc: int  # address of the block's last instruction
    next_pc: int  # the address after it: what a call pushes
    raw: bytes  # its bytes: a patched site gets decoded again


CallFn = Callable[[int, int], None]  # (pc of the call, return address pushed)
RetFn = Callable[[int, int], None]  # (pc of the ret, where it went)
SwitchFn = Callable[[int, int, bool], None]  # (tid leaving the CPU, tid taking it, whether the first is alive)


class CallRetTracker:
    """Sees every call and ret the CPU executes (including the kernel's trampoline pages)."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.cpu = machine.cpu
        self.mem = machine.mem
        self.on_call: list[CallFn] = []
        self.on_ret: list[RetFn] = []
        self.on_switch: list[SwitchFn] = []  # per-thread models swap their state here
        self._cs = cs64()
        self._ends: dict[tuple[int, int], BlockEnd] = {}
        self._pending: BlockEnd | None = None
        self._stepping = False
        self.cpu.hooks.add_block(self._on_block)
        machine.kernel.sched.switch_observers.append(self._switch)

    def _on_block(self, addr: int, size: int) -> None:
        self.settle(addr)
        stepping = self.machine.uprobes.stepping
        first_of_step = stepping and not self._stepping
        self._stepping = stepping
        if stepping and not first_of_step:
            # An out-of-line step runs one instruction, but Unicorn enters the next block before
            # it stops: that block has not run (its hook fires again when the run resumes).
            return
        if size:
            self._pending = self._end_of(addr, size)

    def sync(self) -> None:
        """Act on the last executed block's end now (the kernel is about to look at the stacks,
        e.g. after an out-of-line step); a ret went to the current rip."""
        if self._pending is not None:
            self._flush(self.cpu.read(Reg.RIP))

    def _switch(self, prev: Task, nxt: Task) -> None:
        """A context switch: settle ``prev``'s last block, then let the models swap threads.

        ``prev`` resumes where it stopped (settle)."""
        self.settle(prev.pc)
        for fn in self.on_switch:
            fn(prev.tid, nxt.tid, prev.alive)

    def settle(self, resumed: int) -> None:
        """Execution goes on at ``resumed``: act on the pending block's end, unless ``resumed`` lies
        inside that block. Then the run stopped before the block's end ran (a scheduler slice ends
        at any instruction; the thread resumes there, later or at once) and its hook fires again.
        Not told apart: a call or ret going back into its own block (a call there would be a
        recursion with no branch before it, one that never ends)."""
        end = self._pending
        if end is not None and end.start <= resumed <= end.pc:
            self._pending = None
        else:
            self._flush(resumed)

    def _flush(self, target: int) -> None:
        end, self._pending = self._pending, None
        if end is None or end.op is Op.NONE:
            return
        if end.op is Op.CALL:
            for fn in self.on_call:
                fn(end.pc, end.next_pc)
        else:
            for fn in self.on_ret:
                fn(end.pc, target)

    def _end_of(self, addr: int, size: int) -> BlockEnd:
        key = (addr, size)
        end = self._ends.get(key)
        if end is not None:
            try:
                if self.mem.read(end.pc, len(end.raw)) == end.raw:
                    return end
            except Exception:  # noqa: BLE001 - unreadable now: decode afresh below
                pass
        try:
            code = self.mem.read(addr, size)
        except Exception:  # noqa: BLE001
            return BlockEnd(Op.NONE, addr, addr, addr, b"")
        last = None
        for insn in self._cs.disasm_lite(code, addr):
            last = insn
        if last is None:
            end = BlockEnd(Op.NONE, addr, addr, addr, b"")
        else:
            pc, length, mnemonic, _ops = last
            word = mnemonic.split()[-1] if mnemonic else ""
            op = Op.CALL if word == "call" else Op.RET if word == "ret" else Op.NONE
            end = BlockEnd(op, addr, pc, pc + length, code[pc - addr : pc - addr + length])
        self._ends[key] = end
        return end
