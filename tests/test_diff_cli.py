"""`uprobe-emu diff`: agreement under the matching design, the first difference otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from emu import cli
from emu.native import available as native_available

REDZONE = str(Path(__file__).resolve().parent.parent / "elf_samples" / "redzone_probe")


@pytest.mark.skipif(not native_available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU")
def test_diff_agrees_with_linux_618_and_not_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["diff", "--clear-env", "-p", "uprobe:rz_nop5_site", "-p", "usdt:redzone:site", REDZONE, "4"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("agree:") and "uprobe:rz_nop5_site=4" in out
    assert cli.main([*args[:1], "--kernel", "jmp-slots", *args[1:]]) == 1
    out = capsys.readouterr().out
    assert out.startswith("differ: stdout line 5: native b'rz_nop5 i=1 got=0xfce43cc16f5d083a")
    assert "emulated b'rz_nop5 i=1 got=0xd8f55a41ffb3f893 want=0xd8f55a41ffb3f893'" in out


def test_diff_without_the_pmu_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("emu.native.PMU_DIR", "/nonexistent")
    assert cli.main(["diff", "-p", "uprobe:rz_nop5_site", REDZONE, "1"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no uprobe PMU" in err[0]


@pytest.mark.skipif(not native_available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU")
def test_site_bytes_at_exit_agree_including_the_trampoline_placement() -> None:
    from emu.diff import run_diff

    targets = str(Path(REDZONE).parent / "probe_targets")
    specs = ["uprobe:f_nop5", "uprobe:f_nopl5_reg1", "uprobe:f_nop5_66"]
    report = run_diff(targets, [targets, "3"], specs, {})
    assert report.first_difference() is None
    assert [b[:1] for b in report.native.site_bytes] == [b"\xe8", b"\xcc", b"\xe8"]
    assert report.native.site_bytes == report.sites
