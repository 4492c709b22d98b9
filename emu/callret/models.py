"""The models that follow every ``call`` and ``ret`` of a checked run (a CET shadow stack, emu/callret/shstk.py;
an RSB, emu/callret/rsb.py), fed by one CallRetTracker and told which probe hit last, so that what they find
is put down to the hit before it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from emu.callret.rsb import RsbModel
from emu.callret.shstk import ShadowStack
from emu.callret.tracker import CallRetTracker

if TYPE_CHECKING:
    from emu.kernel.uprobes.consumers import EntryPath
    from emu.kernel.uprobes.records import Uprobe
    from emu.kernel.uprobes.regs import PtRegs
    from emu.machine import Machine
    from emu.violations import Violation


class CallRetModels:
    def __init__(self, machine: Machine, shstk: bool, rsb: int | None, report: Callable[[Violation], None]) -> None:
        """A shadow stack if ``shstk`` (its faults go to ``report``), an RSB model of depth ``rsb`` if given;
        neither: nothing is hooked."""
        self.shadow_stack: ShadowStack | None = None
        self.rsb: RsbModel | None = None
        if not shstk and rsb is None:
            return
        calls = CallRetTracker(machine)
        self.shadow_stack = ShadowStack(machine, calls, report) if shstk else None
        self.rsb = RsbModel(calls, rsb) if rsb is not None else None
        self._names: dict[int, str] = {}
        for att in machine.attachments:
            self._names.setdefault(att.address, att.resolved.spec.text)
        self._hits: dict[int, int] = {}
        machine.uprobes.chain_observers.append(self._on_chain)

    def _on_chain(self, probe: Uprobe, _regs: PtRegs | None, _path: EntryPath, after: bool) -> None:
        if after:
            return
        name = self._names.get(probe.vaddr, f"uprobe:{probe.vaddr:#x}")
        self._hits[probe.vaddr] = self._hits.get(probe.vaddr, 0) + 1
        if self.shadow_stack is not None:
            sh = self.shadow_stack
            sh.last_probe, sh.last_site, sh.last_hit = name, probe.vaddr, self._hits[probe.vaddr]
        if self.rsb is not None:
            self.rsb.probe_hit(name)
