"""Delivering a signal to a guest handler: the x86-64 rt_sigframe, and rt_sigreturn undoing it.

Frame (arch/x86/include/asm/sigframe.h, rt_sigframe for 64-bit): the return address (the
action's restorer), struct ucontext (flags, link, the alternate stack, struct sigcontext,
the blocked mask), struct siginfo. It goes below the red zone, or at the top of the alternate stack
for SA_ONSTACK when not already on it; rsp is 8 mod 16 at the handler, as after a call. The FPU
state goes between the frame and the red zone, 64-byte aligned and as large as the host kernel makes
it (fpu__alloc_mathframe; hostframe.py, fpu.py), and the handler starts with the FPU's init state.
A frame that would leave the alternate stack it is on is not written (get_sigframe): SIGSEGV.
rt_sigreturn loads what the fpstate pointer then points at, and sets the alternate stack from the
frame's uc_stack (restore_altstack, altstack.py).
"""

from __future__ import annotations

import contextlib
import errno
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu.abi import RED_ZONE, SI_KERNEL
from emu.kernel import fpu
from emu.kernel.altstack import DISABLED, SS_AUTODISARM, STACK_T, changed
from emu.kernel.errno_ import SyscallError
from emu.kernel.hostframe import host_frame
from emu.process.memory import UserFault

if TYPE_CHECKING:
    from emu.kernel.dispatch import Kernel

SA_SIGINFO, SA_ONSTACK, SA_RESTORER = 0x4, 0x08000000, 0x04000000
SA_RESTART = 0x10000000
# Waits a handler always interrupts, SA_RESTART or not (-ERESTARTNOHAND, -ERESTART_RESTARTBLOCK: signal(7)).
NEVER_RESTARTED = frozenset({"poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_pwait", "epoll_pwait2",
                             "pause", "rt_sigsuspend", "rt_sigtimedwait", "nanosleep", "clock_nanosleep",
                             "io_getevents", "semop", "semtimedop", "msgrcv", "msgsnd"})


def restarts(k: Kernel, signo: int, syscall: str) -> bool:
    """Whether ``syscall``, waiting when the handler of ``signo`` is about to run, starts again once the
    handler returns (the kernel's -ERESTARTSYS with SA_RESTART: arch/x86/kernel/signal.c) instead of
    failing with EINTR."""
    raw = k.signals.actions.get(signo)
    return raw is not None and bool(Action.parse(raw).flags & SA_RESTART) and syscall not in NEVER_RESTARTED
SA_NODEFER, SA_RESETHAND = 0x40000000, 0x80000000
UC_OFFSET, UC_STACK_OFFSET, MCONTEXT_OFFSET, SIGMASK_OFFSET, SIGINFO_OFFSET = 8, 24, 48, 304, 312
FRAME_SIZE = SIGINFO_OFFSET + 128
TF, DF, RF = 1 << 8, 1 << 10, 1 << 16
FPSTATE_OFFSET = MCONTEXT_OFFSET + 184  # sigcontext: 18 words, 4 selectors, err, trapno, oldmask, cr2, fpstate
UC_FP_XSTATE, UC_SIGCONTEXT_SS, UC_STRICT_RESTORE_SS = 0x1, 0x2, 0x4
UC_FLAGS = UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS  # frame_uc_flags() on a CPU with XSAVE
# sigcontext order, as indexes into Cpu.read_user_state() (16 GPRs in emu.cpu.GPRS order, rip, rflags)
SIGCONTEXT_ORDER = (8, 9, 10, 11, 12, 13, 14, 15, 5, 4, 6, 1, 3, 0, 2, 7, 16, 17)


@dataclass(frozen=True, slots=True)
class SigInfo:
    signo: int
    code: int
    addr: int = 0  # faults: the address; kill/tgkill: unused
    pid: int = 0
    uid: int = 0

    def pack(self) -> bytes:
        head = struct.pack("<iii4x", self.signo, 0, self.code)
        body = struct.pack("<Q", self.addr) if self.code > 0 and self.code != SI_KERNEL else struct.pack(
            "<ii", self.pid, self.uid)
        return (head + body).ljust(128, b"\0")


@dataclass(frozen=True, slots=True)
class Action:
    handler: int
    flags: int
    restorer: int
    mask: int

    @classmethod
    def parse(cls, raw: bytes) -> Action:
        return cls(*struct.unpack_from("<QQQQ", raw))


def _sigcontext(state: list[int], signo: int, addr: int, fpstate: int) -> bytes:
    words = [state[i] for i in SIGCONTEXT_ORDER]
    segs = struct.pack("<HHHH", 0x33, 0, 0, 0x2B)
    tail = struct.pack("<QQQQQ", 0, 14 if signo == 11 else 0, 0, addr, fpstate)  # err, trapno, oldmask, cr2
    return struct.pack(f"<{len(words)}Q", *words) + segs + tail + bytes(64)


def setup_frame(k: Kernel, signo: int, info: SigInfo, state: list[int], action: Action) -> list[int]:
    """Write the frame; return the user state the handler starts with. A frame that cannot be written
    is SIGSEGV, as in the kernel (raised as UserFault for the caller)."""
    layout, alt = host_frame(), k.signals.altstack
    sp = state[7] - RED_ZONE
    nested = alt.on(state[7])
    entering = bool(action.flags & SA_ONSTACK) and alt.mode(sp) == 0
    if entering:
        sp = alt.sp + alt.size
    fpstate = (sp - layout.extended_size) & ~(fpu.FPSTATE_ALIGN - 1)
    frame = ((fpstate - FRAME_SIZE) & ~0xF) - 8
    if (nested or entering) and not alt.contains(frame):
        raise UserFault(frame)  # the frame would overflow the alternate stack
    blob = (struct.pack("<QQQ", action.restorer, UC_FLAGS, 0) + alt.saved()
            + _sigcontext(state, signo, info.addr, fpstate) + struct.pack("<Q", k.signals.mask) + info.pack())
    k.mem.write_user(fpstate, fpu.save(k.cpu, layout))
    k.mem.write_user(frame, blob)
    k.cpu.load_fxsave_image(fpu.init_image())  # the handler starts with the init FPU state
    if alt.flags & SS_AUTODISARM:
        k.signals.altstack = DISABLED  # sas_ss_reset, for as long as the handler runs
    k.signals.mask |= action.mask | (0 if action.flags & SA_NODEFER else 1 << (signo - 1))
    if action.flags & SA_RESETHAND:
        k.signals.actions.pop(signo, None)
    new = list(state)
    new[5], new[4], new[3], new[0] = signo, frame + SIGINFO_OFFSET, frame + UC_OFFSET, 0  # rdi, rsi, rdx, rax
    new[7], new[16] = frame, action.handler
    new[17] = state[17] & ~(TF | DF | RF)
    return new


def restore_frame(k: Kernel, sp: int) -> list[int]:
    """rt_sigreturn: the user state saved in the frame whose ucontext is at ``sp``; the mask and the
    alternate stack come back too. The real kernel decides whether the handler is still on the
    alternate stack (EPERM, ignored) from the rsp it returns with: measured, elf_samples/sigframes."""
    try:
        raw = k.mem.read_user(sp, FRAME_SIZE - UC_OFFSET)
    except UserFault:
        raise SyscallError(errno.EFAULT) from None
    stack_t = raw[UC_STACK_OFFSET - UC_OFFSET: UC_STACK_OFFSET - UC_OFFSET + STACK_T.size]
    words = struct.unpack_from("<18Q", raw, MCONTEXT_OFFSET - UC_OFFSET)
    state = [0] * 18
    for value, index in zip(words, SIGCONTEXT_ORDER, strict=True):
        state[index] = value
    (fpstate,) = struct.unpack_from("<Q", raw, FPSTATE_OFFSET - UC_OFFSET)
    image = _saved_fpu(k, fpstate)
    (k.signals.mask,) = struct.unpack_from("<Q", raw, SIGMASK_OFFSET - UC_OFFSET)
    k.cpu.load_fxsave_image(image)
    with contextlib.suppress(SyscallError):  # restore_altstack squashes every error of do_sigaltstack
        k.signals.altstack = changed(k.signals.altstack, stack_t, sp)
    return state


def _saved_fpu(k: Kernel, fpstate: int) -> bytes:
    """The FPU image rt_sigreturn loads (restore_fpu_from_sigframe): the init state for a NULL pointer;
    a misaligned pointer, an unreadable block or reserved MXCSR bits are a bad frame (EFAULT)."""
    if not fpstate:
        return fpu.init_image()
    if fpstate % fpu.FPSTATE_ALIGN:
        raise SyscallError(errno.EFAULT)
    layout = host_frame()
    try:
        image = fpu.parse(k.mem.read_user(fpstate, layout.extended_size), layout)
    except UserFault:
        raise SyscallError(errno.EFAULT) from None
    if image is None:
        raise SyscallError(errno.EFAULT)
    return image
