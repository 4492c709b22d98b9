"""The records of the uprobe core (emu/kernel/uprobes/core.py) the x86 side and the counting-only
path share with it: a probe, a pending return, a thread's uprobe state, the statistics, the XOL
area, and the interfaces of the shadow-stack model and of the C front's hit path."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from emu.abi import PAGE_SIZE, TASK_SIZE, Prot, Signal
from emu.designs import XOL_SLOT_BYTES, ReturnTrampoline
from emu.kernel.exits import GuestKilled
from emu.kernel.uprobes.consumers import Consumer
from emu.kernel.uprobes.insn import Analysis
from emu.process.memory import Memory

MAX_URETPROBE_DEPTH = 64  # [HDR]
XOL_NAME = "[uprobes]"


class ShadowStackHooks(Protocol):
    """The task's user shadow stack, when the harness models one (spec 3.7; emu/callret/shstk.py)."""

    def push(self, addr: int) -> None: ...  # shstk_push
    def pop(self) -> int | None: ...  # shstk_pop; None: nothing to pop (-EFAULT)
    def update_last_frame(self, addr: int) -> None: ...  # shstk_update_last_frame
    def kernel_violation(self, why: str, expected: int | None, actual: int) -> None: ...


@dataclass(eq=False)
class Uprobe:
    """One probed address in this process."""

    vaddr: int
    insn: Analysis
    ref_ctr: int | None
    can_optimize: bool
    consumers: list[Consumer] = field(default_factory=list)
    optimize_failed: bool = False

    @property
    def changes_nothing(self) -> bool:
        """Its consumers only count: a hit changes no register and takes no return instance."""
        for c in self.consumers:  # (a loop, not all(): every optimized hit asks)  # noqa: SIM110
            if c.handler is not None or c.ret_handler is not None or c.filter is not None:
                return False
        return True


@dataclass(eq=False)
class ReturnInstance:
    func: int
    stack: int
    orig_ret: int
    chained: bool
    entries: list[tuple[Consumer, object]]


@dataclass
class UprobeTask:
    """Per-thread uprobe state (the kernel's struct uprobe_task): pending return instances (the head
    is the last element), an out-of-line step in progress, and the thread's shadow stack hooks."""

    return_instances: list[ReturnInstance] = field(default_factory=list)
    stepping: bool = False
    shadow_stack: ShadowStackHooks | None = None

    def fork_copy(self) -> UprobeTask:
        """dup_utask (spec 5): a forked child returns through the same frames, so it gets copies of the
        pending return instances; no step is in progress at fork, and no shadow stack is modelled."""
        copies = [ReturnInstance(ri.func, ri.stack, ri.orig_ret, ri.chained, list(ri.entries))
                  for ri in self.return_instances]
        return UprobeTask(return_instances=copies)


@dataclass
class UprobeStats:
    traps: int = 0
    emulated: int = 0
    xol_steps: int = 0
    optimized: int = 0
    exits: Counter[str] = field(default_factory=Counter)
    ret_hits: int = 0
    copied: int = 0  # bytes the kernel copied from or to user memory
    mmap_locks: int = 0  # mmap_lock read acquisitions on a hit's path (see Uprobes.in_trampoline)


class XolArea:
    """The per-process [uprobes] page (spec 4.3): --xp, 32 slots of 128 bytes, slot 0 the uretprobe trampoline."""

    def __init__(self, mem: Memory, uretprobe: ReturnTrampoline) -> None:
        hint = TASK_SIZE - PAGE_SIZE
        start = hint if mem.is_free(hint, TASK_SIZE) else mem.find_free(PAGE_SIZE)
        if start is None:
            raise GuestKilled(Signal.SIGKILL, None, "no room for the [uprobes] page")
        mem.map(start, PAGE_SIZE, Prot.EXEC, name=XOL_NAME, data=uretprobe.code_bytes)
        self.mem = mem
        self.vaddr = start
        self.busy = [True] + [False] * (PAGE_SIZE // XOL_SLOT_BYTES - 1)

    def get_slot(self, code: bytes) -> int:
        index = self.busy.index(False)
        self.busy[index] = True
        slot = self.vaddr + index * XOL_SLOT_BYTES
        self.mem.write(slot, code)
        self.mem.backend.flush_code(slot, slot + len(code))
        return slot

    def free_slot(self, slot: int) -> None:
        self.busy[(slot - self.vaddr) // XOL_SLOT_BYTES] = False


class FastHits(Protocol):
    """The C front's hit path of a process, as the core sees it (emu/kernel/uprobes/fastpath.py: FastPaths)."""

    verifier: Any  # the verifiers' tracker, whose observers the C front mirrors (fastpath.NativeVerifier)

    def handed_over(self) -> None: ...
    def find_return(self, stack: int) -> tuple[int, int] | None: ...
    def sync(self, traced: bool | None = None) -> None: ...
    def fold(self, counts: Counter[int]) -> None: ...
    def fold_stats(self, counts: Counter[int]) -> None: ...
    def returns_moved(self) -> None: ...
