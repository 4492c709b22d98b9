"""The x86-64 registers the harness touches, the register sets it reads together, and the user-mode
rules for rflags."""

from __future__ import annotations

import enum

import unicorn.x86_const as x86

# User-mode rflags as Linux keeps them (docs/linux-6.18-observed.md section 10): bit 1 and IF always
# set, IOPL 0 and no virtual-8086 bits; at CPL 3 the guest's popf/iret cannot change those, and a value
# the fake kernel writes for user mode gets the same treatment (the kernel never returns to user mode
# with interrupts off).
FLAGS_FIXED = 0x202  # bit 1 | IF
FLAGS_KERNEL_ONLY = 0x3000 | 0x20000 | 0x80000 | 0x100000  # IOPL, VM, VIF, VIP


def user_flags(value: int) -> int:
    """``value`` as user-mode rflags can hold it."""
    return (value & ~FLAGS_KERNEL_ONLY & 0xFFFFFFFF) | FLAGS_FIXED


class Reg(enum.IntEnum):
    """x86-64 registers the harness touches, valued as Unicorn's ids."""

    RAX = x86.UC_X86_REG_RAX
    RBX = x86.UC_X86_REG_RBX
    RCX = x86.UC_X86_REG_RCX
    RDX = x86.UC_X86_REG_RDX
    RSI = x86.UC_X86_REG_RSI
    RDI = x86.UC_X86_REG_RDI
    RBP = x86.UC_X86_REG_RBP
    RSP = x86.UC_X86_REG_RSP
    R8 = x86.UC_X86_REG_R8
    R9 = x86.UC_X86_REG_R9
    R10 = x86.UC_X86_REG_R10
    R11 = x86.UC_X86_REG_R11
    R12 = x86.UC_X86_REG_R12
    R13 = x86.UC_X86_REG_R13
    R14 = x86.UC_X86_REG_R14
    R15 = x86.UC_X86_REG_R15
    RIP = x86.UC_X86_REG_RIP
    RFLAGS = x86.UC_X86_REG_EFLAGS
    FS_BASE = x86.UC_X86_REG_FS_BASE
    GS_BASE = x86.UC_X86_REG_GS_BASE
    MXCSR = x86.UC_X86_REG_MXCSR
    FPCW = x86.UC_X86_REG_FPCW
    FPSW = x86.UC_X86_REG_FPSW  # the top-of-stack field (bits 13:11) included
    FPTAG = x86.UC_X86_REG_FPTAG  # the full tag word: two bits a physical register, 3 = empty
    CS = x86.UC_X86_REG_CS
    SS = x86.UC_X86_REG_SS
    DS = x86.UC_X86_REG_DS
    ES = x86.UC_X86_REG_ES
    FS = x86.UC_X86_REG_FS
    GS = x86.UC_X86_REG_GS
    CR0 = x86.UC_X86_REG_CR0


# What Linux hands a task at exec: start_thread() (rflags IF and the reserved bit, __USER_CS and
# __USER_DS in cs and ss, null data selectors, fs and gs bases 0) and the FPU's init state
# (fpstate_init_user: x87 control word 0x37f, every x87 register empty, MXCSR 0x1f80, xmm and ymm 0).
USER_CS, USER_DS = 0x33, 0x2B
EXEC_RFLAGS, EXEC_FCW, EXEC_MXCSR, EMPTY_TAGS = 0x202, 0x37F, 0x1F80, 0xFFFF
# Unicorn starts with CR0 = PE|ET. Linux runs with NE (an unmasked x87 exception is #MF, vector 16,
# rather than the legacy FERR# line, which Unicorn ignores) and MP (fwait honours TS).
CR0_MP, CR0_NE = 1 << 1, 1 << 5
EXEC_STATE: tuple[tuple[Reg, int], ...] = (
    (Reg.RFLAGS, EXEC_RFLAGS), (Reg.CS, USER_CS), (Reg.SS, USER_DS), (Reg.DS, 0), (Reg.ES, 0), (Reg.FS, 0),
    (Reg.GS, 0), (Reg.FS_BASE, 0), (Reg.GS_BASE, 0), (Reg.FPCW, EXEC_FCW), (Reg.FPSW, 0), (Reg.FPTAG, EMPTY_TAGS),
    (Reg.MXCSR, EXEC_MXCSR),
)
FXSAVE_SIZE = 512

GPRS: tuple[Reg, ...] = (
    Reg.RAX, Reg.RBX, Reg.RCX, Reg.RDX, Reg.RSI, Reg.RDI, Reg.RBP, Reg.RSP,
    Reg.R8, Reg.R9, Reg.R10, Reg.R11, Reg.R12, Reg.R13, Reg.R14, Reg.R15,
)

# The syscall snapshot: number, six arguments, then where, with which flags, and the stack.
SYSCALL_REGS: tuple[Reg, ...] = (
    Reg.RAX, Reg.RDI, Reg.RSI, Reg.RDX, Reg.R10, Reg.R8, Reg.R9, Reg.RIP, Reg.RFLAGS, Reg.RSP,
)


# ------------------------------------------------------------------ raw state (the verifiers' hot path)
# A probe transaction reads the whole user state at its start and end. One C call each way, raw
# bytes out, compared as bytes: decoding into registers happens only when something differs.

STATE_REGS: tuple[int, ...] = (
    (Reg.RIP, Reg.RSP) + tuple(r for r in GPRS if r != Reg.RSP)
    + (Reg.RFLAGS, Reg.FS_BASE, Reg.GS_BASE, Reg.MXCSR) + tuple(x86.UC_X86_REG_XMM0 + i for i in range(16))
    + (x86.UC_X86_REG_FPCW, x86.UC_X86_REG_FPSW, x86.UC_X86_REG_FPTAG) + tuple(x86.UC_X86_REG_ST0 + i for i in range(8))
)
"""rip and rsp first: everything a probe hit must leave as it was is then one slice of the snapshot."""
STATE_FLAGS_OFFSET = 8 * 17  # rip, rsp, the 15 other GPRs in GPRS order, then rflags
STATE_XMM_OFFSET = 8 * 21  # after rflags, fs base, gs base, mxcsr (8 bytes each); then xmm0-15
STATE_X87_OFFSET = STATE_XMM_OFFSET + 16 * 16  # x87 control, status and tag words (8 bytes each), then st0-7
STATE_BYTES = STATE_X87_OFFSET + 3 * 8 + 8 * 16  # (st registers: 10 bytes each, in 16)
STATE_OFFSETS: tuple[int, ...] = (tuple(8 * i for i in range(21)) + tuple(STATE_XMM_OFFSET + 16 * i for i in range(16))
                                  + tuple(STATE_X87_OFFSET + 8 * i for i in range(3))
                                  + tuple(STATE_X87_OFFSET + 24 + 16 * i for i in range(8)))
"""Where each of STATE_REGS lies in a snapshot."""

