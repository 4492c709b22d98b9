"""Corpus runs probe what the real kernel would: every site of every file the run's processes map,
libraries included (emu/survey/libraries.py, engine.py), and the verifiers watch a library's sites
from the moment it is mapped (emu/verify/session.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import sample, seen_by_symbol, survey_with_corpus, symtab_address

from emu.designs import DESIGNS
from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions
from emu.survey import dynamic, engine
from emu.survey.confusion import confusion
from emu.survey.corpus import load_corpus
from emu.survey.engine import Outcome
from emu.survey.libraries import is_reached, mapped_files
from emu.verify.session import VerifySession
from emu.violations import Check

CORPUS = "rzlib.toml"
LIBRZ = os.path.realpath(sample("librz.so"))
DESIGNS_RUN = [DESIGNS["linux-6.18"], DESIGNS["jmp-slots"]]


def _outcome(tmp_path: Path) -> Outcome:
    return survey_with_corpus(tmp_path, "rzlib_main", CORPUS, DESIGNS_RUN)


def _library_seen(outcome: Outcome, design: str) -> dict[str, tuple[int, int, int]]:
    return seen_by_symbol(outcome, design, outcome.walk.elf[LIBRZ])


def test_the_run_maps_its_library_and_the_interpreter() -> None:
    [entry] = load_corpus(str(Path(__file__).resolve().parents[1] / "fixtures" / CORPUS))
    found, output, reached = mapped_files(entry)
    assert output is not None and output.ending == "exit 0"
    assert found[0] == os.path.realpath("/lib64/ld-linux-x86-64.so.2") and LIBRZ in found
    assert os.path.realpath(sample("rzlib_main")) not in found


def test_a_library_site_is_confirmed_or_refuted_by_the_corpus_run(tmp_path: Path) -> None:
    outcome = _outcome(tmp_path)
    assert _library_seen(outcome, "linux-6.18") == {"lib_rz_live+0x5": (3, 2, 2), "lib_rz_dead+0xa": (3, 2, 0)}
    assert _library_seen(outcome, "jmp-slots") == {"lib_rz_live+0x5": (3, 0, 0), "lib_rz_dead+0xa": (3, 0, 0)}
    linux = confusion(outcome, DESIGNS["linux-6.18"])
    assert linux.cells["hazard"]["clobbered"] == 1 and linux.cells["no_hazard"]["exercised"] == 1
    assert (linux.precision, linux.recall, linux.unexplained) == (1.0, 1.0, [])


def test_negative_control_without_library_probes_the_hazard_is_never_proven(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Probing the executable's own sites only, as before: the executable has none, so the library's
    hazard is neither surveyed nor run, and the corpus proves nothing."""
    monkeypatch.setattr(engine, "_library_sites", lambda *_args: {})
    outcome = _outcome(tmp_path)
    assert LIBRZ not in outcome.walk.elf and _library_seen_nowhere(outcome)
    linux = confusion(outcome, DESIGNS["linux-6.18"])
    assert linux.cells["hazard"]["clobbered"] == 0 and (linux.precision, linux.recall) == (None, None)


def _library_seen_nowhere(outcome: Outcome) -> bool:
    return all(not s.spec.startswith(f"uprobe:{LIBRZ}") for cr in outcome.runs for s in cr.run.sites)


@pytest.mark.parametrize("watched", [True, False])
def test_the_verifiers_watch_a_library_site_once_it_is_mapped(watched: bool) -> None:
    """The negative control drops the session's library observer: the library's hits go unverified."""
    binary = sample("rzlib_main")
    machine = Machine(binary, [binary], {}, RunOptions(design="linux-6.18"), GuestIO.captured())
    machine.attach(f"uprobe:{LIBRZ}:lib_rz_live_site")
    session = VerifySession(machine)
    if not watched:
        machine.attacher.library_observers.clear()
    machine.run()
    flagged = [v for v in session.violations if v.kind is Check.REDZONE]
    assert bool(flagged) == watched


def test_the_discovery_run_says_which_code_ran() -> None:
    """survey_corpus without an argument never calls rz_never: its site is outside the code that ran,
    rz_live's is inside, and the survey then attaches rz_live's probe and leaves rz_never's out."""
    [entry, _explicit] = load_corpus(str(Path(__file__).resolve().parents[1] / "fixtures" / "survey_corpus.toml"))
    binary = os.path.realpath(entry.binary)
    _files, _output, reached = mapped_files(entry)
    live, never = (symtab_address(binary, f"{name}_site") for name in ("rz_live", "rz_never"))
    assert is_reached(reached[binary], live) and not is_reached(reached[binary], never)
    specs, left_out = dynamic._specs(entry, (live, never), (), reached, 0)
    assert specs == (f"uprobe:{live:#x}",) and left_out == [f"uprobe:{never:#x}"]
    everything, nothing_left = dynamic._specs(entry, (live, never), (), {}, 0)  # no discovery: attach all
    assert len(everything) == 2 and nothing_left == []


def test_a_site_left_out_still_counts_as_never_reached(tmp_path: Path) -> None:
    """The run of all sites keeps the site it left out, with no hit, so the confusion table counts it."""
    outcome = survey_with_corpus(tmp_path, "survey_corpus", "survey_corpus.toml", [DESIGNS["jmp-slots"]])
    never = symtab_address(sample("survey_corpus"), "rz_never_site")
    [all_sites] = [cr.run for cr in outcome.runs if cr.name == "survey_corpus, all sites"]
    [left_out] = [s for s in all_sites.sites if s.address == never]
    assert (left_out.hits, left_out.refused) == (0, False)


def test_a_site_left_out_that_the_design_refuses_is_not_counted(tmp_path: Path) -> None:
    """A site the run left out was never attached: never reached, unless the design would refuse it
    (linux-6.18 and a nop10 site), which the static survey knows; then the table leaves it out."""
    outcome = survey_with_corpus(tmp_path, "survey_corpus", "survey_corpus.toml", [DESIGNS["jmp-slots"]])
    outcome.runs = [cr for cr in outcome.runs if cr.name == "survey_corpus, all sites"]  # (the other hits rz_never)
    never = symtab_address(sample("survey_corpus"), "rz_never_site")
    assert confusion(outcome, DESIGNS["jmp-slots"]).cells["no_hazard"]["not_reached"] == 1  # the control
    [site] = [s for stored in outcome.results.values() for s in stored.sites if s.address == never]
    site.verdicts["jmp-slots"] = "refused (-ENOTSUPP)"
    assert confusion(outcome, DESIGNS["jmp-slots"]).cells["no_hazard"]["not_reached"] == 0


def test_an_entry_that_reaches_none_of_its_sites_is_its_unprobed_run(tmp_path: Path) -> None:
    """Every site left out: nothing to attach, so no probed run (check would scan for sites and fail):
    each design's run is ok, with its sites never reached."""
    import hashlib

    corpus = tmp_path / "c.toml"
    corpus.write_text('[[run]]\nbinary = "/usr/bin/true"\n')
    [entry] = load_corpus(str(corpus))
    sha = hashlib.sha256(Path("/usr/bin/true").read_bytes()).hexdigest()
    runs = dynamic.run_entry(entry, sha, DESIGNS_RUN, (0x4000, 0x4010), (), {"/usr/bin/other": ((0, 1),)})
    assert [(r.design, r.status, [(s.address, s.hits, s.refused) for s in r.sites]) for r in runs] == [
        (d.name, "ok", [(0x4000, 0, False), (0x4010, 0, False)]) for d in DESIGNS_RUN]


def test_entries_alike_but_for_their_program_are_discovered_apart(tmp_path: Path) -> None:
    """md5sum and sha1sum of the same input: each its own discovery (the code it runs, its output)."""
    from emu.dist import InlinePool

    corpus = tmp_path / "c.toml"
    corpus.write_text('[[run]]\nbinary = "/usr/bin/md5sum"\nstdin = "x"\n[[run]]\nbinary = "/usr/bin/sha1sum"\nstdin = "x"\n')
    entries = load_corpus(str(corpus))
    outcome = Outcome(engine.Walk(), {})
    found = engine._discover(entries, InlinePool(), outcome, {})
    assert len(found) == 2 and set(outcome.fidelity) == {"md5sum", "sha1sum"}
    md5, sha1 = (found[e.run_key()][1] for e in entries)
    assert "/usr/bin/md5sum" in md5.reached and "/usr/bin/sha1sum" in sha1.reached and md5.output != sha1.output
