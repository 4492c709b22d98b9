"""Where the kernel puts things in a new process, as Linux 6.18 does with ASLR off (`setarch -R`).

notes/linux-6.18-observed.md section 9 records the real layout; this module holds its rules:

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
- [vsyscall]: the gate page at 0xffffffffff600000, `--xp` (vsyscall=xonly, the default): not a VMA
  of the process, shown last in /proc/pid/maps.
"""

from __future__ import annotations

from emu.abi import MMAP_BASE, PAGE_SIZE, PIE_BASE, STACK_TOP, page_down

__all__ = ["MMAP_BASE", "PIE_BASE", "STACK_TOP"]

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


def initial_stack_start(lowest_string: int, rlimit: int = RLIMIT_STACK) -> int:
    """Where [stack] starts at exec: the page of the lowest string copied, less stack_expand (but
    never more than the stack rlimit below the top)."""
    start = page_down(lowest_string)
    if STACK_TOP - start + STACK_EXPAND > rlimit:
        return STACK_TOP - rlimit
    return start - STACK_EXPAND


def strings_bottom(argv: list[bytes], envp: list[bytes], execfn: bytes, top: int = STACK_TOP) -> int:
    """The lowest byte copy_strings writes: below one zero word, the file name, envp, argv."""
    return top - 8 - (len(execfn) + 1) - sum(len(s) + 1 for s in (*envp, *argv))
