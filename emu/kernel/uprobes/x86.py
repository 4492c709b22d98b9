"""The x86 half of uprobes (the kernel's arch/x86/kernel/uprobes.c): running the probed instruction
once its consumers are done. emu/kernel/uprobes/insn.py analyses the instruction (which of these
paths it takes, spec 4.1); this module emulates it or steps it out of line and fixes up after.

- ``emulate``: branch_xol_ops and push_xol_ops (spec 4.2): a NOP, jmp, jcc, call or push is done
  on pt_regs, never run;
- ``start_xol`` / ``finish_xol``: pre_ssout, then the single step in the [uprobes] slot and
  arch_uprobe_post_xol's fixups (spec 4.3, 4.4), or arch_uprobe_abort_xol's signal on a fault.
The generic core (emu/kernel/uprobes/core.py) calls them from handle_swbp.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol

from emu.abi import U64, Signal
from emu.cpu import Cpu, StopReason
from emu.kernel.exits import GuestKilled
from emu.kernel.uprobes.insn import Analysis, Fixup, Kind, jcc_taken
from emu.kernel.uprobes.records import ShadowStackHooks, Uprobe, UprobeStats, XolArea
from emu.kernel.uprobes.regs import PtRegs, regs_from_cpu, regs_to_cpu
from emu.process.memory import Memory, UserFault


class ProbedProcess(Protocol):
    """What the x86 side needs of the generic core (emu/kernel/uprobes/core.py: Uprobes)."""

    cpu: Cpu
    mem: Memory
    stats: UprobeStats
    stepping: bool

    @property
    def shadow_stack(self) -> ShadowStackHooks | None: ...
    def get_xol_area(self) -> XolArea: ...
    def defer(self, work: Callable[[], None]) -> None: ...


def emulate(up: ProbedProcess, insn: Analysis, regs: PtRegs) -> None:
    """branch_xol_ops / push_xol_ops (spec 4.2)."""
    up.stats.emulated += 1
    next_ip = regs.ip + insn.length
    if insn.kind is Kind.NOP:
        regs.ip = next_ip
    elif insn.kind is Kind.JMP:
        regs.ip = (next_ip + insn.rel) & U64
    elif insn.kind is Kind.JCC:
        regs.ip = (next_ip + insn.rel) & U64 if jcc_taken(insn.cc, regs.flags) else next_ip
    elif insn.kind is Kind.CALL:
        _push(up, regs, next_ip)
        if up.shadow_stack is not None:
            up.shadow_stack.push(next_ip)  # LATE10 (spec 4.2)
        regs.ip = (next_ip + insn.rel) & U64
    elif insn.kind is Kind.PUSH:
        _push(up, regs, getattr(regs, insn.push_reg))
        regs.ip = next_ip


def _push(up: ProbedProcess, regs: PtRegs, value: int) -> None:
    up.stats.copied += 8
    try:
        up.mem.write_user((regs.sp - 8) & U64, struct.pack("<Q", value & U64))
    except UserFault as fault:
        raise GuestKilled(Signal.SIGSEGV, regs.ip, f"push to {fault.addr:#x} while emulating a probed insn") from None
    regs.sp = (regs.sp - 8) & U64


def start_xol(up: ProbedProcess, probe: Uprobe, regs: PtRegs) -> None:
    """pre_ssout: copy the insn to a slot, point ip at it; the machine runs exactly one instruction."""
    xol = up.get_xol_area()
    insn = probe.insn
    slot = xol.get_slot(insn.xol_bytes)
    saved_scratch = getattr(regs, insn.scratch) if insn.scratch else 0
    if insn.scratch:
        setattr(regs, insn.scratch, probe.vaddr + insn.length)
    regs.ip = slot
    regs_to_cpu(up.cpu, regs)
    up.stats.xol_steps += 1
    up.defer(lambda: finish_xol(up, probe, slot, saved_scratch))


def finish_xol(up: ProbedProcess, probe: Uprobe, slot: int, saved_scratch: int) -> None:
    """The single step, then arch_uprobe_post_xol's fixups (spec 4.4) or abort_xol's signal."""
    insn = probe.insn
    up.stepping = True
    try:
        reason = up.cpu.step(slot)
    finally:
        up.stepping = False
    regs = regs_from_cpu(up.cpu)
    if insn.scratch:
        setattr(regs, insn.scratch, saved_scratch)
    up.get_xol_area().free_slot(slot)
    if reason is not StopReason.FINISHED:  # arch_uprobe_abort_xol: the fault is reported at vaddr
        regs.ip = probe.vaddr
        regs_to_cpu(up.cpu, regs)
        bad = up.cpu.last_bad_access
        detail = f"{bad.access.value} of {bad.address:#x}" if bad else reason.value
        signal = Signal.SIGILL if reason is StopReason.INVALID_INSN else Signal.SIGSEGV
        raise GuestKilled(signal, probe.vaddr, f"{detail} by the probed instruction, stepped out of line")
    if insn.fixups & Fixup.IP:
        regs.ip = (regs.ip + probe.vaddr - slot) & U64
    if insn.fixups & Fixup.CALL:
        up.mem.write_user(regs.sp, struct.pack("<Q", probe.vaddr + insn.length))
        if up.shadow_stack is not None:
            up.shadow_stack.update_last_frame(probe.vaddr + insn.length)  # LATE10 (spec 4.4)
    regs_to_cpu(up.cpu, regs)
