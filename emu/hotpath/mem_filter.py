"""Memory hooks over the whole address space that enter Python only for the bytes they are told to watch.

A watch that cares about a few bytes (the survey's read-back watch, emu/survey/dynamic.py: red-zone
bytes a probe hit changed) still needs a hook on every load and store, since any of them may touch
those bytes. A Python callback per access costs about ten times the run of a large program (llc's
probed run went from 1.3 s to 12 s). With the C extension, ``memfilter_hook``
(emu/hotpath_src/memfilter.c) stands in front of the Python callbacks and calls them only for an
access that overlaps a watched range; without it, the callbacks are hooked directly (they return at
once while nothing is watched, which is all the pure-Python mode can do).

The table is struct mem_filter of memfilter.c, in 64-bit words where the extension says they are:
the ranges in use, the ranges the table holds, nonzero to pass every access (more ranges than it
holds), the read and write callbacks, the accesses passed to Python, then the [start, end) pairs.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable

import unicorn

from emu import hotpath
from emu.cpu.binding import MEM_CB
from emu.cpu.hooks import Hooks, RawWriteHook

_HEADER = "count capacity everything read_callback write_callback passed"
_LAYOUT = hotpath.struct_layout("mem_filter", [(name, 8) for name in _HEADER.split()] + [("ranges", 0)])
COUNT, CAPACITY, EVERYTHING, READ_CALLBACK, WRITE_CALLBACK, PASSED, HEADER_WORDS = hotpath.words(_LAYOUT,
                                                                                                _HEADER + " ranges")
EVERYWHERE = (1, 0)  # begin > end: Unicorn's whole address space


def ranges_of(addresses: Iterable[int]) -> list[tuple[int, int]]:
    """The sorted addresses as [start, end) runs of consecutive bytes."""
    runs: list[tuple[int, int]] = []
    for a in sorted(addresses):
        if runs and runs[-1][1] == a:
            runs[-1] = (runs[-1][0], a + 1)
        elif not runs or runs[-1][1] < a:
            runs.append((a, a + 1))
    return runs


class FilteredMemHooks:
    """A read hook (after the load) and a write hook (before the store) over everything, whose Python
    callbacks see only the accesses that overlap what :meth:`watch` was last given."""

    def __init__(self, hooks: Hooks, on_read: RawWriteHook, on_write: RawWriteHook, capacity: int = 32) -> None:
        native = hotpath.native
        self._table: ctypes.Array[ctypes.c_uint64] | None = None
        if native is None:
            hooks.add_raw_mem_read(on_read, *EVERYWHERE)
            hooks.add_raw_mem_write(on_write, *EVERYWHERE)
            return
        self._callbacks = (MEM_CB(on_read), MEM_CB(on_write))  # alive as long as the hooks
        table = (ctypes.c_uint64 * (HEADER_WORDS + 2 * capacity))()
        table[CAPACITY] = capacity
        table[READ_CALLBACK], table[WRITE_CALLBACK] = (ctypes.cast(c, ctypes.c_void_p).value or 0 for c in self._callbacks)
        self._table = table
        hook = ctypes.c_void_p(native.memfilter_hook)
        hooks.add(unicorn.UC_HOOK_MEM_READ_AFTER, hook, *EVERYWHERE, user_data=ctypes.addressof(table))
        hooks.add(unicorn.UC_HOOK_MEM_WRITE, hook, *EVERYWHERE, user_data=ctypes.addressof(table))

    def watch(self, addresses: Iterable[int]) -> None:
        """From now on, pass the accesses that touch any of ``addresses`` (and no other) to Python."""
        table = self._table
        if table is None:
            return
        runs = ranges_of(addresses)
        if len(runs) > table[CAPACITY]:
            table[EVERYTHING], table[COUNT] = 1, 0
            return
        for i, (start, end) in enumerate(runs):
            table[HEADER_WORDS + 2 * i], table[HEADER_WORDS + 2 * i + 1] = start, end
        table[COUNT], table[EVERYTHING] = len(runs), 0

    @property
    def passed(self) -> int | None:
        """Accesses handed to Python so far (None: every one is, without the C extension)."""
        return None if self._table is None else int(self._table[PASSED])
