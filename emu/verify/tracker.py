"""The transaction tracker: it follows each probe hit from the moment execution reaches a patched
site until the guest resumes (emu/verify/resume.py says when), with a code hook per site, the write
log (emu/hotpath/write_log.py), a memory backend that sees the fake kernel's writes before they land
(emu/process/vma.py's WatchedBackend) and an observer of the handler chain. With the C extension the site,
write and ``ret`` hooks are C (emu/hotpath/edges.py says what they settle without Python).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from emu.abi import RED_ZONE, Prot
from emu.cpu import HookHandle, RawState
from emu.cpu.effects import MAX_PLANS, Prepared
from emu.cpu.state import RAW_KEPT, RAW_RSP
from emu.hotpath.edges import (
    ARMED,
    IDLE,
    KERNEL_EXIT,
    KERNEL_EXITS,
    KERNEL_PATH,
    KERNEL_SEQ,
    OPEN,
    PY_SEQ,
    SEQ,
    SITE,
    START_RSP,
    STATE,
    Comparison,
    NativeEdges,
    SiteCounters,
)
from emu.hotpath.store_watch import StoreWatch
from emu.hotpath.write_log import SCRATCH, WriteLog
from emu.kernel.uprobes.consumers import NATIVE_PATHS, EntryPath
from emu.kernel.uprobes.generation import TABLES
from emu.kernel.uprobes.insn import Kind
from emu.kernel.uprobes.records import XOL_NAME, Uprobe
from emu.kernel.uprobes.regs import PtRegs
from emu.process.vma import KERNEL_SIDE, Vma, WatchedBackend
from emu.verify.checks.memory import outside_the_hits_share
from emu.verify.records import Finished, Prepare, ProbeSite, Transaction
from emu.verify.resume import ResumeWatch
from emu.verify.signals import SignalWatch
from emu.verify.threads import ThreadWatch

if TYPE_CHECKING:
    from emu.machine import Attachment, Machine

_QWORD = struct.Struct("<Q")


def _reaches_redzone(addr: int, size: int, base: int) -> bool:
    """A write of ``size`` bytes at ``addr`` reaches the red zone at ``base``."""
    return addr < base + RED_ZONE and addr + size > base


def _has_handler(probe: Uprobe) -> bool:
    """A consumer of ``probe`` runs a handler (which may change registers)."""
    return any(consumer.handler is not None for consumer in probe.consumers)


class TransactionTracker:
    def __init__(self, machine: Machine, attachments: list[Attachment], on_finished: Finished) -> None:
        self.machine, self.cpu, self.mem, self.raw = machine, machine.cpu, machine.mem, RawState(machine.cpu)
        self._up, self._exits, self.on_finished = machine.uprobes, machine.uprobes.stats.exits, on_finished
        self._active: Transaction | None = None
        self.lost: Transaction | None = None  # the last one abandoned as the kernel killed or stopped its thread
        self._count = 0
        self._by_site: dict[int, ProbeSite] = {}
        self._site_hooks: list[HookHandle] = []
        self.threads = ThreadWatch(self)
        self.signals = SignalWatch(self, machine.kernel.sched)
        self.log = WriteLog()
        self.watch = StoreWatch(self.cpu, self.log, self.raw.mem)  # the stores of the code a hit runs
        self._site_ranges: list[tuple[int, int]] = []
        for vma in self.mem:
            self._watch_kernel_code(vma)
        self.mem.map_observers.append(self._watch_kernel_code)
        # the C site and ret hooks, where the watch is C too; without them, Python hooks do their work
        self.edges = NativeEdges.create(self.cpu, self.log, self.watch.address, self._on_site) if self.watch.native else None
        if self.edges is not None:
            self.cpu.hooks.before_syscall.append(self._before_kernel)
            self.cpu.hooks.before_interrupt.append(self._before_kernel)
        self._edge_words = None if self.edges is None else self.edges.words
        self._native_tx: Transaction | None = None  # the transaction whose start state the edges' buffer holds
        # The site hook's transactions are numbered (SEQ); the tracker's Transaction is the open one
        # if _seq is its number. What one still without a Transaction met in the kernel:
        self._seq = self._entry_seq = self._path_seq = self._kernel_wrote_seq = self._adopted_seq = self._prepared_seq = 0
        self._entry_exits: Mapping[str, int] = {}  # the exit counts when it entered the kernel
        self._entry_path: EntryPath | None = None  # the path the handler chain took
        self._counters = SiteCounters(0, 0)
        self.prepare: Prepare | None = None  # the session's: a reference, before the instruction runs
        self._prepared: Prepared | None = None  # for the site hook's transaction numbered _prepared_seq
        self.bind(attachments)
        machine.kernel.sched.switch_observers.append(self.threads.switch)
        machine.kernel.signal_frame_observers.append(self.signals.frame)
        machine.uprobes.chain_observers.append(self._on_chain)
        machine.uprobes.step_observers.append(self._before_step)
        self.mem.backend = WatchedBackend(self.mem.backend, self._on_kernel_write)
        self.resume = ResumeWatch(machine, self)
        if self.edges is not None and machine.uprobes.fast is not None:
            # the C syscall front does these observers' work itself for a hit it handles (fastsys.c)
            self._mirrored = [self._on_chain, self._before_step, self._before_kernel, *self.resume.observers]
            machine.uprobes.fast.verifier = self
            TABLES.bump()

    def _watch_kernel_code(self, vma: Vma) -> None:
        """The kernel's pages for uprobes hold the code a hit runs: the trampoline, the slots, the
        out-of-line step (whose branches the kernel answers for) and the return trampoline."""
        if vma.name in KERNEL_SIDE:
            self.watch.watch(vma.start, vma.end, exits_free=vma.name == XOL_NAME)

    @property
    def active(self) -> Transaction | None:
        """The running thread's open transaction (one the site hook opened becomes a Transaction here)."""
        words = self._edge_words
        if words is None:
            return self._active
        if not words[STATE]:
            return None
        return self._active if words[SEQ] == self._seq else self._materialize()

    @active.setter
    def active(self, tx: Transaction | None) -> None:
        self._active = tx
        if self._edge_words is not None:
            self._edge_words[STATE] = IDLE if tx is None else OPEN
            self._seq = self._edge_words[PY_SEQ] = self._edge_words[SEQ]

    def _pending(self) -> NativeEdges | None:
        """The C edges, if the site hook's open transaction has no Transaction yet."""
        words = self._edge_words
        return self.edges if words is not None and words[STATE] != IDLE and words[SEQ] != self._seq else None

    def opened(self) -> tuple[ProbeSite, Mapping[str, int]] | None:
        """The open transaction's site and exit counts at its start, without making it a Transaction."""
        if (edges := self._pending()) is not None:
            self._adopt_kernel_part()
            at = self._by_site.get(edges.words[SITE])
            exits = self._entry_exits if self._entry_seq == edges.words[SEQ] else self._exits
            return None if at is None else (at, exits)
        tx = self.active
        return None if tx is None else (tx.at, tx.exits_before)

    @property
    def count(self) -> int:
        """Transactions that got a verdict."""
        return self._count + (0 if self.edges is None else self.edges.finished)

    def _materialize(self) -> Transaction | None:
        """The transaction the site hook left pending, as a Transaction (none if its probe was detached)."""
        edges, words = self.edges, self._edge_words
        assert edges is not None and words is not None
        addr, seq = words[SITE], words[SEQ]
        self._adopt_kernel_part()
        self._seq = words[PY_SEQ] = seq
        at = self._by_site.get(addr)
        if at is None or self._up.probes.get(addr) is not at.uprobe:
            self._native_tx = None
            if at is not None:
                self._counters.count_hit(at.index, -1)  # the site hook counted it: not a hit
            self.abandon()  # detached: the original instruction ran, nothing to verify
            return None
        exits = self._entry_exits if self._entry_seq == seq else dict(self._exits)
        tx = self._active = self._native_tx = Transaction(at, self._counters.hits(at.index), edges.start_raw(), exits)
        if self._path_seq == seq:
            tx.path = self._entry_path
        if self._prepared_seq == seq:
            tx.prepared = self._prepared
        if self._kernel_wrote_seq == seq:  # as _on_kernel_write() does for a Transaction
            tx.redzone_before, tx.redzone_changed = self._redzone_at_start(tx), True
        return tx

    # ------------------------------------------------------------- the C syscall front
    def mirrors(self, observer: object) -> bool:
        """``observer`` is one of this tracker's, whose work the C syscall front does for a hit it handles."""
        return observer in self._mirrored

    def site_facts(self, vaddr: int) -> tuple[int, int, int]:
        """For the C syscall front: where a hit at this NOP-class site resumes (else 0), and the C-hooked
        ``ret`` its transaction may be armed for and the bytes that pops (resume.armable)."""
        at = self._by_site.get(vaddr)
        if at is None or not at.nop or self._up.probes.get(vaddr) is not at.uprobe:
            return 0, 0, 0
        return (at.next, *self.resume.armable(vaddr))

    def _adopt_kernel_part(self) -> None:
        """The C syscall front did the kernel's part of the open hit: note what the observers would have."""
        words = self._edge_words
        assert words is not None
        seq = words[SEQ]
        if words[KERNEL_SEQ] != seq or self._adopted_seq == seq:
            return
        self._adopted_seq = seq
        fast = self._up.fast
        assert fast is not None
        fast.fold_stats(self.machine.kernel.counts)
        self._path_seq, self._entry_path = seq, EntryPath(NATIVE_PATHS[words[KERNEL_PATH]])
        exits, name = dict(self._exits), KERNEL_EXITS[words[KERNEL_EXIT]]
        if name is not None:
            exits[name] = exits.get(name, 0) - 1
        self._entry_seq, self._entry_exits = seq, {k: n for k, n in exits.items() if n}

    def _before_kernel(self, *_args: object) -> None:
        """The kernel is entered: disarm (it may change anything); note the exit counts at the start."""
        words = self._edge_words
        assert words is not None
        state = words[STATE]
        if state == ARMED:
            words[STATE] = OPEN
        if state and words[SEQ] != self._seq and words[SEQ] != self._entry_seq:
            self._entry_seq, self._entry_exits = words[SEQ], dict(self._exits)

    def arm(self, ret: int, popped: int) -> None:
        """Let the C hook on the ``ret`` at ``ret`` (popping ``popped`` bytes) settle the open transaction
        if it left everything as it found it; only one :meth:`finish` would settle alike (a NOP site)."""
        if self._pending() is not None:
            at = self._pending_site()
        else:
            tx = self.active
            at = None if (tx is None or tx is not self._native_tx or tx.chain is not None or self._up.task.stepping
                          or tx.outside or self.log.outside or tx.path is None) else tx.at
        if at is not None and at.nop:
            assert self.edges is not None
            self.edges.arm(ret, popped, at.next)

    def _pending_site(self) -> ProbeSite | None:
        """The site of the site hook's open transaction still without a Transaction, if its probe is
        attached, its handler chain ran and no step out of line is under way."""
        edges = self._pending()
        if edges is None or self._up.task.stepping:
            return None
        self._adopt_kernel_part()
        if self._path_seq != edges.words[SEQ]:
            return None  # the handler chain has not run for it (yet): not a hit to settle as clean
        at = self._by_site.get(edges.words[SITE])
        return at if at is not None and self._up.probes.get(at.address) is at.uprobe else None

    def settle_at_kernel_return(self, rip_advance: int) -> bool:
        """The kernel returns to rip + ``rip_advance``: True if the site hook's open transaction is done
        with everything as it was (a NOP site) or as the cached reference says, compared in C."""
        at = None if self.cpu.hooks.failed else self._pending_site()
        edges = self.edges
        if at is None or edges is None:
            return False
        if at.nop:
            return edges.settle_return(rip_advance, at.next)
        prepared = self._prepared if self._prepared_seq == edges.words[SEQ] else None
        effect = None if prepared is None else prepared.effect
        if effect is None or not edges.has_start_redzone:
            return False
        base = edges.words[START_RSP] - RED_ZONE
        comparison = effect.compiled.get((base, rip_advance))
        if comparison is None:
            if len(effect.compiled) >= MAX_PLANS:
                effect.compiled.clear()
            comparison = effect.compiled[base, rip_advance] = edges.comparison(effect.spans(base, RED_ZONE), rip_advance)
        return edges.settle_compared(base, cast(Comparison, comparison))

    def new_image(self) -> None:
        """execve: the process's uprobes are the new image's; its sites are watched from its first instruction."""
        self._up = self.machine.uprobes
        self._exits = self._up.stats.exits
        self.resume.new_image()
        self.bind(self.machine.attachments)

    def bind(self, attachments: list[Attachment], forget_hits: bool = False) -> None:
        """Watch these attachments' sites, forgetting earlier ones; a site watched before goes on
        counting its hits unless ``forget_hits`` (the fuzzer's reuse of one process)."""
        hits = {} if forget_hits else {site: self._counters.hits(at.index) for site, at in self._by_site.items()}
        for hook in self._site_hooks:
            self.cpu.hooks.remove(hook)
        self._by_site, self._site_hooks, self.active = {}, [], None
        self.threads.clear()
        self.signals.clear()
        for att in attachments:
            uprobe, addr = att.uprobe, att.address
            if addr not in self._by_site:
                original = uprobe.insn.raw
                self._by_site[addr] = ProbeSite(att.resolved.spec.text, uprobe, addr, original,
                                                uprobe.insn.kind is Kind.NOP, addr + len(original), len(self._by_site))
        for start, end in self._site_ranges:
            self.watch.unwatch(start, end)
        # a patched site may hold more than one instruction (nop10's lea; call): the site hook watches
        # the first, these the rest
        self._site_ranges = [(site + 1, site + len(at.original)) for site, at in self._by_site.items()]
        for start, end in self._site_ranges:
            self.watch.watch(start, end)
        edges = self.edges
        self._counters = SiteCounters(len(self._by_site), 0 if edges is None else edges.address)
        for site, at in self._by_site.items():
            self._counters.count_hit(at.index, hits.get(site, 0))
        TABLES.bump()  # the C syscall front's site facts (site_facts) are of the old sites
        if edges is None:
            self._site_hooks = [self.cpu.hooks.add_raw_code(self._on_site, site, site) for site in self._by_site]
            return
        if edges.repeats is not None:
            edges.repeats.disarm()
            edges.repeats.take()  # of the sites watched until now
        for at in self._by_site.values():
            if at.nop:
                self._counters.copy_redzone_lazily(at.index)
        self._site_hooks = [edges.add_site_hook(site, self._counters.record(at.index)) for site, at in self._by_site.items()]

    def _on_site(self, _uc: object, addr: int, _size: int, _ud: object) -> None:
        """Raw code hook at each probe site (with the C site hook: only when a transaction is open)."""
        try:
            if self.active is not None:
                self.resume.lost_track()  # the guest resumed unseen (not expected): watch blocks
                self.abandon()
            at = self._by_site[addr]
            if self._up.probes.get(addr) is not at.uprobe:
                return  # detached: the original instruction runs, nothing to verify
            tx = self.active = Transaction(at, self._counters.count_hit(at.index), self.raw.read(), dict(self._exits))
            self.log.start(tx.redzone_base, snapshot_wanted=True)
            self.watch.instruction(addr, _size)  # the site's own stores (a call's return address)
        except BaseException as exc:
            self.cpu.hooks.raised(exc)

    def repeatable(self, tx: Transaction) -> bool:
        """``tx`` is the hit whose evidence C kept (emu/hotpath/repeats.py), and its verdict rests on that alone."""
        repeats = None if self.edges is None else self.edges.repeats
        return (repeats is not None and tx is self._native_tx and repeats.candidate_seq == self._seq
                and tx.chain is None and not tx.outside and not tx.kernel_stores and not tx.unrecorded)

    # ------------------------------------------------------------------ threads
    def put_aside(self) -> Transaction | None:
        """A context switch: the running thread's transaction, if any, with its stores kept, put aside."""
        tx = self.active
        if tx is not None:
            self.keep_log(tx)
            self._native_tx = None
        self.abandon()
        return tx

    def take_up(self, tx: Transaction) -> None:
        """``tx``'s thread runs again: it is the active transaction, its red-zone window reopened."""
        self.active = tx
        self.log.start(tx.redzone_base, snapshot_wanted=tx.redzone_before is None)

    def exits_now(self) -> dict[str, int]:
        return dict(self._exits)

    def finish(self, tx: Transaction, resume: int, raw: bytes, rsp: int | None = None,
               redzone: bytes | None = None) -> None:
        """``tx`` ends: the guest resumes at ``resume`` with the state ``raw``, but ``rsp`` if given (a
        ``ret`` about to run), and the red zone ``redzone`` if just read. A hit that provably left
        everything as it found it is counted here; the others go to ``on_finished``, for the checks."""
        self._active = None  # abandon(), inline
        if self._edge_words is not None:
            self._edge_words[STATE] = IDLE
        self.watch.complete()
        self.log.close()
        if self.log.flagged:
            self.keep_log(tx)
        self._count += 1
        if rsp is None:
            rsp = _QWORD.unpack_from(raw, RAW_RSP)[0]
        before = tx.redzone_before
        if redzone is None and before is not None:
            redzone = self.redzone(tx.redzone_base) if tx.redzone_changed else before
        if (tx.nop and resume == tx.at.next and rsp == tx.start_rsp and tx.chain is None and not tx.outside
                and tx.path is not None and not tx.unseen[0] and tx.left is None
                and raw[RAW_KEPT:] == tx.start_raw[RAW_KEPT:] and (before is None or redzone == before)):
            return  # a NOP site left exactly as it was, resumed right after it: no check can find anything
        if redzone is None:  # nothing wrote into it, or nothing read it yet
            redzone = self._redzone_at_start(tx) if before is None else self.redzone(tx.redzone_base)
        tx.redzone_before = redzone if before is None else before
        tx.end_raw, tx.end_addr, tx.end_rsp, tx.redzone_after = raw, resume, rsp, redzone
        tx.exits_after = dict(self._exits)
        self.on_finished(tx)

    def read_end(self, tx: Transaction) -> tuple[bytes, bytes | None]:
        """The state now, and ``tx``'s red zone if a write may have changed it (else None), in one C call."""
        if self.edges is None or not tx.redzone_changed:
            return self.raw.read(), None
        return self.edges.read_end(tx.redzone_base)

    def _redzone_at_start(self, tx: Transaction) -> bytes:
        """The red zone before anything wrote into it (no write has reached it yet)."""
        return self._site_copy(tx) or self.redzone(tx.redzone_base)

    def _site_copy(self, tx: Transaction) -> bytes | None:
        """The red zone as the C site hook copied it, if it started ``tx`` and ``tx`` was never suspended."""
        return self.edges.start_redzone() if tx is self._native_tx and self.edges is not None else None

    def redzone(self, base: int) -> bytes:
        return self.raw.mem(base, RED_ZONE) or self.mem.read(base, RED_ZONE)  # unmapped: Memory's error

    def _on_kernel_write(self, addr: int, data: bytes) -> None:
        """The fake kernel is about to write guest memory: keep what the red-zone and memory checks need."""
        edges, words, size = self.edges, self._edge_words, len(data)
        if self.log.is_open:
            self.watch.complete()  # the guest's last stores, before the kernel writes over them
        if edges is not None and (repeats := edges.repeats) is not None and repeats.holding and self._writes_code(addr):
            repeats.disarm()  # it may be rewriting code a verdict held back names
        if words is not None and not words[STATE]:
            return  # no hit open
        tx = self._active
        rsp = words[START_RSP] if words is not None and words[SEQ] != self._seq else None if tx is None else tx.start_rsp
        if rsp is None:
            return
        if not (rsp - RED_ZONE - SCRATCH <= addr and addr + size <= rsp) and (tx := self.active) is not None \
                and outside_the_hits_share(self.mem, addr, data, rsp):  # kept with the bytes it overwrites
            tx.outside = True
            tx.kernel_stores += ((addr, self.raw.mem(addr, size) or bytes(size), data),)
        if not _reaches_redzone(addr, size, rsp - RED_ZONE):
            return
        if (pending := self._pending()) is not None and pending.has_start_redzone:
            self._kernel_wrote_seq = pending.words[SEQ]  # no Transaction yet: _materialize() takes it up
            return
        tx = self.active
        if tx is not None:
            self.fold_log(tx)  # the guest's stores so far, and the red zone before the first
            if tx.redzone_before is None:
                tx.redzone_before = self._redzone_at_start(tx)
            tx.redzone_changed = True

    def _writes_code(self, addr: int) -> bool:
        """A kernel write at ``addr`` may change code: a mapping that can run (a site, the kernel's
        pages), or none (a write that faults). Its stack writes (sys_uretprobe's) do not."""
        vma = self.mem.find(addr)
        return vma is None or bool(vma.prot & Prot.EXEC)

    def abandon(self) -> None:
        """No verdict on this hit: it ended (or the kernel is delivering a signal: it will not resume)."""
        self.active = None
        self.log.close()

    def fold_log(self, tx: Transaction) -> None:
        """The write log has stores of ``tx``'s: the red zone before the first is its reference, if none
        was taken yet, and it may have changed. The stores stay in the log until keep_log()."""
        if self.log.count:
            if tx.redzone_before is None:  # the log copies it only where the site hook did not
                tx.redzone_before = self._site_copy(tx) or self.log.snapshot() or self.redzone(tx.redzone_base)
            tx.redzone_changed = True

    def keep_log(self, tx: Transaction) -> None:
        """Move the stores the write log holds, and what the watch could not follow, into ``tx``."""
        log = self.log
        if log.flagged:
            self.watch.complete()
            tx.outside |= log.outside != 0
            unseen, first = log.unseen
            if unseen:
                tx.unseen = (tx.unseen[0] + unseen, tx.unseen[1] or first)
            tx.left = tx.left or log.left
            self.fold_log(tx)
            entries, overflowed = log.take()
            tx.logged += (entries,)
            tx.unrecorded |= overflowed

    def _before_step(self, probe: Uprobe, _regs: PtRegs) -> None:
        """The probed instruction is about to run: its reference is taken now, from memory as it finds it."""
        at = self._by_site.get(probe.vaddr)
        if self.prepare is None or at is None or at.nop:
            return
        if (edges := self._pending()) is not None:  # no consumer with a handler: its input is the start state
            if edges.words[SITE] == probe.vaddr:
                self._prepared_seq, self._prepared = edges.words[SEQ], self.prepare(None, at, edges.start_raw())
            return
        tx = self.active
        if tx is not None and tx.site == probe.vaddr:
            tx.prepared = self.prepare(tx, at, tx.start_raw)

    def _on_chain(self, probe: Uprobe, regs: PtRegs | None, path: EntryPath, after: bool) -> None:
        if (edges := self._pending()) is not None:  # no Transaction yet: a handler needs one
            if probe.vaddr != edges.words[SITE]:
                return
            self._path_seq, self._entry_path = edges.words[SEQ], path
            if regs is None or after or not _has_handler(probe):
                return
        tx = self.active
        if tx is None or probe.vaddr != tx.site:
            return
        tx.path = path
        if regs is None:
            return  # a hit that changes nothing: pt_regs was never built
        if after and tx.chain is not None:
            tx.chain = (tx.chain[0], regs.copy())
        elif not after and _has_handler(probe):  # else counting consumers only: nothing can change a register
            tx.chain = (regs.copy(), regs)
