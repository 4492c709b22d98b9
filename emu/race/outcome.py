"""What one interleaving did to thread 1, compared with the unprobed reference run.

The reference is the same entry state run over the original instruction. In order of severity:
a signal (SIGILL, SIGSEGV, SIGTRAP as the fake kernel raises them), the instruction limit, a
resume at another address than the reference's, registers that differ from the reference's,
a write into the 128-byte red zone below thread 1's rsp, and otherwise clean.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from emu.cpu import GPRS
from emu.race.thread import RIP_INDEX, ThreadEnd

CLEAN = "clean"
RED_ZONE_WRITE = "red-zone write"
INSN_LIMIT = "insn limit"
REG_NAMES: tuple[str, ...] = tuple(r.name.lower() for r in GPRS) + ("rip", "rflags")
Describe = Callable[[int], str]


@dataclass(frozen=True)
class Outcome:
    key: str  # what is counted: "clean", "SIGSEGV", "wrong resume at t_nop5+5", "wrong register: rsp" ...
    detail: str  # what this example showed in full


def classify(end: ThreadEnd, reference: ThreadEnd, describe: Describe) -> Outcome:
    if end.signal is not None:
        return Outcome(end.signal.name, f"{end.signal.name} at {describe(end.rip)}: {end.detail}"
                                        f"{_changed_suffix(end, reference)}{_last(end, describe)}")
    if end.limit:
        return Outcome(INSN_LIMIT, end.detail)
    if end.rip != reference.rip:
        where = describe(end.rip)
        return Outcome(f"wrong resume at {where}", f"left the site at {where}, the unprobed run at "
                                                   f"{describe(reference.rip)}{_changed_suffix(end, reference)}"
                                                   f"{_last(end, describe)}")
    changed = changed_registers(end, reference)
    if changed:
        return Outcome(f"wrong register: {', '.join(changed)}", _register_detail(end, reference, changed))
    if end.red_zone != reference.red_zone:
        first = next(i for i, (a, b) in enumerate(zip(end.red_zone, reference.red_zone, strict=True)) if a != b)
        return Outcome(RED_ZONE_WRITE, f"red zone overwritten from rsp-{len(end.red_zone) - first}")
    return Outcome(CLEAN, f"resumed at {describe(end.rip)} with every register and the red zone intact")


def changed_registers(end: ThreadEnd, reference: ThreadEnd) -> list[str]:
    return [REG_NAMES[i] for i in range(len(REG_NAMES))
            if i != RIP_INDEX and end.regs[i] != reference.regs[i]]


def _register_detail(end: ThreadEnd, reference: ThreadEnd, changed: list[str]) -> str:
    parts = []
    for name in changed:
        i = REG_NAMES.index(name)
        delta = (end.regs[i] - reference.regs[i] + (1 << 63)) % (1 << 64) - (1 << 63)
        parts.append(f"{name} {end.regs[i]:#x} (unprobed {reference.regs[i]:#x}, {delta:+d})")
    return "; ".join(parts)


def _changed_suffix(end: ThreadEnd, reference: ThreadEnd) -> str:
    changed = changed_registers(end, reference)
    return f"; {_register_detail(end, reference, changed)}" if changed else ""


def _last(end: ThreadEnd, describe: Describe) -> str:
    at = end.last_at
    return "" if at is None else f"; last instruction at {describe(at)}: {end.last_insn}"
