"""The per-transaction checks: registers, resume address, red zone. Each returns violations."""

from __future__ import annotations

import functools
from collections.abc import Callable

from emu.abi import RED_ZONE
from emu.verify.expected import STATE_INDEX, Expected, resume_address, same_registers
from emu.verify.state import x87_registers
from emu.verify.transaction import RIP_INDEX, Transaction, guest_writes
from emu.verify.violations import Check, Violation
from emu.verify.write_log import classify
from emu.verify.write_log import entries as log_entries

# Every rflags bit a user program can observe (pushf): CF bit 1 PF AF ZF SF TF IF DF OF AC ID. Bit 1
# reads as 1 and IF as 1 in user mode on real hardware; whatever the emulator holds there, a probe hit
# must leave them as the reference does (the invariants), like the other bits. Not compared: RF, VM,
# VIF, VIP, NT and IOPL, which no user-mode instruction can see or set (popf leaves them alone).
FLAG_BITS = {"CF": 0, "bit1": 1, "PF": 2, "AF": 4, "ZF": 6, "SF": 7, "TF": 8, "IF": 9, "DF": 10, "OF": 11,
             "AC": 18, "ID": 21}
FLAGS_MASK = sum(1 << bit for bit in FLAG_BITS.values())
REG_NAMES = {i: ("r" + n if len(n) == 2 and not n[1].isdigit() else n) for n, i in STATE_INDEX.items()}
REG_NAMES[17] = "rflags"
Evidence = tuple[tuple[str, object], ...]  # a violation's detail, as items


def _violation(kind: Check, tx: Transaction, summary: str, **detail: object) -> Violation:
    return Violation(kind, tx.probe, tx.site, summary, dict(detail), tx.hit)


def check_regs(tx: Transaction, exp: Expected) -> list[Violation]:
    if same_registers(tx, exp) or _same_regs(exp.state, tx.end_state) and exp.extended == tx.end_ext:
        return []
    diffs: dict[str, str] = {}
    for i in range(18):
        if i == RIP_INDEX:
            continue
        want, got = exp.state[i], tx.end_state[i]
        if i == 17:
            want, got = want & FLAGS_MASK, got & FLAGS_MASK
            if want != got:
                diffs["rflags"] = f"expected {want:#x}, found {got:#x} ({flag_changes(want, got)})"
        elif want != got:
            diffs[REG_NAMES[i]] = f"expected {want:#x}, found {got:#x}"
    assert tx.end_ext is not None
    (efs, egs, exmm, emx, ex87), (afs, ags, axmm, amx, ax87) = exp.extended, tx.end_ext
    for name, want, got in (("fs_base", efs, afs), ("gs_base", egs, ags), ("mxcsr", emx, amx)):
        if want != got:
            diffs[name] = f"expected {want:#x}, found {got:#x}"
    if ex87 != ax87:
        found = x87_registers(ax87)
        for name, want in x87_registers(ex87).items():
            if want != found[name]:
                diffs[name] = f"expected {want:#x}, found {found[name]:#x}"
    for i in range(16 if exmm != axmm else 0):
        want, got = (int.from_bytes(x[16 * i : 16 * i + 16], "little") for x in (exmm, axmm))
        if want != got:
            diffs[f"xmm{i}"] = f"expected {want:#x}, found {got:#x}"
    if not diffs:
        return []
    summary = ", ".join(f"{k} {v}" for k, v in diffs.items())
    return [_violation(Check.REGS, tx, summary, registers=diffs, path=_path(tx), exits=tx.exits,
                       consumer_changed=list(exp.consumer_changes))]


def flag_changes(want: int, got: int) -> str:
    """The user-visible rflags bits that differ, each as NAME=its value found (``ID=1 DF=0``)."""
    return " ".join(f"{name}={got >> bit & 1}" for name, bit in FLAG_BITS.items() if (want ^ got) >> bit & 1)


def _same_regs(want: list[int], got: list[int]) -> bool:
    return want[:16] == got[:16] and (want[17] & FLAGS_MASK) == (got[17] & FLAGS_MASK)


def check_consumer_view(tx: Transaction) -> list[Violation]:
    """The pt_regs the consumers' handlers were given must be the interrupted code's registers
    (ip the probe's address, every GPR, sp and the user-visible flags as they were at the site):
    a handler reading a saved word from the wrong slot sees another register's value, and its
    program (bpf, a ret_handler) acts on it. Checked on hits where a handler ran."""
    if tx.chain is None:
        return []
    seen, start = tx.chain[0], tx.start_state
    diffs: dict[str, str] = {}
    for name, i in STATE_INDEX.items():
        want = tx.site if i == RIP_INDEX else start[i]
        got = getattr(seen, name)
        if i == 17:
            want, got = want & FLAGS_MASK, got & FLAGS_MASK
        if want != got:
            diffs[name] = f"the site had {want:#x}, the handlers saw {got:#x}"
    if not diffs:
        return []
    summary = "pt_regs given to the handlers: " + ", ".join(f"{k} {v}" for k, v in diffs.items())
    return [_violation(Check.REGS, tx, summary, consumer_view=diffs, path=_path(tx))]


def check_fired(tx: Transaction) -> list[Violation]:
    """A hit whose probe's handler chain never ran: the guest went past the site as if unprobed
    (a trampoline whose syscall the kernel refused, say), and the consumers missed the hit."""
    if tx.path is not None:
        return []
    return [_violation(Check.RESUME, tx, "resumed without the probe firing: the consumers never ran for this hit",
                       expected="the handler chain", actual=hex(tx.end_addr), exits=tx.exits)]


def check_resume(tx: Transaction, exp: Expected) -> list[Violation]:
    want, got = resume_address(exp), tx.end_addr
    if want == got:
        return []
    where = ""
    if tx.site < got < tx.site + len(tx.original):
        where = f" (inside the probed instruction, +{got - tx.site})"
    elif got == tx.site:
        where = " (the probed instruction runs again)"
    return [_violation(Check.RESUME, tx, f"resumed at {got:#x}, expected {want:#x}{where}",
                       expected=hex(want), actual=hex(got), path=_path(tx), exits=tx.exits)]


def check_redzone(tx: Transaction, exp: Expected, describe: Callable[[int], str]) -> list[Violation]:
    """Every red-zone byte that differs from the reference, attributed to the guest store that
    wrote it (pc and disassembly) or, failing that, to the fake kernel's copy_to_user."""
    expected = exp.redzone(tx)
    if tx.redzone_after == expected:
        return []
    kernel = "the fake kernel (copy_to_user)"
    if tx.unrecorded:
        kernel = "one of the guest stores past the write log's capacity, or " + kernel
    return [_redzone(tx, lo, hi, expected, kernel if pc is None else f"guest code at {pc:#x}: {describe(pc)}")
            for lo, hi, pc in _blame(tx.redzone_base, expected, tx.redzone_after, tx.logged, tx.redzone_before, tx.nop)]


@functools.lru_cache(maxsize=256)
def _blame(base: int, expected: bytes, after: bytes, logged: tuple[bytes, ...], before: bytes | None,
           nop: bool) -> tuple[tuple[int, int, int | None], ...]:
    """Each run [lo, hi) of red-zone bytes that differ from ``expected``, by offset, with the pc of
    the guest store that left it (None: no logged store did). Kept: a design that clobbers the red
    zone does it the same way on every hit."""
    wrong = _differing(after, expected)
    out: list[tuple[int, int, int | None]] = []
    for w in reversed(guest_writes(logged, base, before, nop)):  # the last store to a byte is the one that left it
        lo, hi = max(w.addr - base, 0), min(w.addr + w.size - base, RED_ZONE)
        bytes_written = ((1 << hi - lo) - 1) << lo if hi > lo else 0
        if wrong & bytes_written:
            wrong &= ~bytes_written
            out.append((lo, hi, w.pc))
    out += [(lo, hi, None) for lo, hi in _runs(wrong)]
    return tuple(sorted(out))


def _differing(a: bytes, b: bytes) -> int:
    """A mask with bit i set where byte i differs (in a few C calls: each differing byte becomes a
    '1' digit, each equal one a '0', highest byte first)."""
    diff = (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(len(a), "little")
    return int(diff.translate(_DIFFERS_DIGIT)[::-1], 2)


_DIFFERS_DIGIT = b"0" + b"1" * 255


def _runs(mask: int) -> list[tuple[int, int]]:
    """The runs of set bits of ``mask``, as [lo, hi) pairs, lowest first."""
    runs: list[tuple[int, int]] = []
    while mask:
        lo = (mask & -mask).bit_length() - 1
        hi = lo
        while mask >> hi & 1:
            hi += 1
        runs.append((lo, hi))
        mask &= ~(((1 << hi - lo) - 1) << lo)
    return runs


def _redzone(tx: Transaction, lo: int, hi: int, expected: bytes, writer: str) -> Violation:
    summary, detail = _redzone_evidence(lo, hi, bytes(expected[lo:hi]), tx.redzone_after[lo:hi], writer, _path(tx))
    return Violation(Check.REDZONE, tx.probe, tx.site, summary, dict(detail), tx.hit)


@functools.lru_cache(maxsize=1024)
def _redzone_evidence(lo: int, hi: int, old: bytes, new: bytes, writer: str, path: str) -> tuple[str, Evidence]:
    """The summary and detail of one red-zone violation (kept: a design that clobbers the red zone
    does it the same way on every hit)."""
    offset = lo - RED_ZONE
    summary = f"rsp{offset:+d} ({hi - lo} bytes) {old.hex()} -> {new.hex()} by {writer}"
    detail = {"offset": offset, "size": hi - lo, "old": old.hex(), "new": new.hex(), "writer": writer, "path": path}
    return summary, tuple(detail.items())


def _path(tx: Transaction) -> str:
    return tx.path._value_ if tx.path else "?"  # not .value: a Python-level descriptor, on every violation


Reader = Callable[[int, int], bytes | None]  # (address, size) -> the guest's bytes now (None: unmapped)
Allowed = Callable[[Transaction, int, int], bool]  # (tx, address, size): a write there is the hit's right


def outside_writes(tx: Transaction, allowed: Allowed,
                   describe: Callable[[int], str]) -> dict[int, tuple[int, str]]:
    """Each byte written during ``tx`` outside the red zone and the scratch below it, by address:
    (its value before the first such write, the last writer)."""
    written: dict[int, tuple[int, str]] = {}

    def note(addr: int, old: bytes, writer: str) -> None:
        for i, byte in enumerate(old):
            first = written.get(addr + i)
            written[addr + i] = (byte if first is None else first[0], writer)

    for chunk in tx.logged:
        for pc, addr, size, _value, old_word in log_entries(chunk):
            if classify(addr, size, tx.redzone_base) == 2 and not allowed(tx, addr, size):
                note(addr, old_word.to_bytes(8, "little")[:size], f"guest code at {pc:#x}: {describe(pc)}")
    for addr, old_bytes, _new in tx.kernel_stores:
        note(addr, old_bytes, "the fake kernel (copy_to_user)")
    return written


def check_memory(tx: Transaction, exp: Expected, read: Reader, allowed: Allowed,
                 describe: Callable[[int], str]) -> list[Violation]:
    """Every byte a hit wrote outside the red zone, the scratch below it and the kernel's own pages
    that the original instruction would not have left so (its own stores are the reference's)."""
    if not tx.outside:
        return []
    written = outside_writes(tx, allowed, describe)
    stored = {addr + i: byte for addr, data in exp.stores for i, byte in enumerate(data)}
    found: list[Violation] = []
    for lo, hi, writer in _byte_runs(written):
        now = read(lo, hi - lo) or b""
        old = bytes(written[a][0] for a in range(lo, hi))
        if len(now) == hi - lo and all(stored.get(a) == now[a - lo] for a in range(lo, hi)):
            continue  # what the instruction itself stores there
        found.append(_memory(tx, lo, old, now, writer))
    if tx.unrecorded:
        found += [_violation(Check.MEMORY, tx, "more stores than the write log holds: some were not seen",
                             path=_path(tx))] if not found else []
    return found


def _byte_runs(written: dict[int, tuple[int, str]]) -> list[tuple[int, int, str]]:
    """The written bytes as runs [lo, hi) of consecutive addresses with one last writer."""
    runs: list[tuple[int, int, str]] = []
    for addr in sorted(written):
        writer = written[addr][1]
        if runs and runs[-1][1] == addr and runs[-1][2] == writer:
            runs[-1] = (runs[-1][0], addr + 1, writer)
        else:
            runs.append((addr, addr + 1, writer))
    return runs


def _memory(tx: Transaction, addr: int, old: bytes, new: bytes, writer: str) -> Violation:
    where = addr - tx.start_rsp
    place = f"rsp{where:+d}" if 0 <= where < 1 << 20 else f"{addr:#x}"
    summary = f"{place} ({len(old)} bytes at {addr:#x}) {old.hex()} -> {new.hex() or '?'} by {writer}"
    return _violation(Check.MEMORY, tx, summary, address=hex(addr), size=len(old), old=old.hex(), new=new.hex(),
                      writer=writer, path=_path(tx))
