"""The red-zone fuzzer: generated leaf functions around probe sites, an oracle, a shrinker.

Library use: ``check_case(case, design, aslr=None) -> Verdict`` is the oracle (``aslr``: lay the
process out from that ASLR seed); ``generate(seed, index)`` the campaign's generator;
``emu.fuzz.strategy.fuzz_cases()`` the same cases as a hypothesis strategy (imported on demand:
hypothesis is a test dependency).
"""

from __future__ import annotations

from typing import Any

from emu.fuzz.case import Action, ActionKind, Case, Store, StoreKind
from emu.fuzz.generator import generate
from emu.fuzz.oracle import Verdict, check_case

__all__ = ["Action", "ActionKind", "Case", "Store", "StoreKind", "Verdict", "check_case", "fuzz_cases", "generate"]


def __getattr__(name: str) -> Any:
    if name == "fuzz_cases":
        from emu.fuzz.strategy import fuzz_cases

        return fuzz_cases
    raise AttributeError(f"module 'emu.fuzz' has no attribute {name!r}")
