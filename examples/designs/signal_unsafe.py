"""A trampoline a signal breaks, for `uprobe-emu race --signals`:

    uprobe-emu race --clear-env --signals -p uprobe:fn_nop5 --handler stack \
        --design-file examples/designs/signal_unsafe.py --kernel linux-6.18,6.18-stash-below elf_samples/sig_race

6.18-stash-below is linux-6.18 whose trampoline also keeps rdx 256 bytes below rsp from its first
instruction to its last without moving rsp over it: out of the 128 bytes the ABI keeps for the
interrupted code, so the frame of a signal delivered in between (built below rsp - 128) overwrites it
and the hit returns with another rdx. Without a signal, or with one at the site, at the trampoline's
first instruction, at its ret or after the hit, nothing more than linux-6.18's red-zone writes.
"""

from dataclasses import replace

from emu.designs import DESIGNS, NOP5_TRAMPOLINE

six18 = DESIGNS["linux-6.18"]
assert six18.trampoline is not None and isinstance(NOP5_TRAMPOLINE, str)

STASH, UNSTASH = "mov %rdx,-0x100(%rsp); ", "mov -0x100(%rsp),%rdx; "
stash_below = replace(six18, name="6.18-stash-below", trampoline=replace(
    six18.trampoline, code=STASH + NOP5_TRAMPOLINE.replace("ret;", UNSTASH + "ret;")))
