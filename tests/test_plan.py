"""The hit plan: each design compiled once into what sys_uprobe and sys_uretprobe do, the one
description the full path, the counting-only path, the C front and the survey all read."""

from __future__ import annotations

from dataclasses import replace

import pytest

from emu.designs import Exit, get_design
from emu.kernel.uprobes.consumers import EntryPath
from emu.kernel.uprobes.plan import EXIT_KINDS, uprobe_plan, uretprobe_plan


@pytest.mark.parametrize(("design", "by_slot", "exit", "words", "popped", "path"), [
    ("linux-6.18", False, Exit.TRAMPOLINE, 4, 32, EntryPath.CALL),
    ("jmp-slots", True, Exit.IRET, 3, 24 + 128, EntryPath.JMP),  # the slot moved rsp past the red zone first
    ("nop10", False, Exit.TRAMPOLINE, 4, 32 + 128, EntryPath.CALL),  # so did the lea
])
def test_each_optimizing_design_compiles_to_its_plan(design: str, by_slot: bool, exit: Exit, words: int, popped: int,
                                                      path: EntryPath) -> None:
    plan = uprobe_plan(get_design(design))
    assert plan is not None
    assert (plan.by_slot, plan.exit, plan.words, plan.popped(from_call=not by_slot), plan.path) == \
        (by_slot, exit, words, popped, path)
    assert plan.saved == ("ax", "r11", "cx") and plan.direct and plan.nr == 336
    nr, slot, exit_index, _path, regs, *_rest = plan.native_fields()
    assert (nr, slot, EXIT_KINDS[exit_index], len(regs)) == (336, int(by_slot), exit, 3)  # type: ignore[index, arg-type]


def test_a_design_that_never_optimizes_has_no_uprobe_plan_and_its_own_return() -> None:
    assert uprobe_plan(get_design("int3")) is None
    assert uretprobe_plan(get_design("int3")).nr is None
    rfc = uretprobe_plan(get_design("uretprobe-rfc"))
    assert (rfc.nr, rfc.exit) == (462, Exit.IRET)
    six = uretprobe_plan(get_design("linux-6.18"))
    assert (six.nr, six.exit, six.popped) == (335, Exit.TRAMPOLINE, 24) and six.syscall_return > 0


def test_the_plan_follows_the_design_it_was_compiled_from() -> None:
    """The negative control: a design that saves one word more and flags pops further, and cannot exit
    by register writes alone."""
    base = get_design("linux-6.18")
    assert base.handler is not None
    wider = replace(base, name="wider", handler=replace(base.handler, saved=("ax", "r11", "cx", "flags")))
    plan, wide = uprobe_plan(base), uprobe_plan(wider)
    assert plan is not None and wide is not None
    assert wide.popped(from_call=True) == plan.popped(from_call=True) + 8 and not wide.direct
    assert uprobe_plan(base) is plan  # compiled once
