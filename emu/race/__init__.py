"""Races between a running thread and the kernel's patching of a probe site.

``explore(binary, spec, design, event)`` returns a RaceReport: every distinct outcome of every
interleaving of "thread 1" through the site with the event's writes, with a count and an example.
Modules: scenario (the machine, the entry state, the recorded writes), thread (stepping thread 1
from a saved state), explore (the enumeration), outcome (classification), report (rendering).
"""

from emu.race.explore import explore, explore_designs
from emu.race.report import RaceReport, reports_json
from emu.race.scenario import Event, parse_event

__all__ = ["Event", "RaceReport", "explore", "explore_designs", "parse_event", "reports_json"]
