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

The counter is also the process's share of the virtual clock (emu/kernel/clock.py, emu/process/timekeeping.py):
``kernel`` adds what its kernel entries cost (``charge_entries``), and ``set_alarm`` makes it stop exactly
where a timer expires, as it stops at ``--max-insns``. Stopping inside a block needs no flush of the
translation cache: a code hook on the first instruction not to run stops the CPU there, and only the
block holding it is translated again (Unicorn's exact count, which a thread's slices use anyway, does it
when the CPU already counts).
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
FRONT_CAPACITY_LOG2 = 10  # the C counter's direct-mapped front cache (ICOUNT_FRONT_LOG2 in icount.c): 16 KB
FRONT_LOG2 = FRONT_CAPACITY_LOG2  # the slots of it in use (from 1 up to its capacity)
TABLE_BUCKETS_LOG2 = 17  # 2 ways each (4 MB): python3.11 -c "print(1)" translates ~39,000 blocks


def decode_count(cpu: Cpu, address: int, size: int) -> int:
    """Instructions in the ``size`` bytes at ``address`` (a block translated before the counter was
    installed, or, in C, pushed out of the table)."""
    try:
        code = cpu.mem_read(address, size)
    except Exception:
        return 1
    return sum(1 for _ in cs64().disasm_lite(code, address)) or 1


def _straight_line(cpu: Cpu, start: int, most: int) -> list[tuple[int, int]]:
    """(address, size) of up to ``most`` instructions one after the other from ``start``."""
    try:
        code = cpu.mem_read(start, min(16 * most, PAGE_SIZE))
    except Exception:  # the next page is not mapped: the instructions end on this one
        try:
            code = cpu.mem_read(start, PAGE_SIZE - start % PAGE_SIZE)
        except Exception:
            return []
    return [(address, size) for address, size, _m, _o in cs64().disasm_lite(code, start, most)]


def run_count(cpu: Cpu, start: int, end: int, most: int) -> int:
    """How many instructions lie on the straight line from ``start`` to ``end`` (at most ``most``)."""
    if end == start:
        return 0
    for n, (address, size) in enumerate(_straight_line(cpu, start, most), 1):
        if address + size == end:
            return n
    return most  # not a straight line (a hook moved rip): the run went as far as it was let


def nth_address(cpu: Cpu, start: int, n: int) -> int | None:
    """Where the instruction after the first ``n`` from ``start`` begins (None: the bytes end first)."""
    line = _straight_line(cpu, start, n + 1)
    return line[n][0] if len(line) > n else None


class InsnCounter(Protocol):
    """What the machine uses: the total, the limit (None: none), a counted Cpu.run and a time slice; the
    kernel entries' cost and the stop at a timer's expiry (the virtual clock's)."""

    hit_limit: bool

    @property
    def total(self) -> int: ...

    @property
    def kernel(self) -> int: ...

    @property
    def work(self) -> int: ...

    @property
    def limit(self) -> int | None: ...

    @limit.setter
    def limit(self, value: int | None) -> None: ...

    @property
    def alarmed(self) -> bool: ...

    def run(self, begin: int, timeout_us: int = 0, count: int = 0) -> StopReason: ...

    def run_slice(self, begin: int, timeout_us: int, quantum: int) -> StopReason: ...

    def charge_entries(self, cost: int) -> None: ...

    def set_alarm(self, user_at: int | None, work_at: int | None) -> None: ...

    def hold_stops(self) -> Callable[[], None]: ...


class _Counter:
    """What both implementations share: the limit and the timer's stop point, the exact end of a run
    either stops, and the kernel entries' charge.

    An implementation keeps ``total``, ``stop_at`` (its hook stops the CPU before a block that would
    take the total past it), ``stopped`` (its hook did so), ``kernel``, ``entry_cost``, ``alarm_at`` and
    ``alarmed`` (a kernel entry reached ``alarm_at``) where its hooks reach them."""

    total: int
    stop_at: int
    stopped: bool
    kernel: int
    entry_cost: int
    alarm_at: int
    alarmed: bool

    def __init__(self, cpu: Cpu, limit: int | None) -> None:
        self.cpu = cpu
        self.hit_limit = False
        self._limit = limit
        self._user_alarm = NO_LIMIT  # total at which a timer of user CPU time expires
        self._slice_end = NO_LIMIT
        self._held = False  # hold_stops: a kernel action runs instructions the hook must let through
        self.alarm_at = NO_LIMIT
        self.stop_at = self._bound()

    @property
    def limit(self) -> int | None:
        return self._limit

    @limit.setter
    def limit(self, value: int | None) -> None:
        self._limit = value
        self.stop_at = self._bound()

    @property
    def work(self) -> int:
        """Instructions run and the kernel entries' cost: the process's CPU time, in instructions."""
        return self.total + self.kernel

    def _target(self) -> int:
        """The total the CPU must stop at exactly: the limit, or where a timer expires (a timer of
        ``total + kernel`` as a total, with the kernel's charges so far taken off)."""
        work = NO_LIMIT if self.alarm_at == NO_LIMIT else max(0, self.alarm_at - self.kernel)
        return min(NO_LIMIT if self._limit is None else self._limit, self._user_alarm, work)

    def _bound(self) -> int:
        return NO_LIMIT if self._held else min(self._target(), self._slice_end)

    def set_alarm(self, user_at: int | None, work_at: int | None) -> None:
        """Stop where a timer expires: when ``total`` reaches ``user_at`` (a timer of user CPU time) or
        ``total + kernel`` reaches ``work_at`` (None: no such timer). Also from a hook, as the run goes."""
        self._user_alarm = NO_LIMIT if user_at is None else user_at
        self.alarm_at = NO_LIMIT if work_at is None else work_at
        self.stop_at = self._bound()

    def due(self) -> bool:
        """A timer's stop point is reached."""
        return self.total >= self._user_alarm or self.alarm_at != NO_LIMIT and self.work >= self.alarm_at

    def hold_stops(self) -> Callable[[], None]:
        """Let every block run (a kernel action steps the guest: an out-of-line step, Linux holds signals
        back meanwhile too); the function returned lets the stops act again."""
        self._held = True
        self.stop_at = NO_LIMIT

        def release() -> None:
            self._held = False
            self.stop_at = self._bound()

        return release

    def charge_entries(self, cost: int) -> None:
        """From now on each kernel entry (syscall, interrupt) costs ``cost`` instruction-equivalents,
        charged before the kernel handles it: by the C front when there is one, else by observers."""
        self.entry_cost = cost
        front = self.cpu.hooks.front
        if front is not None and self._charge_in_front(front.handle):
            return
        self.cpu.hooks.before_syscall.append(self.charge_entry)
        self.cpu.hooks.before_interrupt.append(lambda _intno: self.charge_entry())

    def _charge_in_front(self, front: object) -> bool:
        return False

    def charge_entry(self) -> None:
        """One kernel entry: its cost, and a stop once it returns if a timer expires while the kernel runs
        it (icount_charge in emu/hotpath_src/icount.c does the same in C)."""
        self.kernel += self.entry_cost
        if self.alarm_at == NO_LIMIT:
            return
        if self.work >= self.alarm_at:
            self.alarmed = True
            self.cpu.stop()
        else:
            self.stop_at = min(self.stop_at, self.alarm_at - self.kernel)

    def run(self, begin: int, timeout_us: int = 0, count: int = 0) -> StopReason:
        """Cpu.run, counted; a run the limit or a timer stops ends exactly there (``hit_limit``, ``alarmed``)."""
        self.stopped = False  # (a run a hook's exception ended may have left it set)
        self.alarmed = False
        self.stop_at = self._bound()
        reason = self.cpu.run(begin, timeout_us=timeout_us, count=count)
        if not self.stopped:
            return reason
        self.stopped = False
        target = self._target()
        if target > self._slice_end:
            return reason  # the slice's end: it needs no exact end
        if target > self.total:
            reason = self._run_exactly(target - self.total, timeout_us, counted=count > 0)
        self.hit_limit = self._limit is not None and self.total >= self._limit
        self.alarmed = self.due()
        return reason

    def run_slice(self, begin: int, timeout_us: int, quantum: int) -> StopReason:
        """A time slice: Cpu.run, counted, stopped before the block that would take the total more than
        ``quantum`` past where it is (or at the limit or a timer, exactly, if one comes first)."""
        self._slice_end = self.total + quantum
        try:
            return self.run(begin, timeout_us)
        finally:
            self._slice_end = NO_LIMIT
            self.stop_at = self._bound()

    def _run_exactly(self, n: int, timeout_us: int, counted: bool) -> StopReason:
        """The first ``n`` instructions of the block the hook did not let run (n is less than its count);
        the hook counts the block whole meanwhile, and the total is set after from where the CPU is."""
        start, total = self.cpu.read(Reg.RIP), self.total
        self.stop_at = NO_LIMIT
        try:
            # a thread's slice: the CPU already counts, Unicorn's count costs no flush
            reason = self.cpu.run(start, timeout_us=timeout_us, count=n) if counted else self._run_to(start, n, timeout_us)
        finally:
            self.stop_at = self._bound()
        # straight-line code: a fault on the way leaves rip at the instruction that did not complete
        self.total = total + run_count(self.cpu, start, self.cpu.read(Reg.RIP), n)
        return reason

    def _run_to(self, start: int, n: int, timeout_us: int) -> StopReason:
        """Run from ``start`` and stop before its ``n + 1``-th instruction, with a code hook there: only
        the block holding it is translated again (with the hook, and after without)."""
        stop = nth_address(self.cpu, start, n)
        if stop is None:  # the bytes cannot be read: Unicorn's count (it flushes the cache)
            return self.cpu.run(start, timeout_us=timeout_us, count=n)
        hook = self.cpu.hooks.add_code(lambda _address, _size: self.cpu.stop(), stop, stop)
        self.cpu.flush_code(stop, stop + 1)
        try:
            return self.cpu.run(start, timeout_us=timeout_us)
        finally:
            self.cpu.hooks.remove(hook)
            self.cpu.flush_code(stop, stop + 1)


class _Entry(ctypes.Structure):
    _fields_ = [("pc", ctypes.c_uint64), ("size", ctypes.c_uint32), ("icount", ctypes.c_uint32)]


class _State(ctypes.Structure):
    """struct icount_state in emu/hotpath_src/icount.c, its fields typed; checked against the layout the
    extension exports when this module loads (hotpath.check_ctypes_layout)."""

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
        ("kernel", ctypes.c_uint64),
        ("entry_cost", ctypes.c_uint64),
        ("alarm_at", ctypes.c_uint64),
        ("alarmed", ctypes.c_uint32),
        ("front_shift", ctypes.c_uint32),
        ("front", _Entry * (1 << FRONT_CAPACITY_LOG2)),
    ]


hotpath.check_ctypes_layout("icount_state", _State, {"last_pc": "last"})


_DECODE_CB = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32)


class _StateField:
    """A field of a NativeCounter's C state (``_state``), under the same name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name


class _StateInt(_StateField):
    def __get__(self, counter: NativeCounter, owner: type | None = None) -> int:
        return int(getattr(counter._state, self.name))

    def __set__(self, counter: NativeCounter, value: int) -> None:
        setattr(counter._state, self.name, value)


class _StateBool(_StateField):
    def __get__(self, counter: NativeCounter, owner: type | None = None) -> bool:
        return bool(getattr(counter._state, self.name))

    def __set__(self, counter: NativeCounter, value: bool) -> None:
        setattr(counter._state, self.name, int(value))


class NativeCounter(_Counter):
    """The C hooks and table (emu/hotpath_src/icount.c); Python reads and sets the state's fields."""

    def __init__(self, cpu: Cpu, limit: int | None, track_translations: bool = True) -> None:
        native = hotpath.native
        assert native is not None
        self._table = (_Entry * (2 << TABLE_BUCKETS_LOG2))()
        self._decode = _DECODE_CB(lambda address, size: decode_count(cpu, address, size))
        assert 1 <= FRONT_LOG2 <= FRONT_CAPACITY_LOG2
        self._state = _State(shift=64 - TABLE_BUCKETS_LOG2, front_shift=64 - FRONT_LOG2,
                             table=ctypes.addressof(self._table),
                             emu_stop=native_function("uc_emu_stop"),
                             decode=ctypes.cast(self._decode, ctypes.c_void_p).value)
        super().__init__(cpu, limit)
        cpu.hooks.keep(self)  # the hooks point into this object's buffers for as long as the engine lives
        state = ctypes.addressof(self._state)
        if track_translations:  # (off only in the test that shows a stale table would be caught)
            cpu.hooks.add_native_translation(native.icount_translated, state)
        cpu.hooks.add_native_block(native.icount_block, state)

    # the fields _Counter keeps, read and written in the C state its hooks reach
    total = _StateInt()
    stop_at = _StateInt()
    stopped = _StateBool()
    kernel = _StateInt()
    entry_cost = _StateInt()
    alarm_at = _StateInt()
    alarmed = _StateBool()

    def _charge_in_front(self, front: object) -> bool:
        """The C syscall and interrupt front charges this counter's state itself (icount_charge)."""
        front.set_clock(ctypes.addressof(self._state))  # type: ignore[attr-defined]
        return True

    @property
    def decoded(self) -> int:
        """Blocks counted from their bytes (translated before the counter was installed, or pushed out)."""
        return int(self._state.decoded)


class PythonCounter(_Counter):
    """The same hooks in Python, the table a dict (a ctypes callback per block: microseconds)."""

    def __init__(self, cpu: Cpu, limit: int | None, track_translations: bool = True) -> None:
        self.total = 0
        self.stopped = False
        self.kernel = self.entry_cost = 0
        self.alarmed = False
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
