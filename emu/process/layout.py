"""Where the kernel puts things in a new process, as Linux 6.18 does with ASLR off (`setarch -R`).

docs/linux-6.18-observed.md section 9 records the real layout; this module holds its rules:

- the executable: a non-PIE at its link address, a PIE at ELF_ET_DYN_BASE (0x555555554000),
  [heap] right after its bss;
- the mmap area top-down from mmap_base (TASK_SIZE less a 128 MiB gap): the interpreter first,
  then [vvar] (4 pages), [vvar_vclock] (2) and [vdso] (2) in one block right below it, then
  whatever ld.so and the program map;
- [stack]: ending at STACK_TOP, covering the pages the argument and environment strings use plus
  128 KiB (setup_arg_pages' stack_expand), growing down on demand to RLIMIT_STACK as long as the
  stack guard gap (256 pages) to the mapping below stays free;
- a static PIE (ET_DYN without an interpreter) goes in the mmap area like a library, and its brk
  moves out of the way to ELF_ET_DYN_BASE rounded up to a page (0x555555555000);
- with ``--aslr SEED`` (randomize_va_space=2) the same rules on randomized bases, drawn from SEED
  the way Linux draws them: mmap_base less 28 random bits of pages (and a gap grown by the stack's
  16 GiB of randomization), the PIE base plus 28 random bits of pages, the stack top less 22 random
  bits of pages and the tables below the strings less 0-8191 bytes (arch_align_stack), the heap up
  to 1 GiB above the bss (arch_randomize_brk, after a page's gap);
- [vsyscall]: the gate page at 0xffffffffff600000, `--xp` (vsyscall=xonly, the default): not a VMA
  of the process, shown last in /proc/pid/maps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from emu.abi import MMAP_BASE, PAGE_SIZE, PIE_BASE, STACK_TOP, TASK_SIZE, page_down, page_up

ELF_ET_DYN_BASE = 0x555555554AAA  # 2/3 of the address space: a PIE loads at its page, the moved brk above
MOVED_BRK = (ELF_ET_DYN_BASE + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1)
STACK_EXPAND = 128 << 10  # setup_arg_pages: the stack VMA reaches this far below the strings at exec
STACK_GUARD_GAP = 256 * PAGE_SIZE  # stack_guard_gap: a growing stack keeps this far from the VMA below
RLIMIT_STACK = 8 << 20  # the default soft limit: how far the stack may grow

VVAR_PAGES, VVAR_VCLOCK_PAGES, VDSO_PAGES = 4, 2, 2
VDSO_BLOCK = (VVAR_PAGES + VVAR_VCLOCK_PAGES + VDSO_PAGES) * PAGE_SIZE
VVAR_NAME, VVAR_VCLOCK_NAME, VDSO_NAME = "[vvar]", "[vvar_vclock]", "[vdso]"

VSYSCALL_START = 0xFFFFFFFFFF600000
VSYSCALL_LINE = f"{VSYSCALL_START:08x}-{VSYSCALL_START + PAGE_SIZE:08x} --xp 00000000 00:00 0"
# vsyscall entry points (arch/x86/entry/vsyscall): the system call each one stands for
VSYSCALL_ENTRIES = {VSYSCALL_START: 96, VSYSCALL_START + 0x400: 201, VSYSCALL_START + 0x800: 309}


MMAP_RND_BITS = 28  # mmap_rnd_bits, x86-64's default
STACK_RND_PAGES_MASK = 0x3FFFFF  # STACK_RND_MASK: 22 bits of pages (16 GiB)
BRK_RANGE = 1 << 30  # arch_randomize_brk for a 64-bit task
SIZE_128M = 128 << 20


@dataclass(frozen=True, slots=True)
class Layout:
    """The bases of one exec: Linux's with ASLR off, or randomized from a seed."""

    mmap_base: int = MMAP_BASE
    pie_base: int = PIE_BASE
    stack_top: int = STACK_TOP
    align_pad: int = 0  # bytes arch_align_stack takes off below the strings
    brk_gap: int = 0  # arch_randomize_brk's random pages above the (moved, or page-gapped) brk

    @property
    def randomized(self) -> bool:
        return self != Layout()


def no_aslr() -> Layout:
    return Layout()


def randomized(seed: int, execs: int = 0) -> Layout:
    """The layout exec number ``execs`` of a run with ``--aslr seed`` gets (each exec draws anew)."""
    rng = random.Random(f"aslr:{seed}:{execs}")
    mmap_rnd = rng.getrandbits(MMAP_RND_BITS) << 12
    gap = RLIMIT_STACK + ((STACK_RND_PAGES_MASK << 12) + STACK_GUARD_GAP)
    gap = min(max(gap, SIZE_128M), TASK_SIZE // 6 * 5)
    mmap_base = page_up(TASK_SIZE - gap - mmap_rnd)
    pie_base = page_down(ELF_ET_DYN_BASE + (rng.getrandbits(MMAP_RND_BITS) << 12))
    stack_top = STACK_TOP - ((rng.getrandbits(32) & STACK_RND_PAGES_MASK) << 12)
    align_pad = rng.randrange(8192)
    brk_gap = rng.randrange(BRK_RANGE // PAGE_SIZE) * PAGE_SIZE
    return Layout(mmap_base, pie_base, stack_top, align_pad, brk_gap)


def for_seed(seed: int | None, execs: int = 0) -> Layout:
    return no_aslr() if seed is None else randomized(seed, execs)


def initial_stack_start(lowest_string: int, rlimit: int = RLIMIT_STACK, top: int = STACK_TOP) -> int:
    """Where [stack] starts at exec: the page of the lowest string copied, less stack_expand (but
    never more than the stack rlimit below the top)."""
    start = page_down(lowest_string)
    if top - start + STACK_EXPAND > rlimit:
        return top - rlimit
    return start - STACK_EXPAND


def strings_bottom(argv: list[bytes], envp: list[bytes], execfn: bytes, top: int = STACK_TOP) -> int:
    """The lowest byte copy_strings writes: below one zero word, the file name, envp, argv."""
    return top - 8 - (len(execfn) + 1) - sum(len(s) + 1 for s in (*envp, *argv))
