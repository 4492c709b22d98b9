"""Which files a corpus entry's processes map executable: its libraries (ld.so and what it loads,
dlopen included) and the programs its children exec, found by running the entry once unprobed.

A uprobe belongs to a file, so the real kernel probes a library site in every process that maps the
library: the dynamic half of the survey probes each of these files' sites too (engine.py). Runs on a
worker (a Dask task) and returns plain data: host paths, resolved, in the order first mapped.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from emu.survey.corpus import Entry

if TYPE_CHECKING:
    from emu.machine import Machine
    from emu.vma import Vma


def mapped_files(entry: Entry) -> tuple[str, ...]:
    """The files other than ``entry``'s binary that any process of its run maps executable (an empty
    tuple if the emulation cannot run it: the corpus run then says why)."""
    from emu.guestio import GuestIO
    from emu.machine import Machine, RunOptions

    found: dict[str, None] = {}

    def watch(machine: Machine) -> None:
        def mapped(vma: Vma) -> None:
            if vma.prot & 4 and vma.name.startswith("/"):  # PROT_EXEC, a file
                found.setdefault(os.path.realpath(vma.name))

        for vma in machine.mem:  # what the loader mapped at exec: the interpreter
            mapped(vma)
        machine.kernel.exec_mmap_observers.append(mapped)

    try:
        machine = Machine(entry.binary, [entry.binary, *entry.args], dict(entry.env),
                          RunOptions(timeout_s=entry.timeout_s), GuestIO.captured(entry.stdin))
        watch(machine)
        machine.fork_observers.append(watch)
        machine.run()
    except Exception:  # (the probed runs report a program the emulation cannot run)
        return ()
    binary = os.path.realpath(entry.binary)
    return tuple(path for path in found if path != binary and os.path.isfile(path))


def discover(entry: Entry) -> tuple[str, tuple[str, ...]]:
    """(the entry's content key, its mapped files): a task's result, whatever order tasks end in."""
    return entry.content_key(), mapped_files(entry)
