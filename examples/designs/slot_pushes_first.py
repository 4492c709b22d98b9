"""A flawed jmp slot: it saves the registers first and only then steps below the red zone.

    uprobe-emu check --design-file examples/designs/slot_pushes_first.py elf_samples/redzone_probe 3

The three pushes land in the caller's red zone ([rsp-24, rsp)), so a leaf function that keeps
data there sees it overwritten: `check` reports red-zone violations at offsets -8, -16 and -24
written by the slot's pushes, and the output differs from the unprobed run.
"""

import errno

from emu.designs import URETPROBE_335, Design, Handler, Patch, Trampoline

SLOT = """
    push %rcx                 # BUG: writes below the interrupted code's rsp, inside its red zone
    push %r11
    push %rax
    lea -128(%rsp), %rsp
    mov $336, %eax
    syscall
"""

slot_pushes_first = Design(
    name="slot-pushes-first",
    source="examples/designs/slot_pushes_first.py",
    patch=Patch(site="nop5", branch="jmp"),
    trampoline=Trampoline(SLOT, layout="slots", slot_size=16),
    # the saved words now sit above the 128-byte gap
    handler=Handler(saved=("ax", "r11", "cx"), saved_offset=128, probe_from="slot", exit="iret",
                    outside_errno=errno.EPROTO),
    uretprobe=URETPROBE_335,
)
