"""The red-zone write log: the guest's stores during a transaction, kept in one buffer that the
verifiers read only when they need them.

A store into the red zone is logged as (pc, address, size, value), and before the first one lands
the red zone is copied: that copy is the reference the red-zone check compares with. A store into
the SCRATCH bytes right below the red zone (the design's own stack use) is ignored. Any other store
(the interrupted frame above rsp, a global, another thread's stack) is logged too, with the bytes
it overwrites (``old``, read before the store lands), and counted in ``outside``: no fast path
settles a hit while that count is not zero, and the memory check (emu/verify/checks/memory.py) reads the
entries.

The store watch fills it (emu/hotpath/store_watch.py): it logs an instruction's stores before the
instruction runs; their values are read later (``complete``). It also notes an instruction
whose stores it could not follow (``unseen``) and the first transfer out of the watched code
(``left``). With the C extension it is C (emu/hotpath_src/writelog.c); without it, Python does the same.

Buffer layout (64-bit words, then bytes; struct write_log in emu/hotpath_src/verify.h):
  0 count: stores seen since start() (it counts on past the capacity)
  1 capacity: entries the buffer holds     2 the red zone's base     3 its length
  4 uc_mem_read (for the C watch)
  5 taken: the snapshot is taken (or not wanted)
  6 snapshot status: what uc_mem_read returned (0: the red zone was mapped)
  7 outside: stores since start() that landed neither in the red zone nor in the scratch below it
  8 open: a transaction is open (the watch logs)     9 SCRATCH
  10 pending: entries from here on have no value yet     11, 12 unseen: instructions whose stores were
  not followed, and the first one's pc     13, 14 left: the first transfer out of the watched code (pc, target)
  15-17 a conditional branch out (pc, target, the next instruction's address): taken unless that runs next
  18.. snapshot (WINDOW bytes), then the entries (pc, address, size, value, old), 40 bytes each
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from types import ModuleType

from emu import hotpath
from emu.abi import RED_ZONE
from emu.cpu import native_function

WINDOW = RED_ZONE
# struct write_log of verify.h, where the extension says its fields lie: the header words, the snapshot, the entries
_HEADER = ("count capacity base length mem_read taken status outside open scratch pending unseen unseen_pc left_pc "
           "left_to branch_pc branch_to branch_next")
_LAYOUT = hotpath.struct_layout("write_log", [(name, 8) for name in _HEADER.split()]
                                + [("snapshot", WINDOW), ("entries", 0)])
COUNT, CAPACITY, BASE, LENGTH, MEM_READ, TAKEN, STATUS, OUTSIDE, OPEN, SCRATCH_WORD, PENDING, UNSEEN, UNSEEN_PC, \
    LEFT_PC, LEFT_TO, BRANCH_PC, BRANCH_TO, BRANCH_NEXT = hotpath.words(_LAYOUT, _HEADER)
SNAPSHOT_OFFSET, ENTRIES_OFFSET = _LAYOUT["snapshot"], _LAYOUT["entries"]
ENTRY = struct.Struct("=QQQqQ")  # pc, address, size, value (the bytes stored, little-endian), old (outside stores)
CAPACITY_ENTRIES = 256
SCRATCH = 4096  # bytes below the red zone a design may use without a log entry (deeper ones are logged, and
# the memory check still lets through those on the interrupted thread's own stack mapping)
assert ENTRIES_OFFSET - SNAPSHOT_OFFSET == WINDOW  # the snapshot's room in struct write_log
MemReader = Callable[[int, int], "bytes | None"]  # (address, size) -> the bytes, None if unmapped (RawState.mem)


def native_hot_path() -> ModuleType | None:
    """The C extension, if it runs (built for this ABI, it has the verifiers' hooks); None: the Python
    hooks do their work. Read at each call: tests switch it."""
    return hotpath.native


class WriteLog:
    def __init__(self, capacity: int = CAPACITY_ENTRIES) -> None:
        self._buf = ctypes.create_string_buffer(ENTRIES_OFFSET + ENTRY.size * capacity)
        self._bytes = memoryview(self._buf).cast("B")
        self._words = self._bytes.cast("Q")
        self._words[CAPACITY] = capacity
        self._words[LENGTH] = WINDOW
        self._words[MEM_READ] = native_function("uc_mem_read")
        self._words[TAKEN] = 1
        self._words[SCRATCH_WORD] = SCRATCH

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
        words[OUTSIDE] = words[PENDING] = words[UNSEEN] = words[UNSEEN_PC] = words[LEFT_PC] = words[LEFT_TO] = 0
        words[BRANCH_PC] = 0
        words[OPEN] = 1

    def close(self) -> None:
        """No transaction is open: the hook logs nothing until the next start()."""
        self._words[OPEN] = 0

    @property
    def base(self) -> int:
        """The red zone's lowest address."""
        return self._words[BASE]

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

    @property
    def flagged(self) -> bool:
        """The watch saw a store, or something it could not follow, since start() or the last take()."""
        w = self._words
        return bool(w[COUNT] or w[UNSEEN] or w[LEFT_PC] or w[BRANCH_PC])

    @property
    def unseen(self) -> tuple[int, int]:
        """(instructions whose stores the watch could not follow, the first one's pc)."""
        return self._words[UNSEEN], self._words[UNSEEN_PC]

    @property
    def left(self) -> tuple[int, int] | None:
        """(pc, target) of the first transfer out of the watched code, if any."""
        w = self._words
        return (w[LEFT_PC], w[LEFT_TO]) if w[LEFT_PC] else None

    def note_unseen(self, pc: int) -> None:
        w = self._words
        if not w[UNSEEN]:
            w[UNSEEN_PC] = pc
        w[UNSEEN] += 1

    def note_left(self, pc: int, target: int) -> None:
        w = self._words
        if not w[LEFT_PC]:
            w[LEFT_PC], w[LEFT_TO] = pc, target

    def note_branch(self, pc: int, target: int, after: int) -> None:
        """A conditional branch out of the watched code: taken unless ``after`` runs next."""
        w = self._words
        w[BRANCH_PC], w[BRANCH_TO], w[BRANCH_NEXT] = pc, target, after

    def resolve_branch(self, address: int | None) -> None:
        """The watched instruction at ``address`` runs next (None: none did, the log is read): the
        pending conditional branch out was taken unless it is the one right after it."""
        w = self._words
        if w[BRANCH_PC]:
            if address != w[BRANCH_NEXT]:
                self.note_left(w[BRANCH_PC], w[BRANCH_TO])
            w[BRANCH_PC] = 0

    def pending_overlaps(self, addr: int, size: int) -> bool:
        """A logged store whose value is not read yet lies in [addr, addr + size)."""
        w = self._words
        for i in range(w[PENDING], min(w[COUNT], w[CAPACITY])):
            _pc, at, n, _value, _old = ENTRY.unpack_from(self._bytes, ENTRIES_OFFSET + ENTRY.size * i)
            if at < addr + size and addr < at + n:
                return True
        return False

    def complete(self, read: MemReader) -> None:
        """Each logged store's value, read now that it has run (watch_complete in C; ``read`` reads guest memory)."""
        self.resolve_branch(None)
        w = self._words
        for i in range(w[PENDING], min(w[COUNT], w[CAPACITY])):
            at = ENTRIES_OFFSET + ENTRY.size * i
            pc, addr, size, _value, old = ENTRY.unpack_from(self._bytes, at)
            stored = (read(addr, size) or bytes(size)).ljust(8, b"\0")
            ENTRY.pack_into(self._bytes, at, pc, addr, size, int.from_bytes(stored, "little", signed=True), old)
        w[PENDING] = w[COUNT]

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
        words[COUNT] = words[OUTSIDE] = words[PENDING] = words[UNSEEN] = words[UNSEEN_PC] = words[LEFT_PC] = 0
        words[LEFT_TO] = 0
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
        """What the C watch does after the snapshot, for the Python one; ``old``: the bytes an
        outside store overwrites (None: a store into the red zone); ``value``: 0 until complete()."""
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
