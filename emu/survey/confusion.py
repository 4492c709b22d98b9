"""The static verdicts against the corpus runs: one confusion table per design.

A probed site's dynamic verdict under a design joins all the corpus runs of its binary: its hits
summed, and **clobbered** when some run saw a changed red-zone byte read back (dynamic.py). Rows
are the static hazard (True, False, None: unknown); columns what the runs saw: clobbered,
exercised (hit at least twice, so linux-6.18's optimized path ran, and not clobbered), reached
once (not clobbered: an optimizing design never ran its patch), never reached. Precision and
recall are those of "hazard" on the sites a run clobbered or exercised; every clobbered site
without a static hazard (a false negative) is listed, and so is every run whose output differs
from the unprobed run's with no site clobbered (a clobber the read-back watch missed, such as one
a system call reads, or another difference).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emu.designs import Design
from emu.survey.analyze import SiteSurvey
from emu.survey.dynamic import library_file
from emu.survey.engine import Outcome

ROWS = {True: "hazard", False: "no_hazard", None: "unknown"}
COLUMNS = ("clobbered", "exercised", "reached_once", "not_reached")


@dataclass
class SiteSeen:
    hits: int = 0
    flagged: int = 0
    read_back: int = 0
    entries: list[str] = field(default_factory=list)  # the entries whose runs hit the site
    clobbered_in: dict[str, str] = field(default_factory=dict)  # entry name -> the spec of a run that read back

    @property
    def column(self) -> str:
        if self.read_back:
            return "clobbered"
        return "exercised" if self.hits >= 2 else "reached_once" if self.hits else "not_reached"


@dataclass
class Confusion:
    cells: dict[str, dict[str, int]]
    false_negatives: list[dict[str, Any]]
    unsurveyed: int = 0  # probed addresses no static site names (a spec on some other instruction)
    flagged_only: int = 0  # sites the red-zone verifier flagged whose changed bytes nothing read back
    unexplained: list[str] = field(default_factory=list)  # runs whose output differs, no site clobbered
    confirmed: list[dict[str, Any]] = field(default_factory=list)  # static hazards a run clobbered, with a replay

    @property
    def precision(self) -> float | None:
        tp, fp = self.cells["hazard"]["clobbered"], self.cells["hazard"]["exercised"]
        return tp / (tp + fp) if tp + fp else None

    @property
    def unknowns_decided(self) -> int:
        """Sites the static analysis left unknown that a run decided: clobbered, or exercised and not."""
        return self.cells["unknown"]["clobbered"] + self.cells["unknown"]["exercised"]

    @property
    def recall(self) -> float | None:
        tp, fn = self.cells["hazard"]["clobbered"], self.cells["no_hazard"]["clobbered"]
        return tp / (tp + fn) if tp + fn else None

    def to_json(self) -> dict[str, Any]:
        return {**self.cells, "precision": self.precision, "recall": self.recall, "unsurveyed": self.unsurveyed,
                "unknowns_decided": self.unknowns_decided,
                "flagged_not_read_back": self.flagged_only, "output_differs_unexplained": self.unexplained,
                "false_negatives": self.false_negatives, "confirmed": self.confirmed}


def seen_sites(outcome: Outcome, design: str) -> dict[tuple[str, int], SiteSeen]:
    """(file sha256, link-time address) -> what the corpus runs under ``design`` saw there: the
    entry's binary, or the library a site's spec names."""
    seen: dict[tuple[str, int], SiteSeen] = {}
    for cr in outcome.runs:
        if cr.run.design != design or cr.run.status != "ok":
            continue
        for s in cr.run.sites:
            if s.refused:
                continue
            library = library_file(s.spec)
            sha = cr.run.sha256 if library is None else outcome.walk.elf.get(library, library)
            got = seen.setdefault((sha, s.address), SiteSeen())
            got.hits += s.hits
            got.flagged += s.flagged
            got.read_back += s.read_back
            if s.hits:
                got.entries.append(cr.name)
            if s.read_back:
                got.clobbered_in.setdefault(cr.name, s.spec)
    return seen


def confusion(outcome: Outcome, design: Design) -> Confusion:
    static = _static_sites(outcome)
    cells = {row: dict.fromkeys(COLUMNS, 0) for row in ROWS.values()}
    result = Confusion(cells, [])
    for (sha, address), got in sorted(seen_sites(outcome, design.name).items()):
        found = static.get((sha, address))
        if found is None:
            result.unsurveyed += 1
            continue
        path, site = found
        if not got.hits and site.verdicts.get(design.name, "").startswith("refused"):
            continue  # a site the run left out as never reached, which the design would not even attach
        hazard = site.hazard.get(design.name)
        cells[ROWS[hazard]][got.column] += 1
        result.flagged_only += bool(got.flagged and not got.read_back)
        if got.column != "clobbered":
            continue
        found_at = {"file": path, "address": address, "symbol": site.symbol, "red_zone": site.red_zone,
                    "reason": site.reason, "live_bytes": [list(x) for x in site.live], "hits": got.hits,
                    "read_back": got.read_back, "entries": sorted(set(got.entries)),
                    "replay": _replay(outcome, design.name, got)}
        if hazard is True:
            result.confirmed.append(found_at)
        elif hazard is False:
            result.false_negatives.append(found_at)
    result.unexplained = [cr.name for cr in outcome.runs if cr.run.design == design.name and cr.run.status == "ok"
                          and not cr.run.same_output and not any(s.read_back for s in cr.run.sites)]
    return result


def _replay(outcome: Outcome, design: str, got: SiteSeen) -> str | None:
    """The command that shows one clobber of the site (the first entry that read it back)."""
    from emu.survey.replay import replay_command

    for name, spec in sorted(got.clobbered_in.items()):
        entry = outcome.entries.get(name)
        if entry is not None:
            return replay_command(entry, design, spec)
    return None


def _static_sites(outcome: Outcome) -> dict[tuple[str, int], tuple[str, SiteSurvey]]:
    first: dict[str, str] = {}
    for path, sha in sorted(outcome.walk.elf.items()):
        first.setdefault(sha, path)
    out: dict[tuple[str, int], tuple[str, SiteSurvey]] = {}
    for sha, stored in outcome.results.items():
        for s in stored.sites:
            out.setdefault((sha, s.address), (first.get(sha, sha), s))
    return out


def corpus_json(outcome: Outcome, designs: Sequence[Design]) -> dict[str, Any]:
    return {
        "runs": [{"name": cr.name, "binary": cr.binary, "design": cr.run.design, "status": cr.run.status,
                  "error": cr.run.error, "same_output": cr.run.same_output, "divergence": cr.run.divergence,
                  "sites": len(cr.run.sites), "hits": sum(s.hits for s in cr.run.sites),
                  "wall_s": round(cr.run.wall_s, 3)} for cr in outcome.runs],
        "confusion": {d.name: confusion(outcome, d).to_json() for d in designs},
        "native": {name: {"result": kind, "how": how} for name, (kind, how) in sorted(outcome.fidelity.items())},
    }
