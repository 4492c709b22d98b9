"""The red-zone write log: the guest's stores into the watched window during a transaction, kept in
one buffer that the verifiers read only when they need them.

The 6.18 trampoline stores four words into the red zone on every hit, and a memory hook that
enters Python costs ~1.6 us a store (a ctypes callback, then a C call to read rip), as much as
the rest of a verified hit. So the hook is a few instructions of machine code, assembled with
keystone on first use and mapped executable (emu/verify/machine_code.py): before the first store
lands it copies the window (``uc_mem_read``), then it appends (pc, address, size, value) of each store (``uc_reg_read`` of
rip), and returns to Unicorn without entering Python. The tracker folds the log into its
transaction when it next looks (emu/verify/transaction.py).

Where executable memory cannot be mapped, a Python hook does the same through
:meth:`WriteLog.set_snapshot` and :meth:`WriteLog.record`.

Buffer layout (64-bit words, then bytes):
  0 count: stores seen since start() (it counts on past the capacity)
  1 capacity: entries the buffer holds
  2 window base: the address the snapshot copies from
  3 window length
  4, 5: uc_mem_read, uc_reg_read (function pointers the machine code calls)
  6 taken: the snapshot is taken (or not wanted)
  7 snapshot status: what uc_mem_read returned (0: the window was mapped)
  8 outside: stores seen since start() that landed neither in the window nor in the scratch below it
  9 reserved
  10.. snapshot (WINDOW bytes), then the entries (pc, address, size, value, old), 40 bytes each

While a transaction is open the hook's range is the whole address space (emu/verify/transaction.py):
a store into the red zone is logged as before; one that lands in the SCRATCH bytes right below it
(the design's own stack use) is ignored at once; any other store (the interrupted frame above rsp,
a global, another thread's stack) is logged too, with the bytes it overwrites (``old``, read
before the store lands), and counted in ``outside``: the machine-code fast paths settle nothing
while that count is not zero, and the memory check (emu/verify/checks.py) reads the entries.
"""

from __future__ import annotations

import ctypes
import struct

import unicorn.x86_const as x86

from emu.abi import RED_ZONE
from emu.cpu import Cpu, HookHandle, RawWriteHook, add_native_mem_write_hook, add_raw_mem_write_hook, native_function
from emu.verify.machine_code import mapped

COUNT, CAPACITY, BASE, LENGTH, MEM_READ, REG_READ, TAKEN, STATUS, OUTSIDE = range(9)
SNAPSHOT_OFFSET = 10 * 8
WINDOW = RED_ZONE
ENTRIES_OFFSET = SNAPSHOT_OFFSET + WINDOW
ENTRY = struct.Struct("<QQQqQ")  # pc, address, size, value (as Unicorn passes it: signed), old (outside stores)
CAPACITY_ENTRIES = 256
SCRATCH = 4096  # bytes below the red zone a design may use without a log entry (deeper ones are logged, and
# the memory check still lets through those on the interrupted thread's own stack mapping)

# The hook, AT&T syntax: (uc=rdi, type=esi, address=rdx, size=ecx, value=r8, log=r9). Five pushes
# leave rsp 16-byte aligned for the calls.
HOOK_SOURCE = f"""
push %rbx; push %r12; push %r13; push %r14; push %r15
mov %r9, %rbx; mov %rdi, %r12; mov %rdx, %r13; mov %ecx, %r14d; mov %r8, %r15
mov {8 * BASE}(%rbx), %rax
lea (%r13,%r14), %rdx
cmp %rax, %rdx
jbe below
lea {WINDOW}(%rax), %rdx
cmp %rdx, %r13
jae outside
cmpq $0, {8 * TAKEN}(%rbx)
jne snapshot_taken
movq $1, {8 * TAKEN}(%rbx)
mov %r12, %rdi; mov {8 * BASE}(%rbx), %rsi; lea {SNAPSHOT_OFFSET}(%rbx), %rdx; mov {8 * LENGTH}(%rbx), %rcx
call *{8 * MEM_READ}(%rbx)
mov %rax, {8 * STATUS}(%rbx)
snapshot_taken:
mov {8 * COUNT}(%rbx), %rax
cmp {8 * CAPACITY}(%rbx), %rax
jae full
imul ${ENTRY.size}, %rax, %rax
lea {ENTRIES_OFFSET}(%rbx,%rax), %rdx
movq $0, 32(%rdx)
jmp log_entry
below:
sub ${SCRATCH}, %rax
cmp %rax, %r13
jae done
outside:
incq {8 * OUTSIDE}(%rbx)
mov {8 * COUNT}(%rbx), %rax
cmp {8 * CAPACITY}(%rbx), %rax
jae full
imul ${ENTRY.size}, %rax, %rax
lea {ENTRIES_OFFSET + 32}(%rbx,%rax), %rdx
movq $0, (%rdx)
mov %r12, %rdi; mov %r13, %rsi; mov %r14, %rcx
call *{8 * MEM_READ}(%rbx)
mov {8 * COUNT}(%rbx), %rax
imul ${ENTRY.size}, %rax, %rax
lea {ENTRIES_OFFSET}(%rbx,%rax), %rdx
log_entry:
mov %r13, 8(%rdx); mov %r14, 16(%rdx); mov %r15, 24(%rdx)
mov %r12, %rdi; mov ${x86.UC_X86_REG_RIP}, %esi
call *{8 * REG_READ}(%rbx)
full:
incq {8 * COUNT}(%rbx)
done:
mov $1, %eax
pop %r15; pop %r14; pop %r13; pop %r12; pop %rbx
ret
"""


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

    def add_hook(self, cpu: Cpu, begin: int, end: int, fallback: RawWriteHook) -> tuple[HookHandle, bool]:
        """The machine-code hook over [begin, end], or ``fallback`` (which calls :meth:`record`)
        where it cannot be mapped. True: native."""
        native = mapped(HOOK_SOURCE)
        if native is None:
            return add_raw_mem_write_hook(cpu, fallback, begin, end), False
        return add_native_mem_write_hook(cpu, native, ctypes.addressof(self._buf), begin, end), True

    @property
    def address(self) -> int:
        """Where the buffer lies (for machine code that starts the log itself)."""
        return ctypes.addressof(self._buf)

    def start(self, base: int, snapshot_wanted: bool) -> None:
        """A transaction (re)starts watching the window at ``base``: no stores logged yet; the
        window is copied before the first store if ``snapshot_wanted``."""
        words = self._words
        words[COUNT] = 0
        words[BASE] = base
        words[TAKEN] = 0 if snapshot_wanted else 1
        words[STATUS] = 0
        words[OUTSIDE] = 0

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

    def set_snapshot(self, window: bytes) -> None:
        self._bytes[SNAPSHOT_OFFSET:ENTRIES_OFFSET] = window
        self._words[TAKEN] = 1

    def record(self, pc: int, addr: int, size: int, value: int, old: bytes | None = None) -> None:
        """What the machine code does after the snapshot, for a Python hook; ``old``: the bytes an
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
    """Where a store lands, as the machine code sorts it: 0 the red zone at ``base``, 1 the
    scratch below it, 2 outside both."""
    if addr + size <= base:
        return 1 if addr >= base - SCRATCH else 2
    return 0 if addr < base + WINDOW else 2


def entries(raw: bytes) -> list[tuple[int, int, int, int, int]]:
    """(pc, address, size, value, old) of each logged store, in order."""
    return [ENTRY.unpack_from(raw, i) for i in range(0, len(raw), ENTRY.size)]
