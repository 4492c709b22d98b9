"""The uprobe syscalls of each design: sys_uprobe (336) and sys_uretprobe (335, RFC 462).

They are "raw" rows: they build pt_regs at entry, change them as the kernel does,
and leave through SYSRET or IRET by do_syscall_64's rule (spec 2.0).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from emu.abi import NR_UPROBE, NR_URETPROBE, NR_URETPROBE_RFC, RED_ZONE, Signal
from emu.designs import RetMode, SiteMode
from emu.kernel.exits import GuestKilled
from emu.kernel.table import Row
from emu.kernel.uprobes import tramp_code as tc
from emu.kernel.uprobes.consumers import Path
from emu.kernel.uprobes.core import Uprobes
from emu.kernel.uprobes.fastpath import FastPaths
from emu.kernel.uprobes.regs import ExitPath, PtRegs, return_from_syscall, syscall_entry_regs
from emu.memory import UserFault

U64 = (1 << 64) - 1


def _leave(up: Uprobes, regs: PtRegs, held: list[int], force_iret: bool = False) -> None:
    path = return_from_syscall(up.cpu, regs, held)
    up.stats.exits[(ExitPath.IRET if force_iret else path).value] += 1


def _sigill(regs: PtRegs, why: str) -> GuestKilled:
    """force_sig(SIGILL) from a syscall: a handler sees SI_KERNEL and resumes after the syscall."""
    return GuestKilled(Signal.SIGILL, regs.ip - 2, why, resume_ip=regs.ip)


def _fail(up: Uprobes, regs: PtRegs, held: list[int], errno_value: int) -> None:
    regs.ax = -errno_value & U64
    _leave(up, regs, held)


def _read_words(up: Uprobes, regs: PtRegs, addr: int, count: int) -> list[int]:
    up.stats.copied += 8 * count
    try:
        return list(struct.unpack(f"<{count}Q", up.mem.read_user(addr, 8 * count)))
    except UserFault:
        raise _sigill(regs, "cannot read the trampoline's saved registers") from None


def _write_words(up: Uprobes, regs: PtRegs, addr: int, words: list[int]) -> None:
    up.stats.copied += 8 * len(words)
    try:
        up.mem.write_user(addr, struct.pack(f"<{len(words)}Q", *(w & U64 for w in words)))
    except UserFault:
        raise _sigill(regs, "cannot write the trampoline's saved registers") from None


def sys_uprobe_call(up: Uprobes, nr: int, entry: list[int] | None = None) -> None:
    """sys_uprobe of 6.18 (nop5 -> call) and of nop10 (lea + call): spec 2.1 and 3.8."""
    if entry is not None and up.fast is not None and up.fast.call(entry):
        return
    regs, held = syscall_entry_regs(up.cpu, nr)
    assert up.design.uprobe_syscall_errno is not None
    if not up.sites.in_trampoline(regs.ip):
        return _fail(up, regs, held, up.design.uprobe_syscall_errno)
    insn_len = 10 if up.design.sites is SiteMode.LEA_CALL_NOP10 else 5
    extra = RED_ZONE if insn_len == 10 else 0
    ax, r11, cx, retaddr = _read_words(up, regs, regs.sp, 4)
    ip = regs.ip
    regs.ax, regs.r11, regs.cx = ax, r11, cx
    regs.ip = (retaddr - insn_len) & U64
    regs.sp = (regs.sp + 32 + extra) & U64
    regs.orig_ax = U64
    sp = regs.sp
    if up.shadow_stack is not None:  # shstk_pop the trampoline's return address (spec 2.1 step 6, 3.7)
        sret = up.shadow_stack.pop()
        if sret != retaddr:
            up.shadow_stack.kernel_violation("sys_uprobe: shstk_pop does not match args.retaddr", sret, retaddr)
            raise _sigill(regs, "shadow stack does not match the trampoline's return address")
    up.handle_syscall_uprobe(regs, regs.ip, Path.CALL)
    if regs.sp != sp:  # a consumer moved sp: the slow IRET path
        if (retaddr - insn_len) & U64 == regs.ip:
            regs.ip = (regs.ip + insn_len) & U64
        return _leave(up, regs, held)
    regs.sp = (regs.sp - 32 - extra) & U64
    if (retaddr - insn_len) & U64 != regs.ip:
        retaddr = regs.ip  # a consumer redirected ip: the trampoline returns there
    if up.shadow_stack is not None:
        up.shadow_stack.push(retaddr)  # spec 2.1 step 12: for the trampoline's ret
    _write_words(up, regs, regs.sp, [regs.ax, regs.r11, regs.cx, retaddr])
    regs.ip = ip
    regs.r11 = regs.flags  # "ensure sysret"; the trampoline pops the real values
    regs.cx = regs.ip
    regs.ax = 0
    _leave(up, regs, held)


def sys_uprobe_slot(up: Uprobes, nr: int, entry: list[int] | None = None) -> None:
    """jmp-slots: find the probe from the slot, restore everything, IRET to probe+5 (DESIGN.md)."""
    if entry is not None and up.fast is not None and up.fast.slot(entry):
        return
    regs, held = syscall_entry_regs(up.cpu, nr)
    assert up.design.uprobe_syscall_errno is not None
    vaddr = up.sites.probe_of_slot(regs.ip)
    if vaddr is None:
        return _fail(up, regs, held, up.design.uprobe_syscall_errno)
    ax, r11, cx = _read_words(up, regs, regs.sp, 3)
    regs.ax, regs.r11, regs.cx = ax, r11, cx
    regs.sp = (regs.sp + 24 + RED_ZONE) & U64
    regs.ip = vaddr
    regs.orig_ax = U64
    up.handle_syscall_uprobe(regs, vaddr, Path.JMP)
    if regs.ip == vaddr:
        regs.ip = vaddr + 5
    _leave(up, regs, held, force_iret=True)


def _uretprobe_entry(up: Uprobes, nr: int, check_offset: int) -> tuple[PtRegs, list[int]]:
    """Steps 1-4 of spec 2.2, shared by 335 and the RFC's 462: the call must come from the trampoline
    (else SIGILL); rax/rcx/r11 come back from the stack and sp moves past them."""
    regs, held = syscall_entry_regs(up.cpu, nr)
    if up.xol is None or regs.ip != up.xol.vaddr + check_offset:
        raise _sigill(regs, "uretprobe syscall from outside the uretprobe trampoline")
    r11, cx, ax = _read_words(up, regs, regs.sp, 3)
    regs.r11, regs.cx, regs.ax = r11, cx, ax
    regs.sp = (regs.sp + 24) & U64
    regs.orig_ax = U64
    return regs, held


def sys_uretprobe(up: Uprobes, nr: int, entry: list[int] | None = None) -> None:
    """sys_uretprobe (335), spec 2.2."""
    regs, held = _uretprobe_entry(up, nr, tc.URETPROBE_335_CHECK)
    ip, sp = regs.ip, regs.sp
    up.handle_trampoline(regs)
    if regs.sp != sp or up.shadow_stack is not None:  # shstk on: IRET, the trampoline's ret would #CP (2.2 step 7)
        return _leave(up, regs, held)
    regs.sp = (regs.sp - 24) & U64
    _write_words(up, regs, regs.sp, [regs.r11, regs.cx, regs.ip])
    regs.ip = ip
    regs.r11 = regs.flags
    regs.cx = regs.ip
    _leave(up, regs, held)


def sys_uretprobe_rfc(up: Uprobes, nr: int, entry: list[int] | None = None) -> None:
    """The RFC's 462: restore rax/rcx/r11, sp += 24, run the return handlers, IRET to the real return address."""
    regs, held = _uretprobe_entry(up, nr, tc.URETPROBE_RFC_CHECK)
    up.handle_trampoline(regs)
    _leave(up, regs, held, force_iret=True)


def _row(nr: int, name: str, fn: Callable[[Uprobes, int, list[int] | None], None], up: Uprobes) -> Row:
    return Row(nr, name, lambda k, _nr, entry: fn(up, nr, entry), (), raw=True)


def uprobe_rows(up: Uprobes) -> tuple[Row, ...]:
    """The syscall rows a design adds to the table (absent numbers stay -ENOSYS)."""
    design = up.design
    up.fast = FastPaths(up)
    rows: list[Row] = []
    if design.sites in (SiteMode.CALL_NOP5, SiteMode.LEA_CALL_NOP10):
        rows.append(_row(NR_UPROBE, "uprobe", sys_uprobe_call, up))
    elif design.sites is SiteMode.JMP_SLOT_NOP5:
        rows.append(_row(NR_UPROBE, "uprobe", sys_uprobe_slot, up))
    if design.uretprobe is RetMode.SYSCALL_335:
        rows.append(_row(NR_URETPROBE, "uretprobe", sys_uretprobe, up))
    elif design.uretprobe is RetMode.RFC_462:
        rows.append(_row(NR_URETPROBE_RFC, "uretprobe", sys_uretprobe_rfc, up))
    return tuple(rows)


