"""Instruction counting for ``run --json`` and ``--max-insns``: per translated block, not per instruction.

A block hook adds the instruction count of each block about to run. Counts come from a table keyed by
(block address, block size), filled when Unicorn translates a block (its UC_HOOK_EDGE_GENERATED hook
reports every new translation with its ``icount``). Every translation overwrites its entry, so code
that changes (a patched probe site, guest self-modifying code, text unmapped and mapped again) gets a
new translation and the new count: the table is never stale, and no flush has to reach it. A block
translated before the counter existed is counted once from its bytes (capstone).

Unicorn calls the block hook before the block's first instruction, and a stop asked for there comes
before that instruction. So ``--max-insns N`` is exact: the block that would take the total past N
is not run; the remaining instructions run one by one under Unicorn's exact count, at the end of
the run only.

The C extension (emu/hotpath_src/icount.c) holds the table and both hooks; without it the same
table is a dict and the hooks are Python (emu/hotpath/__init__.py chooses). Both count the same.

Where a block does not run to its end (a fault in the middle, a thread's counted slice ending in it),
it still counts whole, as with any block counter; single-threaded runs without faults count exactly.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Protocol

from emu import hotpath
from emu.abi import PAGE_SIZE
from emu.cpu import (
    Cpu,
    Reg,
    StopReason,
    native_function,
)
from emu.disasm import cs64

NO_LIMIT = (1 << 64) - 1
TABLE_BUCKETS_LOG2 = 17  # 2 ways each (4 MB): python3.11 -c "print(1)" translates ~39,000 blocks


def decode_count(cpu: Cpu, address: int, size: int) -> int:
    """Instructions in the ``size`` bytes at ``address`` (a block translated before the counter was
    installed, or, in C, pushed out of the table)."""
    try:
        code = cpu.mem_read(address, size)
    except Exception:
        return 1
    return sum(1 for _ in cs64().disasm_lite(code, address)) or 1


def run_count(cpu: Cpu, start: int, end: int, most: int) -> int:
    """How many instructions lie on the straight line from ``start`` to ``end`` (at most ``most``)."""
    if end == start:
        return 0
    try:
        code = cpu.mem_read(start, min(16 * most, PAGE_SIZE))
    except Exception:  # the next page is not mapped: the instructions end on this one
        try:
            code = cpu.mem_read(start, PAGE_SIZE - start % PAGE_SIZE)
        except Exception:
            return most
    for n, (address, size, _m, _o) in enumerate(cs64().disasm_lite(code, start, most), 1):
        if address + size == end:
            return n
    return most  # not a straight line (a hook moved rip): Unicorn's count ran out


class InsnCounter(Protocol):
    """What the machine uses: the total, the limit (None: none), a counted Cpu.run and a time slice."""

    hit_limit: bool

    @property
    def total(self) -> int: ...

    @property
    def limit(self) -> int | None: ...

    @limit.setter
    def limit(self, value: int | None) -> None: ...

    def run(self, begin: int, timeout_us: int = 0, count: int = 0) -> StopReason: ...

    def run_slice(self, begin: int, timeout_us: int, quantum: int) -> StopReason: ...


class _Counter:
    """What both implementations share: the limit, and the exact end of a run the limit stops.

    An implementation keeps ``total``, ``stop_at`` (its hook stops the CPU before a block that
    would take the total past it) and ``stopped`` (its hook did so) where its hooks reach them."""

    total: int
    stop_at: int
    stopped: bool

    def __init__(self, cpu: Cpu, limit: int | None) -> None:
        self.cpu = cpu
        self.hit_limit = False
        self._limit = limit
        self.stop_at = NO_LIMIT if limit is None else limit

    @property
    def limit(self) -> int | None:
        return self._limit

    @limit.setter
    def limit(self, value: int | None) -> None:
        self._limit = value
        self.stop_at = NO_LIMIT if value is None else value

    def run(self, begin: int, timeout_us: int = 0, count: int = 0) -> StopReason:
        """Cpu.run, counted; a run the limit stops ends exactly at the limit (``hit_limit``)."""
        self.stopped = False  # (a run a hook's exception ended may have left it set)
        reason = self.cpu.run(begin, timeout_us=timeout_us, count=count)
        if not self.stopped or self._limit is None or self.stop_at != self._limit:
            return reason
        self.stopped = False
        left = self._limit - self.total
        if left > 0:
            reason = self._run_exactly(left, timeout_us)
        self.hit_limit = self.total >= self._limit
        return reason

    def run_slice(self, begin: int, timeout_us: int, quantum: int) -> StopReason:
        """A time slice: Cpu.run, counted, stopped before the block that would take the total more than
        ``quantum`` past where it is (or at the limit, exactly, if that comes first)."""
        end = self.total + quantum
        if end < self.stop_at:
            self.stop_at = end
        try:
            return self.run(begin, timeout_us)
        finally:
            self.stop_at = NO_LIMIT if self._limit is None else self._limit

    def _run_exactly(self, n: int, timeout_us: int) -> StopReason:
        """Up to ``n`` instructions of the block the hook did not let run (n is less than its count),
        under Unicorn's exact count; the hooks count nothing meanwhile."""
        start, total = self.cpu.read(Reg.RIP), self.total
        self.stop_at = NO_LIMIT
        try:
            reason = self.cpu.run(start, timeout_us=timeout_us, count=n)
        finally:
            self.stop_at = NO_LIMIT if self._limit is None else self._limit
        # straight-line code: a fault on the way leaves rip at the instruction that did not complete
        self.total = total + run_count(self.cpu, start, self.cpu.read(Reg.RIP), n)
        return reason


class _State(ctypes.Structure):
    """struct icount_state in emu/hotpath_src/icount.c (keep the two in step)."""

    _fields_ = [
        ("total", ctypes.c_uint64),
        ("stop_at", ctypes.c_uint64),
        ("decoded", ctypes.c_uint64),
        ("stopped", ctypes.c_uint32),
        ("shift", ctypes.c_uint32),
        ("table", ctypes.c_void_p),
        ("emu_stop", ctypes.c_void_p),
        ("decode", ctypes.c_void_p),
        ("last_pc", ctypes.c_uint64),
        ("last_size", ctypes.c_uint32),
        ("last_icount", ctypes.c_uint32),
    ]


class _Entry(ctypes.Structure):
    _fields_ = [("pc", ctypes.c_uint64), ("size", ctypes.c_uint32), ("icount", ctypes.c_uint32)]


_DECODE_CB = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32)


class NativeCounter(_Counter):
    """The C hooks and table (emu/hotpath_src/icount.c); Python reads and sets the state's fields."""

    def __init__(self, cpu: Cpu, limit: int | None, track_translations: bool = True) -> None:
        native = hotpath.native
        assert native is not None and ctypes.sizeof(_State) == native.ICOUNT_STATE_SIZE
        self._table = (_Entry * (2 << TABLE_BUCKETS_LOG2))()
        self._decode = _DECODE_CB(lambda address, size: decode_count(cpu, address, size))
        self._state = _State(shift=64 - TABLE_BUCKETS_LOG2, table=ctypes.addressof(self._table),
                             emu_stop=native_function("uc_emu_stop"),
                             decode=ctypes.cast(self._decode, ctypes.c_void_p).value)
        super().__init__(cpu, limit)
        cpu.hooks.keep(self)  # the hooks point into this object's buffers for as long as the engine lives
        state = ctypes.addressof(self._state)
        if track_translations:  # (off only in the test that shows a stale table would be caught)
            cpu.hooks.add_native_translation(native.icount_translated, state)
        cpu.hooks.add_native_block(native.icount_block, state)

    @property
    def total(self) -> int:
        return int(self._state.total)

    @total.setter
    def total(self, value: int) -> None:
        self._state.total = value

    @property
    def stop_at(self) -> int:
        return int(self._state.stop_at)

    @stop_at.setter
    def stop_at(self, value: int) -> None:
        self._state.stop_at = value

    @property
    def stopped(self) -> bool:
        return bool(self._state.stopped)

    @stopped.setter
    def stopped(self, value: bool) -> None:
        self._state.stopped = int(value)

    @property
    def decoded(self) -> int:
        """Blocks counted from their bytes (translated before the counter was installed, or pushed out)."""
        return int(self._state.decoded)


class PythonCounter(_Counter):
    """The same hooks in Python, the table a dict (a ctypes callback per block: microseconds)."""

    def __init__(self, cpu: Cpu, limit: int | None, track_translations: bool = True) -> None:
        self.total = 0
        self.stopped = False
        self.decoded = 0
        self._counts: dict[tuple[int, int], int] = {}
        super().__init__(cpu, limit)
        if track_translations:
            cpu.hooks.add_translation(self._on_translated)
        cpu.hooks.add_raw_block(self._block_hook())

    def _on_translated(self, pc: int, size: int, icount: int) -> None:
        self._counts[pc, size] = icount

    def _block_hook(self) -> Callable[[object, int, int, object], None]:
        """The block hook as a closure: the table and the stop are locals (each attribute costs)."""
        lookup, decode, stop = self._counts.get, self._decode_block, self.cpu.stop

        def on_block(_uc: object, address: int, size: int, _ud: object) -> None:
            n = lookup((address, size)) or decode(address, size)
            total = self.total + n
            if total > self.stop_at:
                self.stopped = True
                stop()
            else:
                self.total = total

        return on_block

    def _decode_block(self, address: int, size: int) -> int:
        self.decoded += 1
        n = self._counts[address, size] = decode_count(self.cpu, address, size)
        return n


def make_counter(cpu: Cpu, limit: int | None) -> InsnCounter:
    """The C counter when the extension is built, else the Python one."""
    if hotpath.native is not None:
        return NativeCounter(cpu, limit)
    return PythonCounter(cpu, limit)
