"""Guest page permissions in Unicorn's TLB: why every store of a program can stay on the fast path.

In its default TLB mode Unicorn 2.1.4 enters every page into the TLB as executable, and a TLB entry
of an executable page keeps its "not dirty" flag for good (``notdirty_write`` in cputlb.c clears it
only on a page without a code mapping, and ``cpu_physical_memory_is_clean`` always says clean), so
every guest store calls out of the translated code into the slow store helper. In the virtual-TLB
mode (``UC_TLB_VIRTUAL``) Unicorn asks a ``UC_HOOK_TLB_FILL`` hook instead: this one answers with the
permissions of the guest's own mapping, so a data page carries no EXEC bit and its stores stay in
the translated code after the first. A page that is executable and writable (JIT code) keeps the
slow path, which is also what detects its self-modifying stores.

Faults are still Unicorn's own: an access the page does not allow (or to no page) is granted to the
TLB, so that the mapping's permissions, which Unicorn also holds, make it fault with its exact
address and kind; for a load or store the hook first arms an invalid-access hook over that one page
to hear of it. An invalid-access hook over the whole address space would cost every store of the
program its fast path again (Unicorn never marks a page dirty while one covers it); the
page-bounded ones go as soon as their fault is handled, or when the run returns.

A fetch is granted without a hook: Unicorn also fills the TLB for a fetch of every range it drops
translated code from (uc_invalidate_tb: an unmap, a split for mprotect, a cache flush, a code hook's
removal, the end address of every run), whatever the range holds, and a refusal there would leave
its error standing for the rest of the run. A fetch that does fault stops the run at its
instruction, and Cpu.run makes the fault from the CPU's state.

A grant over a mapped page leaves a TLB entry that allows more than the page does (an executable
entry over a data page also keeps its stores on the slow path), so the TLB is flushed after any run
or call that made one. A grant over no page is harmless: mapping a page flushes the TLB.

Unicorn's TLB starts with 256 entries (1 MiB) and changes size only when it is flushed, doubling
when more than 70% of it was in use. A program whose working set does not fit misses on and on, and
each miss first rebuilds the CPU state from the translated block (``cpu_restore_state``): xz made
7.6 million fills in a run. So misses that go on flush the TLB to let it grow, after 2,048 fills,
then after twice as many each time, nine times at most (up to 128k entries, 512 MiB).

The table lives in C memory that both fill hooks read: ``tlbfill_hook`` of the C extension
(emu/hotpath_src/tlbfill.c) or, without it, :meth:`PageTable.fill` in Python.
"""

from __future__ import annotations

import bisect
import ctypes
from typing import TYPE_CHECKING, Any

import unicorn

from emu.abi import PAGE_SIZE
from emu.cpu import binding
from emu.hotpath import constant, struct_layout, words

if TYPE_CHECKING:
    from emu.cpu.hooks import Hooks

# struct page_table in emu/hotpath_src/tlbfill.c: its header words, then (page, hook handle) pairs
_HEADER = ("count capacity hook_add fault_callback fault_data armed_count armed_capacity granted fills last catch_all "
           "arms ranges ctl ctl_flush grow_at grow_step growths")
ARMED_WORDS = 64
_LAYOUT = struct_layout("page_table", [(name, 8) for name in _HEADER.split()] + [("armed", 8 * ARMED_WORDS)])
COUNT, CAPACITY, HOOK_ADD, FAULT_CALLBACK, FAULT_DATA, ARMED_COUNT, ARMED_CAPACITY, GRANTED, FILLS, LAST, \
    CATCH_ALL, ARMS, RANGES, CTL, CTL_FLUSH, GROW_AT, GROW_STEP, GROWTHS, ARMED = words(_LAYOUT, _HEADER + " armed")
HEADER_WORDS = _LAYOUT["sizeof"] // 8
INITIAL_RANGES = 256  # (start, end, perms) triples, in an array of their own that grows
# Unicorn's TLB (256 entries at first) changes size only when flushed: fills that go on flush it,
# GROW_STEP_FIRST fills after the start, then after twice as many each time, up to GROW_STEP_MAX.
GROW_STEP_FIRST = 2048
GROW_STEP_MAX = constant("GROW_STEP_MAX", 1 << 19)  # tlbfill.c's

HOOK_MEM_INVALID = (
    unicorn.UC_HOOK_MEM_READ_UNMAPPED | unicorn.UC_HOOK_MEM_WRITE_UNMAPPED | unicorn.UC_HOOK_MEM_FETCH_UNMAPPED
    | unicorn.UC_HOOK_MEM_READ_PROT | unicorn.UC_HOOK_MEM_WRITE_PROT | unicorn.UC_HOOK_MEM_FETCH_PROT
)
_NEED = {unicorn.UC_MEM_READ: unicorn.UC_PROT_READ, unicorn.UC_MEM_WRITE: unicorn.UC_PROT_WRITE,
         unicorn.UC_MEM_FETCH: unicorn.UC_PROT_EXEC}
EXEC = unicorn.UC_PROT_EXEC
_PAGE_MASK = PAGE_SIZE - 1


class TlbEntry(ctypes.Structure):
    """uc_tlb_entry: what a TLB-fill hook answers."""

    _fields_ = [("paddr", ctypes.c_uint64), ("perms", ctypes.c_int)]


TLB_FILL_CB = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int,
                               ctypes.POINTER(TlbEntry), ctypes.c_void_p)


class PageTable:
    """The permissions of every mapped page, as ranges, for the TLB-fill hook; and the invalid-access
    hooks it arms."""

    def __init__(self, handle: Any, fault_callback: int) -> None:
        self._uch = handle
        self._starts: list[int] = []
        self._ranges: list[tuple[int, int, int]] = []  # (start, end, perms), sorted, disjoint, neighbours differ
        self._buf = (ctypes.c_uint64 * HEADER_WORDS)()
        self._words = w = self._buf
        self._table = self._new_table(INITIAL_RANGES)
        w[HOOK_ADD] = binding.native_function("uc_hook_add")
        w[FAULT_CALLBACK] = fault_callback
        w[ARMED_CAPACITY] = ARMED_WORDS
        w[CTL], w[CTL_FLUSH] = binding.native_function("uc_ctl"), binding.CTL_FLUSH_TLB
        w[GROW_AT] = w[GROW_STEP] = GROW_STEP_FIRST

    @property
    def address(self) -> int:
        """The table's address: the C hook's user data."""
        return ctypes.addressof(self._buf)

    # ------------------------------------------------------------- the mapping
    def perms_at(self, addr: int) -> int:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0:
            start, end, perms = self._ranges[i]
            if addr < end:
                return perms
        return 0

    def ranges(self) -> list[tuple[int, int, int]]:
        """(start, end, perms) of each range, in address order."""
        return list(self._ranges)

    def takes_exec(self, start: int, end: int, perms: int) -> bool:
        """Would giving [start, end) ``perms`` take EXEC away anywhere in it?"""
        if perms & EXEC:
            return False
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        for lo, hi, old in self._ranges[i:]:
            if lo >= end:
                break
            if hi > start and old & EXEC:
                return True
        return False

    def set(self, start: int, end: int, perms: int | None) -> None:
        """[start, end) now has ``perms`` (None: it is unmapped)."""
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        j = i
        kept: list[tuple[int, int, int]] = []
        while j < len(self._ranges) and self._ranges[j][0] < end:
            lo, hi, old = self._ranges[j]
            if hi > start:
                if lo < start:
                    kept.append((lo, start, old))
                if hi > end:
                    kept.append((end, hi, old))
            else:
                kept.append((lo, hi, old))
            j += 1
        if perms is not None:
            kept.append((start, end, perms))
        kept.sort()
        merged: list[tuple[int, int, int]] = []
        before = self._ranges[i - 1] if i > 0 else None
        after = self._ranges[j] if j < len(self._ranges) else None
        for piece in ([before] if before is not None else []) + kept + ([after] if after is not None else []):
            if merged and merged[-1][1] == piece[0] and merged[-1][2] == piece[2]:
                merged[-1] = (merged[-1][0], piece[1], piece[2])
            else:
                merged.append(piece)
        lo_index = i - 1 if before is not None else i
        hi_index = j + 1 if after is not None else j
        self._ranges[lo_index:hi_index] = merged
        self._starts[lo_index:hi_index] = [r[0] for r in merged]
        self._publish(lo_index)

    def _new_table(self, capacity: int) -> ctypes.Array[ctypes.c_uint64]:
        table = (ctypes.c_uint64 * (3 * capacity))()
        self._words[RANGES] = ctypes.addressof(table)
        self._words[CAPACITY] = capacity
        return table

    def _publish(self, first: int) -> None:
        """Write the ranges from index ``first`` on into the C table (a larger one if they do not fit)."""
        n = len(self._ranges)
        if n > self._words[CAPACITY]:
            self._table = self._new_table(2 * n)
            first = 0
        table = self._table
        for k, (lo, hi, perms) in enumerate(self._ranges[first:], start=first):
            table[3 * k], table[3 * k + 1], table[3 * k + 2] = lo, hi, perms
        self._words[LAST] = 0
        self._words[COUNT] = n

    # ------------------------------------------------------------------ fills
    def fill(self, _uc: object, vaddr: int, kind: int, entry: Any, _ud: object) -> bool:
        """The pure-Python TLB-fill hook (tlbfill_hook's twin)."""
        perms = self.perms_at(vaddr)
        need = _NEED.get(kind, unicorn.UC_PROT_READ)
        w = self._words
        w[FILLS] += 1
        self._grow()
        result = entry.contents
        result.paddr = vaddr
        if not perms & need:
            if need != EXEC:
                self._arm(vaddr)
            if perms:
                w[GRANTED] += 1
            perms |= need
        result.perms = perms
        return True

    def _grow(self) -> None:
        """Flush the TLB so that Unicorn may make it larger, if the misses go on (tlbfill.c's grow)."""
        w = self._words
        if not w[GROW_STEP] or w[FILLS] < w[GROW_AT]:
            return
        binding.ctl(self._uch, binding.CTL_FLUSH_TLB)
        w[GROWTHS] += 1
        w[GROW_STEP] = 2 * w[GROW_STEP] if w[GROW_STEP] < GROW_STEP_MAX else 0
        w[GROW_AT] = w[FILLS] + w[GROW_STEP]

    def _arm(self, page: int) -> None:
        w = self._words
        pairs = w[ARMED_COUNT]
        if any(w[ARMED + 2 * i] == page for i in range(pairs)) or w[CATCH_ALL]:
            return
        w[ARMS] += 1
        room = 2 * pairs + 2 <= w[ARMED_CAPACITY]
        handle = ctypes.c_size_t()
        begin, end = (page, page + _PAGE_MASK) if room else (1, 0)
        status = binding.hook_add(self._uch, ctypes.byref(handle), HOOK_MEM_INVALID, ctypes.c_void_p(w[FAULT_CALLBACK]),
                                  ctypes.c_void_p(w[FAULT_DATA] or None), ctypes.c_uint64(begin), ctypes.c_uint64(end))
        if status != binding.OK:
            return
        if not room:
            w[CATCH_ALL] = handle.value
            return
        w[ARMED + 2 * pairs], w[ARMED + 2 * pairs + 1] = page, handle.value
        w[ARMED_COUNT] = pairs + 1

    # -------------------------------------------------------------- clean-up
    def disarm(self, addr: int) -> None:
        """The fault on ``addr``'s page was handled (the page is mapped now): its hook goes."""
        w = self._words
        page = addr & ~_PAGE_MASK
        pairs = w[ARMED_COUNT]
        for i in range(pairs):
            if w[ARMED + 2 * i] == page:
                binding.hook_del(self._uch, ctypes.c_size_t(w[ARMED + 2 * i + 1]))
                last = pairs - 1
                w[ARMED + 2 * i], w[ARMED + 2 * i + 1] = w[ARMED + 2 * last], w[ARMED + 2 * last + 1]
                w[ARMED_COUNT] = last
                return

    def after_run(self) -> bool:
        """The run returned: remove every armed hook. True if a fill granted more than a page allows
        (the TLB must then be flushed before the next run)."""
        w = self._words
        for i in range(w[ARMED_COUNT]):
            binding.hook_del(self._uch, ctypes.c_size_t(w[ARMED + 2 * i + 1]))
        w[ARMED_COUNT] = 0
        if w[CATCH_ALL]:
            binding.hook_del(self._uch, ctypes.c_size_t(w[CATCH_ALL]))
            w[CATCH_ALL] = 0
        return self.take_granted()

    def take_granted(self) -> bool:
        """Did a fill grant more than a page allows since the last call?"""
        granted = bool(self._words[GRANTED])
        self._words[GRANTED] = 0
        return granted

    def armed(self) -> list[int]:
        """The pages an invalid-access hook is armed over now."""
        w = self._words
        return [w[ARMED + 2 * i] for i in range(w[ARMED_COUNT])]

    @property
    def fills(self) -> int:
        """TLB misses answered."""
        return int(self._words[FILLS])

    @property
    def growths(self) -> int:
        """TLB flushes made so that the TLB may grow."""
        return int(self._words[GROWTHS])

    @property
    def arms(self) -> int:
        """Invalid-access hooks armed, ever (one a load or store that faulted, or is to fault)."""
        return int(self._words[ARMS])


def install_tlb_fill(hooks: Hooks, table: PageTable, native: Any) -> None:
    """Answer Unicorn's TLB misses from ``table``: the C hook if ``native`` (the extension) is given."""
    if native is not None:
        hooks.add(unicorn.UC_HOOK_TLB_FILL, ctypes.c_void_p(native.tlbfill_hook), 1, 0, user_data=table.address)
    else:
        hooks.add(unicorn.UC_HOOK_TLB_FILL, TLB_FILL_CB(table.fill), 1, 0)
