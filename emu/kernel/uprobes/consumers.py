"""What a probe's user supplies (consumers) and what a handler sees (a Hit)."""

from __future__ import annotations

import ctypes
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu import hotpath
from emu.designs import Branch
from emu.kernel.uprobes.generation import TABLES
from emu.kernel.uprobes.regs import PtRegs

if TYPE_CHECKING:
    from emu.process.memory import Memory

UPROBE_HANDLER_REMOVE = 1  # include/linux/uprobes.h [HDR]
UPROBE_HANDLER_IGNORE = 2


class EntryPath(enum.Enum):
    """How execution reached the fake kernel for a hit."""

    INT3 = "int3"
    CALL = "call"  # nop5 -> call into [uprobes-trampoline] (linux-6.18) or lea+call (nop10)
    JMP = "jmp"  # nop5 -> jmp into a 16-byte slot
    RETURN = "return"  # a uretprobe firing on the way back


def branch_path(branch: Branch | str) -> EntryPath:
    """The path of an optimized hit through a site patched with ``branch``."""
    return EntryPath.CALL if branch is Branch.CALL else EntryPath.JMP


@dataclass
class Hit:
    """One probe hit as a consumer sees it: pt_regs (ip = probe address), memory, path."""

    regs: PtRegs
    address: int
    path: EntryPath
    mem: Memory
    func: int = 0  # for return handlers: the probed function's address
    cookie: object = None  # session consumers: what the entry handler stored

    def read(self, addr: int, size: int) -> bytes:
        return self.mem.read_user(addr, size)

    def write(self, addr: int, data: bytes) -> None:
        self.mem.write_user(addr, data)


Handler = Callable[[Hit], "int | None"]


def count_return(hit: Hit) -> None:
    """The return handler of a uretprobe that only counts (machine.attach gives one to a consumer without)."""
    return None


class Consumer:
    """A probe user: entry handler, return handler, or both (session: the cookie travels).

    ``hits``, ``paths`` and ``ret_hits`` count in Python, plus what the C hot path counted in ``native``
    (one word a path, in NATIVE_PATHS order, then the returns) when it handled hits itself: reading them
    is exact at any time. Setting ``handler``, ``ret_handler``, ``enabled`` or ``filter`` tells the C hot
    path its tables are stale (generation.TABLES); reading them is a plain attribute read, as every hit
    does."""

    handler: Handler | None
    ret_handler: Handler | None
    enabled: bool
    # uprobe_consumer.filter: does this consumer want hits in the process with this pid? None: every
    # process (a probe attached from outside, like a system-wide one). A hit in a process no consumer
    # wants takes the breakpoint out of that process only (spec 2.3, handler_chain + filter_chain).
    filter: Callable[[int], bool] | None

    def __init__(self, handler: Handler | None = None, ret_handler: Handler | None = None, session: bool = False,
                 enabled: bool = True, filter: Callable[[int], bool] | None = None) -> None:
        self.handler, self.ret_handler, self.enabled, self.filter = handler, ret_handler, enabled, filter
        self.session = session
        self._counts: dict[str, int] = {}  # Python's hits by EntryPath value, and returns under "return"
        self._adjust = [0, 0]  # what the hits and ret_hits setters added
        self.native: ctypes.Array[ctypes.c_uint64] | None = None  # made by the C hot path's tables (fastpath.py)

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)
        if name in WATCHED:
            TABLES.bump()

    def _native_paths(self) -> dict[str, int]:
        native = self.native
        return {} if native is None else {name: native[i] for i, name in enumerate(NATIVE_PATHS) if native[i]}

    @property
    def ret_hits(self) -> int:
        native = self.native[NATIVE_RETURN] if self.native is not None else 0
        return self._counts.get(RETURN, 0) + native + self._adjust[1]

    @ret_hits.setter
    def ret_hits(self, value: int) -> None:
        self._adjust[1] += value - self.ret_hits

    @property
    def hits(self) -> int:
        return sum(self.paths.values()) + self._adjust[0]

    @hits.setter
    def hits(self, value: int) -> None:
        self._adjust[0] += value - self.hits

    @property
    def paths(self) -> dict[str, int]:
        """Hits by EntryPath value (a copy: count() adds one)."""
        merged = {name: n for name, n in self._counts.items() if name != RETURN}
        for name, n in self._native_paths().items():
            merged[name] = merged.get(name, 0) + n
        return merged

    def count(self, path: str) -> None:
        """One more hit, reached by ``path`` (an EntryPath value; "return" for a return)."""
        counts = self._counts
        counts[path] = counts.get(path, 0) + 1

    def native_counters(self) -> int:
        """The address of the words the C hot path counts this consumer's hits in (made on first use)."""
        if self.native is None:
            self.native = (ctypes.c_uint64 * (NATIVE_RETURN + 1))()
        return ctypes.addressof(self.native)

    @property
    def counts_only(self) -> bool:
        """No handler that looks at a hit, no filter: the hit (and the return, with count_return) can be
        counted without a Hit or pt_regs."""
        return self.handler is None and self.ret_handler in (None, count_return) and self.filter is None


WATCHED = frozenset({"handler", "ret_handler", "enabled", "filter"})  # what the C hot path's tables hold of a consumer
RETURN = EntryPath.RETURN.value


# the paths in the order of fastsys.h's PATH_* (the C front counts by that index)
NATIVE_PATHS = hotpath.in_c_order({EntryPath.INT3.value: "PATH_INT3", EntryPath.CALL.value: "PATH_CALL",
                                   EntryPath.JMP.value: "PATH_JMP"})
NATIVE_RETURN = len(NATIVE_PATHS)  # the word after them counts returns (PATH_RETURN)
