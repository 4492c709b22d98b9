"""The mutation suite: flawed variants of the optimizing designs, and the verifiers catching them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from emu import cli
from emu.designs import DESIGNS
from emu.mutation import (
    LIVE_STATE,
    OPERATORS,
    Outcome,
    Target,
    global_address,
    instructions,
    mutants,
    run_once,
    score_design,
)
from emu.verify.session import Verifier

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "designs" / "jmp_slots.py"
TARGET = Target(global_address=global_address(LIVE_STATE))


def test_the_operators_and_the_kinds_of_equivalent_mutant() -> None:
    assert len(OPERATORS) >= 25
    assert {name for name, (_edit, equivalent) in OPERATORS.items() if equivalent} == {
        "deeper-lea", "leading-nop", "one-more-saved", "ret-leading-nop", "ret-exit-iret"}
    assert {name for name in OPERATORS if name.startswith("ret-")} >= {
        "ret-drop-insn", "ret-clobber-gpr", "ret-clobber-vector", "ret-set-flag", "ret-saved-order", "ret-exit-trampoline"}


def test_every_operator_makes_a_viable_mutant_of_some_design() -> None:
    """Of a built-in optimizing design, or (the return that IRETs) of jmp-slots with the RFC's uretprobe."""
    designs = [d for d in DESIGNS.values() if d.optimizes]
    designs.append(replace(DESIGNS["jmp-slots"], name="jmp-slots-rfc-return", uretprobe=DESIGNS["uretprobe-rfc"].uretprobe))
    made = {m.operator for d in designs for m in mutants(d, TARGET)}
    assert made == set(OPERATORS)


@pytest.mark.parametrize("operator", ["ret-clobber-gpr", "ret-set-flag", "ret-saved-order", "ret-drop-insn"])
def test_return_trampoline_mutants_are_killed(operator: str) -> None:
    score = score_design(DESIGNS["linux-6.18"], TARGET, [operator])
    assert score.results and all(r.outcome is Outcome.KILLED for r in score.results), [
        (r.mutant.change, r.outcome) for r in score.results]


def test_without_the_return_path_checked_return_mutants_survive(monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: with the return watch blind, a clobbered callee-saved register reaches
    the program (live_state's errors) and no verifier says so."""
    from emu.verify.returns import ReturnWatch

    monkeypatch.setattr(ReturnWatch, "_on_map", lambda self, vma: None)
    score = score_design(DESIGNS["linux-6.18"], TARGET, ["ret-clobber-gpr"])
    assert score.count(Outcome.SURVIVED) >= 2 and not score.perfect


def test_mutants_are_made_through_the_design_api_and_validated() -> None:
    found = list(mutants(DESIGNS["jmp-slots"], TARGET, ["set-flag"]))
    assert [m.change for m in found] == ["std before the syscall", "stc before the syscall", "clc before the syscall",
                                         "AC before the syscall", "ID before the syscall"]
    for m in found:
        assert m.design.validate() is m.design and m.design.name.startswith("jmp-slots.m")
        assert m.design.trampoline is not None and m.design.trampoline.slot_size >= 32  # grown to fit
    id_toggle = instructions(found[-1].design.trampoline.code)  # type: ignore[union-attr]
    assert id_toggle is not None and "xorl $0x200000, (%rsp)" in id_toggle


def test_the_live_state_program_sees_every_kind_of_change() -> None:
    """The fixture itself, unprobed-equivalent under a clean design, and each of its error bits reachable."""
    clean = run_once(DESIGNS["jmp-slots"], TARGET)
    assert clean.stdout == b"live_state errors=0x00\n" and clean.exit_status == 0 and not clean.violations
    assert run_once(DESIGNS["linux-6.18"], TARGET).stdout == b"live_state errors=0x04\n"  # the red zone


@pytest.mark.parametrize("operator", ["set-flag", "stray-store", "clobber-vector", "clobber-control",
                                      "sysret-for-iret", "deeper-lea", "leading-nop", "one-more-saved"])
def test_jmp_slots_mutants_are_killed_or_clean(operator: str) -> None:
    score = score_design(DESIGNS["jmp-slots"], TARGET, [operator])
    assert score.results and score.perfect
    equivalent = OPERATORS[operator][1]
    want = Outcome.CLEAN if equivalent else Outcome.KILLED
    assert all(r.outcome is want for r in score.results), [(r.mutant.change, r.outcome) for r in score.results]


def test_a_verifier_left_out_lets_its_mutants_survive() -> None:
    """The negative control of the scoring: without the memory and red-zone checks, stray stores
    change what the program sees and nothing says so."""
    score = score_design(DESIGNS["jmp-slots"], TARGET, ["stray-store"], verifiers=(Verifier.REGS, Verifier.RESUME))
    assert score.count(Outcome.SURVIVED) == 3 and score.score() == 0.0 and not score.perfect


def test_an_equivalent_mutant_that_is_not_equivalent_is_a_false_alarm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scoring's other control: a 'leading nop' that is really a std must be reported as a false alarm."""
    def std_first(design, _target):  # type: ignore[no-untyped-def]
        yield "std first", replace(design, trampoline=replace(design.trampoline, code="std; " + design.trampoline.code))

    monkeypatch.setitem(OPERATORS, "leading-nop", (std_first, True))
    score = score_design(DESIGNS["jmp-slots"], TARGET, ["leading-nop"])
    assert [r.outcome for r in score.results] == [Outcome.FALSE_ALARM] and not score.perfect


def test_mutate_command_on_a_user_design_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mutate.json"
    assert cli.main(["mutate", "--design-file", str(EXAMPLE), "--operator", "clobber-gpr", "--operator",
                     "leading-nop", "--json", str(out), "--strict"]) == 0
    text = capsys.readouterr().out
    assert "my-jmp-slots" in text and "100%" in text
    data = json.loads(out.read_text())["designs"]["my-jmp-slots"]
    assert data["perfect"] and data["operators"]["clobber-gpr"]["killed"] == 6
    assert all("lea -128(%rsp), %rsp; push %rcx" in m["code"] for m in data["mutants"])  # the file's own code


def test_mutate_refuses_a_design_without_a_trampoline(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["mutate", "--design", "int3"]) == 2
    assert "optimizing design" in capsys.readouterr().err
    assert cli.main(["mutate", "--operator", "no-such-op"]) == 2


@pytest.mark.slow
def test_every_built_in_optimizing_design_scores_100_percent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mutate.json"
    assert cli.main(["mutate", "--json", str(out), "--strict"]) == 0
    data = json.loads(out.read_text())["designs"]
    assert set(data) == {"linux-6.18", "jmp-slots", "nop10"}
    for name, design in data.items():
        assert design["perfect"] and design["score"] == 1.0, name
        outcomes = {m["outcome"] for m in design["mutants"]}
        assert outcomes <= {"killed", "clean"}, (name, outcomes)
    assert "mutants not caught" not in capsys.readouterr().out
