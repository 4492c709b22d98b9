"""What a transaction should have produced: the original instruction alone, from the state the
consumers left (or no instruction at all when a consumer redirected ip)."""

from __future__ import annotations

from functools import cached_property

from emu.cpu.effects import ReferenceCache, stored_into
from emu.cpu.scratch import Reference
from emu.cpu.state import RAW_KEPT, RAW_RIP, RAW_RSP, ExtendedState, decode_extended, decode_state, encode_state
from emu.kernel.uprobes.regs import STATE_FIELDS
from emu.verify.records import RIP_INDEX, Transaction

STATE_INDEX = {name: i for i, name in enumerate(STATE_FIELDS)}  # PtRegs field -> index in Cpu.read_user_state()


class Expected:
    """The reference as a RawState snapshot (rip: where the guest must resume, decoded on first use), the
    stores the instruction makes (in order), and what the consumers changed."""

    def __init__(self, raw: bytes, stores: tuple[tuple[int, bytes], ...] = (),
                 consumer_changes: tuple[str, ...] = ()) -> None:
        self.raw, self.stores, self.consumer_changes = raw, stores, consumer_changes

    @cached_property
    def state(self) -> list[int]:
        return decode_state(self.raw)

    @cached_property
    def extended(self) -> ExtendedState:
        return decode_extended(self.raw)

    def redzone(self, tx: Transaction) -> bytes:
        """The red zone the guest must resume with: as it was, plus the instruction's own stores."""
        assert tx.redzone_before is not None  # the tracker fills it in before reporting
        return stored_into(tx.redzone_before, tx.redzone_base, self.stores) if self.stores else tx.redzone_before


def consumer_changes(tx: Transaction) -> dict[str, int]:
    if tx.chain is None:
        return {}
    before, after = tx.chain
    return {name: getattr(after, name) for name in STATE_INDEX if getattr(after, name) != getattr(before, name)}


def expected_outcome(tx: Transaction, references: ReferenceCache) -> Expected:
    """The reference taken before the instruction ran (tx.prepared), if there is one; else one
    taken now (right for an instruction that does not load what it stores)."""
    if tx.chain is None and not tx.nop:  # the common case: the scratch CPU's snapshot is the reference
        ref = _reference(tx, tx.start_raw, references)
        return Expected(ref.raw, ref.stores)
    if tx.chain is None:  # a NOP, nothing changed: the start state with ip moved past it
        return Expected(tx.at.next.to_bytes(8, "little") + tx.start_raw[8:])
    changes = consumer_changes(tx)
    state = _changed_state(tx, changes)
    if state[RIP_INDEX] == tx.site and not tx.nop:
        ref = _reference(tx, encode_state(state, tx.start_ext), references)
        return Expected(ref.raw, ref.stores, tuple(changes))
    if state[RIP_INDEX] == tx.site:  # a NOP's whole effect is ip += length: no need to run it
        state[RIP_INDEX] = tx.at.next
    return Expected(encode_state(state, tx.start_ext), (), tuple(changes))  # (or a consumer moved ip)


def reference_input(tx: Transaction) -> bytes | None:
    """The snapshot ``tx``'s instruction runs from, with what the consumers changed; None if they moved ip."""
    state = _changed_state(tx, consumer_changes(tx))
    return None if state[RIP_INDEX] != tx.site else encode_state(state, tx.start_ext)


def _changed_state(tx: Transaction, changes: dict[str, int]) -> list[int]:
    state = list(tx.start_state)
    for name, value in changes.items():
        state[STATE_INDEX[name]] = value
    return state


def _reference(tx: Transaction, raw: bytes, references: ReferenceCache) -> Reference:
    if tx.prepared is not None and tx.prepared.raw == raw:
        return tx.prepared.reference
    return references.reference(tx.site, tx.at.original, raw)


def resume_address(exp: Expected) -> int:
    return int.from_bytes(exp.raw[RAW_RIP : RAW_RIP + 8], "little")


def same_registers(tx: Transaction, exp: Expected) -> bool:
    """Every register but rip (rflags exactly) and the extended state as in the reference."""
    return tx.end_raw[RAW_KEPT:] == exp.raw[RAW_KEPT:] and tx.end_rsp == int.from_bytes(
        exp.raw[RAW_RSP : RAW_RSP + 8], "little")


def matches_exactly(tx: Transaction, exp: Expected) -> bool:
    """Resumed where the reference says, every register and the red zone byte for byte as in it: no check can find anything."""
    return tx.end_addr == resume_address(exp) and same_registers(tx, exp) and tx.redzone_after == exp.redzone(tx)
