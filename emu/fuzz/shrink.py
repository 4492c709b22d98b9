"""Greedy shrinking of a finding: fewest stores, then the simplest consumer, smallest offsets,
simplest values and registers, while the case stays a finding of the same nature (a finding
whose program output differs keeps a differing output, so the shrunk ELF still shows it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from emu.errors import UsageError
from emu.fuzz.case import CASE_REGS, FLAGS_BASE, Case, Store, StoreKind

DEFAULT_BUDGET = 300  # oracle calls at most (~2 ms each)


def _without_stores(case: Case) -> Iterator[Case]:
    for i in reversed(range(len(case.stores))):
        yield case.with_(stores=case.stores[:i] + case.stores[i + 1 :])


def _simpler_probes(case: Case) -> Iterator[Case]:
    if case.action is not None:
        yield case.with_(action=None)
    if case.uretprobe:
        yield case.with_(uretprobe=False)
    if case.entry != "nop1":
        yield case.with_(entry="nop1")


def _smaller_offsets(store: Store) -> list[int]:
    low = 24 if store.kind is StoreKind.MOVAPS else store.size
    step = 16 if store.kind is StoreKind.MOVAPS else 1
    wanted = {low, low + ((store.offset - low) // 2 // step) * step, store.offset - step}
    return sorted(o for o in wanted if low <= o < store.offset)


def _simpler_values(store: Store) -> list[int]:
    if store.kind is StoreKind.SETCC:
        return []
    small = [0, 1, store.value & 0xFF, store.value & 0xFFFFFFFF]
    return sorted({v for v in small if v < store.value})


def _simpler_stores(case: Case) -> Iterator[Case]:
    for i, store in enumerate(case.stores):
        variants: list[Store] = []
        for offset in _smaller_offsets(store):
            variants.append(Store(offset, store.size, store.kind, store.value, store.cc))
        for value in _simpler_values(store):
            variants.append(Store(store.offset, store.size, store.kind, value, store.cc))
        if store.kind is StoreKind.MOVAPS:
            variants.append(Store(store.offset, 16, StoreKind.MOVDQU, store.value))
        for variant in variants:
            yield case.with_(stores=case.stores[:i] + (variant,) + case.stores[i + 1 :])


def _simpler_state(case: Case) -> Iterator[Case]:
    zero = tuple(0 for _ in CASE_REGS)
    if case.regs != zero:
        yield case.with_(regs=zero)
        for i, value in enumerate(case.regs):
            if value:
                yield case.with_(regs=case.regs[:i] + (0,) + case.regs[i + 1 :])
    if case.flags != FLAGS_BASE:
        yield case.with_(flags=FLAGS_BASE)


def candidates(case: Case) -> Iterator[Case]:
    """Smaller cases, the most valuable reductions first."""
    for group in (_without_stores, _simpler_probes, _simpler_stores, _simpler_state):
        for candidate in group(case):
            if candidate != case:
                yield candidate


def shrink(case: Case, still_fails: Callable[[Case], bool], budget: int = DEFAULT_BUDGET) -> Case:
    """The smallest case reached greedily from ``case`` for which ``still_fails`` holds."""
    current = case
    progress = True
    while progress and budget > 0:
        progress = False
        for candidate in candidates(current):
            budget -= 1
            try:
                kept = still_fails(candidate)
            except UsageError:
                kept = False
            if kept:
                current, progress = candidate, True
                break
            if budget <= 0:
                break
    return current.with_(origin={"seed": case.seed, "index": case.index, "stores": len(case.stores)})
