"""The race explorer: every interleaving of thread 1 through a site with one patching event.

For the event's ``n`` writes and each split ``j`` (0..n writes done before thread 1 enters), thread 1
runs through once without being preempted; then, for every instruction boundary ``k`` on that path
(inside the site, the trampoline or slot, the kernel's syscall handling counting as one
instruction) and every later split ``m``, thread 1 is stopped after ``k`` instructions, writes
j+1..m land, and thread 1 continues to the end. Each run is classified against the unprobed
reference (outcome.py) and summed up per design (report.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import TypeVar

from emu.designs import Design, get_design
from emu.errors import UsageError
from emu.machine import Machine, RunOptions
from emu.race.outcome import classify
from emu.race.report import Interleaving, RaceReport
from emu.race.scenario import Event, Scenario, build, parse_event
from emu.race.thread import ThreadRunner

R = TypeVar("R")


class Describer:
    """Addresses as people read them: ``t_nop5+5``, ``[uprobes-trampoline]+0x10``, else hex."""

    def __init__(self, machine: Machine) -> None:
        self.mem = machine.mem
        bias = machine.exe.bias
        found = sorted((value + bias, size, name) for name, (value, size) in
                       machine.resolver.symbols.items() if value)
        self.starts = [start for start, _, _ in found]
        self.symbols = found

    def __call__(self, addr: int) -> str:
        vma = self.mem.find(addr)
        if vma is not None and vma.name and vma.name.startswith("["):
            return f"{vma.name}+{addr - vma.start:#x}"
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0:
            start, size, name = self.symbols[i]
            if addr < start + max(size, 1) or (size == 0 and addr - start < 16):
                return name if addr == start else f"{name}+{addr - start}"
        return f"{addr:#x}"


def explore(binary: str, spec: str | Sequence[str], design: str | Design, event: str | Event,
            argv: Sequence[str] | None = None, options: RunOptions | None = None,
            env: dict[str, str] | None = None) -> RaceReport:
    """Explore ``event`` on the probe ``spec`` (reattach: two specs, A then B) under ``design``."""
    specs = (spec,) if isinstance(spec, str) else tuple(spec)
    chosen = get_design(design)
    scenario = build(binary, list(argv or [binary]), specs, chosen, parse_event(event) if isinstance(event, str)
                     else event, options, env)
    return _enumerate(scenario)


def explore_designs(binary: str, specs: Sequence[str], designs: Sequence[str | Design], event: str | Event,
                    argv: Sequence[str] | None = None, options: RunOptions | None = None,
                    env: dict[str, str] | None = None) -> list[RaceReport]:
    """``explore`` under each design. A design whose kernel refuses the probe gets a report saying so;
    if every design refuses, that is the caller's error."""
    chosen = parse_event(event) if isinstance(event, str) else event
    return each_design(designs, lambda d: explore(binary, specs, d, chosen, argv, options, env),
                       lambda name, why: RaceReport(name, chosen.value, tuple(specs), (), refused=why))


def each_design(designs: Sequence[str | Design], explore_one: Callable[[str | Design], R],
                refused: Callable[[str, str], R]) -> list[R]:
    """``explore_one`` of each design; one that raises UsageError (its kernel refuses the probe) gets
    ``refused(name, why)`` instead, unless every design does: then that is the caller's error."""
    reports: list[R] = []
    errors: list[UsageError] = []
    for design in designs:
        name = get_design(design).name
        try:
            reports.append(explore_one(design))
        except UsageError as err:
            errors.append(err)
            reports.append(refused(name, str(err)))
    if errors and len(errors) == len(reports):
        raise errors[0]
    return reports


def _enumerate(scenario: Scenario) -> RaceReport:
    describe = Describer(scenario.machine)
    total = len(scenario.writes)
    report = RaceReport(scenario.design.name, scenario.event.value,
                        tuple(f"{s.spec} at {s.vaddr:#x}" for s in scenario.sites), scenario.writes)
    with ThreadRunner(scenario) as runner:
        reference = runner.reference()
        for before in range(total + 1):
            through = runner.run(before)
            outcome = classify(through, reference, describe)
            report.add(Interleaving(before), outcome)
            if before in (0, total):
                report.no_race(outcome)
            for insns in range(1, through.steps):
                at = describe(through.path[insns])
                for after in range(before + 1, total + 1):
                    end = runner.run(before, insns, after)
                    report.add(Interleaving(before, insns, after, at), classify(end, reference, describe))
    return report


