"""struct pt_regs as the kernel keeps it for a user task, and the way back to user mode.

Word order is the uapi x86-64 one (spec 6): r15 r14 r13 r12 rbp rbx r11 r10 r9 r8
rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss.
"""

from __future__ import annotations

import enum
import operator
import struct
from dataclasses import dataclass, fields

from emu.cpu import GPRS, Cpu, Reg

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
        return struct.pack("<21Q", *(v & 0xFFFFFFFFFFFFFFFF for v in _get_all(self)))

    def copy(self) -> PtRegs:
        return PtRegs(*_get_all(self))


PT_REGS_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(PtRegs))
_get_all = operator.attrgetter(*PT_REGS_FIELDS)


# PtRegs field for each slot of Cpu.read_user_state(): 16 GPRs in emu.cpu.GPRS order, rip, rflags.
STATE_FIELDS: tuple[str, ...] = (
    "ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15",
    "ip", "flags",
)
assert [f"r{f}" if len(f) == 2 and not f[1].isdigit() else f for f in STATE_FIELDS[:16]] == [
    r.name.lower() for r in GPRS
]
FIELD_REG: dict[str, Reg] = dict(zip(STATE_FIELDS, (*GPRS, Reg.RIP, Reg.RFLAGS), strict=True))  # a field's register


def regs_from_cpu(cpu: Cpu, state: list[int] | None = None) -> PtRegs:
    """The user state as an exception entry (INT3) saves it (``state``: already read by the caller)."""
    v = state if state is not None else cpu.read_user_state()
    return PtRegs(
        r15=v[15], r14=v[14], r13=v[13], r12=v[12], bp=v[6], bx=v[1], r11=v[11], r10=v[10], r9=v[9], r8=v[8],
        ax=v[0], cx=v[2], dx=v[3], si=v[4], di=v[5], orig_ax=0xFFFFFFFFFFFFFFFF, ip=v[16], flags=v[17], sp=v[7],
    )


_get_state = operator.attrgetter(*STATE_FIELDS)


def _state(regs: PtRegs) -> list[int]:
    return [v & 0xFFFFFFFFFFFFFFFF for v in _get_state(regs)]


def regs_to_cpu(cpu: Cpu, regs: PtRegs, rip_bias: int = 0, current: list[int] | None = None) -> None:
    """Load the registers from ``regs``; ``rip_bias`` undoes what Unicorn adds after a syscall hook.

    With ``current`` (what the CPU holds now) nothing is written when nothing changed, and
    rip only when it changed: a rip write costs ~10 us in Unicorn (it ends the translation
    block), so a return to the natural next instruction must not write it.
    """
    new = _state(regs)
    old = current
    write_rip = old is None or new[16] != old[16]
    if old is not None and new == old:
        return
    new[16] = (new[16] + rip_bias) & 0xFFFFFFFFFFFFFFFF
    cpu.write_user_state(new, write_rip)


def syscall_entry_regs(cpu: Cpu, nr: int, state: list[int] | None = None) -> tuple[PtRegs, list[int]]:
    """pt_regs at ``syscall`` (spec 2.0): ip = next insn, cx = ip, r11 = flags, ax = -ENOSYS.

    Also returns what the CPU itself holds (with ip already past the ``syscall``, as Unicorn
    will leave it), so the exit can write back only what changed.
    """
    regs = regs_from_cpu(cpu, state)
    regs.ip += 2
    held = _state(regs)
    regs.cx = regs.ip
    regs.r11 = regs.flags
    regs.orig_ax = nr
    regs.ax = -38 & 0xFFFFFFFFFFFFFFFF
    return regs, held


def sysret_allowed(ip: int, flags: int) -> bool:
    """What do_syscall_64 asks of ip and rflags before it returns by SYSRET: canonical, no RF or TF."""
    return ip < TASK_SIZE_MAX and not flags & (RF | TF)


def exit_path(regs: PtRegs) -> ExitPath:
    """do_syscall_64's rule: SYSRET only if cx == ip, r11 == flags, the user segments, and sysret_allowed."""
    if (
        regs.cx == regs.ip
        and regs.r11 == regs.flags
        and regs.cs == USER_CS
        and regs.ss == USER_SS
        and sysret_allowed(regs.ip, regs.flags)
    ):
        return ExitPath.SYSRET
    return ExitPath.IRET


def return_from_syscall(cpu: Cpu, regs: PtRegs, held: list[int]) -> ExitPath:
    """Resume user mode from a syscall the way Linux would, and say which way it went.

    SYSRET loads rcx <- ip and r11 <- flags (and rflags from r11); IRET loads everything
    from ``regs``. Either way every register comes from ``regs`` here, because the rule
    only picks SYSRET when those already agree.
    """
    path = exit_path(regs)
    regs_to_cpu(cpu, regs, rip_bias=-2, current=held)  # Unicorn adds 2 to rip when the syscall hook returns
    return path
