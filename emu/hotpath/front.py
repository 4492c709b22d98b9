"""The C syscall and interrupt front of an engine (emu/hotpath_src/fastsys.c): it takes the probe hits
whose every consumer only counts without entering Python (emu/kernel/uprobes/fastpath.py fills its
tables and opens it) and hands everything else to the Python handlers."""

from __future__ import annotations

import ctypes

from emu import hotpath
from emu.cpu import Cpu, Reg, native_function
from emu.cpu.hooks import NativeFront

# The registers the front reads and writes, in the order of fastsys.h's REG_*
FRONT_REGS = hotpath.in_c_order({Reg.RAX: "REG_AX", Reg.RIP: "REG_IP", Reg.RFLAGS: "REG_FLAGS", Reg.RSP: "REG_SP",
                                 Reg.RCX: "REG_CX", Reg.R11: "REG_R11"})
FRONT_FUNCTIONS = ("uc_reg_read_batch", "uc_reg_write_batch", "uc_reg_read", "uc_mem_read", "uc_mem_write")


def syscall_front(cpu: Cpu) -> NativeFront | None:
    """A front for ``cpu``'s syscall and interrupt hooks, or None with the pure-Python hot path."""
    native = hotpath.native
    if native is None:
        return None
    handle = native.FastSys(ctypes.cast(cpu.handle, ctypes.c_void_p).value,
                            tuple(native_function(name) for name in FRONT_FUNCTIONS), tuple(int(r) for r in FRONT_REGS))
    return NativeFront(handle, native.fastsys_syscall_hook, native.fastsys_interrupt_hook)
