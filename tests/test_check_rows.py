"""`check` never stops at one design: a probe a design refuses, or a run the harness cannot make
under one design, is that design's row in the table and the JSON; the other designs still run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import sample

import emu.check
from emu.cli import main
from emu.errors import EmuError

TARGETS = sample("probe_targets")


def _check(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, dict[str, Any]]:
    """(status, stdout, the --json) of one check; a run that fails writes no JSON, and says so in one line."""
    report = tmp_path / "check.json"
    report.unlink(missing_ok=True)
    status = main(["check", "--json", str(report), *argv, TARGETS])
    out, err = capsys.readouterr()
    assert err.count("\n") == (1 if status == 2 else 0), err
    return status, out, json.loads(report.read_text()) if report.exists() and report.stat().st_size else {}


def test_a_refused_probe_is_a_row_not_the_end_of_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every design but nop10 refuses the CS-prefixed 10-byte NOP (-ENOTSUPP, as Linux does); all
    five still run the other probe and are compared."""
    status, out, data = _check(tmp_path, capsys, "-p", "uprobe:t_nop10", "-p", "uprobe:t_nop5")
    assert status == 0
    designs = data["designs"]
    assert set(designs) == {"int3", "uretprobe-rfc", "linux-6.18", "jmp-slots", "nop10"}
    for name, row in designs.items():
        refused = [] if name == "nop10" else ["-ENOTSUPP, 524"]
        assert [r.rpartition("(")[2].rstrip(")") for r in row["refused"]] == refused, name
        assert row["hits"] == (6 if name == "nop10" else 3) and row["error"] is None
    assert "int3: refused uprobe:t_nop10: the kernel refuses the instruction" in out
    assert out.splitlines()[0].split()[-1] == "refused"


def test_a_spec_that_names_nothing_is_still_the_user_s_error(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    status, out, data = _check(tmp_path, capsys, "-p", "uprobe:no_such_function")
    assert (status, out, data) == (2, "", {})


def test_a_design_whose_run_fails_is_a_row(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    real = emu.check._run_design

    def run_design(request: emu.check.CheckRequest, design: str, *reference: Any) -> Any:
        if design == "jmp-slots":
            raise EmuError("the slot page could not be placed")
        return real(request, design, *reference)

    monkeypatch.setattr(emu.check, "_run_design", run_design)
    status, out, data = _check(tmp_path, capsys, "-p", "uprobe:t_nop5")
    assert status == 0
    assert data["designs"]["jmp-slots"]["error"] == "the slot page could not be placed"
    assert data["designs"]["nop10"]["hits"] == 3 and data["designs"]["nop10"]["error"] is None
    row = next(line for line in out.splitlines() if line.startswith("jmp-slots "))
    assert "failed" in row.split()
    assert "jmp-slots: failed: the slot page could not be placed" in out
    status, _, _ = _check(tmp_path, capsys, "--strict", "--kernel", "jmp-slots,nop10", "-p", "uprobe:t_nop5")
    assert status == 1  # --strict: a design that could not be checked is not a clean one
