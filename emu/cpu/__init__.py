"""The one package that imports Unicorn: a CPU's registers, memory, hooks and runs.

- engine.py: :class:`Cpu`: registers, contexts, memory, runs;
- stops.py: why a run stopped (StopReason) and what a faulting access touched (BadAccess);
- hooks.py: :class:`Hooks` (``Cpu.hooks``): Python, raw and C hooks, and the syscall front;
- regs.py: the registers, the register sets read together, user-mode rflags;
- state.py: :class:`RawState`, the verifiers' whole-state snapshots, and their decoding;
- binding.py: Unicorn's C functions, bound without the Python binding's conversions;
- scratch.py: what Unicorn itself does with an instruction, on a CPU of its own (``ScratchCpu``: a
  probed site's original instruction run for real);
- effects.py: what an instruction did, kept per site and keyed by its inputs (the scratch runs' cache).
"""

from emu.cpu.binding import native_function
from emu.cpu.engine import Cpu, CpuContext
from emu.cpu.hooks import HookHandle, Hooks, RawCodeHook, RawWriteHook
from emu.cpu.regs import (
    EXEC_FCW,
    EXEC_MXCSR,
    FXSAVE_SIZE,
    GPRS,
    STATE_BYTES,
    STATE_FLAGS_OFFSET,
    STATE_OFFSETS,
    STATE_REGS,
    STATE_X87_OFFSET,
    STATE_XMM_OFFSET,
    Reg,
    user_flags,
)
from emu.cpu.scratch import instructions_run, unicorn_cpuid
from emu.cpu.state import RawState
from emu.cpu.stops import Access, BadAccess, StopReason

__all__ = [
    "EXEC_FCW", "EXEC_MXCSR", "FXSAVE_SIZE", "GPRS", "STATE_BYTES", "STATE_FLAGS_OFFSET", "STATE_OFFSETS",
    "STATE_REGS", "STATE_X87_OFFSET", "STATE_XMM_OFFSET", "Access", "BadAccess", "Cpu", "CpuContext",
    "HookHandle", "Hooks", "RawCodeHook", "RawState", "RawWriteHook", "Reg", "StopReason", "instructions_run",
    "native_function", "unicorn_cpuid", "user_flags",
]
