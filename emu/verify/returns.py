"""The uretprobe return path: from the probed function's ``ret`` landing in the return trampoline
(the address the uretprobe put in place of the return address, spec 5.1) until the guest runs its
caller again.

The reference is the original ``ret`` alone: it would have popped the return address the hijack
replaced and left every other register as it was. So the state on entering the trampoline, with rip
at that return address, is what the caller must resume with, but for what the return handlers
changed (they may set registers, as a handler may at entry). The returning instance is the one whose
return address slot the ``ret`` just popped (its ``stack`` is rsp - 8 there): the address it saved
is where the program itself was going, whatever the kernel decides.

Hooks: one on the trampoline's first instruction (added when the kernel maps [uprobes]) opens a
return (its instance Python's, or one the C front pushed: FastPaths.find_return); one on each return
address seen (added once, kept) closes it there, on the same thread with rsp back where the ``ret``
left it. A return that left every byte of the state as it found it is counted and nothing more; the
others are judged by the register check. A return still open when its frame is gone (a later return
on the thread from higher up the stack) or when the run ends never reached its caller: a ``resume``
violation.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emu.cpu.state import RAW_RIP, RAW_RSP, decode_extended, encode_state
from emu.kernel.uprobes.consumers import EntryPath
from emu.kernel.uprobes.records import XOL_NAME
from emu.kernel.uprobes.regs import PtRegs
from emu.verify.checks.regs import FLAGS_MASK, check_regs
from emu.verify.expected import STATE_INDEX, Expected
from emu.verify.records import ProbeSite, Transaction, violation
from emu.verify.signals import FrameStacks
from emu.violations import Check, Violation

if TYPE_CHECKING:
    from emu.cpu import RawState
    from emu.kernel.uprobes.records import Uprobe
    from emu.machine import Machine
    from emu.process.vma import Vma

_QWORD = struct.Struct("<Q")


@dataclass(slots=True)
class OpenReturn:
    """A return under way: the state the trampoline was entered with (rip: where the caller must
    resume) and what the return handlers set."""

    number: int
    func: int
    uprobe: Uprobe
    start_raw: bytes
    target: int
    rsp: int
    changes: dict[str, int] = field(default_factory=dict)


class ReturnWatch:
    def __init__(self, machine: Machine, raw: RawState, report: Callable[[list[Violation]], None],
                 regs: bool, resume: bool) -> None:
        self.machine, self.cpu, self.raw, self.report = machine, machine.cpu, raw, report
        self._regs, self._resume = regs, resume
        self._sched, self._up = machine.kernel.sched, machine.uprobes
        self._open: dict[int, list[OpenReturn]] = {}  # tid -> its returns under way, innermost last
        self._held: FrameStacks[list[OpenReturn] | None] = FrameStacks(self._sched)  # the returns each frame set aside
        self._hooked: set[int] = set()  # return addresses with a hook
        self._trampolines: set[int] = set()
        self._names: dict[int, str] = {}  # probed function -> how its returns are named
        self._returns = 0
        self.count = 0  # returns that got a verdict
        for vma in machine.mem:
            self._on_map(vma)
        machine.mem.map_observers.append(self._on_map)
        machine.uprobes.return_observers.append(self._on_handlers)
        machine.kernel.signal_frame_observers.append(self._on_signal_frame)

    def new_image(self) -> None:
        """execve: the process's uprobes are the new image's; the returns under way are gone with the old one."""
        self._up = self.machine.uprobes
        self._open.clear()
        self._held.clear()

    def finish(self, ending: str) -> None:
        """The run is over: a return still open never reached its caller."""
        for returns in self._open.values():
            for opened in returns:
                self._never_resumed(opened, f"the run ended first ({ending})")
        self._open.clear()
        self._held.clear()

    # ------------------------------------------------------------------ hooks
    def _on_map(self, vma: Vma) -> None:
        """[uprobes] is mapped: its slot 0 is the return trampoline every hijacked return lands on."""
        if vma.name == XOL_NAME and vma.start not in self._trampolines:
            self._trampolines.add(vma.start)
            self.cpu.hooks.add_raw_code(self._on_trampoline, vma.start, vma.start)

    def _on_trampoline(self, _uc: object, _addr: int, _size: int, _ud: object) -> None:
        try:
            self._start()
        except BaseException as exc:
            self.cpu.hooks.raised(exc)

    def _start(self) -> None:
        raw = self.raw.read()
        rsp = _QWORD.unpack_from(raw, RAW_RSP)[0]
        returning = self._returning(rsp - 8)
        if returning is None:
            return  # no instance popped here (the kernel answers a stray entry with SIGILL)
        func, target = returning
        uprobe = self._up.probes.get(func)
        if uprobe is None:
            return  # unregistered since: nothing names the return
        returns = self._open.setdefault(self._sched.current.tid, [])
        while returns and returns[-1].rsp <= rsp:  # their frames are gone: they never resumed
            self._never_resumed(returns.pop(), "its frame was left before it resumed")
        self._returns += 1
        returns.append(OpenReturn(self._returns, func, uprobe, raw, target, rsp))
        self._hook(target)

    def _returning(self, stack: int) -> tuple[int, int] | None:
        """(probed function, original return address) of the instance whose return address slot is at
        ``stack``: one the C front pushed (newer than Python's, it pushes over them), else Python's."""
        fast = self._up.fast
        found = None if fast is None else fast.find_return(stack)
        if found is not None:
            return found
        instances = self._up.return_instances
        ri = instances[-1] if instances and instances[-1].stack == stack else next(
            (ri for ri in reversed(instances) if ri.stack == stack), None)
        return None if ri is None else (ri.func, ri.orig_ret)

    def _hook(self, target: int) -> None:
        if target not in self._hooked:
            self._hooked.add(target)
            self.cpu.hooks.add_raw_code(self._on_return_address, target, target)
            self.cpu.flush_code(target, target + 1)

    def _on_handlers(self, before: PtRegs, after: PtRegs) -> None:
        """The kernel ran return handlers that may set registers (the Python path). What they set is
        the reference's too; ip set elsewhere moves where the caller resumes."""
        returns = self._open.get(self._sched.current.tid)
        if not returns:
            return
        opened = returns[-1]
        if self._regs:
            self._check_view(opened, before)
        opened.changes.update({name: getattr(after, name) for name in STATE_INDEX if name != "ip"
                               and getattr(after, name) != getattr(before, name)})
        if after.ip != before.ip:
            opened.target = after.ip
            self._hook(after.ip)

    def _on_signal_frame(self, restorer: int | None, _ip: int) -> None:
        """Kernel observer: a handler's frame is built (the thread's open returns wait for its
        rt_sigreturn) or returned from (they go on). A frame never returned from (a siglongjmp out of the
        handler) takes them away without a verdict, as signals.py does for entry hits."""
        tid = self._sched.current.tid
        if restorer is not None:
            self._held.push(self._open.pop(tid, []))
        elif (held := self._held.pop(None)) is not None:
            self._open[tid] = held + self._open.get(tid, [])

    def _on_return_address(self, _uc: object, addr: int, _size: int, _ud: object) -> None:
        try:
            returns = self._open.get(self._sched.current.tid)
            if not returns or returns[-1].target != addr:
                return
            raw = self.raw.read()
            opened = returns[-1]
            if raw[RAW_RSP:] == opened.start_raw[RAW_RSP:]:  # every byte as the ret left it: the common case
                returns.pop()
                self.count += 1
            elif _QWORD.unpack_from(raw, RAW_RSP)[0] == opened.rsp:  # else another activation runs this code
                returns.pop()
                self.count += 1
                self._judge(opened, raw)
        except BaseException as exc:
            self.cpu.hooks.raised(exc)

    # ------------------------------------------------------------------ verdicts
    def _transaction(self, opened: OpenReturn) -> Transaction:
        """The return as a probe transaction, for the checks and the violation's words."""
        name = self._names.get(opened.func) or self._names.setdefault(opened.func, self._spec(opened.func))
        start = opened.start_raw[:RAW_RIP] + _QWORD.pack(opened.target) + opened.start_raw[RAW_RIP + 8:]
        tx = Transaction(ProbeSite(name, opened.uprobe, opened.target, b"", True, opened.target, -1),
                         opened.number, start, {})
        tx.path = EntryPath.RETURN
        return tx

    def _judge(self, opened: OpenReturn, raw: bytes) -> None:
        if not self._regs:
            return
        tx = self._transaction(opened)
        tx.end_raw, tx.end_addr, tx.end_rsp = raw, opened.target, opened.rsp
        expected = tx.start_raw
        if opened.changes:
            expected = _with_changes(tx.start_state, opened.changes, tx.start_raw)
        found = check_regs(tx, Expected(expected, (), tuple(opened.changes)))
        if found:
            self.report(found)

    def _check_view(self, opened: OpenReturn, seen: PtRegs) -> None:
        """The pt_regs the return handlers were given must be the state the ``ret`` left, ip the
        return address: a handler reading a saved word from the wrong slot acts on another register."""
        tx = self._transaction(opened)
        diffs = {}
        for name, i in STATE_INDEX.items():
            want, got = tx.start_state[i], getattr(seen, name)
            if name == "flags":
                want, got = want & FLAGS_MASK, got & FLAGS_MASK
            if want != got:
                diffs[name] = f"the return had {want:#x}, the handlers saw {got:#x}"
        if diffs:
            summary = "pt_regs given to the return handlers: " + ", ".join(f"{k} {v}" for k, v in diffs.items())
            self.report([violation(Check.REGS, tx, summary, consumer_view=diffs, path=EntryPath.RETURN.value)])

    def _never_resumed(self, opened: OpenReturn, why: str) -> None:
        if self._resume:
            self.report([violation(Check.RESUME, self._transaction(opened), f"the return never reached its "
                                   f"caller at {opened.target:#x}: {why}", expected=opened.target)])

    def _spec(self, func: int) -> str:
        names = [a.resolved.spec.text for a in self.machine.attachments if a.address == func
                 and a.resolved.spec.text.startswith("uretprobe")]
        return (names[0] if names else f"uretprobe:{func:#x}") + " (return)"


def _with_changes(state: list[int], changes: dict[str, int], raw: bytes) -> bytes:
    changed = list(state)
    for name, value in changes.items():
        changed[STATE_INDEX[name]] = value
    return encode_state(changed, decode_extended(raw))
