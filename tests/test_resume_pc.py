"""A hook that moves rip between blocks (an INT3 hit) leaves Unicorn syncing the pc: after the hit, a
memory hook reads the rip of the store that called it, and a guest's SIGSEGV handler the rip of the
faulting instruction, on every design. The Cpu-level tests show the Unicorn behaviour the
harness works around: uc_reg_write of rip from an interrupt hook leaves the pc unsynced for the
rest of the run (Cpu.resume_at docstring)."""

from __future__ import annotations

import subprocess

import pytest
from keystone import KS_ARCH_X86, KS_MODE_64, Ks

from emu.abi import Prot
from emu.cpu import Cpu, Reg
from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions

SOURCE = r"""
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>
__asm__(".text\n.globl f0\n.type f0,@function\nf0: .byte 0x0f,0x1f,0x44,0x00,0x00\nret\n");
void f0(void);
extern char fault_here[];

static void on_segv(int sig, siginfo_t *si, void *ctx)
{
    ucontext_t *uc = ctx;
    (void)sig;
    printf("rip %s addr %p\n", uc->uc_mcontext.gregs[REG_RIP] == (long)fault_here ? "at the fault" : "ELSEWHERE",
           si->si_addr);
    fflush(stdout);
    _exit(0);
}

int main(int argc, char **argv)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, 0);
    for (int i = 0; i < 3; i++) {
        f0();
        __asm__ volatile("nop\n nop\n movq $0x77, -64(%%rsp)\n.globl store_here\nstore_here: movq $0x77, -72(%%rsp)"
                         ::: "memory");
    }
    if (argc > 1)
        __asm__ volatile("movq $1, %%rax\n movq $2, %%rbx\n.globl fault_here\nfault_here: movq %%rax, 0x10\n"
                         ::: "rax", "rbx", "memory");
    return 0;
}
"""
DESIGNS = ["int3", "nop10", "linux-6.18", "jmp-slots", "uretprobe-rfc"]


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int, int]:
    """The program, and the addresses of its two stores (the first is 9 bytes before the label)."""
    where = tmp_path_factory.mktemp("resume_pc")
    (where / "p.c").write_text(SOURCE)
    exe = where / "p"
    subprocess.run(["gcc", "-O1", "-static", "-no-pie", "-o", str(exe), str(where / "p.c")], check=True)
    symbols = dict(line.split()[::-2] for line in subprocess.run(["nm", str(exe)], capture_output=True, text=True,
                                                                  check=True).stdout.splitlines() if " T " in line)
    second = int(symbols["store_here"], 16)
    return str(exe), second - 9, second


def machine(exe: str, design: str, *args: str) -> Machine:
    m = Machine(exe, [exe, *args], {}, RunOptions(design=design), GuestIO.captured())
    m.attach("uprobe:f0")
    return m


@pytest.mark.parametrize("design", DESIGNS)
def test_a_memory_hook_after_an_int3_hit_reads_the_rip_of_its_store(program: tuple[str, int, int],
                                                                    design: str) -> None:
    exe, first, second = program
    m = machine(exe, design)
    writers: list[int] = []
    m.cpu.hooks.add_mem_write(lambda _addr, _size, value: writers.append(m.cpu.read(Reg.RIP)) if value == 0x77
                              else None, 1, 0)
    result = m.run()
    assert result.exit_status == 0
    assert writers == [first, second] * 3


@pytest.mark.parametrize("design", DESIGNS)
def test_a_fault_after_an_int3_hit_is_reported_at_the_faulting_instruction(program: tuple[str, int, int],
                                                                            design: str) -> None:
    m = machine(program[0], design, "fault")
    result = m.run()
    assert result.exit_status == 0, result.message
    assert m.io.out.startswith(b"rip at the fault addr 0x10")


# ------------------------------------------------ Unicorn's behaviour, on a bare Cpu
CODE = 0x400000
STACK = 0x7000000


def _stores_after_int3(move_rip: str) -> list[int]:
    """rip at each of two stores that follow an int3 whose hook moves rip past four nops."""
    code = bytes(Ks(KS_ARCH_X86, KS_MODE_64).asm(
        "int3; nop; nop; nop; nop; mov rax, 1; mov qword ptr [rsp-8], rax; mov rcx, 3; mov qword ptr [rsp-16], rcx;"
        "hlt", CODE)[0])
    cpu = Cpu()
    cpu.mem_map(CODE, 0x1000, Prot.READ | Prot.EXEC)
    cpu.mem_write(CODE, code)
    cpu.mem_map(STACK, 0x10000, Prot.READ | Prot.WRITE)
    cpu.write(Reg.RSP, STACK + 0x8000)
    seen: list[int] = []

    def on_interrupt(intno: int) -> None:
        if intno != 3:
            cpu.stop()  # the hlt (#GP in user mode)
        elif move_rip == "write":
            cpu.write(Reg.RIP, CODE + 5)
        else:
            cpu.resume_at(CODE + 5)

    cpu.hooks.add_interrupt(on_interrupt)
    cpu.hooks.add_mem_write(lambda _addr, _size, _value: seen.append(cpu.read(Reg.RIP) - CODE), 1, 0)
    cpu.run(CODE)
    return seen


def test_resume_at_from_an_interrupt_hook_keeps_the_pc_synced() -> None:
    assert _stores_after_int3("resume_at") == [0xC, 0x18]


def test_uc_reg_write_from_an_interrupt_hook_leaves_later_hooks_a_stale_rip() -> None:
    """The negative control: a stale rip. The first store's TLB miss makes Unicorn sync the pc (the
    TLB-fill hook runs at the store), so it reads right; the second store reads the first one's rip."""
    assert _stores_after_int3("write") == [0xC, 0xC]
