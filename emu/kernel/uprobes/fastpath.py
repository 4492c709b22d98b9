"""Probe hits when nothing can change a register: every consumer only counts, nothing in Python watches.

When every consumer of the probe only counts (no handler, no ret_handler, no filter) and no shadow
stack is modelled, sys_uprobe's pt_regs round trip (spec 2.1) writes back exactly what it read.
What remains observable is: the hit, the saved words read from the stack, and the exit: SYSRET into
the trampoline (rax = 0, rcx = ip, r11 = flags) for the 'trampoline' exit, or straight to the site's
next instruction with the saved registers and rsp restored (IRET; SYSRET also sets rcx and r11).
An INT3 hit on a probed NOP that is never optimized is a count and ip += length (spec 4.2).
A uretprobe whose return handlers only count (consumers.count_return) adds, on the syscall path,
prepare_uretprobe at the entry (spec 5.1) and sys_uretprobe's 'trampoline' exit at the return (2.2).

Two implementations of the same thing. With the C extension, the CPU's syscall and interrupt hooks
go through a FastSys (emu/hotpath_src/fastsys.c) that handles these hits without entering Python;
this module keeps its tables (sync), adds what it counted to the statistics (fold) and moves the
return instances it pushed to the task's list before Python handles anything (take_over). Without it,
or whenever the C side hands a hit over, :meth:`FastPaths.uprobe` does the same in Python, and
returns False whenever the full path is needed (an error, a fault, a consumer that looks at registers).
Nothing in Python may need to see the hit for the C side to take it: no chain or step observer (the
hit-path report), no syscall or interrupt observer, no strace, no shadow stack, except the verifiers'
transaction tracker (emu/verify/tracker.py), whose observers' work the C side does itself for the
hits it takes (a NOP-class site: FastSys's WATCH_OPEN).
"""

from __future__ import annotations

import struct
from collections import Counter
from typing import Any, Protocol

from emu import hotpath
from emu.abi import PAGE_SIZE, U64
from emu.cpu import Reg
from emu.designs import Exit
from emu.kernel.uprobes.consumers import Consumer, EntryPath
from emu.kernel.uprobes.core import Uprobes
from emu.kernel.uprobes.generation import TABLES
from emu.kernel.uprobes.insn import Kind
from emu.kernel.uprobes.records import ReturnInstance, Uprobe
from emu.process.memory import UserFault

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
        plan = up.plan
        self.enabled = plan is not None and plan.direct
        if plan is None or not self.enabled:
            return
        self.plan = plan
        self.saved_fmt = f"<{len(plan.saved)}Q"
        # SYSCALL itself left rcx = ip and r11 = flags; the saved words then override what the design restores
        direct = [Reg.RCX, Reg.R11, *plan.saved_regs, Reg.RSP, Reg.RIP]
        if plan.exit is Exit.SYSRET:
            direct += [Reg.RCX, Reg.R11]  # written last: SYSRET's rcx and r11 win over the restored ones
        self.write_direct = up.cpu.batch_writer(direct)

    # ------------------------------------------------------------ the C front
    def _front(self) -> Any:
        """The C front's FastSys (emu/hotpath/front.py), or None with the pure-Python hot path."""
        front = self.up.cpu.hooks.front
        return front.handle if front is not None else None

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
        if not self.enabled:
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
        if sites.slot_pages and self.plan.by_slot:
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

    # --------------------------------------------------------- the Python path
    def _counting_only(self, vaddr: int, path: EntryPath) -> bool:
        """Count the hit if no consumer can change a register; observers hear of it with regs=None
        (nothing changed). False: the full path must run."""
        up = self.up
        if up.shadow_stack is not None:
            return False
        probe = up.probes.get(vaddr)
        if probe is None:
            return True  # no uprobe there any more: the trampoline just returns (spec 3.6)
        if not all(c.counts_only and c.ret_handler is None for c in probe.consumers):
            return False  # a return handler needs prepare_uretprobe: the full path
        for observer in up.chain_observers:
            observer(probe, None, path, False)
        for consumer in probe.consumers:
            if consumer.enabled:
                consumer.count(path.value)
        for observer in up.chain_observers:
            observer(probe, None, path, True)
        return True

    def uprobe(self, entry: list[int]) -> bool:
        """sys_uprobe on the fast path. ``entry``: the dispatcher's register snapshot (rip, flags, sp at 7-9)."""
        if not self.enabled:
            return False
        front = self._front()
        if front is not None and not front.current:
            self.sync()  # the C front handed it over for stale tables: this hit here, the next ones there
        up, plan = self.up, self.plan
        rip, flags, sp = entry[7], entry[8], entry[9]
        ip = rip + 2
        vaddr = up.sites.probe_of_slot(ip) if plan.by_slot else None
        if vaddr is None if plan.by_slot else not up.sites.in_trampoline(ip):
            return False
        try:
            raw = up.mem.read_user(sp + plan.saved_offset, 8 * plan.words)
        except UserFault:
            return False
        if vaddr is None:
            vaddr = (struct.unpack_from("<Q", raw, 8 * len(plan.saved))[0] - plan.branch_end) & U64
        if not self._counting_only(vaddr, plan.path):
            return False  # the full path looks the trampoline up again, and counts that lookup
        if not plan.by_slot:
            up.stats.mmap_locks += 1  # the lookup Uprobes.in_trampoline counts on the full path
        if plan.exit is Exit.TRAMPOLINE:
            up.stats.copied += 16 * plan.words  # the words are read and written back unchanged
            up.stats.exits["sysret"] += 1
            up.cpu.write_syscall_return(0, ip, flags)  # SYSRET: rcx <- ip, r11 <- flags; the trampoline pops the rest
            return True
        up.stats.copied += 8 * plan.words
        next_ip = vaddr + plan.patch_length
        values = [ip, flags, *struct.unpack_from(self.saved_fmt, raw), sp + plan.popped(from_call=not plan.by_slot),
                  next_ip - 2]
        if plan.exit is Exit.SYSRET:
            values += [next_ip, flags]
        up.stats.exits["iret" if plan.exit is Exit.IRET else "sysret"] += 1
        self.write_direct(values)  # Unicorn adds 2 to rip once the syscall hook returns
        return True
