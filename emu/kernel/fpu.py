"""The FPU state in a signal frame, and the si_code of a floating-point exception, as x86-64 Linux has them.

A signal frame's fpstate is the XSAVE image of the x87 and SSE state (arch/x86/kernel/fpu/signal.c
copy_fpstate_to_sigframe): the 512-byte FXSAVE layout, whose software-reserved bytes 464..511 hold
struct _fpx_sw_bytes (FP_XSTATE_MAGIC1, the extended size, the features saved, the XSAVE size), the
64-byte XSAVE header, then FP_XSTATE_MAGIC2 right after the XSAVE area. The area has the host
kernel's size (hostframe.py); the emulated CPU runs x87 and SSE only, so those are the components
in use (xstate_bv) and the rest is in its init state. rt_sigreturn restores it as
check_xstate_in_sigframe allows; a NULL fpstate restores the init state; reserved MXCSR bits make
the frame bad (SIGSEGV).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from emu.cpu import EXEC_FCW, EXEC_MXCSR, FXSAVE_SIZE, Reg
from emu.cpumodel import XCR0, XSAVE_SIZE
from emu.kernel.hostframe import FP_XSTATE_MAGIC1, SW_BYTES_OFFSET, FrameXState

if TYPE_CHECKING:
    from emu.cpu import Cpu

FP_XSTATE_MAGIC2 = 0x46505845
HEADER_OFFSET = FXSAVE_SIZE
FPSTATE_ALIGN = 64
XFEATURE_FP, XFEATURE_SSE = 1 << 0, 1 << 1
MXCSR_FEATURE_MASK = 0xFFFF  # what the emulated CPU's fxsave stores as MXCSR_MASK
# si_code of SIGFPE (include/uapi/asm-generic/siginfo.h)
FPE_FLTDIV, FPE_FLTOVF, FPE_FLTUND, FPE_FLTRES, FPE_FLTINV = 3, 4, 5, 6, 7


def init_image() -> bytes:
    """The FXSAVE image of the FPU's init state: what a signal handler starts with (fpu__clear_user_states)."""
    image = bytearray(FXSAVE_SIZE)
    struct.pack_into("<H", image, 0, EXEC_FCW)
    struct.pack_into("<II", image, 24, EXEC_MXCSR, MXCSR_FEATURE_MASK)
    return bytes(image)


def save(cpu: Cpu, layout: FrameXState) -> bytes:
    """The fpstate block as copy_fpstate_to_sigframe writes it (layout.extended_size bytes)."""
    image = cpu.fxsave_image()
    struct.pack_into("<IIQI", image, SW_BYTES_OFFSET, FP_XSTATE_MAGIC1, layout.extended_size, layout.features,
                     layout.size)
    header = struct.pack("<QQ", XCR0, 0).ljust(64, b"\0")  # xstate_bv: x87 and SSE always set (save_xstate_epilog)
    return bytes(image) + header + bytes(layout.size - FXSAVE_SIZE - 64) + struct.pack("<I", FP_XSTATE_MAGIC2)


def parse(block: bytes, layout: FrameXState) -> bytes | None:
    """The FXSAVE image rt_sigreturn loads from an fpstate block of layout.extended_size bytes; None
    for a bad frame (reserved MXCSR bits). With the XSAVE software bytes check_xstate_in_sigframe
    accepts (magic1, a size between the legacy area plus header and the kernel's, magic2 after it), a
    component whose xstate_bv bit is clear loads its init state, as XRSTOR does; otherwise the legacy
    512 bytes load as FXRSTOR would."""
    image = bytearray(block[:FXSAVE_SIZE])
    (mxcsr,) = struct.unpack_from("<I", image, 24)
    if mxcsr & ~MXCSR_FEATURE_MASK:
        return None
    magic1, extended, features, size = struct.unpack_from("<IIQI", block, SW_BYTES_OFFSET)
    if magic1 != FP_XSTATE_MAGIC1 or not XSAVE_SIZE <= size <= min(layout.size, extended) or (
            struct.unpack_from("<I", block, size)[0] != FP_XSTATE_MAGIC2):
        return bytes(image)
    (xstate_bv,) = struct.unpack_from("<Q", block, HEADER_OFFSET)
    present = xstate_bv & features
    if not present & XFEATURE_FP:
        init = init_image()
        image[0:24] = init[0:24]
        image[32:160] = bytes(128)
    if not present & XFEATURE_SSE:
        image[160:416] = bytes(256)
    return bytes(image)


def exception_code(cpu: Cpu, vector: int) -> int:
    """si_code of the SIGFPE for an x87 (#MF, 16) or SIMD (#XM, 19) exception: the first unmasked
    exception pending, in fpu__exception_code's order; 0 if none is (a spurious trap)."""
    if vector == 16:
        err = cpu.read_narrow(Reg.FPSW) & ~cpu.read_narrow(Reg.FPCW)
    else:
        mxcsr = cpu.read_narrow(Reg.MXCSR)
        err = ~(mxcsr >> 7) & mxcsr
    for bits, code in ((0x001, FPE_FLTINV), (0x004, FPE_FLTDIV), (0x008, FPE_FLTOVF), (0x012, FPE_FLTUND),
                       (0x020, FPE_FLTRES)):
        if err & bits:
            return code
    return 0

