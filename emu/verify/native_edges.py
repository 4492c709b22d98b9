"""Machine code at the edges of a probe hit, so that a hit that left everything as it found it
is settled without entering Python.

In Python, a hit's hooks cost more than the hit they watch (~10 us for an optimized hit; each hook
is a ctypes callback plus a state read through ctypes, ~4-8 us). In machine code:

* the **site hook** counts the hit (SiteCounters), reads the whole state (``uc_reg_read_batch``,
  the RawState layout) and the red zone into the control block, starts the write log (which
  copies the red zone again only if that read failed), opens the red-zone window and numbers
  the now *open* transaction (SEQ). The window is the whole address space while it is open: the
  write log sorts the stores (emu/verify/write_log.py), and a store outside the red zone and the
  scratch below it keeps every fast path here from settling the hit. The tracker makes a Transaction of it only when Python
  needs one (emu/verify/transaction.py): a consumer with a handler, a context switch, a hit the
  code here hands over.
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

Anything else is handed to the Python hook unchanged (a tail jump with Unicorn's arguments): a
site hit while a transaction is open, a ``ret`` of a transaction that is not armed, or an armed one
that fails any test above. Handing over disarms it.

Control block layout (64-bit words), then the buffers:
  0 state: IDLE, OPEN or ARMED
  1 site: the open transaction's site       2 next: the armed transaction's resume address
  3 finished: transactions the machine code settled
  4, 5: uc_reg_read_batch, uc_mem_read      6, 7: the Python site and ret hooks
  8 the write log's buffer                  9 the red-zone window's range (HookRange)
  10 the register count   11-13 the register ids, start and end pointer arrays   14 a word read
  15 the ret the armed transaction leaves by   16 the bytes it pops (8 + its immediate)
  17 what uc_mem_read returned for the red zone at the site (0: read)
  18 SEQ: the number of the site hook's last transaction
"""

from __future__ import annotations

import ctypes

from emu.abi import RED_ZONE
from emu.cpu import (
    STATE_BYTES,
    STATE_OFFSETS,
    STATE_REGS,
    Cpu,
    HookHandle,
    HookRange,
    RawCodeHook,
    add_native_code_hook,
    cpu_handle,
    native_function,
    raw_code_hook_address,
)
from emu.verify.machine_code import mapped
from emu.verify.reference_cache import EffectSpans
from emu.verify.state import RAW_KEPT, RAW_RIP, RAW_RSP
from emu.verify.write_log import BASE, COUNT, OUTSIDE, STATUS, TAKEN, WriteLog

(STATE, SITE, NEXT, FINISHED, REG_BATCH, MEM_READ, PY_SITE, PY_RET, LOG, WINDOW, NREGS, IDS, START_PTRS, END_PTRS,
 WORD, RET_PC, POPPED, START_REDZONE_STATUS, SEQ) = range(19)
START = 20 * 8  # byte offsets of the buffers
END = START + STATE_BYTES
REDZONE = END + STATE_BYTES
START_REDZONE = REDZONE + RED_ZONE
IDS_AT = START_REDZONE + RED_ZONE
START_PTRS_AT = IDS_AT + (4 * len(STATE_REGS) + 7) // 8 * 8
END_PTRS_AT = START_PTRS_AT + 8 * len(STATE_REGS)
BLOCK_BYTES = END_PTRS_AT + 8 * len(STATE_REGS)
START_RSP = (START + RAW_RSP) // 8  # the word of the start state's rsp
ADDRESS_MASK = (1 << 64) - 1


# The state word (plain ints: the tracker compares it on every hit, and an enum costs ~0.1 us more).
IDLE = 0
OPEN = 1  # a transaction is open (the site hook's, numbered SEQ, or one the tracker started)
ARMED = 2  # ... and the ret hook may settle it


def _nothing_outside(differs: str) -> str:
    """Machine code that jumps to ``differs`` if the write log holds a store outside the red zone
    and the scratch below it (the memory check needs Python); rbx = the block."""
    return f"""
mov {8 * LOG}(%rbx), %rax
cmpq $0, {8 * OUTSIDE}(%rax)
jne {differs}
"""


def _same_as_start(differs: str) -> str:
    """Machine code that jumps to ``differs`` unless the end buffer (just read) holds every register
    but rip and rsp, rflags exactly and the extended state as the start buffer, and the red zone
    now is the site hook's copy, and no store landed outside it and the scratch; with rbx = the
    block, r12 = the engine."""
    return f"""{_nothing_outside(differs)}
lea {START + RAW_KEPT}(%rbx), %rsi
lea {END + RAW_KEPT}(%rbx), %rdi
mov ${(STATE_BYTES - RAW_KEPT) // 8}, %ecx
repe cmpsq
jne {differs}
cmpl $0, {8 * START_REDZONE_STATUS}(%rbx)
jne {differs}
mov %r12, %rdi
mov {START + RAW_RSP}(%rbx), %rsi
sub ${RED_ZONE}, %rsi
lea {REDZONE}(%rbx), %rdx
mov ${RED_ZONE}, %ecx
call *{8 * MEM_READ}(%rbx)
test %eax, %eax
jne {differs}
lea {START_REDZONE}(%rbx), %rsi
lea {REDZONE}(%rbx), %rdi
mov ${RED_ZONE // 8}, %ecx
repe cmpsq
jne {differs}
"""


def _read_end_state() -> str:
    """Machine code: the state into the end buffer; rbx = the block, r12 = the engine."""
    return f"""
mov %r12, %rdi
mov {8 * IDS}(%rbx), %rsi
mov {8 * END_PTRS}(%rbx), %rdx
mov {8 * NREGS}(%rbx), %ecx
call *{8 * REG_BATCH}(%rbx)
"""


# The transaction is settled: no verdict needed, the window closes; rbx = the block.
_SETTLE = f"""
movq ${IDLE}, {8 * STATE}(%rbx)
incq {8 * FINISHED}(%rbx)
mov {8 * WINDOW}(%rbx), %rax
movq $0, (%rax)
movq $0, 8(%rax)
"""
_SAVE = "push %rbx\npush %r12\npush %r13\npush %r14\npush %r15"  # five: rsp 16-byte aligned for the calls
_RESTORE = "pop %r15\npop %r14\npop %r13\npop %r12\npop %rbx"

# The site hook: (uc=rdi, address=rsi, size=edx, site record=rcx: the block, then the site's hits).
SITE_SOURCE = f"""
mov (%rcx), %rax
cmpq $0, {8 * STATE}(%rax)
jne to_python
incq 8(%rcx)
{_SAVE}
mov %rax, %rbx
mov %rdi, %r12
mov %rsi, %r13
mov {8 * IDS}(%rbx), %rsi
mov {8 * START_PTRS}(%rbx), %rdx
mov {8 * NREGS}(%rbx), %ecx
call *{8 * REG_BATCH}(%rbx)
mov %r12, %rdi
mov {START + RAW_RSP}(%rbx), %rsi
sub ${RED_ZONE}, %rsi
lea {START_REDZONE}(%rbx), %rdx
mov ${RED_ZONE}, %ecx
call *{8 * MEM_READ}(%rbx)
mov %rax, {8 * START_REDZONE_STATUS}(%rbx)
xor %r14d, %r14d
test %eax, %eax
sete %r14b
mov %r13, {8 * SITE}(%rbx)
incq {8 * SEQ}(%rbx)
movq ${OPEN}, {8 * STATE}(%rbx)
mov {START + RAW_RSP}(%rbx), %rax
sub ${RED_ZONE}, %rax
mov {8 * LOG}(%rbx), %rdx
movq $0, {8 * COUNT}(%rdx)
mov %rax, {8 * BASE}(%rdx)
mov %r14, {8 * TAKEN}(%rdx)
movq $0, {8 * STATUS}(%rdx)
movq $0, {8 * OUTSIDE}(%rdx)
mov {8 * WINDOW}(%rbx), %rdx
movq $-1, 8(%rdx)
movq $0, (%rdx)
{_RESTORE}
ret
to_python:
mov %rax, %rcx
jmp *{8 * PY_SITE}(%rcx)
"""

# The ret hook: (uc=rdi, address=rsi, size=edx, block=rcx).
RET_SOURCE = f"""
mov {8 * STATE}(%rcx), %rax
test %rax, %rax
je idle
cmp ${ARMED}, %rax
jne to_python
cmp {8 * RET_PC}(%rcx), %rsi
jne disarm
{_SAVE}
mov %rcx, %rbx
mov %rdi, %r12
mov %rsi, %r13
mov %edx, %r14d
{_read_end_state()}
mov {END + RAW_RSP}(%rbx), %rsi
mov %rsi, %rax
add {8 * POPPED}(%rbx), %rax
cmp {START + RAW_RSP}(%rbx), %rax
jne slow
mov %r12, %rdi
lea {8 * WORD}(%rbx), %rdx
mov $8, %ecx
call *{8 * MEM_READ}(%rbx)
test %eax, %eax
jne slow
mov {8 * WORD}(%rbx), %rax
cmp {8 * NEXT}(%rbx), %rax
jne slow
{_same_as_start("slow")}
{_SETTLE}
{_RESTORE}
ret
slow:
movq ${OPEN}, {8 * STATE}(%rbx)
mov %r12, %rdi
mov %r13, %rsi
mov %r14d, %edx
mov %rbx, %rcx
{_RESTORE}
jmp *{8 * PY_RET}(%rcx)
disarm:
movq ${OPEN}, {8 * STATE}(%rcx)
to_python:
jmp *{8 * PY_RET}(%rcx)
idle:
ret
"""

# The functions Python calls: (uc=rdi, block=rsi, rdx, rcx) kept in r12, rbx, r13, r14, and the
# state read into the end buffer.
_CALLED = f"""
{_SAVE}
mov %rdi, %r12
mov %rsi, %rbx
mov %rdx, %r13
mov %rcx, %r14
{_read_end_state()}
"""
# The red zone at r13 into its buffer; eax: what uc_mem_read returned.
_READ_REDZONE = f"""
mov %r12, %rdi
mov %r13, %rsi
lea {REDZONE}(%rbx), %rdx
mov ${RED_ZONE}, %ecx
call *{8 * MEM_READ}(%rbx)
"""
# Falling in: settled (1); at "differs": not (0).
_SETTLED_OR_NOT = f"""
{_SETTLE}
mov $1, %eax
jmp done
differs:
xor %eax, %eax
done:
{_RESTORE}
ret
"""

# settle_return(uc, block, rip_advance, resume) -> 1 if settled, else 0: the kernel returns to
# user mode (rip + rip_advance) with everything as the site hook found it.
SETTLE_RETURN_SOURCE = f"""
{_CALLED}
mov {END + RAW_RIP}(%rbx), %rax
add %r13, %rax
cmp %r14, %rax
jne differs
mov {END + RAW_RSP}(%rbx), %rax
cmp {START + RAW_RSP}(%rbx), %rax
jne differs
{_same_as_start("differs")}
{_SETTLED_OR_NOT}
"""

# settle_compared(uc, block, red-zone base, ops) -> 1 if settled, else 0: the red zone at base into
# its buffer, then each (a, b, length) of the list at ops (ended by a zero length): length bytes
# at a must equal those at b.
SETTLE_COMPARED_SOURCE = f"""
{_CALLED}
{_nothing_outside("differs")}
{_READ_REDZONE}
test %eax, %eax
jne differs
next_op:
mov 16(%r14), %rcx
test %rcx, %rcx
je same
mov (%r14), %rsi
mov 8(%r14), %rdi
repe cmpsb
jne differs
add $24, %r14
jmp next_op
same:
{_SETTLED_OR_NOT}
"""

# read_end(uc, block, red-zone base) -> what uc_mem_read returned: the state into the end buffer
# and the red zone into its buffer, for a transaction that ends in Python (one C call from Python
# instead of two).
READ_END_SOURCE = f"""
{_CALLED}
{_READ_REDZONE}
{_RESTORE}
ret
"""
assert STATE_BYTES % 8 == 0 and RAW_KEPT % 8 == 0 and RED_ZONE % 8 == 0


_NATIVE_CALL = ctypes.PYFUNCTYPE(ctypes.c_int)  # no argument conversion: each argument is a ctypes object


class SiteCounters:
    """Per probe site: the record its machine-code hook gets (the control block's address, then the
    site's hit count, which the hook counts itself)."""

    def __init__(self, count: int, block: int) -> None:
        self._records = (ctypes.c_uint64 * (2 * count))(*[block, 0] * count)
        self._words = memoryview(self._records).cast("B").cast("Q")

    def record(self, index: int) -> int:
        return ctypes.addressof(self._records) + 16 * index

    def hits(self, index: int) -> int:
        return self._words[2 * index + 1]

    def count_hit(self, index: int, by: int = 1) -> int:
        """One more hit (one the machine code did not see), or ``by`` more; the hit's number."""
        words = self._words
        words[2 * index + 1] += by
        return words[2 * index + 1]


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
        self.ops = ctypes.c_void_p(ctypes.addressof(self._ops))


class NativeEdges:
    """The control block and the machine code of one tracker. :meth:`create` returns None where
    machine code cannot be mapped: the tracker's Python hooks do the same work then."""

    def __init__(self, cpu: Cpu, code: tuple[int, int, int, int, int], log: WriteLog, window: HookRange,
                 on_site: RawCodeHook) -> None:
        """``code``: where the site hook, the ret hook, settle_return, settle_compared and read_end
        are mapped."""
        self.cpu = cpu
        self._site_code, self._ret_code, settle_return, settle_compared, read_end = code
        self._block = ctypes.create_string_buffer(BLOCK_BYTES)
        self._bytes = memoryview(self._block).cast("B")
        self.words = self._bytes.cast("Q")
        base = self.address = ctypes.addressof(self._block)
        self._settle_return, self._read_end = _NATIVE_CALL(settle_return), _NATIVE_CALL(read_end)
        self._settle_compared = _NATIVE_CALL(settle_compared)
        self._args = (cpu_handle(cpu), ctypes.c_void_p(base), ctypes.c_uint64(0), ctypes.c_uint64(0))
        n = len(STATE_REGS)
        (ctypes.c_int * n).from_address(base + IDS_AT)[:] = list(STATE_REGS)
        (ctypes.c_uint64 * n).from_address(base + START_PTRS_AT)[:] = [base + START + o for o in STATE_OFFSETS]
        (ctypes.c_uint64 * n).from_address(base + END_PTRS_AT)[:] = [base + END + o for o in STATE_OFFSETS]
        w = self.words
        w[REG_BATCH], w[MEM_READ] = native_function("uc_reg_read_batch"), native_function("uc_mem_read")
        w[PY_SITE] = raw_code_hook_address(cpu, on_site)
        w[LOG], w[WINDOW] = log.address, window.address
        w[NREGS], w[IDS], w[START_PTRS], w[END_PTRS] = n, base + IDS_AT, base + START_PTRS_AT, base + END_PTRS_AT

    @classmethod
    def create(cls, cpu: Cpu, log: WriteLog, window: HookRange, on_site: RawCodeHook) -> NativeEdges | None:
        code = tuple(mapped(source) for source in (SITE_SOURCE, RET_SOURCE, SETTLE_RETURN_SOURCE, SETTLE_COMPARED_SOURCE,
                                                   READ_END_SOURCE))
        if None in code:
            return None
        return cls(cpu, code, log, window, on_site)  # type: ignore[arg-type]

    def add_site_hook(self, address: int, record: int) -> HookHandle:
        """The machine-code hook at a probe site; ``record``: the site's in SiteCounters."""
        return add_native_code_hook(self.cpu, self._site_code, record, address, address)

    def set_ret_fallback(self, on_ret: RawCodeHook) -> None:
        """The Python hook every ``ret`` hook hands over to."""
        self.words[PY_RET] = raw_code_hook_address(self.cpu, on_ret)

    def add_ret_hook(self, address: int) -> HookHandle:
        """A hook on a ``ret``; it settles only a transaction armed for that ``ret``."""
        assert self.words[PY_RET], "set_ret_fallback first"
        return add_native_code_hook(self.cpu, self._ret_code, self.address, address, address)

    def start_raw(self) -> bytes:
        """The state the site hook read (the RawState layout)."""
        return self._bytes[START:END].tobytes()

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
        uch, block, arg, _ = self._args
        arg.value = base
        status = self._read_end(uch, block, arg)
        return self._bytes[END:REDZONE].tobytes(), None if status else self._bytes[REDZONE:START_REDZONE].tobytes()

    def settle_return(self, rip_advance: int, resume: int) -> bool:
        """The kernel returns to user mode at rip + ``rip_advance``: settle the site hook's open
        transaction (True) if that is ``resume`` and everything is as the site hook found it."""
        uch, block, advance, target = self._args
        advance.value, target.value = rip_advance, resume
        return bool(self._settle_return(uch, block, advance, target))

    def comparison(self, spans: EffectSpans, rip_advance: int) -> Comparison:
        """``spans`` for settle_compared, where the kernel returns to rip + ``rip_advance``."""
        return Comparison(self.address, spans, rip_advance)

    def settle_compared(self, base: int, comparison: Comparison) -> bool:
        """The kernel returns to user mode: settle the site hook's open transaction (True) if the
        state and the red zone at ``base`` pass ``comparison``."""
        uch, block, arg, _ = self._args
        arg.value = base
        return bool(self._settle_compared(uch, block, arg, comparison.ops))

    def arm(self, ret: int, popped: int, resume: int) -> None:
        """Let the hook on the ``ret`` at ``ret`` (which pops ``popped`` bytes) settle the open
        transaction if it returns to ``resume`` with everything as the site hook found it."""
        w = self.words
        w[RET_PC], w[POPPED], w[NEXT], w[STATE] = ret, popped, resume, ARMED

    @property
    def finished(self) -> int:
        return self.words[FINISHED]
