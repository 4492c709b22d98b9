"""The generic uprobe core for one process (the kernel's kernel/events/uprobes.c): registry,
install/remove, handle_swbp, handler_chain, the XOL area, return instances (spec 2.3, 3.2, 3.3, 5).
Running the probed instruction itself is the x86 side's (emu/kernel/uprobes/x86.py)."""

from __future__ import annotations

import struct
from collections.abc import Callable

from emu.abi import Signal
from emu.cpu import Cpu, Reg
from emu.designs import Design
from emu.kernel.exits import GuestKilled
from emu.kernel.uprobes import x86
from emu.kernel.uprobes.consumers import (
    RETURN,
    UPROBE_HANDLER_IGNORE,
    UPROBE_HANDLER_REMOVE,
    Consumer,
    EntryPath,
    Hit,
    count_return,
)
from emu.kernel.uprobes.generation import TABLES
from emu.kernel.uprobes.insn import Kind, analyze
from emu.kernel.uprobes.plan import uprobe_plan, uretprobe_plan
from emu.kernel.uprobes.records import (
    MAX_URETPROBE_DEPTH,
    FastHits,
    ReturnInstance,
    ShadowStackHooks,
    Uprobe,
    UprobeStats,
    UprobeTask,
    XolArea,
)
from emu.kernel.uprobes.regs import PtRegs, regs_from_cpu, regs_to_cpu
from emu.kernel.uprobes.sites import INT3, SitePatcher
from emu.process.memory import Memory, UserFault

DeferFn = Callable[[Callable[[], None]], None]
# (probe, regs, path, after_consumers); regs None: a hit that changes nothing (pt_regs never built)
ChainObserver = Callable[["Uprobe", PtRegs | None, EntryPath, bool], None]
StepObserver = Callable[["Uprobe", PtRegs], None]


class Uprobes:
    """Probes of one process under one design."""

    def __init__(self, cpu: Cpu, mem: Memory, design: Design, defer: DeferFn) -> None:
        self.cpu = cpu
        self.mem = mem
        self.design = design
        self.plan = uprobe_plan(design)  # what sys_uprobe does under it (None: it never optimizes)
        self.ret_plan = uretprobe_plan(design)
        # sys_uprobe's exit for a hit that changed nothing: the plan's resume_regs in one write (None: it restores rflags)
        self.resume = cpu.batch_writer(self.plan.resume_regs) if self.plan is not None and self.plan.direct else None
        self.sites = SitePatcher(mem, design)
        self.probes: dict[int, Uprobe] = {}
        self.xol: XolArea | None = None
        self.task = UprobeTask()  # the running thread's; the scheduler switches it with the thread
        self.pid = 0  # of the process (its mm), for the consumers' filters
        self.stats = UprobeStats()
        self.defer = defer  # run work between two CPU runs (an out-of-line step: x86.start_xol)
        self.chain_observers: list[ChainObserver] = []
        self.step_observers: list[StepObserver] = []  # right before a probed instruction runs (emulated or out of line)
        # (pt_regs before, after) return handlers that may set registers ran (the Python path only)
        self.return_observers: list[Callable[[PtRegs, PtRegs], None]] = []
        self.fast: FastHits | None = None  # set with the design's syscall rows (fastpath.py)

    def follow(self, old: Uprobes) -> None:
        """A new image's uprobes in place of ``old``'s (execve): what watches the process's hits and
        their statistics belong to the process, not the image, and carry over."""
        self.chain_observers, self.step_observers = old.chain_observers, old.step_observers
        self.return_observers, self.stats = old.return_observers, old.stats
        if self.fast is not None and old.fast is not None:
            self.fast.verifier = old.fast.verifier

    # ------------------------------------------------------ the running thread's state
    @property
    def return_instances(self) -> list[ReturnInstance]:
        return self.task.return_instances

    @property
    def stepping(self) -> bool:
        """Inside an out-of-line single step: the kernel, not the guest, is running."""
        return self.task.stepping

    @stepping.setter
    def stepping(self, value: bool) -> None:
        self.task.stepping = value

    @property
    def shadow_stack(self) -> ShadowStackHooks | None:
        """None: shstk off (-ENOTSUPP, ignored; spec 3.7)."""
        return self.task.shadow_stack

    @shadow_stack.setter
    def shadow_stack(self, hooks: ShadowStackHooks | None) -> None:
        self.task.shadow_stack = hooks

    def reset(self) -> None:
        """Forget every probe, pending return and busy XOL slot without touching memory, as a fresh
        process would start (trampoline pages, slot owners and statistics stay): for a caller that
        rewrites the code itself between runs of one process (the fuzzer)."""
        self.probes.clear()
        self.return_instances.clear()
        TABLES.bump()
        self._returns_moved()
        if self.xol is not None:
            self.xol.busy[1:] = [False] * (len(self.xol.busy) - 1)

    # ------------------------------------------------------------ attaching
    def attach(self, vaddr: int, consumer: Consumer, ref_ctr: int | None = None, original: bytes | None = None) -> Uprobe:
        """uprobe_register + install in this mm (spec 3.2). Raises SyscallError for refused instructions.

        ``original`` is the instruction as the file holds it (spec 1.1: the kernel analyzes the file's
        bytes, not memory's, which may hold a stale ``eb 08`` after a nop10 detach)."""
        probe = self.probes.get(vaddr)
        if probe is None:
            code = original if original else self.mem.read(vaddr, 16)
            insn = analyze(code, vaddr, accept_nop10=self.design.site_length == 10)
            probe = Uprobe(vaddr, insn, ref_ctr, self.sites.can_optimize(insn.raw, vaddr))
            self.probes[vaddr] = probe
            self._install(probe)
        probe.consumers.append(consumer)
        TABLES.bump()  # the C hot path's tables (fastpath.py) follow the registry
        return probe

    def detach(self, probe: Uprobe, consumer: Consumer) -> None:
        if consumer in probe.consumers:
            probe.consumers.remove(consumer)
            TABLES.bump()
        if not probe.consumers and self.probes.get(probe.vaddr) is probe:
            self._remove(probe)

    def _install(self, probe: Uprobe) -> None:
        if probe.can_optimize and not probe.optimize_failed and self.sites.is_optimized(probe.vaddr):
            return  # another thread already optimized it: leave the call alone (spec 3.2)
        self.sites.set_swbp(probe.vaddr)
        self._ref_ctr(probe, +1)

    def _remove(self, probe: Uprobe) -> None:
        """Breakpoints first, then the uprobe (spec 3.6): a thread trapping on the transient CC still
        finds its probe."""
        if probe.can_optimize and self.sites.is_optimized(probe.vaddr):
            self.sites.unoptimize(probe.vaddr, probe.insn.raw)
        else:
            self.sites.set_orig(probe.vaddr, probe.insn.raw[0])
        self._ref_ctr(probe, -1)
        del self.probes[probe.vaddr]
        TABLES.bump()

    def _ref_ctr(self, probe: Uprobe, delta: int) -> None:
        if probe.ref_ctr is None:
            return
        (value,) = struct.unpack("<H", self.mem.read(probe.ref_ctr, 2))
        self.mem.write(probe.ref_ctr, struct.pack("<H", (value + delta) & 0xFFFF))

    def in_trampoline(self, ip: int) -> bool:
        """sys_uprobe's check that it was called from a trampoline (spec 2.1 step 1): a VMA lookup, counted
        as one mmap_lock read acquisition, as the red-zone fix's thread describes the call-trampoline base
        it compares with; a slot design's lookup by slot index is RCU-only and does not come here."""
        self.stats.mmap_locks += 1
        return self.sites.in_trampoline(ip)

    def is_optimized(self, probe: Uprobe) -> bool:
        return probe.can_optimize and self.sites.is_optimized(probe.vaddr)

    # -------------------------------------------------------------- INT3 path
    def handle_int3(self) -> bool:
        """#BP from user mode: True if a uprobe (or the INT3 uretprobe trampoline) owned it."""
        bp = self.cpu.read(Reg.RIP) - 1
        if self.xol is not None and bp == self.xol.vaddr and self.ret_plan.nr is None:
            self.stats.traps += 1  # the INT3 return trampoline's #BP (spec 5.2) costs a trap like a probe's
            regs = regs_from_cpu(self.cpu)
            self.handle_trampoline(regs)
            regs_to_cpu(self.cpu, regs)
            return True
        probe = self.probes.get(bp)
        if probe is None:
            if self.mem.read(bp, 1) == INT3:
                return False  # a real int3: SIGTRAP
            self.cpu.resume_at(bp)  # raced with removal: restart the instruction
            return True
        self.stats.traps += 1
        regs = regs_from_cpu(self.cpu)
        regs.ip = bp
        self.handler_chain(probe, regs, EntryPath.INT3)
        self.optimize_now(probe)
        if regs.ip != bp:  # a consumer redirected: no emulation, no step [IPCHG]
            regs_to_cpu(self.cpu, regs)
            return True
        for observer in self.step_observers:
            observer(probe, regs)
        if probe.insn.kind is Kind.XOL:
            x86.start_xol(self, probe, regs)
        else:
            x86.emulate(self, probe.insn, regs)
            regs_to_cpu(self.cpu, regs)
        return True

    def optimize_now(self, probe: Uprobe) -> None:
        """arch_uprobe_optimize, as after the first hit (spec 3.3): only while byte 0 is still CC."""
        if not probe.can_optimize or probe.optimize_failed or self.probes.get(probe.vaddr) is not probe:
            return
        if self.mem.read(probe.vaddr, 1) != INT3:
            return
        sites = self.sites
        places = len(sites.trampolines), len(sites.slot_of)
        if sites.optimize(probe.vaddr):
            self.stats.optimized += 1
        else:
            probe.optimize_failed = True
        if probe.optimize_failed or places != (len(sites.trampolines), len(sites.slot_of)):
            TABLES.bump()  # a new trampoline page or slot, or a probe that stays on INT3 for good

    def get_xol_area(self) -> XolArea:
        if self.xol is None:
            self.xol = XolArea(self.mem, self.design.uretprobe)
            self._returns_moved()  # the C hot path hijacks return addresses to it from now on
        return self.xol

    # ---------------------------------------------------------------- consumers
    def handler_chain(self, probe: Uprobe, regs: PtRegs | None, path: EntryPath) -> None:
        """Run the entry handlers; allocate a return instance if any consumer has a ret_handler (spec 2.3).
        ``regs`` None: the probe changes nothing (Uprobe.changes_nothing), pt_regs was never built."""
        observers = self.chain_observers
        for observer in observers:
            observer(probe, regs, path, False)
        remove = True
        entries: list[tuple[Consumer, object]] = []
        path_name = path._value_  # (not .value: a descriptor call, on every hit)
        for consumer in tuple(probe.consumers):  # (a REMOVE detaches)
            rc = 0
            cookie = None
            if consumer.filter is not None and not consumer.filter(self.pid):
                rc = UPROBE_HANDLER_REMOVE  # uprobe_perf_func: not this event's process, not counted
            elif consumer.enabled:
                consumer.count(path_name)
                if consumer.handler is not None:  # a Hit only for consumers that look at it
                    assert regs is not None
                    hit = Hit(regs, probe.vaddr, path, self.mem)
                    rc = consumer.handler(hit) or 0
                    cookie = hit.cookie
            if consumer.ret_handler is not None and rc not in (UPROBE_HANDLER_REMOVE, UPROBE_HANDLER_IGNORE):
                entries.append((consumer, cookie if consumer.session else None))
            remove &= rc == UPROBE_HANDLER_REMOVE
        for observer in observers:
            observer(probe, regs, path, True)
        if entries:
            assert regs is not None
            self.prepare_uretprobe(regs, entries)
        if remove and probe.consumers:
            if all(c.filter is not None for c in probe.consumers):  # filter_chain, then unapply_uprobe
                if not any(c.filter(self.pid) for c in probe.consumers if c.filter is not None):
                    self.unapply(probe)
                return
            for consumer in list(probe.consumers):  # a harness consumer's REMOVE: it lets go of the probe
                self.detach(probe, consumer)

    def unapply(self, probe: Uprobe) -> None:
        """unapply_uprobe for this process only: its breakpoint goes (and the optimized call, if any);
        the probe and its consumers stay for the other processes."""
        if self.probes.get(probe.vaddr) is probe:
            self._remove(probe)

    def handle_syscall_uprobe(self, regs: PtRegs, vaddr: int, path: EntryPath) -> None:
        """No emulation, no step: the NOP is skipped by returning past it (spec 2.1)."""
        probe = self.probes.get(vaddr)
        if probe is not None:
            self.handler_chain(probe, regs, path)

    # ---------------------------------------------------------------- uretprobes
    def prepare_uretprobe(self, regs: PtRegs, entries: list[tuple[Consumer, object]]) -> None:
        """Hijack the return address at [sp] (spec 5.1)."""
        try:
            self._prepare_uretprobe(regs, entries)
        finally:
            self._returns_moved()

    def _returns_moved(self) -> None:
        """The C hot path pushes its return instances over these: it must know how many, and the top."""
        if self.fast is not None:
            self.fast.returns_moved()

    def _prepare_uretprobe(self, regs: PtRegs, entries: list[tuple[Consumer, object]]) -> None:
        tramp = self.get_xol_area().vaddr
        if len(self.return_instances) >= MAX_URETPROBE_DEPTH:
            import logging  # loaded here, not at start-up: the only message this package logs

            logging.getLogger(__name__).info("uprobe: omit uretprobe due to nestedness limit")
            return
        try:
            (orig,) = struct.unpack("<Q", self.mem.read_user(regs.sp, 8))
        except UserFault:
            return
        self.stats.copied += 8
        chained = orig == tramp
        if not chained:
            self.stats.copied += 8
            try:
                self.mem.write_user(regs.sp, struct.pack("<Q", tramp))
            except UserFault:
                raise GuestKilled(Signal.SIGSEGV, regs.ip, "return address not writable") from None
            if self.shadow_stack is not None:
                self.shadow_stack.update_last_frame(tramp)  # spec 5.1
        self._cleanup_return_instances(chained, regs)
        if chained:
            if not self.return_instances:
                return
            orig = self.return_instances[-1].orig_ret
        self.return_instances.append(ReturnInstance(regs.ip, regs.sp, orig, chained, entries))

    def _cleanup_return_instances(self, chained: bool, regs: PtRegs) -> None:
        while self.return_instances and not self._alive(self.return_instances[-1], regs, chained_call=chained):
            self.return_instances.pop()  # longjmp'd over: dropped without running handlers

    @staticmethod
    def _alive(ri: ReturnInstance, regs: PtRegs, chained_call: bool = False, ret: bool = False) -> bool:
        if ret or chained_call:
            return regs.sp <= ri.stack
        return regs.sp < ri.stack

    def handle_trampoline(self, regs: PtRegs) -> None:
        """uprobe_handle_trampoline (spec 5.2): run every handler of the returning chain."""
        try:
            self._handle_trampoline(regs)
        finally:
            self._returns_moved()

    def _handle_trampoline(self, regs: PtRegs) -> None:
        if not self.return_instances:
            raise GuestKilled(Signal.SIGILL, regs.ip, "uretprobe trampoline hit with no pending return")
        while True:
            chain = self._pop_chain()
            below = self.return_instances[-1] if self.return_instances else None
            valid = below is None or self._alive(below, regs, ret=True)
            regs.ip = chain[0].orig_ret
            if valid:
                before = regs.copy() if self.return_observers and _may_set_registers(chain) else None
                for ri in chain:
                    self._run_ret_handlers(ri, regs)
                if before is not None:
                    for observer in self.return_observers:
                        observer(before, regs)
                return
            if not self.return_instances:
                return

    def _pop_chain(self) -> list[ReturnInstance]:
        chain = [self.return_instances.pop()]
        while chain[-1].chained and self.return_instances:
            chain.append(self.return_instances.pop())
        return chain

    def _run_ret_handlers(self, ri: ReturnInstance, regs: PtRegs) -> None:
        self.stats.ret_hits += 1
        for consumer, cookie in ri.entries:
            if consumer.ret_handler is None or not consumer.enabled:
                continue
            consumer.count(RETURN)
            consumer.ret_handler(Hit(regs, ri.func, EntryPath.RETURN, self.mem, func=ri.func, cookie=cookie))


def _may_set_registers(chain: list[ReturnInstance]) -> bool:
    """A return handler of ``chain`` could change a register (a counting one cannot)."""
    return any(consumer.ret_handler not in (None, count_return) for ri in chain for consumer, _ in ri.entries)
