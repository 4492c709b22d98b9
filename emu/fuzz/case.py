"""One fuzz case: a leaf function that stores to its red zone, passes a probe site, reads back.

Plain data, no emulator: the generator makes these, the code generator turns one into machine
code, the shrinker makes smaller ones, and findings store them as JSON.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

from emu.abi import RED_ZONE
from emu.errors import UsageError
from emu.fuzz.sites import site_form

# Registers the driver loads before each call (rsp excluded), in the order of the result block.
CASE_REGS: tuple[str, ...] = ("ax", "bx", "cx", "dx", "si", "di", "bp", "r8", "r9", "r10", "r11", "r12", "r13", "r14",
                              "r15")
STORE_SIZES = (1, 2, 4, 8, 16)
MAX_STORES = 8
FLAGS_BASE = 0x202  # bit 1 (reserved, always set) and IF
ARITH_FLAGS = (0x1, 0x4, 0x10, 0x40, 0x80, 0x800)  # CF PF AF ZF SF OF
CONDITIONS = ("o", "no", "b", "ae", "e", "ne", "be", "a", "s", "ns", "p", "np", "l", "ge", "le", "g")


class StoreKind(enum.Enum):
    MOV = "mov"  # 1, 2, 4 or 8 bytes from a general register
    MOVDQU = "movdqu"  # 16 bytes, any alignment
    MOVAPS = "movaps"  # 16 bytes, 16-aligned (the offset is chosen so)
    SETCC = "setcc"  # 1 byte: 0 or 1 from the flags


class ActionKind(enum.Enum):
    SET_REG = "set-reg"  # the consumer writes a register
    REDIRECT = "redirect"  # the consumer moves ip past the site and the instruction after it
    MOVE_SP = "move-sp"  # the consumer raises sp (the function restores its own sp on the way out)


def _short(value: object, limit: int = 80) -> str:
    """``value`` for a one-line message: a hostile record's 2**200 or its megabyte string cut short."""
    text = f"{value:#x}" if isinstance(value, int) else str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def aslr_seed(value: object) -> int | None:
    """``value`` as the ASLR seed of fuzz runs (``--aslr``, a finding's ``aslr``): None for ASLR off,
    else an integer 0 <= n < 2**64 (a UsageError otherwise: a finding's record may come from anyone)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 64:
        return value
    plain = isinstance(value, (int, float, str)) and not isinstance(value, bool)
    shown = _short(value) if plain else f"a {type(value).__name__}"
    raise UsageError(f"aslr must be an integer from 0 to 2**64-1 (null: ASLR off), not {shown}")


@dataclass(frozen=True, slots=True)
class Store:
    offset: int  # the store covers [rsp - offset, rsp - offset + size)
    size: int
    kind: StoreKind
    value: int  # bytes stored (little endian); for setcc the condition index
    cc: str = ""

    def __post_init__(self) -> None:
        if self.size not in STORE_SIZES or not self.size <= self.offset <= RED_ZONE:
            raise UsageError(f"store of {self.size} bytes at rsp-{self.offset} is not inside the red zone")
        if self.kind is StoreKind.MOVAPS and (self.offset % 16 != 8 or self.size != 16):
            raise UsageError(f"movaps at rsp-{self.offset} would fault (needs rsp-offset 16-aligned)")
        if self.kind is StoreKind.SETCC and (self.size != 1 or self.cc not in CONDITIONS):
            raise UsageError(f"setcc store needs size 1 and a condition, got {self.size}, {self.cc!r}")
        if not 0 <= self.value < 1 << (8 * self.size):
            raise UsageError(f"a {self.size}-byte store cannot hold {self.value:#x}")

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "size": self.size, "kind": self.kind.value, "value": hex(self.value),
                "cc": self.cc}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Store:
        return Store(int(d["offset"]), int(d["size"]), StoreKind(d["kind"]), int(str(d["value"]), 0), str(d.get("cc", "")))


@dataclass(frozen=True, slots=True)
class Action:
    """What the site probe's consumer does on every hit."""

    kind: ActionKind
    reg: str = ""  # SET_REG: which register
    value: int = 0  # SET_REG: the value; MOVE_SP: bytes added to sp

    def __post_init__(self) -> None:
        if self.kind is ActionKind.SET_REG and self.reg not in CASE_REGS:
            raise UsageError(f"a consumer can set one of {', '.join(CASE_REGS)}, not {_short(self.reg)!r}")
        if not 0 <= self.value < 1 << 64:
            raise UsageError(f"the consumer's value must be an unsigned 64-bit value, got {_short(self.value)}")
        if self.kind is ActionKind.MOVE_SP and not 0 < self.value <= RED_ZONE:
            raise UsageError(f"a consumer may raise sp by 1 to {RED_ZONE} bytes, not {self.value}")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "reg": self.reg, "value": hex(self.value)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Action:
        return Action(ActionKind(d["kind"]), str(d.get("reg", "")), int(str(d.get("value", "0")), 0))


@dataclass(frozen=True, slots=True)
class Case:
    """Everything that decides one generated program and how it is probed."""

    seed: int
    index: int
    site: str  # a name from emu.fuzz.sites.SITES
    entry: str  # the function's first instruction (a name from emu.fuzz.sites.ENTRIES)
    stores: tuple[Store, ...]
    regs: tuple[int, ...]  # CASE_REGS order
    flags: int
    action: Action | None = None
    uretprobe: bool = False
    origin: dict[str, int] = field(default_factory=dict, compare=False)  # provenance, e.g. the unshrunk case

    def __post_init__(self) -> None:
        if len(self.regs) != len(CASE_REGS):
            raise UsageError(f"a case needs {len(CASE_REGS)} register values, got {len(self.regs)}")
        for name, value in (("seed", self.seed), ("index", self.index), ("flags", self.flags),
                            *zip(CASE_REGS, self.regs, strict=True)):
            if not 0 <= value < 1 << 64:
                raise UsageError(f"{name} must be an unsigned 64-bit value, got {_short(value)}")
        if len(self.stores) > MAX_STORES:
            raise UsageError(f"at most {MAX_STORES} stores, got {len(self.stores)}")
        if self.action is not None and self.action.kind is ActionKind.MOVE_SP and site_form(self.site).pushes:
            raise UsageError(f"a consumer raising sp over a {self.site} site makes it overwrite the return address")

    def with_(self, **changes: Any) -> Case:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "index": self.index, "site": self.site, "entry": self.entry,
            "stores": [s.to_json() for s in self.stores], "regs": [hex(r) for r in self.regs],
            "flags": hex(self.flags), "action": self.action.to_json() if self.action else None,
            "uretprobe": self.uretprobe,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> Case:
        try:
            return Case(
                seed=int(d["seed"]), index=int(d["index"]), site=str(d["site"]), entry=str(d["entry"]),
                stores=tuple(Store.from_json(s) for s in d["stores"]),
                regs=tuple(int(str(r), 0) for r in d["regs"]), flags=int(str(d["flags"]), 0),
                action=Action.from_json(d["action"]) if d.get("action") else None,
                uretprobe=bool(d.get("uretprobe", False)),
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise UsageError(f"not a fuzz case record: {_short(exc)}") from None
