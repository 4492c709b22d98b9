"""The uprobe syscalls, as the design's Handler and ReturnTrampoline describe them.

sys_uprobe (336 in every built-in design; spec 2.1) and sys_uretprobe (335, or the RFC's 462;
spec 2.2) are "raw" rows: they build pt_regs at entry, change them as the kernel does, and
leave through SYSRET or IRET by do_syscall_64's rule (spec 2.0).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from emu.abi import U64, Signal
from emu.designs import Exit
from emu.kernel.exits import GuestKilled
from emu.kernel.rows import Row
from emu.kernel.uprobes.core import Uprobes
from emu.kernel.uprobes.fastpath import FastPaths
from emu.kernel.uprobes.plan import UprobePlan
from emu.kernel.uprobes.regs import ExitPath, PtRegs, return_from_syscall, syscall_entry_regs
from emu.process.memory import UserFault


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


def _locate(up: Uprobes, regs: PtRegs, plan: UprobePlan) -> tuple[int, list[int], int | None] | None:
    """Spec 2.1 steps 1-2: (probe address, the saved words, the call's return address), read in one copy;
    None if the call came from anywhere but a trampoline or slot."""
    vaddr = up.sites.probe_of_slot(regs.ip) if plan.by_slot else None
    if vaddr is None if plan.by_slot else not up.in_trampoline(regs.ip):
        return None
    words = _read_words(up, regs, regs.sp + plan.saved_offset, plan.words)
    if vaddr is not None:
        return vaddr, words, None
    retaddr = words.pop()
    return (retaddr - plan.branch_end) & U64, words, retaddr


def sys_uprobe(up: Uprobes, nr: int, entry: list[int] | None = None) -> None:
    """sys_uprobe: restore what the trampoline saved, run the consumers, return as the design's plan says."""
    if entry is not None and up.fast is not None and up.fast.uprobe(entry):
        return
    plan = up.plan
    assert plan is not None
    regs, held = syscall_entry_regs(up.cpu, nr)
    located = _locate(up, regs, plan)
    if located is None:
        return _fail(up, regs, held, plan.outside_errno)
    vaddr, saved, retaddr = located
    trampoline_ip = regs.ip
    for name, word in zip(plan.saved, saved, strict=True):
        setattr(regs, name, word)
    popped = plan.popped(from_call=retaddr is not None)
    regs.sp = (regs.sp + popped) & U64
    regs.ip = vaddr
    regs.orig_ax = U64
    if retaddr is not None and up.shadow_stack is not None:  # shstk_pop the call's return address (2.1 step 6, 3.7)
        sret = up.shadow_stack.pop()
        if sret != retaddr:
            up.shadow_stack.kernel_violation("sys_uprobe: shstk_pop does not match args.retaddr", sret, retaddr)
            raise _sigill(regs, "shadow stack does not match the trampoline's return address")
    sp = regs.sp
    up.handle_syscall_uprobe(regs, vaddr, plan.path)
    if plan.exit is Exit.TRAMPOLINE and regs.sp == sp and retaddr is not None:
        return _back_into_trampoline(up, regs, held, vaddr, popped, trampoline_ip)
    if regs.ip == vaddr:  # no consumer redirected: skip the site, which is never emulated (spec 2.1)
        regs.ip = (vaddr + plan.patch_length) & U64
    if plan.exit is Exit.SYSRET:
        regs.cx, regs.r11 = regs.ip, regs.flags  # make the exit SYSRET-able, losing the guest's rcx and r11
    _leave(up, regs, held, force_iret=plan.exit is Exit.IRET)


def _back_into_trampoline(up: Uprobes, regs: PtRegs, held: list[int], vaddr: int, popped: int,
                          trampoline_ip: int) -> None:
    """Spec 2.1 steps 10-13: write the words back where they were and SYSRET into the trampoline,
    whose pops and ret restore them and return to the (possibly redirected) next instruction."""
    plan = up.plan
    assert plan is not None
    retaddr = (vaddr + plan.branch_end) & U64 if regs.ip == vaddr else regs.ip
    regs.sp = (regs.sp - popped) & U64
    if up.shadow_stack is not None:
        up.shadow_stack.push(retaddr)  # spec 2.1 step 12: for the trampoline's ret
    _write_words(up, regs, regs.sp + plan.saved_offset, [getattr(regs, name) for name in plan.saved] + [retaddr])
    regs.ip = trampoline_ip
    regs.r11 = regs.flags  # "ensure sysret"; the trampoline pops the real values
    regs.cx = regs.ip
    regs.ax = 0
    _leave(up, regs, held)


def sys_uretprobe(up: Uprobes, nr: int, entry: list[int] | None = None) -> None:
    """sys_uretprobe (335, spec 2.2; the RFC's 462 with exit='iret')."""
    ret = up.ret_plan
    regs, held = syscall_entry_regs(up.cpu, nr)
    # steps 1-4: only from the trampoline (else SIGILL); the saved words come back, sp moves past them
    if up.xol is None or regs.ip != up.xol.vaddr + ret.syscall_return:
        raise _sigill(regs, "uretprobe syscall from outside the uretprobe trampoline")
    for name, word in zip(ret.saved, _read_words(up, regs, regs.sp, len(ret.saved)), strict=True):
        setattr(regs, name, word)
    popped = ret.popped
    regs.sp = (regs.sp + popped) & U64
    regs.orig_ax = U64
    ip, sp = regs.ip, regs.sp
    up.handle_trampoline(regs)
    # a moved sp, or shstk on (the trampoline's ret would #CP, 2.2 step 7): IRET straight to the caller
    if ret.exit is Exit.IRET or regs.sp != sp or up.shadow_stack is not None:
        return _leave(up, regs, held, force_iret=ret.exit is Exit.IRET)
    regs.sp = (regs.sp - popped) & U64
    _write_words(up, regs, regs.sp, [getattr(regs, name) for name in ret.saved[:-1]] + [regs.ip])
    regs.ip = ip
    regs.r11 = regs.flags
    regs.cx = regs.ip
    _leave(up, regs, held)


def _row(nr: int, name: str, fn: Callable[[Uprobes, int, list[int] | None], None], up: Uprobes) -> Row:
    return Row(nr, name, lambda k, _nr, entry: fn(up, nr, entry), (), raw=True)


def uprobe_rows(up: Uprobes) -> tuple[Row, ...]:
    """The syscall rows a design adds to the table (absent numbers stay -ENOSYS)."""
    up.fast = FastPaths(up)
    rows: list[Row] = []
    if up.plan is not None:
        rows.append(_row(up.plan.nr, "uprobe", sys_uprobe, up))
    if up.ret_plan.nr is not None:
        rows.append(_row(up.ret_plan.nr, "uretprobe", sys_uretprobe, up))
    return tuple(rows)
