"""The registers a hit leaves (``regs``): every GPR, user-visible rflags bit, fs/gs base, mxcsr, x87
and SSE register as the original instruction alone would have left them; and the pt_regs the
handlers were given, as the interrupted code had them."""

from __future__ import annotations

from emu.cpu.state import x87_registers
from emu.verify.expected import STATE_INDEX, Expected, same_registers
from emu.verify.records import RIP_INDEX, Transaction, path_name, violation
from emu.violations import Check, Violation

# Every rflags bit a user program can observe (pushf), bit 1 and IF included: a hit must leave them as
# the reference does. Not compared: RF, VM, VIF, VIP, NT and IOPL, which no user-mode instruction can see.
FLAG_BITS = {"CF": 0, "bit1": 1, "PF": 2, "AF": 4, "ZF": 6, "SF": 7, "TF": 8, "IF": 9, "DF": 10, "OF": 11,
             "AC": 18, "ID": 21}
FLAGS_MASK = sum(1 << bit for bit in FLAG_BITS.values())
REG_NAMES = {i: ("r" + n if len(n) == 2 and not n[1].isdigit() else n) for n, i in STATE_INDEX.items()}


def check_regs(tx: Transaction, exp: Expected) -> list[Violation]:
    want, got = exp.state, tx.end_state
    if same_registers(tx, exp) or _same_regs(want, got) and exp.extended == tx.end_ext:
        return []
    (efs, egs, exmm, emx, ex87), (afs, ags, axmm, amx, ax87) = exp.extended, tx.end_ext
    pairs = [(REG_NAMES[i], want[i], got[i]) for i in range(16)]
    pairs += [("rflags", want[17] & FLAGS_MASK, got[17] & FLAGS_MASK), ("fs_base", efs, afs), ("gs_base", egs, ags),
              ("mxcsr", emx, amx)]
    if ex87 != ax87:
        found = x87_registers(ax87)
        pairs += [(name, value, found[name]) for name, value in x87_registers(ex87).items()]
    if exmm != axmm:
        pairs += [(f"xmm{i}", int.from_bytes(exmm[16 * i : 16 * i + 16], "little"),
                   int.from_bytes(axmm[16 * i : 16 * i + 16], "little")) for i in range(16)]
    diffs = {name: f"expected {w:#x}, found {g:#x}" + (f" ({flag_changes(w, g)})" if name == "rflags" else "")
             for name, w, g in pairs if w != g}
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
    """The pt_regs the handlers were given must be the interrupted code's registers (ip the probe's
    address): a handler reading a saved word from the wrong slot acts on another register's value."""
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
