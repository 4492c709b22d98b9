"""Patching probe sites: INT3, and each design's optimized form with the kernel's write order.

Every write goes through Memory.patch, which checks the expected bytes first (the
kernel's verify_insn, spec 3.5). Trampoline pages are mapped on the nearest free
page within rel32 reach (spec 3.4) and never unmapped. What is written comes from
the design (emu/designs/__init__.py): its Patch, Trampoline and their parameters.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from emu.abi import PAGE_SIZE, TASK_SIZE, Prot
from emu.designs import BRANCH_OPCODE, Design, Detach, Layout, Patch, SiteForm, Trampoline, WriteOrder
from emu.kernel.errno_ import SyscallError
from emu.kernel.uprobes.insn import analyze, decode
from emu.process.memory import Memory

INT3 = b"\xcc"
JMP8 = 0xEB
NOP10_HEAD = bytes.fromhex("662e0f1f84")
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
TRAMPOLINE_NAME = "[uprobes-trampoline]"


def rel32(target: int, next_ip: int) -> bytes | None:
    delta = target - next_ip
    if not INT_MIN <= delta <= INT_MAX:
        return None
    return struct.pack("<i", delta)


def is_nop5(raw: bytes) -> bool:
    """[NOPS]: one 5-byte instruction that is opcode 90 (any prefixes; REX.B would make it
    xchg %r8) or NOPL 0f 1f /0."""
    insn = decode(raw[:5], 0)
    if insn is None or insn.size != 5:
        return False
    if insn.opcode[0] == 0x90:
        return bool(insn.mnemonic == "nop")
    return bool(insn.opcode[:2] == [0x0F, 0x1F] and (insn.modrm >> 3) & 7 == 0)


def crosses_page(vaddr: int, length: int) -> bool:
    return PAGE_SIZE - (vaddr & (PAGE_SIZE - 1)) < length


def nearest_page(mem: Memory, call_end: int) -> int | None:
    """find_nearest_trampoline (spec 3.4): closest free page within rel32 of call_end; ties go up."""
    high = mem.find_free_above(PAGE_SIZE, call_end, min(call_end + INT_MAX, TASK_SIZE))
    low = mem.find_free(PAGE_SIZE, below=call_end, above=max(call_end + INT_MIN, PAGE_SIZE))
    if high is None:
        return low
    if low is None:
        return high
    return high if high - call_end <= call_end - low else low


def can_optimize(design: Design, raw: bytes, vaddr: int) -> bool:
    """Would ``design`` optimize a probe on this instruction (file bytes) at ``vaddr``? Pure: no memory."""
    patch = design.patch
    if patch is None:
        return False
    if patch.site is SiteForm.NOP10:
        return len(raw) == 10 and raw[:5] == NOP10_HEAD and not crosses_page(vaddr, 10)
    return is_nop5(raw) and not crosses_page(vaddr, 5)


def usdt_combo_site(code: bytes, pc: int, design: Design) -> int:
    """libbpf's nop combo (spec 3.8): a `90` followed by a long NOP that ``design`` optimizes moves the
    probe to pc+1; anything else stays on pc. ``code``: the bytes at pc."""
    if code[:1] != b"\x90":
        return pc
    try:
        insn = analyze(code[1:], pc + 1, accept_nop10=design.site_length == 10)
    except SyscallError:
        return pc
    return pc + 1 if can_optimize(design, insn.raw, pc + 1) else pc


def patched_bytes(patch: Patch, target: int, vaddr: int) -> bytes | None:
    """The site's optimized bytes: prefix, then call/jmp rel32 to ``target``; None if out of reach."""
    branch_end = vaddr + patch.branch_end
    rel = rel32(target, branch_end)
    return None if rel is None else patch.prefix_bytes + bytes([BRANCH_OPCODE[patch.branch]]) + rel


@dataclass
class SlotPage:
    start: int
    owners: list[int | None]


class SitePatcher:
    """One process's trampolines and slots, and the patch sequences of one design."""

    def __init__(self, mem: Memory, design: Design) -> None:
        self.mem = mem
        self.design = design
        self.trampolines: list[int] = []
        self.slot_pages: list[SlotPage] = []
        self.slot_of: dict[int, int] = {}  # probe vaddr -> slot address (forever, unless the design reuses slots)

    @property
    def patch(self) -> Patch:
        assert self.design.patch is not None
        return self.design.patch

    @property
    def trampoline(self) -> Trampoline:
        assert self.design.trampoline is not None
        return self.design.trampoline

    # ---------------------------------------------------------------- INT3
    def set_swbp(self, vaddr: int) -> None:
        current = self.mem.read(vaddr, 1)
        self.mem.patch(vaddr, current, INT3)

    def set_orig(self, vaddr: int, orig_byte0: int) -> None:
        """Restore byte 0 of a non-optimized site (a jump-over design keeps a stale `eb rel8` intact).

        verify_opcode: a byte 0 that is no longer INT3 (a call into a trampoline page the process
        unmapped, which is_optimized no longer recognizes) is left as it is."""
        if self.mem.read(vaddr, 1) != INT3:
            return
        restore = bytes([JMP8]) if self._stale_jump_over(vaddr) else bytes([orig_byte0])
        self.mem.patch(vaddr, INT3, restore)

    def _stale_jump_over(self, vaddr: int) -> bool:
        patch = self.design.patch
        return patch is not None and patch.detach is Detach.JUMP_OVER and \
            self.mem.read(vaddr + 1, 1) == bytes([patch.length - 2])

    def inherit(self, parent: SitePatcher) -> None:
        """fork, for a design whose trampoline pages the child keeps: the same pages and slot owners."""
        self.trampolines = list(parent.trampolines)
        self.slot_pages = [SlotPage(page.start, list(page.owners)) for page in parent.slot_pages]
        self.slot_of = dict(parent.slot_of)

    # ------------------------------------------------------------- queries
    def can_optimize(self, raw: bytes, vaddr: int) -> bool:
        return can_optimize(self.design, raw, vaddr)

    def is_optimized(self, vaddr: int) -> bool:
        """Do the site's bytes hold this design's prefix and branch into one of its trampoline pages?"""
        patch = self.patch
        prefix = patch.prefix_bytes
        head = self.mem.read(vaddr, len(prefix) + 5)
        if head[:len(prefix)] != prefix or head[len(prefix)] != BRANCH_OPCODE[patch.branch]:
            return False
        target = vaddr + len(head) + struct.unpack("<i", head[-4:])[0]
        return self.in_trampoline(target)

    def in_trampoline(self, ip: int) -> bool:
        vma = self.mem.find(ip)
        return vma is not None and vma.name == TRAMPOLINE_NAME

    # ------------------------------------------------------------- optimize
    def optimize(self, vaddr: int) -> bool:
        """Replace the INT3 site by the design's branch into the kernel; False if it cannot (OPTIMIZE_FAIL)."""
        branch_end = vaddr + self.patch.branch_end
        target = self._slot_for(vaddr) if self.trampoline.layout is Layout.SLOTS else self._trampoline_for(branch_end)
        if target is None:
            return False  # nothing reachable: the probe stays on INT3
        new = patched_bytes(self.patch, target, vaddr)
        assert new is not None
        current = self.mem.read(vaddr, len(new))
        if self.patch.write_order is WriteOrder.FRONT_TO_BACK:  # every byte in place, one at a time (the torn-insn hazard)
            for i in range(len(new)):
                self.mem.patch(vaddr + i, current[i:i + 1], new[i:i + 1])
            return True
        # spec 3.5 / 3.8: bytes 1.. first while byte 0 still traps, then byte 0
        self.mem.patch(vaddr + 1, current[1:], new[1:])
        self.mem.patch(vaddr, INT3, new[:1])
        return True

    def unoptimize(self, vaddr: int, orig: bytes) -> None:
        """Back to the original bytes in the kernel's order, or to `eb rel8` over the stale tail (spec 3.5, 3.8)."""
        patch = self.patch
        length = patch.length if patch.detach is Detach.RESTORE else 2
        current = self.mem.read(vaddr, length)
        tail = orig[1:length] if patch.detach is Detach.RESTORE else bytes([patch.length - 2])
        self.mem.patch(vaddr, current[:1], INT3)
        self.mem.patch(vaddr + 1, current[1:length], tail)
        self.mem.patch(vaddr, INT3, orig[:1] if patch.detach is Detach.RESTORE else bytes([JMP8]))
        if self.trampoline.layout is Layout.SLOTS and self.trampoline.slot_reuse:
            self._release_slot(vaddr)

    # ---------------------------------------------------- trampoline pages
    def _map_page(self, near: int, code: bytes) -> int | None:
        page = nearest_page(self.mem, near)
        if page is not None:
            self.mem.map(page, PAGE_SIZE, Prot.READ | Prot.EXEC, name=TRAMPOLINE_NAME, data=code)
        return page

    def _trampoline_for(self, call_end: int) -> int | None:
        for tramp in self.trampolines:  # 6.18: the first reachable one is reused
            if rel32(tramp, call_end) is not None:
                return tramp
        page = self._map_page(call_end, self.trampoline.code_bytes)
        if page is not None:
            self.trampolines.append(page)
        return page

    def _slot_for(self, vaddr: int) -> int | None:
        if vaddr in self.slot_of:
            return self.slot_of[vaddr]  # a slot belongs forever to its first probe address
        call_end = vaddr + 5
        for page in self.slot_pages:
            if rel32(page.start, call_end) is None or rel32(page.start + PAGE_SIZE, call_end) is None:
                continue  # the whole page must be reachable
            for i, owner in enumerate(page.owners):
                if owner is None:
                    return self._take(page, i, vaddr)
        tramp = self.trampoline
        slot_code = tramp.code_bytes.ljust(tramp.slot_size, b"\xcc")
        start = self._map_page(call_end, slot_code * tramp.slots_per_page)
        if start is None:
            return None
        page = SlotPage(start, [None] * tramp.slots_per_page)
        self.slot_pages.append(page)
        return self._take(page, 0, vaddr)

    def _take(self, page: SlotPage, index: int, vaddr: int) -> int:
        page.owners[index] = vaddr
        slot = page.start + index * self.trampoline.slot_size
        self.slot_of[vaddr] = slot
        return slot

    def _release_slot(self, vaddr: int) -> None:
        slot = self.slot_of.pop(vaddr, None)
        for page in self.slot_pages:
            if slot is not None and page.start <= slot < page.start + PAGE_SIZE:
                page.owners[(slot - page.start) // self.trampoline.slot_size] = None

    def probe_of_slot(self, ip_after_syscall: int) -> int | None:
        """The probe address owning the slot whose syscall returned at ``ip_after_syscall``."""
        size = self.trampoline.slot_size
        slot = ip_after_syscall - self.trampoline.syscall_return
        for page in self.slot_pages:
            if page.start <= slot < page.start + PAGE_SIZE and (slot - page.start) % size == 0:
                return page.owners[(slot - page.start) // size]
        return None
