"""The choices a kernel design makes (emu/designs/__init__.py), one enum each.

A design file writes a choice as its value (``exit="iret"``); each part of a design turns it into
the member (coerce_choices), and the kernel's code compares members only. Each member's comment
names the function that implements it.
"""

from __future__ import annotations

import enum


class SiteForm(enum.StrEnum):
    """The long NOP a design optimizes (sites.can_optimize)."""

    NOP5 = "nop5"  # any of the kernel's nop5 forms (insn.is_nop5)
    NOP10 = "nop10"  # 66 2e 0f 1f 84 00 00 00 00 00 (sites.NOP10_HEAD)


class Branch(enum.StrEnum):
    """The rel32 branch a patched site takes (sites.patched_bytes; the hit's path, consumers.branch_path)."""

    CALL = "call"  # into the shared trampoline, pushing the return address sys_uprobe finds the probe by
    JMP = "jmp"  # into this probe's slot: nothing pushed


class WriteOrder(enum.StrEnum):
    """How SitePatcher.optimize writes the patch (spec 3.5)."""

    INT3_FIRST = "int3-first"  # bytes 1.. while byte 0 still traps, then byte 0
    FRONT_TO_BACK = "front-to-back"  # every byte in turn: a thread may run a torn instruction


class Detach(enum.StrEnum):
    """What SitePatcher.unoptimize leaves at a detached site (spec 3.8)."""

    RESTORE = "restore"  # the original bytes
    JUMP_OVER = "jump-over"  # `eb rel8` over the stale tail


class Layout(enum.StrEnum):
    """Where SitePatcher.optimize points a site (sites._trampoline_for, sites._slot_for)."""

    SHARED = "shared"  # one trampoline page for every site in rel32 reach
    SLOTS = "slots"  # a slot of its own per probe, found by sys_uprobe from the slot (SitePatcher.probe_of_slot)


class ProbeFrom(enum.StrEnum):
    """How sys_uprobe finds the probe (syscalls._locate)."""

    RETURN_ADDRESS = "return-address"  # the call's return address, minus Patch.branch_end
    SLOT = "slot"  # which slot the syscall came from


class Exit(enum.StrEnum):
    """How sys_uprobe returns to user mode (syscalls.sys_uprobe, and syscalls.sys_uretprobe for a
    ReturnTrampoline, which has TRAMPOLINE and IRET)."""

    TRAMPOLINE = "trampoline"  # the words written back, SYSRET into the trampoline, whose pops and ret restore them
    IRET = "iret"  # everything restored, IRET to the instruction after the site (syscalls._leave, force_iret)
    SYSRET = "sysret"  # restored, then rcx = ip and r11 = flags: SYSRET straight past the site


def coerce_choices(part: object, **choices: type[enum.StrEnum]) -> None:
    """A frozen part's choice fields as members: a value that names one becomes it; anything else
    stays as it is, for problems() and shape_problems() to name."""
    for name, choice in choices.items():
        value = getattr(part, name)
        if isinstance(value, str) and not isinstance(value, choice) and value in choice._value2member_map_:
            object.__setattr__(part, name, choice(value))
