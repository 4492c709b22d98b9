"""A design compiled once into what an optimized hit does: the plan that sys_uprobe and sys_uretprobe
follow in Python (syscalls.py) and in C (fastsys.c, which fastpath.py hands the plan's fields), and
that the survey's red-zone writes are read from (emu/survey/writes.py).

Everything here is derived from the design alone (spec 2.1 and 2.2): which words the trampoline
saved and where, how the probe is found, how far rsp moves back, and how the kernel returns. What
depends on the process (where the trampoline was assembled, its syscall's return address) is not.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from emu import hotpath
from emu.abi import U64
from emu.cpu import Reg
from emu.designs import SAVABLE, Design, Exit, ProbeFrom, ReturnTrampoline
from emu.kernel.uprobes.consumers import NATIVE_PATHS, EntryPath, branch_path
from emu.kernel.uprobes.regs import FIELD_REG

# the exits in the order of fastsys.h's EXIT_* (set_handler takes the index)
EXIT_KINDS = hotpath.in_c_order({Exit.TRAMPOLINE: "EXIT_TRAMPOLINE", Exit.IRET: "EXIT_IRET", Exit.SYSRET: "EXIT_SYSRET"})

SAVED_REG = {name: FIELD_REG[name] for name in SAVABLE}  # the register of each field a trampoline may save


@dataclass(frozen=True, slots=True)
class UprobePlan:
    """sys_uprobe under one design (spec 2.1)."""

    nr: int
    by_slot: bool  # the probe is the slot's owner (else the call's return address less branch_end)
    saved: tuple[str, ...]  # pt_regs fields of the words the trampoline pushed, from rsp upward
    saved_offset: int  # bytes between rsp at the syscall and the first saved word
    sp_skip: int  # bytes the site or slot moved rsp down before the pushes
    branch_end: int  # the site's call returns here, relative to the probe
    patch_length: int  # the site's length: a hit resumes this far past the probe
    exit: Exit
    path: EntryPath  # how the consumers see the hit enter
    outside_errno: int  # a call from anywhere but a trampoline or slot
    words: int  # read from the stack at the syscall: the saved ones, and the call's return address if any
    saved_regs: tuple[Reg, ...]  # the registers of ``saved`` (plain fields: read for every hit that changes nothing)

    def popped(self, from_call: bool) -> int:
        """How far rsp moves back up: past the saved words, the return address if a call pushed one,
        and what the site or slot moved it down first."""
        return self.saved_offset + 8 * len(self.saved) + (8 if from_call else 0) + self.sp_skip

    @property
    def direct(self) -> bool:
        """Can a hit that changes no register leave by writing registers alone (no saved flags)?"""
        return "flags" not in self.saved

    @property
    def resume_regs(self) -> tuple[Reg, ...]:
        """What a hit that changed nothing writes as it leaves straight past the site, in order: the
        syscall's own rcx and r11, the restored words, rsp, rip, and last SYSRET's rcx and r11."""
        regs = (Reg.RCX, Reg.R11, *self.saved_regs, Reg.RSP, Reg.RIP)
        return regs + ((Reg.RCX, Reg.R11) if self.exit is Exit.SYSRET else ())

    def resume_values(self, vaddr: int, saved: list[int], ip: int, flags: int, sp: int, from_call: bool) -> list[int]:
        """The values of ``resume_regs`` for a hit at ``vaddr`` entered with ``flags`` and ``sp`` whose
        syscall returns to ``ip``; rip is 2 short, as Unicorn adds 2 once a syscall hook returns."""
        next_ip = (vaddr + self.patch_length) & U64
        values = [ip, flags, *saved, (sp + self.popped(from_call)) & U64, next_ip - 2]
        return values + [next_ip, flags] if self.exit is Exit.SYSRET else values

    def native_fields(self) -> tuple[int | tuple[int, ...], ...]:
        """The plan as fastsys.c's set_handler takes it (all but the slot syscall's return address)."""
        return (self.nr, int(self.by_slot), EXIT_KINDS.index(self.exit), NATIVE_PATHS.index(self.path.value),
                tuple(int(r) for r in self.saved_regs), self.saved_offset, self.sp_skip, self.branch_end,
                self.patch_length)


@dataclass(frozen=True, slots=True)
class UretprobePlan:
    """sys_uretprobe under one design (spec 2.2): its number (None: no syscall, INT3 returns), the words
    its trampoline saved, how it returns, and where in the trampoline its syscall returns to."""

    nr: int | None
    saved: tuple[str, ...]
    exit: Exit
    trampoline: ReturnTrampoline

    @property
    def syscall_return(self) -> int:
        """Where in the trampoline its syscall returns to (0: no syscall); assembled on first use."""
        return self.trampoline.syscall_return

    @property
    def popped(self) -> int:
        return 8 * len(self.saved)

    @property
    def saved_regs(self) -> tuple[Reg, ...]:
        return tuple(SAVED_REG[name] for name in self.saved)


@functools.cache
def uprobe_plan(design: Design) -> UprobePlan | None:
    """The design's sys_uprobe plan; None for a design that never optimizes (no handler)."""
    handler, patch = design.handler, design.patch
    if handler is None or patch is None:
        return None
    by_slot = handler.probe_from is ProbeFrom.SLOT
    return UprobePlan(handler.nr, by_slot, handler.saved, handler.saved_offset, handler.sp_skip, patch.branch_end,
                      patch.length, Exit(handler.exit), branch_path(patch.branch), handler.outside_errno,
                      words=len(handler.saved) + (0 if by_slot else 1),
                      saved_regs=tuple(SAVED_REG[name] for name in handler.saved))


@functools.cache
def uretprobe_plan(design: Design) -> UretprobePlan:
    ret = design.uretprobe
    return UretprobePlan(ret.nr, tuple(ret.saved), Exit(ret.exit), ret)
