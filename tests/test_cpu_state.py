"""The CPU state Linux hands a process, a thread, a forked child and a signal handler, natively and emulated.

cpu_state (fixtures/cpu_state.c) captures the registers at its ELF entry before libc runs, then
changes its MXCSR and x87 control word and prints what a new thread and a forked child start
with, then execs itself. Every line must match the native run on this machine.
"""

from __future__ import annotations

import struct

import pytest
from conftest import run_emulated, run_native, sample

from emu.cpu import EXEC_FCW, EXEC_MXCSR, Cpu, Reg
from emu.kernel import fpu
from emu.kernel.hostframe import MODEL, SW_BYTES_OFFSET

CPU_STATE = sample("cpu_state")


def both(*args: str) -> tuple[tuple[bytes, bytes, int], tuple[bytes, bytes, int]]:
    argv = [CPU_STATE, *args]
    return run_native(argv).observed(), run_emulated(argv).observed()


def test_exec_thread_fork_and_exec_again_start_as_natively() -> None:
    native, emulated = both()
    assert native[2] == 0, native
    lines = native[0].decode().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "process entry", "main", "main changed", "thread", "child", "exec entry", "exec main"]
    assert "mxcsr=0x1f80 fcw=0x37f fsw=0 ftw=0xffff xmm_nonzero=0 gpr_nonzero=0" in lines[0]
    assert emulated == native


def test_a_forked_child_gets_every_fpu_register_of_its_parent() -> None:
    parent, child = Cpu(), Cpu()
    parent.write(Reg.FPCW, 0xF7F)
    parent.write(Reg.MXCSR, 0x7F80)
    parent.write_xmm(3, 0x1234)
    child.restore_context(parent.save_context())
    assert child.fxsave_image() == parent.fxsave_image()
    assert Cpu().fxsave_image() != parent.fxsave_image()  # negative control: a new CPU has the init state


def test_exec_state_is_linux_init_state_and_load_exec_state_restores_it() -> None:
    cpu = Cpu()
    image = cpu.fxsave_image()
    assert struct.unpack_from("<HHB", image) == (EXEC_FCW, 0, 0)  # abridged tags 0: every register empty
    assert struct.unpack_from("<I", image, 24)[0] == EXEC_MXCSR
    assert cpu.read(Reg.RFLAGS) == 0x202 and cpu.read_narrow(Reg.CS) == 0x33 and cpu.read_narrow(Reg.SS) == 0x2B
    cpu.write(Reg.MXCSR, 0)
    cpu.write(Reg.FPCW, 0x7F)
    cpu.write_xmm(0, 1)
    cpu.load_exec_state()
    assert cpu.fxsave_image() == image


def test_signal_frames_carry_the_fpu_state_and_sigreturn_restores_it() -> None:
    native, emulated = both("sigframe")
    assert b"magic1=0x46505853 uc_flags&1=1" in native[0]
    assert b"handler ran with mxcsr=0x1f80 fcw=0x37f" in native[0]
    assert b"after sigreturn: mxcsr=0x5f80 fcw=0xf7f xmm1=0x1234" in native[0]
    assert emulated == native


@pytest.mark.parametrize("case", ["fpe-x87", "fpe-int"])
def test_unmasked_divide_by_zero_signals_as_natively(case: str) -> None:
    native, emulated = both(case)
    assert native[2] == 3 and b"SIGFPE" in native[0]
    assert emulated == native


def test_unmasked_sse_divide_by_zero_is_the_documented_difference() -> None:
    """Unicorn 2.1.4 neither raises #XM nor sets MXCSR's sticky flags (README, "The emulated CPU")."""
    native, emulated = both("fpe-sse")
    assert native[0] == b"SIGFPE signo=8 code=3 saved mxcsr=0x1d84 fsw&0x3f=0\n" and native[2] == 3
    assert emulated[0] == b"no signal: result=inf mxcsr=0x1d80\n" and emulated[2] == 0


def _block(**changes: int) -> bytearray:
    block = bytearray(fpu.save(Cpu(), MODEL))
    for offset, value in changes.items():
        struct.pack_into("<I", block, int(offset[1:]), value)
    return block


def test_sigreturn_refuses_reserved_mxcsr_bits() -> None:
    assert fpu.parse(bytes(_block()), MODEL) is not None
    assert fpu.parse(bytes(_block(o24=0x10000 | EXEC_MXCSR)), MODEL) is None


def test_sigreturn_without_xsave_magic_loads_the_legacy_area_only() -> None:
    cpu = Cpu()
    cpu.write_xmm(2, 0x55)
    block = bytearray(fpu.save(cpu, MODEL))
    struct.pack_into("<Q", block, fpu.HEADER_OFFSET, 0)  # xstate_bv: x87 and SSE in their init state
    cleared = fpu.parse(bytes(block), MODEL)
    assert cleared is not None and cleared[160 + 32 : 160 + 48] == bytes(16)
    struct.pack_into("<I", block, SW_BYTES_OFFSET, 0)  # no magic1: FXRSTOR of the 512 bytes, header ignored
    legacy = fpu.parse(bytes(block), MODEL)
    assert legacy is not None and legacy[160 + 32] == 0x55


def test_sigfpe_code_names_the_unmasked_pending_exception() -> None:
    cpu = Cpu()
    assert fpu.exception_code(cpu, 16) == 0 and fpu.exception_code(cpu, 19) == 0  # nothing pending: spurious
    cpu.write(Reg.FPSW, 0x4)  # zero divide pending, masked by the init control word
    assert fpu.exception_code(cpu, 16) == 0
    cpu.write(Reg.FPCW, EXEC_FCW & ~0x4)
    assert fpu.exception_code(cpu, 16) == fpu.FPE_FLTDIV
    cpu.write(Reg.MXCSR, (EXEC_MXCSR & ~0x400) | 0x8)  # overflow pending and unmasked
    assert fpu.exception_code(cpu, 19) == fpu.FPE_FLTOVF
