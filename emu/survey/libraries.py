"""Which files a corpus entry's processes map executable: its libraries (ld.so and what it loads,
dlopen included) and the programs its children exec, found by running the entry once unprobed.

A uprobe belongs to a file, so the real kernel probes a library site in every process that maps the
library: the dynamic half of the survey probes each of these files' sites too (engine.py). Runs on a
worker (a Dask task) and returns plain data: host paths, resolved, in the order first mapped, and
what the run printed (compared with the entry's native record, native.py).
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emu.survey.corpus import Entry, run_options
from emu.survey.native import Output

if TYPE_CHECKING:
    from emu.machine import Machine
    from emu.process.elf import LoadPlan
    from emu.process.vma import Vma


Reached = dict[str, tuple[tuple[int, int], ...]]  # a file (real path) -> [start, end) link-time ranges that ran


class _Coverage:
    """The code each process of a run translates (so runs), by file and link-time address: a block
    is translated when control first reaches it, and Unicorn translates no code it will not run."""

    def __init__(self) -> None:
        self.blocks: dict[str, list[tuple[int, int]]] = {}
        self._biases: dict[tuple[str, int, int], int | None] = {}
        self._plans: dict[str, LoadPlan | None] = {}

    def watch(self, machine: Machine) -> None:
        def translated(pc: int, size: int, _insns: int) -> None:
            vma = machine.mem.find(pc)
            if vma is None or not vma.name.startswith("/"):
                return
            bias = self._bias(vma)
            if bias is not None:
                self.blocks.setdefault(os.path.realpath(vma.name), []).append((pc - bias, pc - bias + size))

        machine.cpu.hooks.add_translation(translated)

    def _bias(self, vma: Vma) -> int | None:
        from emu.libprobes import library_bias
        from emu.process.elf import load_plan

        key = (vma.name, vma.start, vma.offset)
        if key not in self._biases:
            if vma.name not in self._plans:
                try:
                    self._plans[vma.name] = load_plan(vma.name)
                except Exception:  # not an ELF file the loader reads: its code is no site's
                    self._plans[vma.name] = None
            plan = self._plans[vma.name]
            self._biases[key] = None if plan is None else library_bias(plan, vma)
        return self._biases[key]

    def reached(self) -> Reached:
        return {path: tuple(_merged(blocks)) for path, blocks in self.blocks.items()}


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def is_reached(ranges: tuple[tuple[int, int], ...], address: int) -> bool:
    """Whether the code at link-time ``address`` ran (``ranges``: sorted and disjoint, as Reached holds them)."""
    i = bisect.bisect_right(ranges, (address, 1 << 64)) - 1
    return i >= 0 and ranges[i][0] <= address < ranges[i][1]


def mapped_files(entry: Entry) -> tuple[tuple[str, ...], Output | None, Reached]:
    """The files other than ``entry``'s binary that any process of its run maps executable, the run's
    output, and the code it ran (no files, None and nothing if the emulation cannot run it: the corpus
    run then says why)."""
    from emu.guestio import GuestIO
    from emu.machine import Machine
    from emu.runtypes import LIMITS

    found: dict[str, None] = {}
    coverage = _Coverage()

    def watch(machine: Machine) -> None:
        def mapped(vma: Vma) -> None:
            if vma.prot & 4 and vma.name.startswith("/"):  # PROT_EXEC, a file
                found.setdefault(os.path.realpath(vma.name))

        for vma in machine.mem:  # what the loader mapped at exec: the interpreter
            mapped(vma)
        machine.kernel.exec_mmap_observers.append(mapped)
        coverage.watch(machine)

    io = GuestIO.captured(entry.stdin)
    try:
        with run_options(entry) as options:
            machine = Machine(entry.binary, [entry.binary, *entry.args], dict(entry.env), options, io)
            watch(machine)
            machine.fork_observers.append(watch)
            result = machine.run()
    except Exception:  # (the probed runs report a program the emulation cannot run)
        return (), None, {}
    binary = os.path.realpath(entry.binary)
    ending = (f"stopped: {result.message}" if result.ending in LIMITS
              else f"signal {int(result.signal)}" if result.signal is not None else f"exit {result.exit_status}")
    files = tuple(path for path in found if path != binary and os.path.isfile(path))
    return files, Output.of(ending, bytes(io.out)), coverage.reached()


@dataclass(frozen=True, slots=True)
class Discovery:
    """A task's result, whatever order tasks end in: the entry (its run key), the files its
    processes map, its unprobed run's output (None: the emulation could not run it) and the code the
    run ran, its own binary's included."""

    key: str
    files: tuple[str, ...]
    output: Output | None
    reached: Reached


def discover(entry: Entry) -> Discovery:
    return Discovery(entry.run_key(), *mapped_files(entry))
