"""The kernel designs the harness emulates: one row each, combining mechanisms implemented once.

See DESIGN.md's table and spec sections 1-5. Adding a design is one row here.
"""

from __future__ import annotations

import enum
import errno
from dataclasses import dataclass

from emu.errors import UsageError


class SiteMode(enum.Enum):
    """What happens to an optimizable long NOP after its first INT3 hit."""

    INT3_ONLY = "int3"  # never optimized
    CALL_NOP5 = "call"  # nop5 -> call [uprobes-trampoline] (spec 1.2, 3)
    JMP_SLOT_NOP5 = "jmp"  # nop5 -> jmp to a 16-byte slot
    LEA_CALL_NOP10 = "lea+call"  # nop10 -> lea -0x80(%rsp),%rsp; call (spec 1.5, 3.8)


class RetMode(enum.Enum):
    """The uretprobe trampoline in [uprobes] slot 0."""

    INT3 = "int3"  # a CC routed to uprobe_handle_trampoline (<= 6.10)
    SYSCALL_335 = "syscall-335"  # push rax/rcx/r11; syscall 335; pop; ret (spec 1.4)
    RFC_462 = "rfc-462"  # push rax/rcx/r11; syscall 462; kernel returns by IRET


@dataclass(frozen=True, slots=True)
class Design:
    name: str
    sites: SiteMode
    uretprobe: RetMode
    uprobe_syscall_errno: int | None  # what syscall 336 returns from outside a trampoline; None: no such syscall
    source: str

    @property
    def optimizes(self) -> bool:
        return self.sites is not SiteMode.INT3_ONLY

    @property
    def site_length(self) -> int:
        return 10 if self.sites is SiteMode.LEA_CALL_NOP10 else 5


DESIGNS: dict[str, Design] = {
    d.name: d
    for d in (
        Design("int3", SiteMode.INT3_ONLY, RetMode.INT3, None, "Linux <= 6.10"),
        Design("uretprobe-rfc", SiteMode.INT3_ONLY, RetMode.RFC_462, None,
               "RFC 'uprobe: Add uretprobe syscall to speed up return probe' (syscall 462)"),
        Design("linux-6.18", SiteMode.CALL_NOP5, RetMode.SYSCALL_335, errno.ENXIO, "mainline 6.18"),
        Design("jmp-slots", SiteMode.JMP_SLOT_NOP5, RetMode.SYSCALL_335, errno.EPROTO,
               "'uprobes/x86: Fix red zone clobbering in nop5 optimization' (May 2026)"),
        Design("nop10", SiteMode.LEA_CALL_NOP10, RetMode.SYSCALL_335, errno.EPROTO, "nop10 alternative (LATE10/WIP10)"),
    )
}
DEFAULT_DESIGN = "linux-6.18"


def get_design(name: str) -> Design:
    try:
        return DESIGNS[name]
    except KeyError:
        raise UsageError(f"unknown kernel design {name!r} (known: {', '.join(DESIGNS)})") from None
