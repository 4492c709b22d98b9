"""Corpus runs probe what the real kernel would: every site of every file the run's processes map,
libraries included (emu/survey/libraries.py, engine.py), and the verifiers watch a library's sites
from the moment it is mapped (emu/verify/session.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import sample, seen_by_symbol, survey_with_corpus

from emu.designs import DESIGNS
from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions
from emu.survey import engine
from emu.survey.confusion import confusion
from emu.survey.corpus import load_corpus
from emu.survey.engine import Outcome
from emu.survey.libraries import mapped_files
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
    found, output = mapped_files(entry)
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
