"""What a hit writes elsewhere (``memory``): a hit may write only below the red zone (the design's
scratch) and into the kernel's own pages; any other byte it leaves changed that the original
instruction would not have is reported with its address, old and new bytes and writer."""

from __future__ import annotations

from collections.abc import Callable

from emu.hotpath.write_log import classify
from emu.hotpath.write_log import entries as log_entries
from emu.verify.checks.hit import path_name, violation
from emu.verify.expected import Expected
from emu.verify.records import Transaction
from emu.verify.violations import Check, Violation

Reader = Callable[[int, int], bytes | None]  # (address, size) -> the guest's bytes now (None: unmapped)
Allowed = Callable[[Transaction, int, int], bool]  # (tx, address, size): a write there is the hit's right


def outside_writes(tx: Transaction, allowed: Allowed,
                   describe: Callable[[int], str]) -> dict[int, tuple[int, str]]:
    """Each byte written during ``tx`` outside the red zone and the scratch: (its first old value, the last writer)."""
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
    if tx.unrecorded and not found:
        found.append(violation(Check.MEMORY, tx, "more stores than the write log holds: some were not seen",
                               path=path_name(tx)))
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
    return violation(Check.MEMORY, tx, summary, address=hex(addr), size=len(old), old=old.hex(), new=new.hex(),
                      writer=writer, path=path_name(tx))
