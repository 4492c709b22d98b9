"""Which files a corpus entry's processes map executable: its libraries (ld.so and what it loads,
dlopen included) and the programs its children exec, found by running the entry once unprobed.

A uprobe belongs to a file, so the real kernel probes a library site in every process that maps the
library: the dynamic half of the survey probes each of these files' sites too (engine.py). Runs on a
worker (a Dask task) and returns plain data: host paths, resolved, in the order first mapped, and
what the run printed (compared with the entry's native record, native.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu.survey.corpus import Entry
from emu.survey.native import Output

if TYPE_CHECKING:
    from emu.machine import Machine
    from emu.vma import Vma


def mapped_files(entry: Entry) -> tuple[tuple[str, ...], Output | None]:
    """The files other than ``entry``'s binary that any process of its run maps executable, and the
    run's output (no files and None if the emulation cannot run it: the corpus run then says why)."""
    from emu.guestio import GuestIO
    from emu.machine import Machine, RunOptions
    from emu.runtypes import LIMITS

    found: dict[str, None] = {}

    def watch(machine: Machine) -> None:
        def mapped(vma: Vma) -> None:
            if vma.prot & 4 and vma.name.startswith("/"):  # PROT_EXEC, a file
                found.setdefault(os.path.realpath(vma.name))

        for vma in machine.mem:  # what the loader mapped at exec: the interpreter
            mapped(vma)
        machine.kernel.exec_mmap_observers.append(mapped)

    io = GuestIO.captured(entry.stdin)
    try:
        machine = Machine(entry.binary, [entry.binary, *entry.args], dict(entry.env),
                          RunOptions(timeout_s=entry.timeout_s), io)
        watch(machine)
        machine.fork_observers.append(watch)
        result = machine.run()
    except Exception:  # (the probed runs report a program the emulation cannot run)
        return (), None
    binary = os.path.realpath(entry.binary)
    ending = (f"stopped: {result.message}" if result.ending in LIMITS
              else f"signal {int(result.signal)}" if result.signal is not None else f"exit {result.exit_status}")
    return tuple(path for path in found if path != binary and os.path.isfile(path)), Output.of(ending, bytes(io.out))


@dataclass(frozen=True, slots=True)
class Discovery:
    """A task's result, whatever order tasks end in: the entry (its content key), the files its
    processes map, and its unprobed run's output (None: the emulation could not run it)."""

    key: str
    files: tuple[str, ...]
    output: Output | None


def discover(entry: Entry) -> Discovery:
    return Discovery(entry.content_key(), *mapped_files(entry))
