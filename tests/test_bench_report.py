"""`bench --report` and `bench --predict`: every published figure beside the counts and the model's
predictions; predicted rates for a user's design next to the built-ins'; a bad CPU is one line, exit 2."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from emu import cli
from emu.bench import published as pub
from emu.bench.model import ChangeCheck
from emu.bench.report import missing_figures, verdict

REPO = Path(__file__).resolve().parent.parent
USER_DESIGN = str(REPO / "examples" / "designs" / "slot_sysret.py")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One report and one prediction run (counting every published configuration takes a while)."""
    d = tmp_path_factory.mktemp("bench")
    report, out_json = d / "report.txt", d / "bench.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = cli.main(["bench", "--report", str(report), "--predict", "i7-1165g7", "--no-native",
                           "--kernel", "jmp-slots,slot-sysret", "--design-file", USER_DESIGN,
                           "--workload", "uprobe-nop5,usdt-nop5", "--json", str(out_json)])
    return {"status": status, "report": report.read_text(), "json": json.loads(out_json.read_text()),
            "stdout": stdout.getvalue()}


@pytest.mark.slow  # shares one fixture that counts every published configuration (~40 s)
def test_the_report_holds_every_published_figure(outputs: dict[str, Any]) -> None:
    assert outputs["status"] == 0
    assert missing_figures(outputs["report"]) == []
    data = outputs["json"]["report"]
    assert len(data["figures"]) == len(pub.FIGURES)
    assert {(c["cpu"], c["label"]) for c in data["changes"]} == {(c.cpu, c.label) for c in pub.CHANGES}


@pytest.mark.slow  # shares one fixture that counts every published configuration (~40 s)
def test_negative_control_a_dropped_figure_is_reported_missing(outputs: dict[str, Any]) -> None:
    text = "\n".join(line for line in outputs["report"].splitlines()
                     if not ("milan" in line and "usdt-nop5-fix " in line and "3.82" in line))
    assert missing_figures(text) == ["milan usdt-nop5-fix 3.82"]


@pytest.mark.slow  # shares one fixture that counts every published configuration (~40 s)
def test_counts_sit_beside_the_figures(outputs: dict[str, Any]) -> None:
    rows = {(f["cpu"], f["label"]): f for f in outputs["json"]["report"]["figures"]}
    base, fix = rows[("milan", "usdt-nop5-base")]["counts"], rows[("milan", "usdt-nop5-fix")]["counts"]
    assert (base["sysret"], base["iret"], base["mmap_lock"]) == (1, 0, 1)  # call trampoline: SYSRET, VMA lookup
    assert (fix["sysret"], fix["iret"], fix["mmap_lock"]) == (0, 1, 0)  # slots: IRET, lookup by slot index
    cur, new = rows[("i7-1165g7", "uretprobe-nop (current)")]["counts"], rows[("i7-1165g7", "uretprobe-nop (syscall)")]["counts"]
    assert (cur["trap"], cur["syscall"]) == (2, 0) and (new["trap"], new["syscall"], new["iret"]) == (1, 1, 1)


@pytest.mark.slow  # shares one fixture that counts every published configuration (~40 s)
def test_the_report_says_what_the_model_cannot_explain(outputs: dict[str, Any]) -> None:
    data = outputs["json"]["report"]
    milan = [u for u in data["unexplained"] if u.startswith("milan nop5-change")]
    assert milan and "mmap_lock" in milan[0]
    assert "Not measured: not asked for (--no-native)" in outputs["report"]


@pytest.mark.slow  # shares one fixture that counts every published configuration (~40 s)
def test_predict_lists_a_user_design_next_to_the_built_ins(outputs: dict[str, Any]) -> None:
    rows = outputs["json"]["predictions"]["rows"]
    assert {(r["design"], r["workload"]) for r in rows} == {
        (d, w) for d in ("jmp-slots", "slot-sysret") for w in ("uprobe-nop5", "usdt-nop5")}
    assert all(r["mps"] > 0 and r["err_mps"] > 0 for r in rows)
    per_cpu = outputs["json"]["report"]["predictions"]
    assert set(per_cpu) == {c.slug for c in pub.CPUS}  # --no-native: the published CPUs only
    assert all({r["design"] for r in rs} == {"jmp-slots", "slot-sysret"} for rs in per_cpu.values())
    assert "## Predicted native rates of the selected designs" in outputs["report"]
    user = next(r for r in rows if r["design"] == "slot-sysret")
    assert ["slot-sysret", "uprobe-nop5", f"{user['mps']:.3f}"] in [line.split()[:3] for line in outputs["stdout"].splitlines()]


def test_predict_a_bad_cpu_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--predict", "pentium4", "--no-native"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pentium4" in err and "skylake" in err


def _check(published: float, predicted: float, sigma: float) -> ChangeCheck:
    return ChangeCheck(pub.Change("x", "c", "a", "b", published, pub.Source.REDZONE_FIX), False, predicted, sigma)


def test_change_verdicts_and_their_negative_controls() -> None:
    assert verdict(_check(-24.3, -23.0, 3.0)) == "explained"
    assert verdict(_check(-24.3, -18.0, 4.0)) == "explained within 2 sigma"
    assert verdict(_check(11.0, -25.0, 5.0)) == "not explained"
    assert verdict(_check(11.0, -4.0, 19.0)).startswith("not determined")
