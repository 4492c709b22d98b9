"""Deterministic case generation: case ``index`` of campaign ``seed`` is always the same case,
in any process, on any machine (``random.Random`` seeded with a string hashes it with SHA-512)."""

from __future__ import annotations

import random

from emu.abi import RED_ZONE
from emu.fuzz.case import (
    ARITH_FLAGS,
    CASE_REGS,
    CONDITIONS,
    FLAGS_BASE,
    MAX_STORES,
    STORE_SIZES,
    Action,
    ActionKind,
    Case,
    Store,
    StoreKind,
)
from emu.fuzz.sites import ENTRIES, SITES

ACTION_CHANCE = 0.25
URETPROBE_CHANCE = 0.25
MOVE_SP_STEPS = (8, 16, 32, 64)  # sp moves up only: the function then reads inside the old red zone or above


def case_rng(seed: int, index: int) -> random.Random:
    return random.Random(f"uprobe-emu-fuzz:{seed}:{index}")


def interesting_value(rng: random.Random, size: int) -> int:
    """Mostly random bytes, sometimes the edges (0, all ones, one bit) that hide or show a clobber."""
    bits = 8 * size
    pick = rng.random()
    if pick < 0.1:
        return 0
    if pick < 0.2:
        return (1 << bits) - 1
    if pick < 0.3:
        return 1 << rng.randrange(bits)
    return rng.getrandbits(bits)


def random_store(rng: random.Random, stores: list[Store]) -> Store:
    size = rng.choice(STORE_SIZES)
    if stores and rng.random() < 0.3:  # overlap an earlier store on purpose
        other = rng.choice(stores)
        offset = min(max(other.offset + rng.randrange(-size + 1, other.size), size), RED_ZONE)
    else:
        offset = rng.randrange(size, RED_ZONE + 1)
    if size == 16:
        kind = rng.choice((StoreKind.MOVDQU, StoreKind.MOVAPS))
        if kind is StoreKind.MOVAPS:  # rsp is 8 mod 16 in the function: rsp-offset aligned needs offset 8 mod 16
            offset = rng.randrange(24, RED_ZONE + 1, 16)
        return Store(offset, 16, kind, interesting_value(rng, 16))
    if size == 1 and rng.random() < 0.3:
        return Store(offset, 1, StoreKind.SETCC, 0, rng.choice(CONDITIONS))
    return Store(offset, size, StoreKind.MOV, interesting_value(rng, size))


def random_action(rng: random.Random, site: str) -> Action | None:
    if rng.random() >= ACTION_CHANCE:
        return None
    kinds = [k for k in ActionKind if not (k is ActionKind.MOVE_SP and SITES[site].pushes)]
    kind = rng.choice(kinds)
    if kind is ActionKind.SET_REG:
        return Action(kind, rng.choice(CASE_REGS), interesting_value(rng, 8))
    if kind is ActionKind.MOVE_SP:
        return Action(kind, "", rng.choice(MOVE_SP_STEPS))
    return Action(kind)


def random_flags(rng: random.Random) -> int:
    flags = FLAGS_BASE
    for bit in ARITH_FLAGS:
        if rng.random() < 0.5:
            flags |= bit
    return flags


def generate(seed: int, index: int) -> Case:
    rng = case_rng(seed, index)
    forms = list(SITES.values())
    site = rng.choices(forms, weights=[f.weight for f in forms])[0].name
    stores: list[Store] = []
    for _ in range(rng.randint(0, MAX_STORES)):
        stores.append(random_store(rng, stores))
    return Case(
        seed=seed, index=index, site=site, entry=rng.choice(tuple(ENTRIES)), stores=tuple(stores),
        regs=tuple(interesting_value(rng, 8) for _ in CASE_REGS), flags=random_flags(rng),
        action=random_action(rng, site), uretprobe=rng.random() < URETPROBE_CHANCE,
    )
