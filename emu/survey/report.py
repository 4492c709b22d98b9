"""A survey's results as JSON (the issue's schema), a terminal summary and a Markdown report.

Each distinct content is counted once, under the first path it was found at (a library and its
copy in another directory are one file to probe); ``files`` and ``elf_files`` count paths.
"""

from __future__ import annotations

import glob
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

from emu.designs import Design
from emu.render import table
from emu.survey.analyze import SiteSurvey, site_rows
from emu.survey.engine import Outcome
from emu.survey.redzone import LIVE, UNKNOWN

HAZARDS_SHOWN = 50  # hazardous sites the Markdown report lists with their disassembly


def _contents(outcome: Outcome) -> list[tuple[str, str]]:
    """(first path, sha256) per distinct surveyed content, in path order."""
    first: dict[str, str] = {}
    for path, sha in sorted(outcome.walk.elf.items()):
        first.setdefault(sha, path)
    return [(path, sha) for sha, path in first.items() if sha in outcome.results]


def _sites(outcome: Outcome) -> list[tuple[str, SiteSurvey]]:
    return [(path, s) for path, sha in _contents(outcome) for s in outcome.results[sha].sites]


def totals(outcome: Outcome, designs: Sequence[Design]) -> dict[str, Any]:
    sites = [s for _, s in _sites(outcome)]
    statuses = Counter(outcome.results[sha].status for _, sha in _contents(outcome))
    return {
        "files": outcome.walk.counts["files"],
        "elf_files": sum(1 for sha in outcome.walk.elf.values()
                         if sha in outcome.results and outcome.results[sha].status == "ok"),
        "distinct_elf_files": statuses["ok"],
        "skipped": {**{k: v for k, v in outcome.walk.counts.items() if k != "files"},
                    **{k: v for k, v in statuses.items() if k != "ok"}},
        "site_count": len(sites),
        "usdt_notes": sum(1 for s in sites if s.kind == "usdt"),
        "red_zone": dict(Counter(s.red_zone for s in sites)),
        "designs": {d.name: {"optimized": sum(s.optimized(d.name) for s in sites),
                             "hazards": sum(s.hazard.get(d.name) is True for s in sites),
                             "unknown": sum(s.hazard.get(d.name) is None for s in sites)} for d in designs},
        "complete": outcome.complete,
    }


def to_json(outcome: Outcome, designs: Sequence[Design]) -> dict[str, Any]:
    out = totals(outcome, designs)
    out["sites"] = [row for path, sha in _contents(outcome)
                    for row in site_rows(path, outcome.results[sha].sites)]
    if outcome.runs:
        from emu.survey.confusion import corpus_json

        out["corpus"] = corpus_json(outcome, designs)
    return out


def confusion_rows(outcome: Outcome, designs: Sequence[Design]) -> list[tuple[str, ...]]:
    """Three rows per design (static hazard, no hazard, unknown) against what the runs saw; the
    design's first row also has the precision and recall."""
    from emu.survey.confusion import COLUMNS, ROWS, confusion

    rows: list[tuple[str, ...]] = [("design", "static", *(c.replace("_", " ") for c in COLUMNS), "precision",
                                    "recall")]
    for d in designs:
        c = confusion(outcome, d)
        for i, row in enumerate(ROWS.values()):
            scores = (_ratio(c.precision), _ratio(c.recall)) if i == 0 else ("", "")
            rows.append((d.name if i == 0 else "", row.replace("_", " "), *(str(c.cells[row][col]) for col in COLUMNS),
                         *scores))
    return rows


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def summary_text(outcome: Outcome, designs: Sequence[Design]) -> str:
    t = totals(outcome, designs)
    rz = t["red_zone"]
    lines = [f"{t['files']} files, {t['elf_files']} ELF files ({t['distinct_elf_files']} distinct), "
             f"{t['site_count']} sites ({t['usdt_notes']} USDT notes): red zone live {rz.get(LIVE, 0)}, "
             f"dead {rz.get('dead', 0)}, unknown {rz.get(UNKNOWN, 0)}"]
    if t["skipped"]:
        lines.append("skipped: " + ", ".join(f"{k} {v}" for k, v in sorted(t["skipped"].items())))
    lines.append(table([("design", "optimized", "hazards", "unknown")] + [
        (name, str(v["optimized"]), str(v["hazards"]), str(v["unknown"])) for name, v in t["designs"].items()]))
    lines.append(f"{outcome.analysed} files analysed by this run" + ("" if outcome.complete else
                                                                     " (stopped early: run again to go on)"))
    if outcome.runs:
        lines += _corpus_text(outcome, designs)
    return "\n".join(lines)


def _corpus_text(outcome: Outcome, designs: Sequence[Design]) -> list[str]:
    from emu.survey.confusion import confusion

    failed = [cr for cr in outcome.runs if cr.run.status != "ok"]
    lines = [f"corpus: {len(outcome.runs)} runs ({outcome.ran} made by this survey, {len(failed)} failed); "
             "the static verdicts against them:"]
    lines.append(table(confusion_rows(outcome, designs)))
    for d in designs:
        c = confusion(outcome, d)
        if c.unknowns_decided:
            lines.append(f"{d.name}: {c.unknowns_decided} sites the static analysis left unknown were decided by the "
                         f"runs ({c.cells['unknown']['clobbered']} clobbered)")
        lines += [f"{d.name}: confirmed hazard: {h['file']} {h['address']:#x} {h['symbol'] or '-'}, "
                  f"{h['read_back']} of {h['hits']} hits read back; replay: {h['replay']}" for h in c.confirmed]
        lines += [f"{d.name}: clobbered without a static hazard: {fn['file']} {fn['address']:#x} "
                  f"{fn['symbol'] or '-'} (red zone {fn['red_zone']})" for fn in c.false_negatives]
        lines += [f"{d.name}: output differs with no site clobbered: {name}" for name in c.unexplained]
    lines += [f"failed: {cr.name} under {cr.run.design}: {cr.run.error}" for cr in failed[:10]]
    return lines + fidelity_lines(outcome)


def fidelity_lines(outcome: Outcome) -> list[str]:
    """How many entries' unprobed emulated runs print what they print natively (native.py), and which do not."""
    if not outcome.fidelity:
        return []
    kinds = Counter(kind for kind, _how in outcome.fidelity.values())
    head = "unprobed runs against the native record: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    return [head] + [f"emulation differs from Linux: {name}: {how}"
                     for name, (kind, how) in sorted(outcome.fidelity.items()) if kind == "differs"]


def packages(paths: Sequence[str], info_dir: str = "/var/lib/dpkg/info") -> dict[str, str]:
    """path -> Debian package, from dpkg's file lists (usr-merged paths looked up with and without /usr)."""
    owner: dict[str, str] = {}
    for listing in glob.glob(os.path.join(info_dir, "*.list")):
        package = os.path.basename(listing)[: -len(".list")].split(":")[0]
        try:
            with open(listing, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    owner.setdefault(line.rstrip("\n"), package)
        except OSError:
            continue
    found: dict[str, str] = {}
    for path in paths:
        alias = path.removeprefix("/usr") if path.startswith("/usr/") else "/usr" + path
        name = owner.get(path) or owner.get(alias)
        if name is not None:
            found[path] = name
    return found


def markdown(outcome: Outcome, designs: Sequence[Design], owners: dict[str, str] | None = None) -> str:
    t = totals(outcome, designs)
    sites = _sites(outcome)
    rz = t["red_zone"]
    out = ["# uprobe-emu survey", "",
           f"{t['files']} files, {t['elf_files']} ELF files ({t['distinct_elf_files']} distinct contents), "
           f"{t['site_count']} probe sites, {t['usdt_notes']} USDT notes. Red zone across the site: "
           f"live {rz.get(LIVE, 0)}, dead {rz.get('dead', 0)}, unknown {rz.get(UNKNOWN, 0)}.", ""]
    if t["skipped"]:
        out += ["Skipped: " + ", ".join(f"{k} {v}" for k, v in sorted(t["skipped"].items())) + ".", ""]
    confirmed = _confirmed(outcome, designs)
    extra = " confirmed |" if confirmed else ""
    out += ["## Per design", "", "| design | sites | optimized | hazards | unknown |" + extra,
            "|---|---|---|---|---|" + "---|" * bool(confirmed)]
    out += [f"| {name} | {t['site_count']} | {v['optimized']} | {v['hazards']} | {v['unknown']} |"
            + (f" {confirmed[name]} |" if confirmed else "") for name, v in t["designs"].items()]
    reasons = Counter((s.reason or "").split(" at 0x")[0] for _, s in sites if s.red_zone == UNKNOWN)
    if reasons:
        out += ["", "## Why a red zone is unknown", "", "| reason | sites |", "|---|---|"]
        out += [f"| {r} | {n} |" for r, n in reasons.most_common(12)]
    out += _hazards(sites, designs)
    if outcome.runs:
        out += _corpus_markdown(outcome, designs)
    if owners:
        out += _packages(outcome, owners, designs)
    return "\n".join(out) + "\n"


def _confirmed(outcome: Outcome, designs: Sequence[Design]) -> dict[str, int]:
    """design -> static hazards a corpus run clobbered (empty without a corpus)."""
    if not outcome.runs:
        return {}
    from emu.survey.confusion import confusion

    return {d.name: confusion(outcome, d).cells["hazard"]["clobbered"] for d in designs}


def _hazards(sites: list[tuple[str, SiteSurvey]], designs: Sequence[Design]) -> list[str]:
    hazardous = [(p, s) for p, s in sites if any(s.hazard.get(d.name) for d in designs)]
    out = ["", f"## Hazardous sites ({len(hazardous)})", ""]
    if not hazardous:
        return out + ["No site keeps a live red-zone byte that a design writes."]
    for path, s in hazardous[:HAZARDS_SHOWN]:
        live = ", ".join(f"rsp{lo}..rsp{hi}" for lo, hi in s.live)
        under = ", ".join(d.name for d in designs if s.hazard.get(d.name))
        out += [f"### {path} {s.address:#x} {s.symbol or '-'} ({s.kind})", "",
                f"Live: {live}. Hazard under: {under}.", "", "```", s.context, "```", ""]
    if len(hazardous) > HAZARDS_SHOWN:
        out.append(f"({len(hazardous) - HAZARDS_SHOWN} more in the JSON and the database.)")
    return out


def package_sites(outcome: Outcome, designs: Sequence[Design], owners: dict[str, str]) -> list[tuple[str, Counter[str]]]:
    """Per Debian package (most sites first): its sites, live red zones, and per design the hazards
    (key: the design's name) and the unknowns ("unknown NAME")."""
    per: dict[str, Counter[str]] = {}
    for path, s in _sites(outcome):
        c = per.setdefault(owners.get(path, "(no package)"), Counter())
        c["sites"] += 1
        c["live"] += s.red_zone == LIVE
        for d in designs:
            c[d.name] += bool(s.hazard.get(d.name))
            c["unknown " + d.name] += s.hazard.get(d.name) is None
    return sorted(per.items(), key=lambda kv: (-kv[1]["sites"], kv[0]))


def _packages(outcome: Outcome, owners: dict[str, str], designs: Sequence[Design]) -> list[str]:
    names = [d.name for d in designs]
    out = ["", "## Per package", "", "| package | sites | live | " + " | ".join(f"hazards {n}" for n in names) + " |",
           "|---|---|---|" + "---|" * len(names)]
    for package, c in package_sites(outcome, designs, owners):
        out.append(f"| {package} | {c['sites']} | {c['live']} | " + " | ".join(str(c[n]) for n in names) + " |")
    return out


def _corpus_markdown(outcome: Outcome, designs: Sequence[Design]) -> list[str]:
    from emu.survey.confusion import confusion

    rows = confusion_rows(outcome, designs)
    out = ["", "## Static verdicts against the corpus runs", "",
           f"{len(outcome.runs)} runs. Clobbered: a red-zone byte the design changed was read back by the "
           "program; exercised: hit at least twice (linux-6.18's optimized path ran), not clobbered.", "",
           "| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    tables = {d.name: confusion(outcome, d) for d in designs}
    out += ["", "Sites the red-zone verifier flagged whose changed bytes the program never read back: " +
            ", ".join(f"{name} {c.flagged_only}" for name, c in tables.items()) + "."]
    confirmed = [(name, h) for name, c in tables.items() for h in c.confirmed]
    if confirmed:
        out += ["", f"### Confirmed hazards ({len(confirmed)})", ""]
        for name, h in confirmed:
            out += [f"- {name}: {h['file']} {h['address']:#x} {h['symbol'] or '-'}: {h['read_back']} of "
                    f"{h['hits']} hits read back ({', '.join(h['entries'])}). Replay:", "",
                    f"  ```\n  {h['replay']}\n  ```"]
    missed = [(name, fn) for name, c in tables.items() for fn in c.false_negatives]
    if missed:
        out += ["", f"### Clobbered without a static hazard ({len(missed)})", ""]
        out += [f"- {name}: {fn['file']} {fn['address']:#x} {fn['symbol'] or '-'}: red zone {fn['red_zone']}"
                f"{' (' + fn['reason'] + ')' if fn['reason'] else ''}, {fn['hits']} hits, "
                f"{fn['read_back']} read back" for name, fn in missed]
    unexplained = [(name, run) for name, c in tables.items() for run in c.unexplained]
    if unexplained:
        out += ["", f"### Output differs, no site clobbered ({len(unexplained)})", ""]
        out += [f"- {name}: {run}" for name, run in unexplained]
    failed = [cr for cr in outcome.runs if cr.run.status != "ok"]
    if failed:
        out += ["", f"### Runs that failed ({len(failed)})", ""]
        out += [f"- {cr.name} under {cr.run.design}: {cr.run.error}" for cr in failed]
    fidelity = fidelity_lines(outcome)
    if fidelity:
        out += ["", "### The emulation against Linux", "", fidelity[0] + ".", ""] + [f"- {line}" for line in fidelity[1:]]
    return out
