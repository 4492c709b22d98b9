"""The store watch: the stores a probe hit makes, seen without a memory hook.

Unicorn takes every load and store of the whole program off its fast path while any memory-write
hook exists (and keeps a page's stores slow wherever one covers it), hit or no hit. A hit runs a
handful of instructions: the patched site, then code in the kernel's pages (the trampoline or slot,
the out-of-line step, the return trampoline). The watch hooks that code alone: before each of its
instructions, while a transaction is open (the write log's OPEN word), it computes the instruction's
stores from formulas decoded once (emu/cpu/memops.py) and logs them in the write log with the bytes
each is about to overwrite. What a store wrote is read when the log is read (``complete``), or before
another store lands over it.

Two things it cannot see are noted for the checks instead of being missed: an instruction whose stores
its text does not tell (``unseen``: the memory check), and a branch or call from the watched code to
code that is not watched (``left``: the resume check), whose stores would go unseen.

With the C extension the hook is C (emu/hotpath_src/writelog.c, ``watch_hook``) and Python only decodes
an instruction the C table lacks; without it, the Python hook here does the same work.

Block layout (64-bit words; struct store_watch in emu/hotpath_src/verify.h):
  0 the write log   1, 2 uc_reg_read, uc_mem_read   3 the decode callback   4 the record table
  5 its shift (64 - log2 of its slots)   6, 7 the ranges' count and their (start, end, flags) triples
  8 records decoded   9 rcx's register id
A record (struct watch_record, 32 words): pc, length, flags (KNOWN, CONDITIONAL), the transfer kind,
its target (an address or a register), the store count, three operands of 7 words.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from emu import hotpath
from emu.cpu import Cpu, HookHandle, Reg, native_function
from emu.cpu.memops import MemOp, Shape, Transfer, decode
from emu.hotpath.write_log import WINDOW, MemReader, WriteLog, classify, native_hot_path

if TYPE_CHECKING:
    from types import ModuleType

OPS = hotpath.constant("WATCH_OPS", 3)  # two stores, then an indirect branch's memory operand
# struct store_watch, struct watch_record and struct watch_op of verify.h, where the extension says they lie
_BLOCK = "log reg_read mem_read decode table shift nranges ranges decoded rcx"
_BLOCK_LAYOUT = hotpath.struct_layout("store_watch", [(name, 8) for name in _BLOCK.split()])
LOG, REG_READ, MEM_READ, DECODE, TABLE, SHIFT, NRANGES, RANGES, DECODED, RCX = hotpath.words(_BLOCK_LAYOUT, _BLOCK)
BLOCK_WORDS = _BLOCK_LAYOUT["sizeof"] // 8
_OP = "base index scale disp size segment flags"
_OP_LAYOUT = hotpath.struct_layout("watch_op", [(name, 8) for name in _OP.split()])
OP_FIELDS = hotpath.words(_OP_LAYOUT, _OP)
OP_WORDS = _OP_LAYOUT["sizeof"] // 8
_RECORD = "pc length flags transfer target nstores ops"
_RECORD_LAYOUT = hotpath.struct_layout("watch_record", [(name, 8) for name in _RECORD.split()[:-1]]
                                       + [("ops", 8 * OP_WORDS * OPS), ("pad", 8 * 5)])
R_PC, R_LENGTH, R_FLAGS, R_TRANSFER, R_TARGET, R_NSTORES, R_OPS = hotpath.words(_RECORD_LAYOUT, _RECORD)
RECORD_WORDS = _RECORD_LAYOUT["sizeof"] // 8
TABLE_BITS = 9
KNOWN, CONDITIONAL = hotpath.constant("WATCH_KNOWN", 1), hotpath.constant("WATCH_CONDITIONAL", 2)
OP_REP, OP_ADDR32 = hotpath.constant("WATCH_OP_REP", 1), hotpath.constant("WATCH_OP_ADDR32", 2)
# a range whose transfers the kernel answers for: the out-of-line step runs there
NO_EXITS = hotpath.constant("WATCH_RANGE_NO_EXITS", 1)
_TRANSFER = {Transfer.NONE: hotpath.constant("WATCH_T_NONE", 0), Transfer.DIRECT: hotpath.constant("WATCH_T_DIRECT", 1),
             Transfer.RETURN: hotpath.constant("WATCH_T_RETURN", 4), Transfer.KERNEL: hotpath.constant("WATCH_T_KERNEL", 5)}
T_REG, T_MEM = hotpath.constant("WATCH_T_REG", 2), hotpath.constant("WATCH_T_MEM", 3)  # INDIRECT: through either
CHUNK = 8  # a log entry holds up to 8 bytes, as Unicorn reports a store
MASK64 = (1 << 64) - 1


def _slot(pc: int) -> int:
    """The table slot of ``pc``: Fibonacci hashing, as writelog.c's slot()."""
    return ((pc * 0x9E3779B97F4A7C15) & MASK64) >> (64 - TABLE_BITS)


def _op_values(op: MemOp) -> tuple[int, ...]:
    """struct watch_op's fields, in _OP's order."""
    return (op.base, op.index, op.scale, op.disp & MASK64, op.size, op.segment,
            (OP_REP if op.rep else 0) | (OP_ADDR32 if op.addr32 else 0))


def record_words(pc: int, shape: Shape) -> list[int]:
    """``shape`` as struct watch_record's words."""
    ops = list(shape.stores[: OPS - 1])
    known = shape.known and len(shape.stores) <= len(ops)  # more than the record holds: unseen
    words = [0] * RECORD_WORDS
    words[R_PC], words[R_LENGTH], words[R_NSTORES] = pc, shape.length, len(ops)
    words[R_FLAGS] = KNOWN * known | CONDITIONAL * shape.conditional
    if shape.transfer is Transfer.INDIRECT:
        words[R_TRANSFER], words[R_TARGET] = (T_MEM, 0) if shape.target_op is not None else (T_REG, shape.target_reg)
    else:
        words[R_TRANSFER], words[R_TARGET] = _TRANSFER[shape.transfer], shape.target
    padded = ops + [MemOp()] * (OPS - 1 - len(ops)) + [shape.target_op or MemOp()]
    for i, op in enumerate(padded):
        for field, value in zip(OP_FIELDS, _op_values(op), strict=True):
            words[R_OPS + i * OP_WORDS + field] = value
    return words


class StoreWatch:
    """The watch of one tracker: ranges of code hooked, the record table and the Python twin."""

    def __init__(self, cpu: Cpu, log: WriteLog, read: MemReader) -> None:
        self.cpu, self.log, self._read = cpu, log, read
        self._native: ModuleType | None = native_hot_path()
        self._ranges: dict[tuple[int, int], tuple[int, HookHandle]] = {}  # (start, end) -> flags, its hook
        self._range_buf = (ctypes.c_uint64 * 3)()
        self._block = (ctypes.c_uint64 * BLOCK_WORDS)()
        self._table = (ctypes.c_uint64 * (RECORD_WORDS << TABLE_BITS))()
        w = self._block
        w[LOG], w[REG_READ], w[MEM_READ] = log.address, native_function("uc_reg_read"), native_function("uc_mem_read")
        w[TABLE], w[SHIFT], w[RCX] = ctypes.addressof(self._table), 64 - TABLE_BITS, Reg.RCX
        self._filled: dict[int, int] = {}  # pc -> its slot, for the records in the C table
        if self._native is not None:
            w[DECODE] = cpu.hooks.python_address(self._fill_record)
            cpu.code_observers.append(self._forget)
        self._uc = cpu.handle.value

    @property
    def native(self) -> bool:
        """The hook is C."""
        return self._native is not None

    @property
    def address(self) -> int:
        """The block's address (edges.c's site hook calls the watch for the site's instruction)."""
        return ctypes.addressof(self._block)

    @property
    def decoded(self) -> int:
        """Instructions decoded for the C table."""
        return int(self._block[DECODED])

    # ------------------------------------------------------------- what is watched
    def watch(self, start: int, end: int, *, exits_free: bool = False) -> None:
        """Watch the instructions in [start, end); ``exits_free``: their branches are the kernel's
        business (the out-of-line step). Code translated before is dropped, so the hook sees it."""
        if end <= start or (start, end) in self._ranges:
            return
        if self._native is not None:
            hook = self.cpu.hooks.add_native_code(self._native.watch_hook, self.address, start, end - 1)
        else:
            hook = self.cpu.hooks.add_raw_code(self._python_hook, start, end - 1)
        self._ranges[start, end] = (NO_EXITS if exits_free else 0, hook)
        self._publish()
        self.cpu.flush_code(start, end)

    def unwatch(self, start: int, end: int) -> None:
        entry = self._ranges.pop((start, end), None)
        if entry is not None:
            self.cpu.hooks.remove(entry[1])
            self._publish()

    def _publish(self) -> None:
        triples = [x for (lo, hi), (flags, _hook) in self._ranges.items() for x in (lo, hi, flags)]
        self._range_buf = (ctypes.c_uint64 * max(len(triples), 3))(*triples)
        self._block[RANGES], self._block[NRANGES] = ctypes.addressof(self._range_buf), len(self._ranges)

    def _range_flags(self, addr: int) -> int | None:
        for (lo, hi), (flags, _hook) in self._ranges.items():
            if lo <= addr < hi:
                return flags
        return None

    # ---------------------------------------------------------------- per instruction
    def instruction(self, address: int, size: int) -> None:
        """The instruction at ``address`` is about to run in an open transaction (the site's own)."""
        if self._native is not None:
            self._native.watch_instruction(self._uc, self.address, address, size)
        else:
            self._on_instruction(address, size)

    def complete(self) -> None:
        """The logged stores' values, read now (before the log is read or the kernel writes)."""
        if self._native is not None:
            self._native.watch_complete(self._uc, self.log.address)
        else:
            self.log.complete(self._read)

    def _fill_record(self, _uc: object, address: int, size: int, _ud: object) -> None:
        """For the C table: decode the instruction at ``address`` into its slot."""
        try:
            code = self._read(address, size)
            shape = None if code is None else decode(code, address)
            if code is not None and shape is not None:
                slot = _slot(address)
                base = RECORD_WORDS * slot
                for i, word in enumerate(record_words(address, shape)):
                    self._table[base + i] = word
                self._filled[address] = slot
        except BaseException as exc:
            self.cpu.hooks.raised(exc)

    def _forget(self, begin: int, end: int) -> None:
        """The code in [begin, end) may have changed: its records go (the C table holds no bytes to check)."""
        for pc in [pc for pc in self._filled if begin <= pc < end]:
            slot = self._filled.pop(pc)
            if self._table[RECORD_WORDS * slot + R_PC] == pc:
                self._table[RECORD_WORDS * slot + R_PC] = 0

    # ------------------------------------------------------------ the Python twin
    def _python_hook(self, _uc: object, address: int, size: int, _ud: object) -> None:
        try:
            if self.log.is_open:
                self._on_instruction(address, size)
        except BaseException as exc:
            self.cpu.hooks.raised(exc)

    def _on_instruction(self, address: int, size: int) -> None:
        """What writelog.c's watch_instruction does."""
        log = self.log
        log.resolve_branch(address)
        code = self._read(address, size)
        shape = None if code is None else decode(code, address)
        if shape is None or not shape.known:
            log.note_unseen(address)
            if shape is None:
                return
        reg = cast(Callable[[int], int], self.cpu.read)  # it takes any register id
        for op in shape.stores:
            at, n = op.span(reg)
            for done in range(0, n, CHUNK):
                self._log_store(address, (at + done) & MASK64, min(CHUNK, n - done))
        if shape.transfer not in (Transfer.NONE, Transfer.RETURN, Transfer.KERNEL) and self._range_flags(address) != NO_EXITS:
            self._check_transfer(shape, address)

    def _log_store(self, pc: int, addr: int, size: int) -> None:
        log = self.log
        if log.pending_overlaps(addr, size):
            log.complete(self._read)  # a store not read yet lies where this one lands
        where = classify(addr, size, log.base)
        if where == 1:
            return
        if where == 2:  # not landed yet: the bytes it overwrites
            log.record(pc, addr, size, 0, self._read(addr, size) or bytes(size))
            return
        if log.snapshot_pending:  # the first store into it, not landed yet: the red zone as it was
            log.set_snapshot(self._read(log.base, WINDOW))
        log.record(pc, addr, size, 0)

    def _check_transfer(self, shape: Shape, address: int) -> None:
        if shape.transfer is Transfer.DIRECT:
            to = shape.target
        elif shape.target_op is not None:
            at, _n = shape.target_op.span(cast(Callable[[int], int], self.cpu.read))
            to = int.from_bytes(self._read(at, 8) or bytes(8), "little")
        else:
            to = self.cpu.read(Reg(shape.target_reg))
        if self._range_flags(to) is not None:
            return
        if shape.conditional:
            self.log.note_branch(address, to, address + shape.length)
        else:
            self.log.note_left(address, to)
