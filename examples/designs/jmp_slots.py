"""The red-zone fix's jmp-slots design, written from scratch as a user design.

    uprobe-emu check --design-file examples/designs/jmp_slots.py --kernel my-jmp-slots elf_samples/redzone_probe 3

Each optimized nop5 becomes `jmp` to a 16-byte slot of its own. The slot first steps below
the red zone, then saves the three registers a syscall clobbers and enters sys_uprobe, which
finds the probe from the slot, restores everything and returns by IRET past the nop5.
"""

import errno

from emu.designs import Design, Handler, Patch, ReturnTrampoline, Trampoline

SLOT = """
    lea -128(%rsp), %rsp      # step over the red zone before writing anything
    push %rcx
    push %r11
    push %rax
    mov $336, %eax
    syscall                   # never returns here: sys_uprobe IRETs to the probe's next instruction
"""

# uretprobes as in 6.18: [uprobes] slot 0 saves rax/rcx/r11, calls 335, and returns through its pops and ret
RETURN_TRAMPOLINE = "push %rax; push %rcx; push %r11; movq $335, %rax; syscall; pop %r11; pop %rcx; ret; int3"

my_jmp_slots = Design(
    name="my-jmp-slots",
    source="examples/designs/jmp_slots.py",
    patch=Patch(site="nop5", branch="jmp"),
    trampoline=Trampoline(SLOT, layout="slots", slot_size=16),
    handler=Handler(saved=("ax", "r11", "cx"), probe_from="slot", sp_skip=128, exit="iret",
                    outside_errno=errno.EPROTO),
    uretprobe=ReturnTrampoline(RETURN_TRAMPOLINE, nr=335, saved=("r11", "cx", "ax"), exit="trampoline"),
)
