"""The red-zone bytes a design writes when an optimized site is hit, read off the design itself.

The patched site runs the patch's prefix, then its call (pushes a return address) or jmp, then
the trampoline up to its syscall; sys_uprobe with ``exit="trampoline"`` writes the saved words
back where they were pushed (spec 2.1). Those instructions go through the same stack model as the
survey's functions, from rsp = 0 at the site, so a user's design (--design-file) is judged by
what its code does, not by its name. A design without a patch takes every hit as an INT3, whose
kernel path writes nothing on the user stack on entry (spec 1.2).
"""

from __future__ import annotations

import functools

from emu.abi import RED_ZONE
from emu.designs import Branch, Design, Exit
from emu.kernel.uprobes.plan import uprobe_plan
from emu.survey.redzone import spans
from emu.survey.stack import RSP, Range, decode, effect

Spans = tuple[tuple[int, int], ...]


@functools.cache
def red_zone_writes(design: Design) -> Spans | None:
    """Inclusive rsp offsets in [-128, -1] the design writes on an optimized hit; None: not knowable."""
    plan = uprobe_plan(design)
    if design.patch is None or design.trampoline is None or plan is None:
        return ()
    regs = {RSP: 0}
    stores: list[Range] = []
    for insn in decode(design.patch.prefix_bytes, 0):
        eff = effect(insn, regs)
        if eff.opaque or RSP not in eff.regs:
            return None
        stores += eff.stores
        regs = eff.regs
    if design.patch.branch is Branch.CALL:
        regs = {RSP: regs[RSP] - 8}
        stores.append((regs[RSP], regs[RSP] + 8))
    for insn in decode(design.trampoline.code_bytes, 0):
        if insn.mnemonic == "syscall":
            break
        eff = effect(insn, regs)
        if eff.opaque or RSP not in eff.regs:
            return None
        stores += eff.stores
        regs = eff.regs
    else:
        return None  # no syscall: the design's validation refuses it, nothing to judge
    if plan.exit is Exit.TRAMPOLINE:  # sys_uprobe writes the saved words back for the trampoline's pops
        first = regs[RSP] + plan.saved_offset
        stores += [(first + 8 * i, first + 8 * i + 8) for i in range(len(plan.saved))]
    bits = 0
    for lo, hi in stores:
        lo, hi = max(lo, -RED_ZONE), min(hi, 0)
        if lo < hi:
            bits |= ((1 << (hi - lo)) - 1) << (lo + RED_ZONE)
    return spans(bits, -RED_ZONE)
