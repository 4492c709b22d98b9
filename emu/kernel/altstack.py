"""A thread's alternate signal stack, as Linux keeps it (kernel/signal.c).

The kernel stores what sigaltstack(2) was given: the base, the size and the flags as passed
(SS_ONSTACK included; SS_DISABLE empties base and size). What it reports is computed from the stack
pointer each time (sas_ss_flags): SS_DISABLE for an empty stack, SS_ONSTACK while rsp is on it, plus
SS_AUTODISARM if it was set. A signal frame saves the stored values (unsafe_save_altstack); with
SS_AUTODISARM the stack is then emptied while the handler runs (signal_delivered), and rt_sigreturn
sets it again from the frame (restore_altstack), ignoring every error but a fault.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass

from emu.kernel.errno_ import SyscallError

SS_ONSTACK, SS_DISABLE, SS_AUTODISARM = 1, 2, 1 << 31
MINSIGSTKSZ = 2048  # the kernel's own floor (include/uapi/asm-generic/signal.h); glibc's asks sysconf
STACK_T = struct.Struct("<QIiQ")  # ss_sp, ss_flags, padding, ss_size
assert STACK_T.size == 24


@dataclass(frozen=True, slots=True)
class AltStack:
    sp: int = 0
    flags: int = SS_DISABLE  # as sigaltstack was given them
    size: int = 0

    def contains(self, rsp: int) -> bool:
        """__on_sig_stack: rsp in (sp, sp + size], the stack growing down from sp + size."""
        return self.sp < rsp and rsp - self.sp <= self.size

    def on(self, rsp: int) -> bool:
        """on_sig_stack: never with SS_AUTODISARM (by construction a handler cannot be on it then)."""
        return not self.flags & SS_AUTODISARM and self.contains(rsp)

    def mode(self, rsp: int) -> int:
        """sas_ss_flags: SS_DISABLE for an empty stack, SS_ONSTACK while rsp is on it, else 0."""
        if not self.size:
            return SS_DISABLE
        return SS_ONSTACK if self.on(rsp) else 0

    def reported(self, rsp: int) -> bytes:
        """The stack_t sigaltstack writes back for the old stack."""
        return STACK_T.pack(self.sp, self.mode(rsp) | self.flags & SS_AUTODISARM, 0, self.size)

    def saved(self) -> bytes:
        """The stack_t a signal frame's uc_stack holds."""
        return STACK_T.pack(self.sp, self.flags, 0, self.size)


DISABLED = AltStack()


def changed(current: AltStack, raw: bytes, rsp: int) -> AltStack:
    """do_sigaltstack: the stack ``raw`` (a user stack_t) asks for, given the one set now and rsp.
    EPERM while on the current stack, EINVAL for an unknown mode, ENOMEM below MINSIGSTKSZ."""
    sp, flags, _pad, size = STACK_T.unpack(raw)
    if current.on(rsp):
        raise SyscallError(errno.EPERM)
    mode = flags & ~SS_AUTODISARM
    if mode not in (0, SS_ONSTACK, SS_DISABLE):
        raise SyscallError(errno.EINVAL)
    if (sp, flags, size) == (current.sp, current.flags, current.size):
        return current
    if mode == SS_DISABLE:
        return AltStack(0, flags, 0)
    if size < MINSIGSTKSZ:
        raise SyscallError(errno.ENOMEM)
    return AltStack(sp, flags, size)
