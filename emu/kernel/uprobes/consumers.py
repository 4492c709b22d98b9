"""What a probe's user supplies (consumers) and what a handler sees (a Hit)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emu.kernel.uprobes.regs import PtRegs

if TYPE_CHECKING:
    from emu.memory import Memory

UPROBE_HANDLER_REMOVE = 1  # include/linux/uprobes.h [HDR]
UPROBE_HANDLER_IGNORE = 2


class Path(enum.Enum):
    """How execution reached the fake kernel for a hit."""

    INT3 = "int3"
    CALL = "call"  # nop5 -> call into [uprobes-trampoline] (linux-6.18) or lea+call (nop10)
    JMP = "jmp"  # nop5 -> jmp into a 16-byte slot
    RETURN = "return"  # a uretprobe firing on the way back


@dataclass
class Hit:
    """One probe hit as a consumer sees it: pt_regs (ip = probe address), memory, path."""

    regs: PtRegs
    address: int
    path: Path
    mem: Memory
    func: int = 0  # for return handlers: the probed function's address
    cookie: object = None  # session consumers: what the entry handler stored

    def read(self, addr: int, size: int) -> bytes:
        return self.mem.read_user(addr, size)

    def write(self, addr: int, data: bytes) -> None:
        self.mem.write_user(addr, data)


Handler = Callable[[Hit], "int | None"]


@dataclass(eq=False)
class Consumer:
    """A probe user: entry handler, return handler, or both (session: the cookie travels)."""

    handler: Handler | None = None
    ret_handler: Handler | None = None
    session: bool = False
    hits: int = 0
    ret_hits: int = 0
    enabled: bool = True
    paths: dict[str, int] = field(default_factory=dict)
    # uprobe_consumer.filter: does this consumer want hits in the process with this pid? None: every
    # process (a probe attached from outside, like a system-wide one). A hit in a process no consumer
    # wants takes the breakpoint out of that process only (spec 2.3, handler_chain + filter_chain).
    filter: Callable[[int], bool] | None = None
