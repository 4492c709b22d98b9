"""One emulated process per design, reused for every case: the fuzzer's hot path.

Building a Machine costs milliseconds; a case must cost far less. So each CaseRunner loads a
skeleton ELF of the fuzz layout once and, per run, writes the case's function and data,
zeroes the stack below the entry sp, forgets the previous probes (Uprobes.reset) and runs
from the driver. No Unicorn memory snapshot: the kernel maps trampoline pages on the first
optimized hit, and mem_map inside a snapshot window crashes Unicorn 2.1.4
(docs/unicorn.md gotcha 4); a case dirties only the stack, the data page and the
function, all rewritten explicitly.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

from emu.cpu import Reg
from emu.designs import get_design
from emu.fuzz import layout as L
from emu.fuzz.case import Action, ActionKind, Case, aslr_seed
from emu.fuzz.codegen import Program, driver, driver_end
from emu.fuzz.elfwriter import write_elf
from emu.fuzz.sites import site_form
from emu.guestio import GuestIO
from emu.kernel.exits import GuestExit
from emu.kernel.uprobes.consumers import Consumer, Hit
from emu.kernel.uprobes.sites import usdt_combo_site
from emu.machine import Machine, RunOptions
from emu.probes import ResolvedProbe, parse_spec
from emu.process.loading import reset_registers
from emu.verify.session import VerifySession

STACK_WINDOW = 0x800  # zeroed below the entry sp before each run (frames, red zones, kernel pushes)
DATA_USED = L.RESULTS + L.RESULTS_SIZE - L.DATA_BASE  # the data the driver and function touch
# A design that loops forever at a site is a finding, not a hang. Counted in translation blocks
# by a block hook: Unicorn's own timeout starts a thread per emu_start (~1 ms, more than a case).
MAX_BLOCKS = 20_000
REG_IDS = {name: getattr(Reg, ("R" + name if len(name) == 2 and not name[1].isdigit() else name).upper())
           for name in ("ax", "bx", "cx", "dx", "si", "di", "bp", "r8", "r9", "r10", "r11", "r12", "r13", "r14",
                        "r15")}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one run of a case shows: how it ended and the result blocks it wrote."""

    ending: str
    status: int
    results: bytes
    message: str | None = None


@contextmanager
def skeleton_file() -> Iterator[str]:
    """A fuzz-layout ELF with the driver and an empty function, for as long as a Machine loads it
    (the harness's exit skips atexit handlers, so nothing may outlive the with block)."""
    fd, path = tempfile.mkstemp(prefix="uprobe-emu-fuzz-", suffix=".elf")
    os.close(fd)
    try:
        write_elf(path, driver().ljust(L.FUNC - L.CODE_BASE, b"\xcc") + b"\xc3", bytes(L.DATA_SIZE))
        yield path
    finally:
        os.unlink(path)


@lru_cache(maxsize=256)
def resolved(kind: str, address: int) -> ResolvedProbe:
    return ResolvedProbe(parse_spec(f"{kind}:{address:#x}"), address)


def probe_address(case: Case, prog: Program, design: str) -> int:
    """Where the site probe goes under ``design`` (libbpf's choice for the USDT nop combo)."""
    form = site_form(case.site)
    if not form.usdt_combo:
        return prog.site
    return usdt_combo_site(form.code, prog.site, get_design(design))


def consumer_for(action: Action | None, prog: Program) -> Consumer:
    if action is None:
        return Consumer()

    def handler(hit: Hit) -> None:
        if action.kind is ActionKind.SET_REG:
            setattr(hit.regs, action.reg, action.value)
        elif action.kind is ActionKind.REDIRECT:
            hit.regs.ip = prog.after_skip
        else:
            hit.regs.sp = (hit.regs.sp + action.value) & ((1 << 64) - 1)

    return Consumer(handler=handler)


class CaseRunner:
    """One reusable process under one design, laid out with ASLR off or from the seed ``aslr``.

    The skeleton is a non-PIE ET_EXEC, so ASLR leaves the program where it was linked (as Linux does)
    and moves the stack (hence the rsp every case runs on: the driver starts from the entry sp) and the
    mmap area with the vDSO. The kernel's pages do not follow the seed: [uprobes-trampoline] goes to
    the free page nearest the site (find_nearest_trampoline, spec 3.4), and [uprobes] to its hint, the
    last page below TASK_SIZE (spec 4.3), which is free whenever ASLR has moved the stack down (with
    ASLR off the stack holds it, and the page goes top-down in the mmap area)."""

    def __init__(self, design: str, aslr: int | None = None) -> None:
        self.design = get_design(design).name
        self.aslr = aslr_seed(aslr)
        self.io = GuestIO.captured()
        with skeleton_file() as path:  # the loader copies the segments: the file can go afterwards
            self.machine = Machine(path, [path], {}, RunOptions(design=self.design, aslr=self.aslr), self.io)
        self.session = VerifySession(self.machine)
        self.sp = self.machine.entry_sp & ~0xF
        self.blocks = 0
        self._pristine: bytes | None = None  # code in memory, unpatched since written
        self.machine.cpu.hooks.add_block(self._count_block)
        end = driver_end()
        self.machine.cpu.hooks.add_code(self._at_driver_end, end, end)

    @staticmethod
    def _at_driver_end(_addr: int, _size: int) -> None:
        """The results are in memory: end the run as the program's write + exit(0) would, without
        the two syscalls (the native program makes them; here they cost more than a probe hit)."""
        raise GuestExit(0)

    def _count_block(self, _addr: int, _size: int) -> None:
        self.blocks += 1
        if self.blocks > MAX_BLOCKS:
            self.machine.cpu.stop()

    # ------------------------------------------------------------- one run
    def _load(self, prog: Program) -> None:
        m = self.machine
        m.uprobes.reset()
        m.attachments.clear()
        m.kernel.deferred.clear()
        if self._pristine != prog.code:  # the last run left other code or patched sites
            m.mem.write(L.FUNC, prog.code[L.FUNC - L.CODE_BASE :])
            m.cpu.flush_code(L.FUNC, L.CODE_BASE + L.CODE_SIZE)  # the driver stays translated
        self._pristine = None
        m.mem.write(L.DATA_BASE, prog.data[:DATA_USED])
        m.mem.write(self.sp - STACK_WINDOW, bytes(STACK_WINDOW))
        # Every register as exec leaves it: the last case may have left any flag set (a replayed
        # finding's popfq can set TF, and the next case would then trap on its first instruction).
        reset_registers(m.cpu, self.sp)

    def _run(self) -> Outcome:
        self.blocks = 0
        try:
            ending, status, signal, message = self.machine.run_from(L.CODE_BASE)
        except Exception as exc:  # the fake kernel failed under this design: a finding to look at, not a crash
            return Outcome("harness-error", -1, bytes(L.RESULTS_SIZE), f"{type(exc).__name__}: {exc}")
        results = self.machine.mem.read(L.RESULTS, L.RESULTS_SIZE)
        if self.blocks > MAX_BLOCKS:
            outcome = Outcome("looping", status, results, f"still running after {MAX_BLOCKS} translation blocks")
        else:
            outcome = Outcome(ending.value, status, results, message)
        # A hit still open as the run ends never resumed: the verifiers say so (a `resume` violation).
        self.session.finish(outcome.message or outcome.ending, killed=signal is not None)
        return outcome

    def reference(self, case: Case, prog: Program) -> Outcome:
        """The unprobed run; a consumer action is applied by a code hook where the probe would be."""
        self._load(prog)
        self.session.rebind()
        if case.action is None:
            outcome = self._run()
            self._pristine = prog.code  # nothing patched it: the probed run can keep the translation
            return outcome
        cpu = self.machine.cpu
        action = case.action

        def act(_addr: int, _size: int) -> None:
            if action.kind is ActionKind.SET_REG:
                cpu.write(REG_IDS[action.reg], action.value)
            elif action.kind is ActionKind.REDIRECT:
                cpu.write(Reg.RIP, prog.after_skip)
            else:
                cpu.write(Reg.RSP, cpu.read(Reg.RSP) + action.value)

        address = probe_address(case, prog, self.design)
        hook = cpu.hooks.add_code(act, address, address)
        cpu.flush_code(L.FUNC, L.CODE_BASE + L.CODE_SIZE)  # a hook added after translation would not fire
        try:
            return self._run()
        finally:
            cpu.hooks.remove(hook)
            cpu.flush_code(L.FUNC, L.CODE_BASE + L.CODE_SIZE)

    def probed(self, case: Case, prog: Program) -> tuple[Outcome, list[str]]:
        """The run with the site probe (and the uretprobe), verifiers on; returns violation lines."""
        self._load(prog)
        m = self.machine
        address = probe_address(case, prog, self.design)
        # images=(): the kernel reads the instruction from memory (the skeleton file holds none of it)
        m.attach_resolved(resolved("uprobe", address), consumer_for(case.action, prog), ())
        if case.uretprobe:
            m.attach_resolved(resolved("uretprobe", L.FUNC), Consumer(ret_handler=lambda hit: None), ())
        self.session.rebind()
        outcome = self._run()
        return outcome, [v.line() for v in self.session.violations]
