"""The registers a hit leaves (``regs``): every GPR, every user-visible rflags bit, fs/gs base, mxcsr,
the x87 and SSE state, as the original instruction alone would have left them; and the pt_regs the
consumers' handlers were given, as the interrupted code had them."""

from __future__ import annotations

from emu.cpu.state import x87_registers
from emu.verify.checks.hit import path_name, violation
from emu.verify.expected import STATE_INDEX, Expected, same_registers
from emu.verify.records import RIP_INDEX, Transaction
from emu.verify.violations import Check, Violation

# Every rflags bit a user program can observe (pushf): CF bit 1 PF AF ZF SF TF IF DF OF AC ID. Bit 1
# reads as 1 and IF as 1 in user mode on real hardware; whatever the emulator holds there, a probe hit
# must leave them as the reference does (the invariants), like the other bits. Not compared: RF, VM,
# VIF, VIP, NT and IOPL, which no user-mode instruction can see or set (popf leaves them alone).
FLAG_BITS = {"CF": 0, "bit1": 1, "PF": 2, "AF": 4, "ZF": 6, "SF": 7, "TF": 8, "IF": 9, "DF": 10, "OF": 11,
             "AC": 18, "ID": 21}
FLAGS_MASK = sum(1 << bit for bit in FLAG_BITS.values())
REG_NAMES = {i: ("r" + n if len(n) == 2 and not n[1].isdigit() else n) for n, i in STATE_INDEX.items()}
REG_NAMES[17] = "rflags"


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
    return [violation(Check.REGS, tx, summary, registers=diffs, path=path_name(tx), exits=tx.exits,
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
    return [violation(Check.REGS, tx, summary, consumer_view=diffs, path=path_name(tx))]


