"""The survey's read-back watch sees a clobbered red zone read back by the kernel (a write(2) of the
red-zone bytes) and by a child forked after the hit (its copy of the stack), not only by the
program's own loads (emu/survey/dynamic.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import seen_by_symbol, survey_with_corpus

from emu.designs import DESIGNS
from emu.survey.confusion import confusion
from emu.survey.dynamic import ReadBack, _Space
from emu.survey.engine import Outcome

DESIGNS_RUN = [DESIGNS["linux-6.18"], DESIGNS["jmp-slots"]]


def _outcome(tmp_path: Path) -> Outcome:
    return survey_with_corpus(tmp_path, "survey_readback", "survey_readback.toml", DESIGNS_RUN)


def _seen(tmp_path: Path, design: str) -> dict[str, tuple[int, int, int]]:
    """Per site (by symbol): hits, hits flagged by the red-zone verifier, hits read back."""
    return seen_by_symbol(_outcome(tmp_path), design)


def test_a_system_call_given_a_red_zone_address_makes_it_live_statically(tmp_path: Path) -> None:
    """The static half agrees: the write(2) after rz_syscall's site reads the bytes stored before it
    (emu/survey/stack.py), so both sites are hazards under linux-6.18 and both are confirmed."""
    linux = confusion(_outcome(tmp_path), DESIGNS["linux-6.18"])
    assert linux.cells["hazard"] == {"clobbered": 2, "exercised": 0, "reached_once": 0, "not_reached": 0}
    assert (linux.precision, linux.recall, linux.false_negatives) == (1.0, 1.0, [])


def test_the_kernel_and_a_forked_child_read_the_clobbered_bytes_back(tmp_path: Path) -> None:
    assert _seen(tmp_path, "linux-6.18") == {"rz_syscall+0x5": (3, 2, 2), "rz_child+0x5": (3, 2, 2)}


def test_a_design_that_leaves_the_red_zone_alone_has_nothing_read_back(tmp_path: Path) -> None:
    assert _seen(tmp_path, "jmp-slots") == {"rz_syscall+0x5": (3, 0, 0), "rz_child+0x5": (3, 0, 0)}


@pytest.mark.parametrize("blind", ["kernel", "child"])
def test_negative_control_a_watch_blind_to_one_reader_misses_its_site(tmp_path: Path, blind: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch as it was: no eye on copy_from_user, or none in forked children."""
    if blind == "kernel":
        monkeypatch.setattr(_Space, "_on_kernel_read", lambda _self, _addr, _size: None)
    else:
        monkeypatch.setattr(ReadBack, "_on_fork", lambda _self, _child: None)
    seen = _seen(tmp_path, "linux-6.18")
    missed = "rz_syscall+0x5" if blind == "kernel" else "rz_child+0x5"
    assert seen[missed] == (3, 2, 0)
    assert {name: got for name, got in seen.items() if name != missed} == {
        ("rz_child+0x5" if blind == "kernel" else "rz_syscall+0x5"): (3, 2, 2)}
