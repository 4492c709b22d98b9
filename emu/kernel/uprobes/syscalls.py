"""The uprobe syscalls, as the design's Handler and ReturnTrampoline describe them.

sys_uprobe (336 in every built-in design; spec 2.1) and sys_uretprobe (335, or the RFC's 462;
spec 2.2) are "raw" rows: they build pt_regs at entry, change them as the kernel does, and
leave through SYSRET or IRET by do_syscall_64's rule (spec 2.0).
"""

from __future__ import annotations

import struct

from emu.abi import U64, Signal
from emu.designs import Exit
from emu.kernel.exits import GuestKilled
from emu.kernel.rows import Row
from emu.kernel.uprobes.core import Uprobes
from emu.kernel.uprobes.fastpath import FastPaths
from emu.kernel.uprobes.plan import UprobePlan
from emu.kernel.uprobes.regs import ExitPath, PtRegs, return_from_syscall, syscall_entry_regs, sysret_allowed
from emu.process.memory import UserFault


def _leave(up: Uprobes, regs: PtRegs, held: list[int], force_iret: bool = False) -> None:
    path = return_from_syscall(up.cpu, regs, held)
    up.stats.exits[(ExitPath.IRET if force_iret else path).value] += 1


def _sigill(ip: int, why: str) -> GuestKilled:
    """force_sig(SIGILL) from a syscall returning to ``ip``: a handler sees SI_KERNEL and resumes there."""
    return GuestKilled(Signal.SIGILL, ip - 2, why, resume_ip=ip)


def _fail(up: Uprobes, regs: PtRegs, held: list[int], errno_value: int) -> None:
    regs.ax = -errno_value & U64
    _leave(up, regs, held)


def _read_words(up: Uprobes, ip: int, addr: int, count: int) -> list[int]:
    up.stats.copied += 8 * count
    try:
        return list(struct.unpack(f"<{count}Q", up.mem.read_user(addr, 8 * count)))
    except UserFault:
        raise _sigill(ip, "cannot read the trampoline's saved registers") from None


def _write_words(up: Uprobes, ip: int, addr: int, words: list[int]) -> None:
    up.stats.copied += 8 * len(words)
    try:
        up.mem.write_user(addr, struct.pack(f"<{len(words)}Q", *(w & U64 for w in words)))
    except UserFault:
        raise _sigill(ip, "cannot write the trampoline's saved registers") from None


def _locate(up: Uprobes, plan: UprobePlan, ip: int, sp: int) -> tuple[int, list[int], int | None] | None:
    """Spec 2.1 steps 1-2: (probe address, the saved words, the call's return address), read in one copy;
    None if the call came from anywhere but a trampoline or slot."""
    vaddr = up.sites.probe_of_slot(ip) if plan.by_slot else None
    if vaddr is None if plan.by_slot else not up.in_trampoline(ip):
        return None
    words = _read_words(up, ip, sp + plan.saved_offset, plan.words)
    if vaddr is not None:
        return vaddr, words, None
    retaddr = words.pop()
    return (retaddr - plan.branch_end) & U64, words, retaddr


def sys_uprobe(up: Uprobes, nr: int, entry: list[int] | None = None) -> None:
    """sys_uprobe as the design's plan says (spec 2.1): find the probe and the words the trampoline saved,
    run the consumers on pt_regs with those words restored, return by the plan's exit. When no consumer
    can change anything (they only count) the exit follows from the plan alone: pt_regs is never built,
    and Uprobes.resume writes just the registers the exit sets (a plan that restores rflags has none).
    ``entry``: the dispatcher's snapshot (Cpu.read_syscall: rip, rflags and rsp at 7-9), or None to read it."""
    plan = up.plan
    assert plan is not None
    if up.fast is not None:
        up.fast.handed_over()
    ip, flags, sp = entry[7:10] if entry is not None else up.cpu.read_syscall()[7:10]
    ip += 2  # rip was at the syscall
    located = _locate(up, plan, ip, sp)
    if located is None:
        return _fail(up, *syscall_entry_regs(up.cpu, nr), plan.outside_errno)
    vaddr, saved, retaddr = located
    probe = up.probes.get(vaddr)  # None: no uprobe there any more, the hit just returns (spec 3.6)
    if (up.resume is not None and up.shadow_stack is None and sysret_allowed(ip, flags)
            and (probe is None or probe.changes_nothing)):
        if probe is not None:
            up.handler_chain(probe, None, plan.path)
        return _resume_unchanged(up, plan, located, ip, flags, sp)
    regs, held = syscall_entry_regs(up.cpu, nr)
    for name, word in zip(plan.saved, saved, strict=True):
        setattr(regs, name, word)
    popped = plan.popped(from_call=retaddr is not None)
    regs.sp = restored_sp = (regs.sp + popped) & U64
    regs.ip = vaddr
    regs.orig_ax = U64
    if retaddr is not None and up.shadow_stack is not None:  # shstk_pop the call's return address (2.1 step 6, 3.7)
        sret = up.shadow_stack.pop()
        if sret != retaddr:
            up.shadow_stack.kernel_violation("sys_uprobe: shstk_pop does not match args.retaddr", sret, retaddr)
            raise _sigill(ip, "shadow stack does not match the trampoline's return address")
    up.handle_syscall_uprobe(regs, vaddr, plan.path)
    if plan.exit is Exit.TRAMPOLINE and regs.sp == restored_sp and retaddr is not None:
        return _back_into_trampoline(up, regs, held, vaddr, popped, ip)
    if regs.ip == vaddr:  # no consumer redirected: skip the site, which is never emulated (spec 2.1)
        regs.ip = (vaddr + plan.patch_length) & U64
    if plan.exit is Exit.SYSRET:
        regs.cx, regs.r11 = regs.ip, regs.flags  # make the exit SYSRET-able, losing the guest's rcx and r11
    _leave(up, regs, held, force_iret=plan.exit is Exit.IRET)


def _resume_unchanged(up: Uprobes, plan: UprobePlan, located: tuple[int, list[int], int | None], ip: int, flags: int,
                      sp: int) -> None:
    """The exit of a hit that changed nothing, as return_from_syscall would leave pt_regs: the 'trampoline'
    exit writes the words back as they were and SYSRETs into the trampoline (rax = 0, rcx = ip,
    r11 = flags: its pops and ret do the rest); the others restore the words and leave past the site."""
    vaddr, saved, retaddr = located
    if plan.exit is Exit.TRAMPOLINE:  # (entered by a call: Handler.problems refuses this exit without one)
        up.stats.copied += 8 * plan.words  # steps 10-11: written back, unchanged
        up.stats.exits[ExitPath.SYSRET.value] += 1
        up.cpu.write_syscall_return(0, ip, flags)
        return
    up.stats.exits[(ExitPath.IRET if plan.exit is Exit.IRET else ExitPath.SYSRET).value] += 1
    assert up.resume is not None
    up.resume(plan.resume_values(vaddr, saved, ip, flags, sp, from_call=retaddr is not None))


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
    _write_words(up, regs.ip, regs.sp + plan.saved_offset, [getattr(regs, name) for name in plan.saved] + [retaddr])
    regs.ip = trampoline_ip
    regs.r11 = regs.flags  # "ensure sysret"; the trampoline pops the real values
    regs.cx = regs.ip
    regs.ax = 0
    _leave(up, regs, held)


def sys_uretprobe(up: Uprobes, nr: int) -> None:
    """sys_uretprobe (335, spec 2.2; the RFC's 462 with exit='iret')."""
    ret = up.ret_plan
    regs, held = syscall_entry_regs(up.cpu, nr)
    # steps 1-4: only from the trampoline (else SIGILL); the saved words come back, sp moves past them
    if up.xol is None or regs.ip != up.xol.vaddr + ret.syscall_return:
        raise _sigill(regs.ip, "uretprobe syscall from outside the uretprobe trampoline")
    for name, word in zip(ret.saved, _read_words(up, regs.ip, regs.sp, len(ret.saved)), strict=True):
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
    _write_words(up, regs.ip, regs.sp, [getattr(regs, name) for name in ret.saved[:-1]] + [regs.ip])
    regs.ip = ip
    regs.r11 = regs.flags
    regs.cx = regs.ip
    _leave(up, regs, held)


def uprobe_rows(up: Uprobes) -> tuple[Row, ...]:
    """The syscall rows a design adds to the table (absent numbers stay -ENOSYS)."""
    up.fast = FastPaths(up)
    rows: list[Row] = []
    plan, ret = up.plan, up.ret_plan
    if plan is not None:
        rows.append(Row(plan.nr, "uprobe", lambda k, nr, entry: sys_uprobe(up, nr, entry), (), raw=True))
    if ret.nr is not None:
        rows.append(Row(ret.nr, "uretprobe", lambda k, nr, _entry: sys_uretprobe(up, nr), (), raw=True))
    return tuple(rows)
