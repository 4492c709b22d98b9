"""A flawed jmp-slot handler: it returns to the probed code through SYSRET.

    uprobe-emu check --design-file examples/designs/slot_sysret.py elf_samples/redzone_probe 3

SYSRET takes the return address from rcx and the flags from r11, so returning straight to
the instruction after the nop5 that way loses the guest's rcx and r11 (the slot saved them,
but nothing can pop them after SYSRET). `check` reports register violations naming rcx and r11.
"""

import errno

from emu.designs import URETPROBE_335, Design, Handler, Patch, Trampoline

SLOT = "lea -128(%rsp), %rsp; push %rcx; push %r11; push %rax; mov $336, %eax; syscall"

slot_sysret = Design(
    name="slot-sysret",
    source="examples/designs/slot_sysret.py",
    patch=Patch(site="nop5", branch="jmp"),
    trampoline=Trampoline(SLOT, layout="slots", slot_size=16),
    handler=Handler(saved=("ax", "r11", "cx"), probe_from="slot", sp_skip=128, exit="sysret",
                    outside_errno=errno.EPROTO),
    uretprobe=URETPROBE_335,
)
