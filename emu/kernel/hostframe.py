"""The XSAVE area the host kernel puts in a signal frame, measured once per process.

Linux sizes a frame's fpstate by the XSAVE features it enabled on the CPU (fpu__alloc_mathframe):
576 bytes for x87|SSE, 832 with AVX, 2432 with AVX-512. So where a handler's frame lands, and
AT_MINSIGSTKSZ, depend on the machine. The emulated kernel lays its frames out as the host kernel
does, so frame addresses and everything a program derives from them match the real kernel with ASLR
off. The emulated CPU runs x87 and SSE only: the other components stay in their init state, as in a
program that never used them.

Measured by asking the real kernel: this process sends itself a signal whose handler (a ctypes
callback) reads the software-reserved bytes of the fpstate the kernel wrote (struct _fpx_sw_bytes:
the features saved, the area's size); AT_MINSIGSTKSZ comes from /proc/self/auxv. Where that cannot
be done (not x86-64 Linux), the CPU model's own x87|SSE area is used.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import signal
import struct
from dataclasses import dataclass

from emu.cpumodel import FP_XSTATE_MAGIC2_SIZE, MIN_SIGSTKSZ, XCR0, XSAVE_SIZE

FP_XSTATE_MAGIC1 = 0x46505853
SW_BYTES_OFFSET = 464  # struct _fpx_sw_bytes in the FXSAVE image's software-reserved bytes
AT_MINSIGSTKSZ = 51
UCONTEXT_FPSTATE = 40 + 184  # ucontext: flags, link, stack_t (24), then sigcontext's fpstate pointer
SA_SIGINFO = 4


@dataclass(frozen=True, slots=True)
class FrameXState:
    """A signal frame's XSAVE area: its size (xstate_size, without FP_XSTATE_MAGIC2), the features the
    kernel saves (xfeatures), and AT_MINSIGSTKSZ, which grows with it."""

    size: int
    features: int
    minsigstksz: int

    @property
    def extended_size(self) -> int:
        """What get_sigframe reserves below the red zone: the area and FP_XSTATE_MAGIC2 after it."""
        return self.size + FP_XSTATE_MAGIC2_SIZE


MODEL = FrameXState(XSAVE_SIZE, XCR0, MIN_SIGSTKSZ)


@functools.cache
def host_frame() -> FrameXState:
    """The host kernel's frame layout, or MODEL where it cannot be measured."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return MODEL
    try:
        magic, extended, features, size = _sw_bytes_of_a_signal()
        minsigstksz = _auxv(AT_MINSIGSTKSZ)
    except (OSError, AttributeError, ValueError):
        return MODEL
    if magic != FP_XSTATE_MAGIC1 or extended != size + FP_XSTATE_MAGIC2_SIZE or not (
            XSAVE_SIZE <= size <= 1 << 20) or size % 8 or features & XCR0 != XCR0:
        return MODEL
    return FrameXState(size, features, minsigstksz or MIN_SIGSTKSZ + size - XSAVE_SIZE)


def _sw_bytes_of_a_signal() -> tuple[int, int, int, int]:
    """(magic1, extended_size, xfeatures, xstate_size) of the frame the host kernel builds for a signal
    this process sends itself (the last real-time signal, which nothing else here uses)."""
    libc = ctypes.PyDLL(None, use_errno=True)  # the GIL stays held: the handler runs inside raise()
    handler_type = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    seen: list[bytes] = []

    def on_signal(_signo: int, _info: int, uc: int) -> None:
        fpstate = ctypes.c_uint64.from_address(uc + UCONTEXT_FPSTATE).value
        seen.append(ctypes.string_at(fpstate + SW_BYTES_OFFSET, 20))

    handler = handler_type(on_signal)
    new, old = _SigAction(), _SigAction()
    new.handler, new.flags = ctypes.cast(handler, ctypes.c_void_p).value, SA_SIGINFO
    signo = int(signal.SIGRTMAX)
    if libc.sigaction(signo, ctypes.byref(new), ctypes.byref(old)):
        raise OSError(ctypes.get_errno(), "sigaction")
    try:
        getattr(libc, "raise")(signo)
    finally:
        libc.sigaction(signo, ctypes.byref(old), None)
    if not seen:
        raise ValueError("the signal never reached its handler")
    magic, extended, features, size = struct.unpack("<IIQI", seen[0])
    return magic, extended, features, size


class _SigAction(ctypes.Structure):
    """glibc's struct sigaction on x86-64."""

    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]


def _auxv(kind: int) -> int | None:
    """This process's auxiliary vector entry ``kind``, or None."""
    with open("/proc/self/auxv", "rb") as fh:
        raw = fh.read()
    for key, value in struct.iter_unpack("<QQ", raw[: len(raw) // 16 * 16]):
        if key == kind:
            return int(value)
    return None
