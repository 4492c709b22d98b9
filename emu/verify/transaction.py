"""Probe transactions: from the moment execution reaches a patched site until the guest resumes.

Hooks, all installed before the run (Unicorn ignores code hooks added later):
an exact-address code hook per probe site (free elsewhere), one block hook that
notices where execution resumes, one memory-write hook over the stack gated by
``active`` (adding and removing a hook per hit costs ~39 us), and an observer of
the handler chain that records what the consumers changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emu.abi import RED_ZONE
from emu.cpu import HookHandle, Reg
from emu.kernel.uprobes.consumers import Path
from emu.kernel.uprobes.core import Uprobe
from emu.kernel.uprobes.insn import Kind
from emu.kernel.uprobes.regs import PtRegs
from emu.verify.scratch import ExtendedState

if TYPE_CHECKING:
    from emu.machine import Attachment, Machine

KERNEL_SIDE = frozenset({"[uprobes-trampoline]", "[uprobes]"})
RSP_INDEX = 7  # in Cpu.read_user_state()
RIP_INDEX = 16


@dataclass(frozen=True, slots=True)
class GuestWrite:
    pc: int
    addr: int
    size: int
    value: int


@dataclass
class Transaction:
    probe: str
    site: int
    original: bytes
    hit: int
    start_state: list[int]
    start_ext: ExtendedState
    redzone_before: bytes
    guest_writes: list[GuestWrite] = field(default_factory=list)
    chain: tuple[PtRegs, PtRegs] | None = None
    path: Path | None = None
    exits_before: dict[str, int] = field(default_factory=dict)
    end_addr: int = 0
    end_state: list[int] = field(default_factory=list)
    end_ext: ExtendedState | None = None
    redzone_after: bytes = b""
    exits: dict[str, int] = field(default_factory=dict)
    nop: bool = False

    @property
    def redzone_base(self) -> int:
        return self.start_state[RSP_INDEX] - RED_ZONE


Finished = Callable[[Transaction], None]


class TransactionTracker:
    def __init__(self, machine: Machine, attachments: list[Attachment], on_finished: Finished) -> None:
        self.machine = machine
        self.cpu = machine.cpu
        self.mem = machine.mem
        self.on_finished = on_finished
        self.active: Transaction | None = None
        self.count = 0
        self._by_site: dict[int, tuple[str, Uprobe]] = {}
        self._hits: dict[int, int] = {}
        self._site_hooks: list[HookHandle] = []
        self.bind(attachments)
        self.cpu.add_block_hook(self._on_block)
        stack = next((v for v in self.mem if v.name == "[stack]"), None)
        if stack is not None:
            self.cpu.add_mem_write_hook(self._on_write, stack.start, stack.end - 1)
        machine.uprobes.chain_observers.append(self._on_chain)

    def bind(self, attachments: list[Attachment]) -> None:
        """Watch these attachments' sites, forgetting earlier ones and their hit counts: one tracker
        serves a process whose probes are detached and attached again (the fuzzer's reuse)."""
        for hook in self._site_hooks:
            self.cpu.remove_hook(hook)
        self._by_site, self._hits, self._site_hooks, self.active = {}, {}, [], None
        for att in attachments:
            self._by_site.setdefault(att.address, (att.resolved.spec.text, att.uprobe))
        for site in self._by_site:
            self._site_hooks.append(self.cpu.add_code_hook(self._on_site, site, site))

    def _on_site(self, addr: int, _size: int) -> None:
        if self.active is not None:
            return
        name, probe = self._by_site[addr]
        if self.machine.uprobes.probes.get(addr) is not probe:
            return  # detached: the original instruction runs, nothing to verify
        state = self.cpu.read_user_state()
        self._hits[addr] = self._hits.get(addr, 0) + 1
        base = state[RSP_INDEX] - RED_ZONE
        self.active = Transaction(
            probe=name, site=addr, original=probe.insn.raw, hit=self._hits[addr], start_state=state,
            start_ext=self.cpu.read_extended(), redzone_before=self.mem.read(base, RED_ZONE),
            exits_before=dict(self.machine.uprobes.stats.exits), nop=probe.insn.kind is Kind.NOP,
        )

    def _on_block(self, addr: int, _size: int) -> None:
        tx = self.active
        if tx is None or addr == tx.site and tx.chain is None or self.machine.uprobes.stepping:
            return
        vma = self.mem.find(addr)
        if vma is not None and vma.name in KERNEL_SIDE:
            return
        self.active = None
        tx.end_addr = addr
        tx.end_state = self.cpu.read_user_state()
        tx.end_state[RIP_INDEX] = addr
        tx.end_ext = self.cpu.read_extended()
        tx.redzone_after = self.mem.read(tx.redzone_base, RED_ZONE)
        now = self.machine.uprobes.stats.exits
        tx.exits = {k: now[k] - tx.exits_before.get(k, 0) for k in now if now[k] != tx.exits_before.get(k, 0)}
        self.count += 1
        self.on_finished(tx)

    def _on_write(self, addr: int, size: int, value: int) -> None:
        tx = self.active
        if tx is None:
            return
        base = tx.redzone_base
        if addr + size > base and addr < base + RED_ZONE:
            tx.guest_writes.append(GuestWrite(self.cpu.read(Reg.RIP), addr, size, value))

    def _on_chain(self, probe: Uprobe, regs: PtRegs | None, path: Path, after: bool) -> None:
        tx = self.active
        if tx is None or probe.vaddr != tx.site:
            return
        tx.path = path
        if regs is None:
            return  # the counting-only fast path: the consumers changed nothing
        if not after:
            tx.chain = (regs.copy(), regs)
            tx.path = path
        else:
            assert tx.chain is not None
            tx.chain = (tx.chain[0], regs.copy())
