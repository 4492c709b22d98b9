"""The per-transaction checks: registers, resume address, red zone. Each returns violations."""

from __future__ import annotations

from collections.abc import Callable

from emu.abi import RED_ZONE
from emu.verify.expected import STATE_INDEX, Expected, resume_address, same_registers
from emu.verify.transaction import RIP_INDEX, Transaction
from emu.verify.violations import Check, Violation

# rflags bits a probe must preserve: CF PF AF ZF SF DF OF
FLAGS_MASK = 0x1 | 0x4 | 0x10 | 0x40 | 0x80 | 0x400 | 0x800
REG_NAMES = {i: ("r" + n if len(n) == 2 and not n[1].isdigit() else n) for n, i in STATE_INDEX.items()}
REG_NAMES[17] = "rflags"


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
            diffs[REG_NAMES[i]] = f"expected {want:#x}, found {got:#x}"
    assert tx.end_ext is not None
    (efs, egs, exmm, emx), (afs, ags, axmm, amx) = exp.extended, tx.end_ext
    for name, want, got in (("fs_base", efs, afs), ("gs_base", egs, ags), ("mxcsr", emx, amx)):
        if want != got:
            diffs[name] = f"expected {want:#x}, found {got:#x}"
    for i in range(16 if exmm != axmm else 0):
        want, got = (int.from_bytes(x[16 * i : 16 * i + 16], "little") for x in (exmm, axmm))
        if want != got:
            diffs[f"xmm{i}"] = f"expected {want:#x}, found {got:#x}"
    if not diffs:
        return []
    summary = ", ".join(f"{k} {v}" for k, v in diffs.items())
    return [_violation(Check.REGS, tx, summary, registers=diffs, path=_path(tx), exits=tx.exits,
                       consumer_changed=list(exp.consumer_changes))]


def _same_regs(want: list[int], got: list[int]) -> bool:
    return want[:16] == got[:16] and (want[17] & FLAGS_MASK) == (got[17] & FLAGS_MASK)


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
    base = tx.redzone_base
    expected = exp.redzone(tx)
    if tx.redzone_after == expected:
        return []
    wrong = _differing(tx.redzone_after, expected)
    out: list[Violation] = []
    for w in reversed(tx.guest_writes):  # the last store to a byte is the one that left it
        lo, hi = max(w.addr - base, 0), min(w.addr + w.size - base, RED_ZONE)
        bytes_written = ((1 << hi - lo) - 1) << lo if hi > lo else 0
        if not wrong & bytes_written:
            continue
        wrong &= ~bytes_written
        out.append(_redzone(tx, lo, hi, expected, f"guest code at {w.pc:#x}: {describe(w.pc)}"))
    rest = "the fake kernel (copy_to_user)"
    if tx.unrecorded:
        rest = "one of the guest stores past the write log's capacity, or " + rest
    for lo, hi in _runs(wrong):
        out.append(_redzone(tx, lo, hi, expected, rest))
    return sorted(out, key=lambda v: v.detail["offset"])


def _differing(a: bytes, b: bytes) -> int:
    """A mask with bit i set where byte i differs."""
    diff = int.from_bytes(a, "little") ^ int.from_bytes(b, "little")
    mask = 0
    while diff:
        i = ((diff & -diff).bit_length() - 1) >> 3
        mask |= 1 << i
        diff &= ~(0xFF << (8 * i))
    return mask


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
    offset = lo - RED_ZONE
    old, new = bytes(expected[lo:hi]), tx.redzone_after[lo:hi]
    summary = f"rsp{offset:+d} ({hi - lo} bytes) {old.hex()} -> {new.hex()} by {writer}"
    return _violation(Check.REDZONE, tx, summary, offset=offset, size=hi - lo, old=old.hex(), new=new.hex(),
                      writer=writer, path=_path(tx))


def _path(tx: Transaction) -> str:
    return tx.path.value if tx.path else "?"
