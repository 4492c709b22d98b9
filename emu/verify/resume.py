"""Where and when the guest resumes after a probe hit, without a hook on every block: as the kernel
returns to user mode (observers after its syscall and interrupt handlers), at the ``ret`` ending
straight-line trampoline code (an exact-address hook, added when the kernel first returns into that
code), or else at the first block outside the kernel's pages (a block hook, added on first need).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Protocol

from emu.abi import RED_ZONE, U64
from emu.cpu.state import RAW_RIP, RAW_RSP
from emu.disasm import STRAIGHT_LINE_SCAN, cs64, straight_line_end
from emu.kernel.uprobes.generation import TABLES
from emu.kernel.uprobes.regs import ExitPath
from emu.process.vma import KERNEL_SIDE

if TYPE_CHECKING:
    from collections.abc import Mapping

    from emu.cpu import RawState
    from emu.hotpath.edges import NativeEdges
    from emu.machine import Machine
    from emu.verify.records import ProbeSite, Transaction

_KERNEL_ENTRIES = frozenset({"syscall", "int3"})  # the kernel's own exit is seen by the hooks here
_IRET = ExitPath.IRET.value  # its count in the kernel's exit record (UprobeStats.exits)
_QWORD = struct.Struct("<Q")


class Tracker(Protocol):
    """What the watch needs of the transaction tracker (emu/verify/tracker.py, which makes the watch)."""

    edges: NativeEdges | None
    raw: RawState
    lost: Transaction | None

    @property
    def active(self) -> Transaction | None: ...
    def opened(self) -> tuple[ProbeSite, Mapping[str, int]] | None: ...
    def arm(self, ret: int, popped: int) -> None: ...
    def settle_at_kernel_return(self, rip_advance: int) -> bool: ...
    def read_end(self, tx: Transaction) -> tuple[bytes, bytes | None]: ...
    def finish(self, tx: Transaction, resume: int, raw: bytes, rsp: int | None = None,
               redzone: bytes | None = None) -> None: ...
    def fold_log(self, tx: Transaction) -> None: ...
    def abandon(self) -> None: ...


class ResumeWatch:
    def __init__(self, machine: Machine, tracker: Tracker) -> None:
        self.machine, self.cpu, self.mem, self.up, self.tracker = machine, machine.cpu, machine.mem, machine.uprobes, tracker
        self._exits = machine.uprobes.stats.exits
        self._followed: set[int] = set()  # kernel-side addresses whose straight-line run is watched
        self._popped: dict[int, int] = {}  # hooked ret -> the bytes it pops (8 + its immediate)
        self._tail_ret: dict[int, int] = {}  # followed kernel-side address -> the hooked ret ending it
        self._sysret_watched: set[int] = set()  # probe sites whose code after SYSRET is watched
        self._armable: dict[int, int] = {}  # ... and ends in this ret, whose hook is C (emu/hotpath/edges.py)
        self._native_rets: set[int] = set()  # hooked rets whose hook is C
        self.watching_blocks = False  # the fallback is on (it stays on)
        self.cpu.hooks.after_interrupt.append(self._after_interrupt)
        self.cpu.hooks.after_syscall.append(self._after_syscall)
        if tracker.edges is not None:
            tracker.edges.set_ret_fallback(self._on_ret)

    @property
    def observers(self) -> list[object]:
        """The kernel-exit observers installed here (the C syscall front mirrors them: fastsys.c)."""
        return [self._after_interrupt, self._after_syscall]

    def armable(self, site: int) -> tuple[int, int]:
        """The C-hooked ``ret`` a hit at ``site`` may be armed for after SYSRET, and the bytes it pops; or (0, 0)."""
        ret = self._armable.get(site)
        return (0, 0) if ret is None else (ret, self._popped[ret])

    def new_image(self) -> None:
        """execve: the process's uprobes are the new image's, whose sites are new (the kernel pages' code
        followed so far is the design's, the same in every image)."""
        self.up = self.machine.uprobes
        self._exits = self.up.stats.exits
        self._sysret_watched.clear()
        self._armable.clear()
        TABLES.bump()  # the C syscall front's copy of _armable

    def lost_track(self) -> None:
        """The guest resumed without any of the hooks here seeing it: watch blocks from now on."""
        self._sysret_watched.clear()
        self._armable.clear()
        TABLES.bump()  # the C syscall front's copy of _armable
        self._watch_blocks()

    # ----------------------------------------------------------- the kernel's exits
    def _after_interrupt(self, _intno: int) -> None:
        try:
            if not self.tracker.settle_at_kernel_return(0) and (tx := self.tracker.active) is not None:
                self._kernel_returns(tx, 0)
        except BaseException as exc:
            self.cpu.hooks.raised(exc)

    def _after_syscall(self) -> None:
        """A SYSRET into trampoline code already watched for the site needs only the exit count checked."""
        try:
            opened = self.tracker.opened()
            if opened is None:
                return
            at, exits_before = opened
            irets = self._exits.get(_IRET, 0) - exits_before.get(_IRET, 0)
            if not irets and at.address in self._sysret_watched and not self.cpu.hooks.failed:
                if at.address in self._armable:
                    self.tracker.arm(*self.armable(at.address))
                return  # SYSRET into the trampoline code watched for this site
            tx = None if self.tracker.settle_at_kernel_return(2) else self.tracker.active
            if tx is None:
                return
            followed = self._kernel_returns(tx, 2)
            if followed is not None and not irets:
                self._sysret_watched.add(tx.site)
                ret = self._tail_ret[followed]
                if ret in self._native_rets:
                    self._armable[tx.site] = ret
                    TABLES.bump()  # the C syscall front may arm it from now on
        except BaseException as exc:
            self.cpu.hooks.raised(exc)

    def _kernel_returns(self, tx: Transaction, rip_advance: int) -> int | None:
        """The kernel returns to rip + ``rip_advance`` during ``tx``; that address if it is straight-line code
        now watched to its ``ret``."""
        if self.cpu.hooks.failed:
            self.tracker.lost = tx  # the session's finish() judges it if the run ends here
            self.tracker.abandon()  # a signal or an exit: the guest does not resume from this hit
            return None
        raw, redzone = self.tracker.read_end(tx)
        addr = (_QWORD.unpack_from(raw, RAW_RIP)[0] + rip_advance) & U64
        if self._site_step(tx, addr):  # an rt_sigreturn back between a nop10 site's lea and call: the hit goes on
            self._watch_blocks()
            return None
        if self._guest_side(tx, addr):
            self.tracker.finish(tx, addr, raw, redzone=redzone)
            return None
        if self.machine.kernel.deferred:
            self._watch_blocks()  # an out-of-line step: the kernel runs it between two CPU runs
            return None
        return addr if self._follow(addr) else None

    def _guest_side(self, tx: Transaction, addr: int) -> bool:
        """Not in the kernel's pages (right after ``tx``'s probed instruction, the common case, is not)."""
        return addr == tx.at.next or (vma := self.mem.find(addr)) is None or vma.name not in KERNEL_SIDE

    def _site_step(self, tx: Transaction, addr: int) -> bool:
        """``addr``, strictly inside ``tx``'s site, starts one of the patched site's own instructions (the
        call after a nop10 site's lea, where a signal handler returns to): the hit goes on there. Any
        other address inside the site is a resume inside the probed instruction."""
        size = len(tx.at.original)
        if not tx.site < addr < tx.site + size:
            return False
        patched = self.mem.read(tx.site, size)
        return any(at == addr for at, _size, _m, _o in cs64().disasm_lite(patched, tx.site))

    # ------------------------------------------------------ straight-line trampoline code
    def _follow(self, addr: int) -> bool:
        """Hook the ``ret`` ending the straight-line kernel-side code at ``addr`` (once per address); True
        if a hooked ``ret`` ends it and no block hook is needed."""
        if addr not in self._followed:
            self._followed.add(addr)
            vma = self.mem.find(addr)
            assert vma is not None
            end = straight_line_end(self.mem.read(addr, min(STRAIGHT_LINE_SCAN, vma.end - addr)), addr)
            if end is not None and end[2] == "ret":
                pc, size, _word, op_str = end
                self._popped[pc] = 8 + (int(op_str, 0) if op_str else 0)
                if self.tracker.edges is not None:
                    self.tracker.edges.add_ret_hook(pc)
                    self._native_rets.add(pc)
                else:
                    self.cpu.hooks.add_raw_code(self._on_ret, pc, pc)
                self.cpu.flush_code(addr, pc + size)
                self._tail_ret[addr] = pc
            elif end is None or end[2] not in _KERNEL_ENTRIES:
                self._watch_blocks()  # else the kernel is entered again: the hooks here see its exit
        return addr in self._tail_ret and not self.watching_blocks

    def _on_ret(self, _uc: object, addr: int, _size: int, _ud: object) -> None:
        try:
            tracker = self.tracker
            tx = tracker.active
            if tx is None or self.up.task.stepping:
                return
            raw = tracker.raw.read()
            rsp = _QWORD.unpack_from(raw, RAW_RSP)[0]
            redzone = None
            offset = rsp - tx.redzone_base
            if 0 <= offset <= RED_ZONE - 8:  # the 6.18 trampoline returns from the red zone
                tracker.fold_log(tx)
                redzone = tx.redzone_before  # as it is now, if every write into it stored what it held
                if redzone is None or tx.redzone_changed:
                    redzone = tracker.raw.mem(tx.redzone_base, RED_ZONE)
                target = None if redzone is None else int.from_bytes(redzone[offset : offset + 8], "little")
            else:
                target = tracker.raw.u64(rsp)
            if target is None:
                tracker.lost = tx
                tracker.abandon()  # the ret faults: SIGSEGV, no resume
                return
            if self._guest_side(tx, target):
                tracker.finish(tx, target, raw, (rsp + self._popped[addr]) & U64, redzone)
            else:
                self._follow(target)
        except BaseException as exc:
            self.cpu.hooks.raised(exc)

    # ------------------------------------------------------------------ the fallback
    def _watch_blocks(self) -> None:
        if not self.watching_blocks:
            self.watching_blocks = True
            self.machine.kernel.defer(self._add_block_hook)  # outside the run: the hook, then a flush

    def _add_block_hook(self) -> None:
        self.cpu.hooks.add_block(self._on_block)
        self.cpu.flush_all_code()

    def _on_block(self, addr: int, _size: int) -> None:
        tx = self.tracker.active
        if tx is None or addr == tx.site and tx.chain is None or self.up.stepping:
            return
        if self._site_step(tx, addr):
            return
        if self._guest_side(tx, addr):
            self.tracker.finish(tx, addr, self.tracker.raw.read())
