"""What Unicorn itself does with an instruction, asked on a scratch CPU of its own."""

from __future__ import annotations

from collections.abc import Sequence

from emu.abi import PAGE_SIZE, Prot
from emu.cpu.engine import Cpu, StopReason
from emu.cpu.regs import Reg

_PROBE_CODE, _PROBE_DATA = 0x10000, 0x20000


def instructions_run(codes: Sequence[bytes]) -> list[bool]:
    """For each machine-code snippet (one instruction, typically), whether Unicorn runs it to its end
    without an exception, on a scratch CPU in Linux's exec state. Memory operands written as (%rsp)
    reach a 64-byte aligned scratch page; rax = 3 and rdx = 0 (XCR0, for xsave), rcx = 0."""
    cpu = Cpu()
    cpu.mem_map(_PROBE_CODE, PAGE_SIZE, Prot.READ | Prot.EXEC)
    cpu.mem_map(_PROBE_DATA, 2 * PAGE_SIZE, Prot.READ | Prot.WRITE)
    raised: list[int] = []

    def on_exception(intno: int) -> None:
        raised.append(intno)
        cpu.stop()

    cpu.hooks.add_interrupt(on_exception)
    results = []
    for code in codes:
        raised.clear()
        cpu.load_exec_state()
        cpu.mem_write(_PROBE_CODE, code + b"\xf4")  # hlt after it: a run past the end shows
        for reg, value in ((Reg.RSP, _PROBE_DATA + PAGE_SIZE), (Reg.RAX, 3), (Reg.RDX, 0), (Reg.RCX, 0)):
            cpu.write(reg, value)
        cpu.flush_code(_PROBE_CODE, _PROBE_CODE + PAGE_SIZE)
        reason = cpu.run(_PROBE_CODE, count=1)
        results.append(reason is StopReason.FINISHED and not raised and cpu.read(Reg.RIP) == _PROBE_CODE + len(code))
    return results


def unicorn_cpuid(queries: Sequence[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """What Unicorn's own CPU model answers to each (eax, ecx), with no CPUID hook in the way."""
    cpu = Cpu()
    cpu.mem_map(_PROBE_CODE, PAGE_SIZE, Prot.READ | Prot.EXEC)
    cpu.mem_write(_PROBE_CODE, b"\x0f\xa2")  # cpuid
    answers = []
    for leaf, subleaf in queries:
        cpu.write(Reg.RAX, leaf)
        cpu.write(Reg.RCX, subleaf)
        cpu.run(_PROBE_CODE, count=1)
        answers.append((cpu.read(Reg.RAX), cpu.read(Reg.RBX), cpu.read(Reg.RCX), cpu.read(Reg.RDX)))
    return answers

