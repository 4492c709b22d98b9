"""The red zone a hit leaves (``redzone``): the 128 bytes below the interrupted rsp, which the
interrupted code may keep live (System V ABI), byte for byte as the original instruction alone would
have left them; each differing run blamed on the store that left it."""

from __future__ import annotations

import functools
from collections.abc import Callable

from emu.abi import RED_ZONE
from emu.verify.expected import Expected
from emu.verify.records import Evidence, Transaction, guest_writes, path_name
from emu.violations import Check, Violation


def check_redzone(tx: Transaction, exp: Expected, describe: Callable[[int], str]) -> list[Violation]:
    """Every red-zone byte that differs from the reference, blamed on the guest store or kernel copy that wrote it."""
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
    """Each run [lo, hi) of red-zone bytes that differ from ``expected``, with the pc of the guest store
    that left it (None: none did). Cached: a design that clobbers the red zone does it on every hit."""
    wrong = _differing(after, expected)
    out: list[tuple[int, int, int | None]] = []
    for pc, addr, size, _value in reversed(guest_writes(logged, base, before, nop)):  # the last store to a byte left it
        lo, hi = max(addr - base, 0), min(addr + size - base, RED_ZONE)
        bytes_written = ((1 << hi - lo) - 1) << lo if hi > lo else 0
        if wrong & bytes_written:
            wrong &= ~bytes_written
            out.append((lo, hi, pc))
    out += [(lo, hi, None) for lo, hi in _runs(wrong)]
    return tuple(sorted(out))


def _differing(a: bytes, b: bytes) -> int:
    """A mask with bit i set where byte i differs (each byte made a '0' or '1' digit, in a few C calls)."""
    diff = (int.from_bytes(a, "little") ^ int.from_bytes(b, "little")).to_bytes(len(a), "little")
    return int(diff.translate(_DIFFERS_DIGIT)[::-1], 2)


_DIFFERS_DIGIT = b"0" + b"1" * 255


def _runs(mask: int) -> list[tuple[int, int]]:
    """The runs of set bits of ``mask``, as [lo, hi) pairs, lowest first."""
    runs: list[tuple[int, int]] = []
    while mask:
        lo = (mask & -mask).bit_length() - 1
        ones = mask >> lo
        runs.append((lo, hi := lo + (~ones & ones + 1).bit_length() - 1))  # past its trailing ones
        mask &= -1 << hi
    return runs


def _redzone(tx: Transaction, lo: int, hi: int, expected: bytes, writer: str) -> Violation:
    summary, detail = _redzone_evidence(lo, hi, bytes(expected[lo:hi]), tx.redzone_after[lo:hi], writer, path_name(tx))
    return Violation(Check.REDZONE, tx.probe, tx.site, summary, dict(detail), tx.hit)


@functools.lru_cache(maxsize=1024)
def _redzone_evidence(lo: int, hi: int, old: bytes, new: bytes, writer: str, path: str) -> tuple[str, Evidence]:
    """The summary and detail of one red-zone violation (cached, as _blame)."""
    offset = lo - RED_ZONE
    summary = f"rsp{offset:+d} ({hi - lo} bytes) {old.hex()} -> {new.hex()} by {writer}"
    detail = {"offset": offset, "size": hi - lo, "old": old.hex(), "new": new.hex(), "writer": writer, "path": path}
    return summary, tuple(detail.items())
