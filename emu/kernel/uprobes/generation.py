"""How many times what the probe tables hold has changed: the probes, their consumers' handlers and
switches, the trampoline pages and slots, the verifiers' site facts. Whatever keeps a copy of those
tables (the C front, emu/kernel/uprobes/fastpath.py and emu/hotpath_src/fastsys.c) notes the count it
built them at and takes no hit while the count has moved on; the domain only counts.

The count is one word of memory the C front reads directly (its address: ``TABLES.address``), shared
by every process of the run, as the tables' staleness is."""

from __future__ import annotations

import ctypes


class Generation:
    def __init__(self) -> None:
        self._word = ctypes.c_uint64(1)

    @property
    def address(self) -> int:
        return ctypes.addressof(self._word)

    @property
    def value(self) -> int:
        return int(self._word.value)

    def bump(self) -> None:
        """Something the tables hold changed: every copy of them is stale until rebuilt."""
        self._word.value += 1


TABLES = Generation()
