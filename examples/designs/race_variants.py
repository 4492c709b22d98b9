"""Three flawed variants of built-in designs, for `uprobe-emu race`:

    uprobe-emu race elf_samples/probe_targets -p uprobe:t_nop10 --event detach \
        --design-file examples/designs/race_variants.py --kernel nop10,nop10-restore
    uprobe-emu race elf_samples/probe_targets -p uprobe:t_nop5 -p uprobe:f_nop5 --event reattach \
        --design-file examples/designs/race_variants.py --kernel jmp-slots,jmp-slots-reuse
    uprobe-emu race elf_samples/probe_targets -p uprobe:t_nop5 --event optimize \
        --design-file examples/designs/race_variants.py --kernel linux-6.18,6.18-front-to-back
"""

from dataclasses import replace

from emu.designs import DESIGNS

nop10, slots, six18 = DESIGNS["nop10"], DESIGNS["jmp-slots"], DESIGNS["linux-6.18"]
assert nop10.patch is not None and slots.trampoline is not None and six18.patch is not None

# detach writes the original 10-byte NOP back instead of `eb 08` over the stale tail
nop10_restore = replace(nop10, name="nop10-restore", patch=replace(nop10.patch, detach="restore"))
# a detached probe's slot goes to the next probe optimized
slots_reuse = replace(slots, name="jmp-slots-reuse", trampoline=replace(slots.trampoline, slot_reuse=True))
# the call is written byte by byte from byte 0, so a thread can run a torn instruction
front_to_back = replace(six18, name="6.18-front-to-back", patch=replace(six18.patch, write_order="front-to-back"))
