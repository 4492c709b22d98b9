"""The edges of a probe hit in C (emu/hotpath_src/edges.c), so that a hit that left everything as
it found it is settled without entering Python:

* the **site hook** counts the hit (SiteCounters), reads the whole state (the RawState layout) and
  the red zone into the control block, starts the write log (which copies the red zone again
  only if that read failed; emu/hotpath/write_log.py) and numbers the now *open* transaction
  (SEQ). A store outside the red zone and the scratch below it keeps every fast path here from
  settling the hit. The tracker makes a Transaction of it only when Python needs one
  (emu/verify/tracker.py): a consumer with a handler, a context switch, a hit the C hands over.
* the **ret hook** settles an *armed* transaction: the ``ret`` is the one it was armed for, it
  returns to the address right after the site, rsp comes back to where it was, every other
  register (rflags exactly) and the extended state are byte for byte the start state, and the red
  zone is byte for byte the site hook's copy. The tracker arms a transaction (emu/verify/resume.py)
  only when nothing else can change the verdict: a NOP-class site, no consumer that could change a
  register, no out-of-line step. That is the tracker's own fast path (TransactionTracker.finish),
  moved.
* **settle_return**, called from Python as the kernel returns to user mode (IRET, INT3 emulation),
  makes the same test of a NOP-class site; **settle_compared** tests a site that is not a NOP
  against its cached reference (a Comparison: byte ranges of the end state and the red zone that
  must equal the start's or fixed bytes).

Anything else is handed to the Python hook with Unicorn's arguments: a site hit while a
transaction is open, a ``ret`` of a transaction that is not armed, or an armed one that fails any
test above. Handing over disarms it. Without the C extension the tracker's Python hooks do all of
this themselves (no NativeEdges).

Control block layout (64-bit words, struct edges in emu/hotpath_src/verify.h), then the buffers:
  0 state: IDLE, OPEN or ARMED
  1 site: the open transaction's site       2 next: the armed transaction's resume address
  3 finished: transactions the C settled
  4, 5: uc_reg_read_batch, uc_mem_read      6, 7: the Python site and ret hooks
  8 the write log's buffer
  9 the register count   10-12 the register ids, start and end pointer arrays   13 a word read
  14 the ret the armed transaction leaves by   15 the bytes it pops (8 + its immediate)
  16 what uc_mem_read returned for the red zone at the site (0: read)
  17 SEQ: the number of the site hook's last transaction
  18-21 the start, end, red-zone and start red-zone buffers' addresses
  22 a state buffer's length   23 RAW_KEPT
  24 PY_SEQ: the transaction the tracker has a Transaction for
  25-27 KERNEL_SEQ, KERNEL_PATH, KERNEL_EXIT: the last transaction whose kernel part the C syscall front
        did (emu/hotpath_src/fastsys.c), the handler chain's path (NATIVE_PATHS) and the exit (KERNEL_EXITS)
  28-30 the uc_context_save, _reg_read and _reg_read_batch functions
  31, 32 the start and end snapshots (uc_context *; 0: the hooks read registers instead)
  33, 34 (word index, mask) pairs for the words of a snapshot that hold registers, and their count
  35, 36 where a snapshot holds rip and rsp
  37 the start buffer holds every register (else rip and rsp only)   38, 39 the start snapshot's
  rflags is read, and its value   40 the rflags register's id
  41 the open transaction's number among its site's hits
  42 the buffer of hits that repeat one Python judged (emu/hotpath/repeats.py; 0: none are held back)
  43 the store watch (emu/hotpath/store_watch.py): the site hook has it log the site's own stores

Snapshots: a uc_context_save copies the whole CPU in one memcpy, where reading the 48 registers of a
state buffer costs a call each. The site hook saves one and reads only rip and rsp; the end of a hit
compares a second one with it as bytes (edges.c says how), and reads registers only if they differ.
context_snapshots() checks first that a snapshot holds every register of STATE_REGS exactly as the
CPU reads it, and finds where the CPU's part of a snapshot begins; if either fails, the hooks read
registers, as before.
"""

from __future__ import annotations

import ctypes
from types import ModuleType

from emu import hotpath
from emu.cpu import (
    STATE_BYTES,
    STATE_OFFSETS,
    STATE_REGS,
    Cpu,
    HookHandle,
    RawCodeHook,
    Reg,
    native_function,
)
from emu.cpu.effects import EffectSpans
from emu.cpu.snapshots import context_snapshots
from emu.cpu.state import RAW_KEPT, RAW_RIP, RAW_RSP
from emu.hotpath.repeats import RepeatedVerdicts
from emu.hotpath.write_log import WINDOW, WriteLog, native_hot_path

# struct edges of verify.h, where the extension says its words lie; the buffers follow it
_FIELDS = ("state site next finished reg_read_batch mem_read py_site py_ret log nregs ids start_ptrs end_ptrs word "
           "ret_pc popped start_redzone_status seq start end redzone start_redzone state_bytes kept python_seq "
           "kernel_seq kernel_path kernel_exit ctx_save ctx_reg_read ctx_reg_read_batch ctx_start ctx_end ctx_words "
           "ctx_nwords ctx_rip ctx_rsp start_full start_flags_read start_flags flags_id hit repeats watch")
_LAYOUT = hotpath.struct_layout("edges", [(name, 8) for name in _FIELDS.split()])
(STATE, SITE, NEXT, FINISHED, REG_BATCH, MEM_READ, PY_SITE, PY_RET, LOG, NREGS, IDS, START_PTRS, END_PTRS,
 WORD, RET_PC, POPPED, START_REDZONE_STATUS, SEQ, START_AT, END_AT, REDZONE_AT, START_REDZONE_AT, STATE_LEN,
 KEPT, PY_SEQ, KERNEL_SEQ, KERNEL_PATH, KERNEL_EXIT, CTX_SAVE, CTX_REG_READ, CTX_READ_BATCH,
 CTX_START, CTX_END, CTX_WORDS, CTX_NWORDS, CTX_RIP, CTX_RSP, START_FULL, START_FLAGS_READ, START_FLAGS,
 FLAGS_ID, HIT, REPEATS, WATCH) = hotpath.words(_LAYOUT, _FIELDS)
# EDGES_EXIT_* (verify.h): the exit counted in UprobeStats.exits (none for an INT3)
KERNEL_EXITS = hotpath.in_c_order({"sysret": "EDGES_EXIT_SYSRET", "iret": "EDGES_EXIT_IRET", None: "EDGES_EXIT_NONE"})
START = _LAYOUT["sizeof"]  # byte offsets of the buffers
END = START + STATE_BYTES
REDZONE = END + STATE_BYTES
START_REDZONE = REDZONE + WINDOW
IDS_AT = START_REDZONE + WINDOW
START_PTRS_AT = IDS_AT + (4 * len(STATE_REGS) + 7) // 8 * 8
END_PTRS_AT = START_PTRS_AT + 8 * len(STATE_REGS)
BLOCK_BYTES = END_PTRS_AT + 8 * len(STATE_REGS)
START_RSP = (START + RAW_RSP) // 8  # the word of the start state's rsp
ADDRESS_MASK = (1 << 64) - 1
assert RAW_RIP == 0 and RAW_RSP == 8  # where edges.c finds them


# The state word (plain ints: the tracker compares it on every hit).
IDLE = hotpath.constant("EDGES_IDLE", 0)
OPEN = hotpath.constant("EDGES_OPEN", 1)  # a transaction is open (the site hook's, numbered SEQ, or one the tracker started)
ARMED = hotpath.constant("EDGES_ARMED", 2)  # ... and the ret hook may settle it


RECORD_WORDS = 3  # a site's record: the control block's address, the hit count, LAZY_REDZONE or 0
# the site hook does not copy the red zone: the write log copies it before the first store
LAZY_REDZONE = hotpath.constant("SITE_LAZY_REDZONE", 1)
REDZONE_LAZY = hotpath.constant("REDZONE_LAZY", 0x10000)  # START_REDZONE_STATUS then: not copied at the site


class SiteCounters:
    """Per probe site: the record its C hook gets (the control block's address, then the
    site's hit count, which the hook counts itself, then its flags)."""

    def __init__(self, count: int, block: int) -> None:
        self._records = (ctypes.c_uint64 * (RECORD_WORDS * count))(*[block, 0, 0] * count)
        self._words = memoryview(self._records).cast("B").cast("Q")

    def record(self, index: int) -> int:
        return ctypes.addressof(self._records) + 8 * RECORD_WORDS * index

    def copy_redzone_lazily(self, index: int) -> None:
        """A NOP-class site: the red zone it leaves is unchanged if no store reached it (edges.c)."""
        self._words[RECORD_WORDS * index + 2] = LAZY_REDZONE

    def hits(self, index: int) -> int:
        return self._words[RECORD_WORDS * index + 1]

    def count_hit(self, index: int, by: int = 1) -> int:
        """One more hit (one the C did not see), or ``by`` more; the hit's number."""
        words = self._words
        words[RECORD_WORDS * index + 1] += by
        return words[RECORD_WORDS * index + 1]


class Comparison:
    """EffectSpans as settle_compared's list of (a, b, length), over the block's buffers and the
    constants kept here."""

    def __init__(self, block: int, spans: EffectSpans, rip_advance: int) -> None:
        constants = [(spans.rip - rip_advance) & ADDRESS_MASK, spans.rsp]
        fixed = b"".join(v.to_bytes(8, "little") for v in constants) + b"".join(
            data for _, data in (*spans.changed, *spans.redzone_stored))
        self._constants = ctypes.create_string_buffer(fixed, len(fixed) or 1)
        const = ctypes.addressof(self._constants)
        ops = [(block + END + RAW_RIP, const, 8), (block + END + RAW_RSP, const + 8, 8)]
        ops += [(block + END + lo, block + START + lo, hi - lo) for lo, hi in spans.same]
        ops += [(block + REDZONE + lo, block + START_REDZONE + lo, hi - lo) for lo, hi in spans.redzone_same]
        at = const + 16
        for offset, data in (*[(END + lo, d) for lo, d in spans.changed],
                             *[(REDZONE + lo, d) for lo, d in spans.redzone_stored]):
            ops.append((block + offset, at, len(data)))
            at += len(data)
        self._ops = (ctypes.c_uint64 * (3 * len(ops) + 3))(*[x for op in ops for x in op], 0, 0, 0)
        self.ops = ctypes.addressof(self._ops)


class NativeEdges:
    """The control block of one tracker and the C functions that use it. :meth:`create` returns
    None without the C extension: the tracker's Python hooks do the same work then."""

    def __init__(self, cpu: Cpu, native: ModuleType, log: WriteLog, watch: int, on_site: RawCodeHook) -> None:
        self.cpu = cpu
        self._site_code, self._ret_code = native.edges_site_hook, native.edges_ret_hook
        self._settle_return, self._read_end = native.edges_settle_return, native.edges_read_end
        self._settle_compared = native.edges_settle_compared
        self._block = ctypes.create_string_buffer(BLOCK_BYTES)
        self._bytes = memoryview(self._block).cast("B")
        self.words = self._bytes.cast("Q")
        base = self.address = ctypes.addressof(self._block)
        self._uc = cpu.handle.value
        n = len(STATE_REGS)
        (ctypes.c_int * n).from_address(base + IDS_AT)[:] = list(STATE_REGS)
        (ctypes.c_uint64 * n).from_address(base + START_PTRS_AT)[:] = [base + START + o for o in STATE_OFFSETS]
        (ctypes.c_uint64 * n).from_address(base + END_PTRS_AT)[:] = [base + END + o for o in STATE_OFFSETS]
        w = self.words
        w[REG_BATCH], w[MEM_READ] = native_function("uc_reg_read_batch"), native_function("uc_mem_read")
        w[PY_SITE] = cpu.hooks.python_address(on_site)
        w[LOG], w[WATCH] = log.address, watch
        w[NREGS], w[IDS], w[START_PTRS], w[END_PTRS] = n, base + IDS_AT, base + START_PTRS_AT, base + END_PTRS_AT
        w[START_AT], w[END_AT], w[REDZONE_AT], w[START_REDZONE_AT] = (
            base + START, base + END, base + REDZONE, base + START_REDZONE)
        w[STATE_LEN], w[KEPT] = STATE_BYTES, RAW_KEPT
        w[START_FULL] = 1
        self.repeats: RepeatedVerdicts | None = RepeatedVerdicts()
        w[REPEATS] = self.repeats.address
        self._fill_start = native.edges_fill_start
        self._snapshots = context_snapshots(cpu)
        if self._snapshots is not None:
            w[CTX_SAVE], w[CTX_REG_READ], w[CTX_READ_BATCH] = (native_function(name) for name in (
                "uc_context_save", "uc_context_reg_read", "uc_context_reg_read_batch"))
            snaps = self._snapshots
            w[CTX_START], w[CTX_END] = snaps.addresses
            w[CTX_WORDS], w[CTX_NWORDS] = ctypes.addressof(snaps.pairs), snaps.word_count
            w[CTX_RIP], w[CTX_RSP], w[FLAGS_ID] = snaps.rip_offset, snaps.rsp_offset, Reg.RFLAGS

    @classmethod
    def create(cls, cpu: Cpu, log: WriteLog, watch: int, on_site: RawCodeHook) -> NativeEdges | None:
        """``watch``: the store watch's block (StoreWatch.address)."""
        native = native_hot_path()
        return None if native is None else cls(cpu, native, log, watch, on_site)

    def add_site_hook(self, address: int, record: int) -> HookHandle:
        """The C hook at a probe site; ``record``: the site's in SiteCounters."""
        return self.cpu.hooks.add_native_code(self._site_code, record, address, address)

    def set_ret_fallback(self, on_ret: RawCodeHook) -> None:
        """The Python hook every ``ret`` hook hands over to."""
        self.words[PY_RET] = self.cpu.hooks.python_address(on_ret)

    def add_ret_hook(self, address: int) -> HookHandle:
        """A hook on a ``ret``; it settles only a transaction armed for that ``ret``."""
        assert self.words[PY_RET], "set_ret_fallback first"
        return self.cpu.hooks.add_native_code(self._ret_code, self.address, address, address)

    def start_raw(self) -> bytes:
        """The state the site hook found (the RawState layout)."""
        self._fill_start(self.address)
        return self._bytes[START:END].tobytes()

    @property
    def snapshots(self) -> bool:
        """The hooks compare whole-CPU snapshots (else they read every register)."""
        return self._snapshots is not None

    def start_redzone(self) -> bytes | None:
        """The red zone as the site hook found it; None if it could not be read (unmapped)."""
        if self.words[START_REDZONE_STATUS] & 0xFFFFFFFF:
            return None
        return self._bytes[START_REDZONE:IDS_AT].tobytes()

    @property
    def has_start_redzone(self) -> bool:
        return not self.words[START_REDZONE_STATUS] & 0xFFFFFFFF

    def read_end(self, base: int) -> tuple[bytes, bytes | None]:
        """The state now (the RawState layout) and the red zone at ``base`` (None: unmapped), in
        one C call."""
        status = self._read_end(self._uc, self.address, base)
        return self._bytes[END:REDZONE].tobytes(), None if status else self._bytes[REDZONE:START_REDZONE].tobytes()

    def settle_return(self, rip_advance: int, resume: int) -> bool:
        """The kernel returns to user mode at rip + ``rip_advance``: settle the site hook's open
        transaction (True) if that is ``resume`` and everything is as the site hook found it."""
        return bool(self._settle_return(self._uc, self.address, rip_advance, resume))

    def comparison(self, spans: EffectSpans, rip_advance: int) -> Comparison:
        """``spans`` for settle_compared, where the kernel returns to rip + ``rip_advance``."""
        return Comparison(self.address, spans, rip_advance)

    def settle_compared(self, base: int, comparison: Comparison) -> bool:
        """The kernel returns to user mode: settle the site hook's open transaction (True) if the
        state and the red zone at ``base`` pass ``comparison``."""
        return bool(self._settle_compared(self._uc, self.address, base, comparison.ops))

    def arm(self, ret: int, popped: int, resume: int) -> None:
        """Let the hook on the ``ret`` at ``ret`` (which pops ``popped`` bytes) settle the open
        transaction if it returns to ``resume`` with everything as the site hook found it."""
        w = self.words
        w[RET_PC], w[POPPED], w[NEXT], w[STATE] = ret, popped, resume, ARMED

    def judge_every_hit(self) -> None:
        """Hold back no repeated hit: Python sees every hit C does not settle as unchanged."""
        self.repeats = None
        self.words[REPEATS] = 0

    @property
    def finished(self) -> int:
        return self.words[FINISHED]
