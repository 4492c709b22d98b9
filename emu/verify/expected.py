"""What a transaction should have produced: the original instruction alone, from the state the
consumers left (or no instruction at all when a consumer redirected ip)."""

from __future__ import annotations

from dataclasses import dataclass

from emu.verify.scratch import ExtendedState, Reference, ScratchCpu
from emu.verify.transaction import RIP_INDEX, Transaction

# PtRegs field -> index in Cpu.read_user_state()
STATE_INDEX = {
    "ax": 0, "bx": 1, "cx": 2, "dx": 3, "si": 4, "di": 5, "bp": 6, "sp": 7, "r8": 8, "r9": 9, "r10": 10,
    "r11": 11, "r12": 12, "r13": 13, "r14": 14, "r15": 15, "ip": 16, "flags": 17,
}


@dataclass(frozen=True, slots=True)
class Expected:
    state: list[int]
    extended: ExtendedState
    writes: dict[int, int]
    redirected: bool
    consumer_changes: tuple[str, ...]


def consumer_changes(tx: Transaction) -> dict[str, int]:
    if tx.chain is None:
        return {}
    before, after = tx.chain
    return {name: getattr(after, name) for name in STATE_INDEX if getattr(after, name) != getattr(before, name)}


def expected_outcome(tx: Transaction, scratch: ScratchCpu) -> Expected:
    changes = consumer_changes(tx)
    state = list(tx.start_state)
    for name, value in changes.items():
        state[STATE_INDEX[name]] = value
    if state[RIP_INDEX] != tx.site:
        return Expected(state, tx.start_ext, {}, True, tuple(changes))
    if tx.nop:  # a NOP's whole effect is ip += length: no need to run it
        state[RIP_INDEX] = tx.site + len(tx.original)
        return Expected(state, tx.start_ext, {}, False, tuple(changes))
    ref: Reference = scratch.execute(tx.site, tx.original, state, tx.start_ext)
    return Expected(ref.state, ref.extended, ref.writes, False, tuple(changes))
