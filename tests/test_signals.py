"""Signals delivered to guest handlers: the rt_sigframe, siginfo, ucontext and rt_sigreturn as on x86-64 Linux."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions

SIGNALS = str(Path(__file__).resolve().parent.parent / "elf_samples" / "signals")
EXPECTED = {
    "segv": b"signo=11 code=1 addr=0x10 rip=fault_insn\nback in main\n",  # SEGV_MAPERR, si_addr = the address
    "ill": b"signo=4 code=2 addr=0x40176c rip=ud2_insn\nback in main\n",  # ILL_ILLOPN at the ud2
    "fpe": b"signo=8 code=1 addr=0x401765 rip=div_insn\nback in main\n",  # FPE_INTDIV at the idiv
    "trap": b"signo=5 code=128 addr=0 rip=after_int3\nback in main\n",  # SI_KERNEL, rip after the int3
    "uret335": b"signo=4 code=128 addr=0 rip=elsewhere\nback in main\n",  # the uretprobe syscall's SIGILL, caught
    "fixup": b"continued rax=77 handled=1\n",  # the handler edits uc_mcontext: rip skips the store, rax changes
    "raise": b"handled=2 depth-at-nested-raise=1\n",  # a signal raised in its own handler waits for sigreturn
    "altstack": b"on altstack=1\n",
}


def emulated(case: str, design: str = "linux-6.18") -> tuple[int, bytes, bytes]:
    io = GuestIO.captured()
    result = Machine(SIGNALS, [SIGNALS, case], {}, RunOptions(design=design), io).run()
    return result.exit_status, bytes(io.out), bytes(io.err)


@pytest.mark.parametrize("case", list(EXPECTED))
def test_handlers_see_what_linux_gives_them(case: str) -> None:
    assert emulated(case) == (0, EXPECTED[case], b"")


@pytest.mark.parametrize("case", list(EXPECTED))
def test_native_prints_the_same(case: str) -> None:
    native = subprocess.run([SIGNALS, case], capture_output=True, env={}, timeout=30)
    assert (native.returncode, native.stdout) == (0, EXPECTED[case])


@pytest.mark.parametrize("design", ["int3", "uretprobe-rfc"])
def test_335_without_the_uretprobe_syscall_is_just_enosys(design: str) -> None:
    status, out, _ = emulated("uret335", design)
    assert (status, out) == (0, b"back in main\n")  # no such syscall in these kernels: -ENOSYS, no signal
