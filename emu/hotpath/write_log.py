"""The red-zone write log: the guest's stores during a transaction, kept in one buffer that the
verifiers read only when they need them.

A store into the red zone is logged as (pc, address, size, value), and before the first one lands
the red zone is copied: that copy is the reference the red-zone check compares with. A store into
the SCRATCH bytes right below the red zone (the design's own stack use) is ignored. Any other store
(the interrupted frame above rsp, a global, another thread's stack) is logged too, with the bytes
it overwrites (``old``, read before the store lands), and counted in ``outside``: no fast path
settles a hit while that count is not zero, and the memory check (emu/verify/checks/memory.py) reads the
entries.

The hook is one permanent write hook over the whole address space, added only for a verified run;
it does nothing while no transaction is open (the OPEN word). With the C extension it is C
(emu/hotpath_src/writelog.c); without it, a Python hook does the same.

Buffer layout (64-bit words, then bytes; struct write_log in emu/hotpath_src/verify.h):
  0 count: stores seen since start() (it counts on past the capacity)
  1 capacity: entries the buffer holds     2 the red zone's base     3 its length
  4, 5: uc_mem_read, uc_reg_read (for the C hook)
  6 taken: the snapshot is taken (or not wanted)
  7 snapshot status: what uc_mem_read returned (0: the red zone was mapped)
  8 outside: stores since start() that landed neither in the red zone nor in the scratch below it
  9 open: a transaction is open (the hook logs)     10 the id of rip     11 SCRATCH
  12.. snapshot (WINDOW bytes), then the entries (pc, address, size, value, old), 40 bytes each
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from types import ModuleType

from emu import hotpath
from emu.abi import RED_ZONE
from emu.cpu import (
    Cpu,
    HookHandle,
    RawWriteHook,
    Reg,
    native_function,
)

COUNT, CAPACITY, BASE, LENGTH, MEM_READ, REG_READ, TAKEN, STATUS, OUTSIDE, OPEN, RIP_ID, SCRATCH_WORD = range(12)
SNAPSHOT_OFFSET = 12 * 8
WINDOW = RED_ZONE
ENTRIES_OFFSET = SNAPSHOT_OFFSET + WINDOW
ENTRY = struct.Struct("=QQQqQ")  # pc, address, size, value (as Unicorn passes it: signed), old (outside stores)
CAPACITY_ENTRIES = 256
SCRATCH = 4096  # bytes below the red zone a design may use without a log entry (deeper ones are logged, and
# the memory check still lets through those on the interrupted thread's own stack mapping)
assert WINDOW == 128  # the snapshot's room in struct write_log
MemReader = Callable[[int, int], "bytes | None"]  # (address, size) -> the bytes, None if unmapped (RawState.mem)


def native_hot_path() -> ModuleType | None:
    """The C extension, if it runs and has the verifiers' hooks; None: the Python hooks do their work."""
    native = hotpath.native
    return native if native is not None and hasattr(native, "edges_site_hook") else None


class WriteLog:
    def __init__(self, capacity: int = CAPACITY_ENTRIES) -> None:
        self._buf = ctypes.create_string_buffer(ENTRIES_OFFSET + ENTRY.size * capacity)
        self._bytes = memoryview(self._buf).cast("B")
        self._words = self._bytes.cast("Q")
        self._words[CAPACITY] = capacity
        self._words[LENGTH] = WINDOW
        self._words[MEM_READ] = native_function("uc_mem_read")
        self._words[REG_READ] = native_function("uc_reg_read")
        self._words[TAKEN] = 1
        self._words[RIP_ID] = Reg.RIP
        self._words[SCRATCH_WORD] = SCRATCH

    def add_hook(self, cpu: Cpu, begin: int, end: int, mem: MemReader) -> tuple[HookHandle, bool]:
        """The C hook over [begin, end], or without the C extension its Python stand-in, which
        reads guest memory with ``mem``. True: C."""
        native = native_hot_path()
        if native is None:
            return cpu.hooks.add_raw_mem_write(self._python_hook(cpu, mem), begin, end), False
        return cpu.hooks.add_native_mem_write(native.writelog_hook, ctypes.addressof(self._buf), begin, end), True

    def _python_hook(self, cpu: Cpu, mem: MemReader) -> RawWriteHook:
        """What writelog.c does, in Python."""
        words = self._words

        def on_write(_uc: object, _access: int, addr: int, size: int, value: int, _ud: object) -> bool:
            try:
                if not words[OPEN]:
                    return True
                base = words[BASE]
                where = classify(addr, size, base)
                if where == 1:
                    return True
                if where == 2:  # not landed yet: the bytes it overwrites
                    self.record(cpu.read(Reg.RIP), addr, size, value, mem(addr, size) or bytes(size))
                    return True
                if not words[TAKEN]:  # the first store into it, not landed yet: the red zone as it was
                    self.set_snapshot(mem(base, WINDOW))
                self.record(cpu.read(Reg.RIP), addr, size, value)
            except BaseException as exc:
                cpu.hooks.raised(exc)
            return True

        return on_write

    @property
    def address(self) -> int:
        """Where the buffer lies (for C that starts the log itself)."""
        return ctypes.addressof(self._buf)

    def start(self, base: int, snapshot_wanted: bool) -> None:
        """A transaction (re)starts watching the red zone at ``base``: no stores logged yet; the red
        zone is copied before the first store if ``snapshot_wanted``. The hook logs from now on."""
        words = self._words
        words[COUNT] = 0
        words[BASE] = base
        words[TAKEN] = 0 if snapshot_wanted else 1
        words[STATUS] = 0
        words[OUTSIDE] = 0
        words[OPEN] = 1

    def close(self) -> None:
        """No transaction is open: the hook logs nothing until the next start()."""
        self._words[OPEN] = 0

    @property
    def is_open(self) -> bool:
        return self._words[OPEN] != 0

    @property
    def outside(self) -> int:
        """Stores since start() or the last take() outside the red zone and the scratch below it."""
        return self._words[OUTSIDE]

    @property
    def count(self) -> int:
        return self._words[COUNT]

    def snapshot(self) -> bytes | None:
        """The window as it was before the first store into it; None if it could not be read
        (unmapped), or no store into it has come yet (a store elsewhere takes no snapshot)."""
        if self._words[STATUS] & 0xFFFFFFFF or not self._words[TAKEN]:
            return None
        return self._bytes[SNAPSHOT_OFFSET:ENTRIES_OFFSET].tobytes()

    def take(self) -> tuple[bytes, bool]:
        """The entries logged since start() or the last take() (raw), and whether some did not fit;
        the log is empty afterwards (the snapshot stays taken)."""
        words = self._words
        count, capacity = words[COUNT], words[CAPACITY]
        kept = min(count, capacity)
        entries = self._bytes[ENTRIES_OFFSET : ENTRIES_OFFSET + ENTRY.size * kept].tobytes()
        words[COUNT] = words[OUTSIDE] = 0
        return entries, count > capacity

    @property
    def snapshot_pending(self) -> bool:
        """No store yet, and the window is to be copied before the first one."""
        return not self._words[TAKEN]

    def set_snapshot(self, window: bytes | None) -> None:
        """The red zone before the first store (None: it could not be read)."""
        if window is None:
            self._words[STATUS] = 1
        else:
            self._bytes[SNAPSHOT_OFFSET:ENTRIES_OFFSET] = window
        self._words[TAKEN] = 1

    def record(self, pc: int, addr: int, size: int, value: int, old: bytes | None = None) -> None:
        """What the C hook does after the snapshot, for a Python hook; ``old``: the bytes an
        outside store overwrites (None: a store into the red zone)."""
        words = self._words
        count = words[COUNT]
        if old is not None:
            words[OUTSIDE] += 1
        if count < words[CAPACITY]:
            old_word = int.from_bytes(old, "little") if old is not None else 0
            ENTRY.pack_into(self._bytes, ENTRIES_OFFSET + ENTRY.size * count, pc, addr, size, value, old_word)
        words[COUNT] = count + 1


def classify(addr: int, size: int, base: int) -> int:
    """Where a store lands, as the C hook sorts it: 0 the red zone at ``base``, 1 the
    scratch below it, 2 outside both."""
    if addr + size <= base:
        return 1 if addr >= base - SCRATCH else 2
    return 0 if addr < base + WINDOW else 2


def entries(raw: bytes) -> list[tuple[int, int, int, int, int]]:
    """(pc, address, size, value, old) of each logged store, in order."""
    return [ENTRY.unpack_from(raw, i) for i in range(0, len(raw), ENTRY.size)]
