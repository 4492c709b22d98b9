"""struct pt_regs as the kernel keeps it for a user task, and the way back to user mode.

Word order is the uapi x86-64 one (spec 6): r15 r14 r13 r12 rbp rbx r11 r10 r9 r8
rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, fields

from emu.cpu import Cpu, Reg

USER_CS = 0x33
USER_SS = 0x2B
RF = 1 << 16
TF = 1 << 8
TASK_SIZE_MAX = 0x7FFFFFFFF000


class ExitPath(enum.Enum):
    SYSRET = "sysret"
    IRET = "iret"


@dataclass(slots=True)
class PtRegs:
    r15: int = 0
    r14: int = 0
    r13: int = 0
    r12: int = 0
    bp: int = 0
    bx: int = 0
    r11: int = 0
    r10: int = 0
    r9: int = 0
    r8: int = 0
    ax: int = 0
    cx: int = 0
    dx: int = 0
    si: int = 0
    di: int = 0
    orig_ax: int = 0
    ip: int = 0
    cs: int = USER_CS
    flags: int = 0
    sp: int = 0
    ss: int = USER_SS

    def pack(self) -> bytes:
        return struct.pack("<21Q", *(getattr(self, f.name) & 0xFFFFFFFFFFFFFFFF for f in fields(self)))

    def copy(self) -> PtRegs:
        return PtRegs(*(getattr(self, f.name) for f in fields(self)))


_CPU_FIELDS: tuple[tuple[str, Reg], ...] = (
    ("r15", Reg.R15), ("r14", Reg.R14), ("r13", Reg.R13), ("r12", Reg.R12), ("bp", Reg.RBP), ("bx", Reg.RBX),
    ("r11", Reg.R11), ("r10", Reg.R10), ("r9", Reg.R9), ("r8", Reg.R8), ("ax", Reg.RAX), ("cx", Reg.RCX),
    ("dx", Reg.RDX), ("si", Reg.RSI), ("di", Reg.RDI), ("ip", Reg.RIP), ("flags", Reg.RFLAGS), ("sp", Reg.RSP),
)


def regs_from_cpu(cpu: Cpu) -> PtRegs:
    """The user state as an exception entry (INT3) saves it."""
    values = cpu.read_gprs()
    regs = PtRegs()
    for name, reg in _CPU_FIELDS:
        setattr(regs, name, values[reg])
    regs.orig_ax = 0xFFFFFFFFFFFFFFFF
    return regs


def regs_to_cpu(cpu: Cpu, regs: PtRegs, rip_bias: int = 0) -> None:
    """Load every register from ``regs``; ``rip_bias`` undoes what Unicorn adds after a syscall hook."""
    values = {reg: getattr(regs, name) for name, reg in _CPU_FIELDS}
    values[Reg.RIP] += rip_bias
    cpu.write_gprs(values)


def syscall_entry_regs(cpu: Cpu, nr: int) -> PtRegs:
    """pt_regs at ``syscall`` (spec 2.0): ip = next insn, cx = ip, r11 = flags, ax = -ENOSYS."""
    regs = regs_from_cpu(cpu)
    regs.ip += 2
    regs.cx = regs.ip
    regs.r11 = regs.flags
    regs.orig_ax = nr
    regs.ax = -38 & 0xFFFFFFFFFFFFFFFF
    return regs


def exit_path(regs: PtRegs) -> ExitPath:
    """do_syscall_64's rule: SYSRET only if cx == ip, r11 == flags, canonical ip, no RF/TF."""
    if (
        regs.cx == regs.ip
        and regs.r11 == regs.flags
        and regs.cs == USER_CS
        and regs.ss == USER_SS
        and regs.ip < TASK_SIZE_MAX
        and not regs.flags & (RF | TF)
    ):
        return ExitPath.SYSRET
    return ExitPath.IRET


def return_from_syscall(cpu: Cpu, regs: PtRegs) -> ExitPath:
    """Resume user mode from a syscall the way Linux would, and say which way it went.

    SYSRET loads rcx <- ip and r11 <- flags (and rflags from r11); IRET loads everything
    from ``regs``. Either way every register comes from ``regs`` here, because the rule
    only picks SYSRET when those already agree.
    """
    path = exit_path(regs)
    regs_to_cpu(cpu, regs, rip_bias=-2)  # Unicorn adds 2 to rip when the syscall hook returns
    return path
