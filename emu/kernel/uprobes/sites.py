"""Patching probe sites: INT3, and each design's optimized form with the kernel's write order.

Every write goes through Memory.patch, which checks the expected bytes first (the
kernel's verify_insn, spec 3.5). Trampoline pages are mapped on the nearest free
page within rel32 reach (spec 3.4) and never unmapped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from emu.abi import PAGE_SIZE, TASK_SIZE, Prot
from emu.designs import SiteMode
from emu.kernel.errno_ import SyscallError
from emu.kernel.uprobes import tramp_code as tc
from emu.kernel.uprobes.insn import analyze, decode
from emu.memory import Memory

INT3 = b"\xcc"
CALL = 0xE8
JMP = 0xE9
LEA_RSP_M80 = bytes.fromhex("488d642480")
NOP10_HEAD = bytes.fromhex("662e0f1f84")
JMP8_OVER_TAIL = bytes.fromhex("eb08")
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
    return insn.opcode[:2] == [0x0F, 0x1F] and (insn.modrm >> 3) & 7 == 0


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


def can_optimize(mode: SiteMode, raw: bytes, vaddr: int) -> bool:
    """Would ``mode`` optimize a probe on this instruction (file bytes) at ``vaddr``? Pure: no memory."""
    if mode is SiteMode.INT3_ONLY:
        return False
    if mode is SiteMode.LEA_CALL_NOP10:
        return len(raw) == 10 and raw[:5] == NOP10_HEAD and not crosses_page(vaddr, 10)
    return is_nop5(raw) and not crosses_page(vaddr, 5)


def usdt_combo_site(code: bytes, pc: int, mode: SiteMode) -> int:
    """libbpf's nop combo (spec 3.8): a `90` followed by a long NOP that ``mode`` optimizes moves the
    probe to pc+1; anything else stays on pc. ``code``: the bytes at pc."""
    if code[:1] != b"\x90":
        return pc
    try:
        insn = analyze(code[1:], pc + 1, accept_nop10=mode is SiteMode.LEA_CALL_NOP10)
    except SyscallError:
        return pc
    return pc + 1 if can_optimize(mode, insn.raw, pc + 1) else pc


@dataclass
class SlotPage:
    start: int
    owners: list[int | None] = field(default_factory=lambda: [None] * tc.SLOTS_PER_PAGE)


class SitePatcher:
    """One process's trampolines and slots, and the patch sequences of one design."""

    def __init__(self, mem: Memory, mode: SiteMode) -> None:
        self.mem = mem
        self.mode = mode
        self.trampolines: list[int] = []
        self.slot_pages: list[SlotPage] = []
        self.slot_of: dict[int, int] = {}  # probe vaddr -> slot address, forever

    # ---------------------------------------------------------------- INT3
    def set_swbp(self, vaddr: int) -> None:
        current = self.mem.read(vaddr, 1)
        self.mem.patch(vaddr, current, INT3)

    def set_orig(self, vaddr: int, orig_byte0: int) -> None:
        """Restore byte 0 of a non-optimized site (nop10: keep a stale `eb 08` jump intact)."""
        tail = self.mem.read(vaddr + 1, 1)
        restore = JMP8_OVER_TAIL[:1] if self.mode is SiteMode.LEA_CALL_NOP10 and tail == JMP8_OVER_TAIL[1:] else bytes(
            [orig_byte0]
        )
        self.mem.patch(vaddr, INT3, restore)

    # ------------------------------------------------------------- queries
    def can_optimize(self, raw: bytes, vaddr: int) -> bool:
        return can_optimize(self.mode, raw, vaddr)

    def is_optimized(self, vaddr: int) -> bool:
        head = self.mem.read(vaddr, 10 if self.mode is SiteMode.LEA_CALL_NOP10 else 5)
        if self.mode is SiteMode.LEA_CALL_NOP10:
            return head[:5] == LEA_RSP_M80 and head[5] == CALL
        return head[0] in (CALL, JMP) and self._target(vaddr, head[:5]) is not None

    def _target(self, vaddr: int, insn: bytes) -> int | None:
        target = vaddr + 5 + struct.unpack("<i", insn[1:5])[0]
        vma = self.mem.find(target)
        return target if vma is not None and vma.name == TRAMPOLINE_NAME else None

    def in_trampoline(self, ip: int) -> bool:
        vma = self.mem.find(ip)
        return vma is not None and vma.name == TRAMPOLINE_NAME

    # ------------------------------------------------------------- optimize
    def optimize(self, vaddr: int) -> bool:
        """Replace the INT3 site by the design's jump into the kernel; False if it cannot (OPTIMIZE_FAIL)."""
        if self.mode is SiteMode.JMP_SLOT_NOP5:
            return self._optimize_jmp(vaddr)
        length = 10 if self.mode is SiteMode.LEA_CALL_NOP10 else 5
        tramp = self._trampoline_for(vaddr + length)
        if tramp is None:
            return False
        rel = rel32(tramp, vaddr + length)
        assert rel is not None
        current = self.mem.read(vaddr, length)
        if self.mode is SiteMode.LEA_CALL_NOP10:
            # spec 3.8: bytes 1..9 = lea tail + call, expecting CC; then byte 0 = 48.
            self.mem.patch(vaddr + 1, current[1:], LEA_RSP_M80[1:] + bytes([CALL]) + rel)
            self.mem.patch(vaddr, INT3, LEA_RSP_M80[:1])
        else:
            # spec 3.5: bytes 1..4 = rel32 (expect CC at byte 0), then byte 0 = E8.
            self.mem.patch(vaddr + 1, current[1:], rel)
            self.mem.patch(vaddr, INT3, bytes([CALL]))
        return True

    def _optimize_jmp(self, vaddr: int) -> bool:
        slot = self._slot_for(vaddr)
        if slot is None:
            return False  # no slot reachable: the probe stays on INT3
        rel = rel32(slot, vaddr + 5)
        assert rel is not None
        current = self.mem.read(vaddr, 5)
        self.mem.patch(vaddr + 1, current[1:], rel)
        self.mem.patch(vaddr, INT3, bytes([JMP]))
        return True

    def unoptimize(self, vaddr: int, orig: bytes) -> None:
        """Back to the original bytes in the kernel's order (nop10: to `eb 08` over the stale tail)."""
        if self.mode is SiteMode.LEA_CALL_NOP10:
            current = self.mem.read(vaddr, 10)
            self.mem.patch(vaddr, current[:1], INT3)
            self.mem.patch(vaddr + 1, current[1:2], JMP8_OVER_TAIL[1:])
            self.mem.patch(vaddr, INT3, JMP8_OVER_TAIL[:1])
            return
        current = self.mem.read(vaddr, 5)
        self.mem.patch(vaddr, current[:1], INT3)
        self.mem.patch(vaddr + 1, current[1:5], orig[1:5])
        self.mem.patch(vaddr, INT3, orig[:1])

    # ---------------------------------------------------- trampoline pages
    def _trampoline_for(self, call_end: int) -> int | None:
        for tramp in self.trampolines:  # 6.18: the first reachable one is reused
            if rel32(tramp, call_end) is not None:
                return tramp
        page = nearest_page(self.mem, call_end)
        if page is None:
            return None
        code = tc.NOP10_TRAMPOLINE if self.mode is SiteMode.LEA_CALL_NOP10 else tc.NOP5_TRAMPOLINE
        self.mem.map(page, PAGE_SIZE, Prot.READ | Prot.EXEC, name=TRAMPOLINE_NAME, data=code)
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
        start = nearest_page(self.mem, call_end)
        if start is None:
            return None
        self.mem.map(start, PAGE_SIZE, Prot.READ | Prot.EXEC, name=TRAMPOLINE_NAME,
                     data=tc.JMP_SLOT * tc.SLOTS_PER_PAGE)
        page = SlotPage(start)
        self.slot_pages.append(page)
        return self._take(page, 0, vaddr)

    def _take(self, page: SlotPage, index: int, vaddr: int) -> int:
        page.owners[index] = vaddr
        slot = page.start + index * tc.JMP_SLOT_SIZE
        self.slot_of[vaddr] = slot
        return slot

    def probe_of_slot(self, ip_after_syscall: int) -> int | None:
        """The probe address owning the slot whose syscall returned at ``ip_after_syscall``."""
        slot = ip_after_syscall - tc.JMP_SLOT_SIZE
        for page in self.slot_pages:
            if page.start <= slot < page.start + PAGE_SIZE and (slot - page.start) % tc.JMP_SLOT_SIZE == 0:
                return page.owners[(slot - page.start) // tc.JMP_SLOT_SIZE]
        return None
