"""The C front's side of probe hits: what the C extension may take without entering Python, and its tables.

With the C extension, the CPU's syscall and interrupt hooks go through a FastSys
(emu/hotpath_src/fastsys.c) that follows the same plan as syscalls.py (plan.py) for the hits that
change nothing: every consumer of the probe only counts (no handler, no filter; a return handler at
most consumers.count_return) and no shadow stack is modelled. Those are sys_uprobe with the
design's exit, INT3 on a probed NOP that is never optimized (a count and ip += length, spec 4.2),
and, for a uretprobe that only counts, prepare_uretprobe at the entry (spec 5.1) and sys_uretprobe's
'trampoline' exit at the return (2.2). Anything else it hands to Python's dispatcher unchanged.

This module keeps the front's tables (sync), adds what it counted to the statistics (fold) and moves
the return instances it pushed to the task's list before Python handles anything (take_over).
Nothing in Python may need to see a hit for the front to take it: no chain or step observer (the
hit-path report), no syscall or interrupt observer, no strace, no shadow stack, except the verifiers'
transaction tracker (emu/verify/tracker.py), whose observers' work the front does itself for the
hits it takes (a NOP-class site: FastSys's WATCH_OPEN). Without the extension every hit takes
syscalls.py's path, whose hits that change nothing skip pt_regs in the same way.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

from emu import hotpath
from emu.abi import PAGE_SIZE
from emu.designs import Exit
from emu.kernel.uprobes.consumers import Consumer
from emu.kernel.uprobes.core import Uprobes
from emu.kernel.uprobes.generation import TABLES
from emu.kernel.uprobes.insn import Kind
from emu.kernel.uprobes.records import ReturnInstance, Uprobe

# take_stats' tuple, by fastsys.h's ST_* index: what fold_stats unpacks, in its order
STAT_ORDER = tuple(hotpath.constant(name, i) for i, name in enumerate(
    ("ST_UPROBE_CALLS", "ST_MMAP_LOCKS", "ST_COPIED", "ST_EXIT_SYSRET", "ST_EXIT_IRET", "ST_TRAPS", "ST_EMULATED",
     "ST_URETPROBE_CALLS", "ST_RET_HITS")))


class NativeVerifier(Protocol):
    """The verifiers' tracker, as the C front sees it (emu/verify/tracker.py)."""

    edges: Any  # its NativeEdges: the control block the C front shares

    def mirrors(self, observer: object) -> bool: ...

    def site_facts(self, vaddr: int) -> tuple[int, int, int]: ...


class FastPaths:
    def __init__(self, up: Uprobes) -> None:
        self.up = up
        self.traced = False  # strace is on: every syscall must reach the dispatcher (set by sync)
        self._configured = False  # the C front has this design's handler
        self._ret_configured = False  # and its uretprobe trampoline
        self._entries: list[list[tuple[Consumer, object]]] = []  # each published probe's return consumers
        self.verifier: NativeVerifier | None = None  # set by the verifiers' tracker
        TABLES.bump()  # a new registry (a new process, or exec): the front's tables are of the old one
        self.plan = up.plan if up.plan is not None and up.plan.direct else None  # the C front's sys_uprobe (else INT3 only)

    # ------------------------------------------------------------ the C front
    def _front(self) -> Any:
        """The C front's FastSys (emu/hotpath/front.py), or None with the pure-Python hot path."""
        front = self.up.cpu.hooks.front
        return front.handle if front is not None else None

    def handed_over(self) -> None:
        """The C front gave a sys_uprobe to Python because its tables were stale: rebuild them, so that
        the next hits are its own."""
        front = self._front()
        if front is not None and not front.current:
            self.sync()

    def sync(self, traced: bool | None = None) -> None:
        """Let the C front take hits only while nothing in Python needs to see them, with tables of the
        current probes (rebuilt when a probe, consumer or site changed since). Called before each run
        slice and whenever the front hands a sys_uprobe over."""
        if traced is not None:
            self.traced = traced
        front = self._front()
        if front is None:
            return
        if not self._configured:
            self._configure(front)
        front.open = self._unobserved()
        front.set_verifier(self.verifier.edges.address if front.open and self.verifier is not None else 0)
        if front.open and not front.current:
            self.take_over()  # (none: sync comes at a slice's start or from Python) they index the old table
            self._publish(front)
        self.returns_moved()

    def _unobserved(self) -> bool:
        """Nothing in Python watches hits but the verifier's observers, which the C front mirrors."""
        up, cpu = self.up, self.up.cpu
        if self.traced or up.shadow_stack is not None:
            return False
        observers = (*up.chain_observers, *up.step_observers, *cpu.hooks.before_syscall, *cpu.hooks.after_syscall,
                     *cpu.hooks.before_interrupt, *cpu.hooks.after_interrupt)
        verifier = self.verifier
        return all(verifier is not None and verifier.mirrors(o) for o in observers)

    def _configure(self, front: Any) -> None:
        self._configured = True
        front.set_generation(TABLES.address)
        self._ret_configured = False
        hooks_front = self.up.cpu.hooks.front
        if hooks_front is not None:
            hooks_front.take_over = self.take_over
        self._set_handler(front)

    def _set_handler(self, front: Any) -> None:
        """The design's sys_uprobe. A slot design's slot code is assembled only once there are slots
        (a plain run assembles nothing), so its syscall's offset is told when they come (_publish)."""
        if self.plan is None:
            return  # INT3 hits only
        sites = self.up.sites
        front.set_handler(*self.plan.native_fields(), sites.trampoline.syscall_return if sites.slot_pages else 0)

    def _set_uretprobe(self, front: Any) -> None:
        """The design's sys_uretprobe, once the XOL page (and so its assembled trampoline) exists."""
        self._ret_configured = True
        ret = self.up.ret_plan
        if ret.nr is not None and ret.exit is Exit.TRAMPOLINE:
            front.set_uretprobe(ret.nr, tuple(int(r) for r in ret.saved_regs), ret.syscall_return)

    def _publish(self, front: Any) -> None:
        up = self.up
        probes = []
        self._entries = []
        for vaddr, probe in sorted(up.probes.items()):
            consumers = probe.consumers
            if not all(c.counts_only for c in consumers):
                continue
            returning = [c for c in consumers if c.ret_handler is not None]
            self._entries.append([(c, None) for c in returning])  # handler_chain's entries: every one, enabled or not
            facts = (0, 0, 0) if self.verifier is None else self.verifier.site_facts(vaddr)
            probes.append((vaddr, 0 if returning else self._int3_length(probe),
                           tuple(c.native_counters() for c in consumers if c.enabled), bool(returning),
                           tuple(c.native_counters() for c in returning if c.enabled), *facts))
        sites = up.sites
        pages = [(page, page + PAGE_SIZE) for page in sites.trampolines]
        slots: list[tuple[int, int]] = []
        if sites.slot_pages and self.plan is not None and self.plan.by_slot:
            self._set_handler(front)
            size = sites.trampoline.slot_size
            slots = [(page.start + i * size, owner) for page in sites.slot_pages
                     for i, owner in enumerate(page.owners) if owner is not None]
        front.set_tables(probes, pages, slots)

    @staticmethod
    def _int3_length(probe: Uprobe) -> int:
        """A NOP on the INT3 path for good (never optimized: optimize_now would patch it on this hit)."""
        stays = not probe.can_optimize or probe.optimize_failed
        return probe.insn.length if stays and probe.insn.kind is Kind.NOP else 0

    def returns_moved(self) -> None:
        """Tell the C front where the XOL page is and what return instances Python holds (it pushes over them)."""
        front = self._front()
        if front is None:
            return
        pending = self.up.return_instances
        xol = self.up.xol.vaddr if self.up.xol is not None else 0
        if xol and self._configured and not self._ret_configured:
            self._set_uretprobe(front)
        front.set_python_returns(xol, len(pending), pending[-1].stack if pending else 0)

    def take_over(self) -> None:
        """The return instances the C front pushed, onto the task's list (oldest first), before Python
        looks at that list: any Python handling mid-slice, the end of a slice, a rebuild of the tables."""
        front = self._front()
        if front is None or not front.pending:
            return
        pending = self.up.return_instances
        for func, stack, orig, chained, index in front.take_returns():
            pending.append(ReturnInstance(func, stack, orig, chained, list(self._entries[index])))
        self.returns_moved()

    def find_return(self, stack: int) -> tuple[int, int] | None:
        """(probed function, original return address) of the return instance the C front pushed with its
        return address slot at ``stack``, if it holds one (it keeps it: the return is its own to handle)."""
        front = self._front()
        if front is None or not front.pending:
            return None
        found: tuple[int, int] | None = front.find_return(stack)
        return found

    def fold(self, counts: Counter[int]) -> None:
        """Add what the C front counted since the last fold to the statistics, and its sys_uprobe calls
        to the kernel's syscall ``counts`` (after each run slice, and before the Uprobes is replaced)."""
        self.take_over()
        self.fold_stats(counts)

    def fold_stats(self, counts: Counter[int]) -> None:
        """As fold, leaving the return instances the C front pushed where they are (it may pop them)."""
        front = self._front()
        if front is None:
            return
        taken = front.take_stats()  # (it zeroes them)
        calls, locks, copied, sysret, iret, traps, emulated, ret_calls, ret_hits = (taken[i] for i in STAT_ORDER)
        stats = self.up.stats
        if calls:
            assert self.plan is not None
            counts[self.plan.nr] += calls
        if ret_calls:
            ret_nr = self.up.ret_plan.nr
            assert ret_nr is not None
            counts[ret_nr] += ret_calls
        stats.ret_hits += ret_hits
        stats.mmap_locks += locks
        stats.copied += copied
        stats.traps += traps
        stats.emulated += emulated
        for name, n in (("sysret", sysret), ("iret", iret)):
            if n:  # no zero entries: the exits dict is reported as it is
                stats.exits[name] += n
